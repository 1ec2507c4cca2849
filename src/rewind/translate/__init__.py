"""The record-processing core: decode, translate, lineage, quarantine (pure Python, no Spark).

A Spark task calls :func:`process_batch` on each Kafka Arrow batch of a work unit; the planner
calls :func:`load_callable` and :func:`infer_output_schema` as gates before anything runs.

==========================  ==================================================================
``decoder`` and formats      Kafka batch → events frame + failures (JSON, Avro, raw)
``functions``               load a ``module:callable``, apply it, learn its output columns
``lineage``                 the ``_rewind_*`` columns and deterministic event ids
``quarantine``              the quarantine table (raw bytes, stage, reason)
``process``                 all of the above for one batch, with the conservation law
==========================  ==================================================================

Names are imported lazily so that ``import rewind.translate`` stays cheap for the CLI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewind.translate.avro_decoder import AvroDecoder
    from rewind.translate.avro_schemas import LocalSchemaSource, RegistrySchemaSource, SchemaSource
    from rewind.translate.decoder import Decoded, Decoder, RawDecoder
    from rewind.translate.exceptions import (
        DecoderConfigError,
        OutputSchemaUnknown,
        SchemaRegistryUnavailable,
        SchemaSourceError,
        TranslateError,
        TranslateLoadError,
        TranslateOutputError,
    )
    from rewind.translate.failures import Failure, Stage
    from rewind.translate.functions import (
        OutputSchema,
        TranslateResult,
        Translator,
        apply_translate,
        infer_output_schema,
        load_callable,
    )
    from rewind.translate.json_decoder import JsonDecoder
    from rewind.translate.lineage import LINEAGE_SCHEMA, add_lineage, event_id
    from rewind.translate.process import ProcessContext, ProcessedBatch, process_batch
    from rewind.translate.quarantine import QUARANTINE_SCHEMA, quarantine_table

_WHERE = {
    "AvroDecoder": "avro_decoder",
    "Decoded": "decoder",
    "Decoder": "decoder",
    "JsonDecoder": "json_decoder",
    "LocalSchemaSource": "avro_schemas",
    "RawDecoder": "decoder",
    "RegistrySchemaSource": "avro_schemas",
    "SchemaSource": "avro_schemas",
    "DecoderConfigError": "exceptions",
    "OutputSchemaUnknown": "exceptions",
    "SchemaRegistryUnavailable": "exceptions",
    "SchemaSourceError": "exceptions",
    "TranslateError": "exceptions",
    "TranslateLoadError": "exceptions",
    "TranslateOutputError": "exceptions",
    "Failure": "failures",
    "Stage": "failures",
    "OutputSchema": "functions",
    "TranslateResult": "functions",
    "Translator": "functions",
    "apply_translate": "functions",
    "infer_output_schema": "functions",
    "load_callable": "functions",
    "LINEAGE_SCHEMA": "lineage",
    "add_lineage": "lineage",
    "event_id": "lineage",
    "ProcessContext": "process",
    "ProcessedBatch": "process",
    "process_batch": "process",
    "QUARANTINE_SCHEMA": "quarantine",
    "quarantine_table": "quarantine",
}

__all__ = [
    "LINEAGE_SCHEMA",
    "QUARANTINE_SCHEMA",
    "AvroDecoder",
    "Decoded",
    "Decoder",
    "DecoderConfigError",
    "Failure",
    "JsonDecoder",
    "LocalSchemaSource",
    "OutputSchema",
    "OutputSchemaUnknown",
    "ProcessContext",
    "ProcessedBatch",
    "RawDecoder",
    "RegistrySchemaSource",
    "SchemaRegistryUnavailable",
    "SchemaSource",
    "SchemaSourceError",
    "Stage",
    "TranslateError",
    "TranslateLoadError",
    "TranslateOutputError",
    "TranslateResult",
    "Translator",
    "add_lineage",
    "apply_translate",
    "event_id",
    "infer_output_schema",
    "load_callable",
    "process_batch",
    "quarantine_table",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rewind.translate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rewind.translate.{module}"), name)
