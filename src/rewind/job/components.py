"""Turning a spec into the runtime parts: decoder, translator, sinks, Arrow types.

Everything here is also called inside Spark tasks (from the spec's JSON), so it must be
cheap and must not touch Spark.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from rewind.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings
    from rewind.sinks.base import StagingSink
    from rewind.spec import Decode, JobSpec, Translate
    from rewind.translate.decode import Decoder

_DECIMAL = re.compile(r"decimal\((\d+)\s*,\s*(\d+)\)")


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a spec's Spark type name (the spec validates the names)."""
    import pyarrow as pa

    name = spark_type.strip().lower()
    simple: dict[str, pa.DataType] = {
        "string": pa.string(),
        "long": pa.int64(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "integer": pa.int32(),
        "short": pa.int16(),
        "smallint": pa.int16(),
        "byte": pa.int8(),
        "tinyint": pa.int8(),
        "double": pa.float64(),
        "float": pa.float32(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
        "binary": pa.binary(),
    }
    if name in simple:
        return simple[name]
    match = _DECIMAL.fullmatch(name)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise ConfigError(f"type {spark_type!r} has no Arrow equivalent here; use a simple Spark type")


def make_decoder(decode: Decode) -> Decoder:
    from rewind.translate.decode import (
        AvroDecoder,
        JsonDecoder,
        LocalSchemaSource,
        RawDecoder,
        RegistrySchemaSource,
    )

    if decode.format == "json":
        return JsonDecoder(decode.schema_, cast(Any, decode.null_value or "quarantine"))
    if decode.format == "raw":
        return RawDecoder()
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
    from rewind.translate.functions import load_callable

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
    import pyarrow as pa

    if not translate.output_schema:
        return None
    return pa.schema([pa.field(name, arrow_type(kind)) for name, kind in translate.output_schema.items()])


def make_sink(settings: Settings, spec: JobSpec) -> StagingSink[Any]:
    """The staging sink of a spec (each kind imported only when used)."""
    from rewind.catalog import load_catalog

    if spec.sink.iceberg is not None:
        from rewind.sinks.iceberg import IcebergSink

        ice = spec.sink.iceberg
        return IcebergSink(load_catalog(settings), ice.table, ice.mode, ice.window_column, _time_window(spec))
    if spec.sink.postgres is not None:
        from rewind.sinks.postgres import PostgresSink

        return PostgresSink.from_spec(settings, spec)
    if spec.sink.kafka is not None:
        from rewind.sinks.kafka_topic import KafkaTopicSink

        return KafkaTopicSink.from_spec(settings, spec)
    raise ConfigError(f"sink.{spec.sink.kind}: no such sink")


def _time_window(spec: JobSpec) -> tuple[datetime, datetime] | None:
    """The window a replace-window run replaces, when both ends are times."""
    from rewind.job.finalize import replaced_window

    return replaced_window(spec)


def quarantine_table(spec: JobSpec) -> str:
    if spec.quarantine.table:
        return spec.quarantine.table
    if spec.sink.iceberg is not None:
        namespace = spec.sink.iceberg.table.rpartition(".")[0]
        return f"{namespace}.rewind_quarantine"
    return "rewind.rewind_quarantine"
