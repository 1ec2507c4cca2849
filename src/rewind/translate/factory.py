"""The translate's runtime parts from a spec: decoder, translator function, output schema.

Also called inside Spark tasks (from the spec's JSON), so it is cheap and never touches Spark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rewind.core.datatypes import arrow_type
from rewind.errors import ConfigError
from rewind.translate.avro_schemas import LocalSchemaSource, RegistrySchemaSource
from rewind.translate.functions import load_callable

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.spec import Decode, JobSpec, Translate
    from rewind.translate.decoder import Decoder


def make_decoder(decode: Decode) -> Decoder:
    # lazy: the decoders import pandas, numpy and pyarrow: loaded when a job is planned, not for
    # every CLI call
    from rewind.translate.avro_decoder import AvroDecoder
    from rewind.translate.decoder import RawDecoder
    from rewind.translate.json_decoder import JsonDecoder

    if decode.format == "json":
        return JsonDecoder(decode.schema_, cast(Any, decode.null_value or "quarantine"))
    if decode.format == "raw":
        return RawDecoder()
    if decode.format == "rows":
        # lazy: avoids numpy, pandas, pyarrow at import
        from rewind.translate.rows_decoder import RowsDecoder

        return RowsDecoder()
    if decode.schema_dir:
        reader = decode.reader_schema if decode.reader_schema not in (None, "latest") else None
        source: Any = LocalSchemaSource(decode.schema_dir, reader)
    elif decode.registry_url:
        source = RegistrySchemaSource(decode.registry_url, subject=decode.subject)
    else:
        raise ConfigError("decode: avro needs registry_url or schema_dir")
    return AvroDecoder(source, null_value=cast(Any, decode.null_value or "quarantine"))


def make_translator(translate: Translate) -> Callable[..., Any] | None:
    """The user's function (None for SQL translates, which run as Spark SQL)."""
    if translate.function:
        return load_callable(translate.function)
    return None


def transform_name(translate: Translate) -> str:
    if translate.name:
        return translate.name
    if translate.function:
        return translate.function.rsplit(":", 1)[-1]
    return "sql"


def declared_output_schema(translate: Translate) -> pa.Schema | None:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if not translate.output_schema:
        return None
    return pa.schema([pa.field(name, arrow_type(kind)) for name, kind in translate.output_schema.items()])


def lineage_options(spec: JobSpec) -> dict[str, str | None]:
    """The spec's ``lineage:`` as :func:`~rewind.translate.process.process_batch` keywords."""
    lineage = spec.lineage
    if lineage is None:
        return {}
    return {"source_system": lineage.source_system, "effective_time_column": lineage.effective_time_column}
