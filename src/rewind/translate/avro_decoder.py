"""The Avro decoder: Confluent wire format, writer schema by id, optional reader schema."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from rewind.core.columns import (
    RESERVED_PREFIXES,
    is_reserved,
)
from rewind.translate.avro_schemas import AVRO_DTYPES, SchemaSource
from rewind.translate.decoder import (
    TOMBSTONE_REASON,
    Decoded,
    Decoder,
    NullPolicy,
    as_batch,
    events_frame,
    null_policy,
)
from rewind.translate.exceptions import SchemaSourceError
from rewind.translate.failures import Failure
from rewind.translate.json_decoder import kafka_values, typed_column


def _avro_dtype(avro_type: Any) -> Any:
    """The pandas dtype of a reader-schema field: primitives (nullable or not), else objects."""
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        return _avro_dtype(branches[0]) if len(branches) == 1 else object
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType")
        if logical in ("timestamp-millis", "timestamp-micros"):
            return "datetime64[us, UTC]"
        if logical is None and isinstance(avro_type.get("type"), str):
            return AVRO_DTYPES.get(avro_type["type"], object)
        return object
    return AVRO_DTYPES.get(avro_type, object)


def _avro_flat(avro_type: Any) -> bool:
    """True when the field's values are scalars (primitives, or a nullable primitive)."""
    if isinstance(avro_type, list):
        return all(_avro_flat(b) for b in avro_type)
    if isinstance(avro_type, dict):
        return avro_type.get("type") in AVRO_DTYPES or avro_type.get("type") in ("enum", "fixed", "bytes")
    return avro_type in (*AVRO_DTYPES, "null", "bytes")


@dataclass(slots=True)
class _Writer:
    schema_id: int
    parsed: Any
    reader: Any  # the parsed reader schema, or None when writer and reader are the same


class AvroDecoder(Decoder):
    """Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro binary body).

    Each record is read with its writer schema and evolved to the reader schema (the latest
    version, or ``reader_schema`` if given) by fastavro, so every row has the reader's fields.
    Per-record problems are quarantined: "no magic byte", "unknown schema id 42",
    "Avro decode failed: ..."; a schema source that cannot be reached raises.
    """

    def __init__(
        self,
        source: SchemaSource,
        reader_schema: Any | None = None,
        null_value: NullPolicy = "quarantine",
    ) -> None:
        self.source = source
        self.null_value = null_policy(null_value, ("quarantine", "skip"), "decode (avro)")
        self._reader_json = reader_schema
        self._reader: Any | None = None
        self._fields: list[tuple[str, Any]] | None = None
        self._writers: dict[int, _Writer | None] = {}

    def _load_reader(self) -> tuple[Any, list[tuple[str, Any]]]:
        if self._reader is None or self._fields is None:
            # lazy: avoids fastavro at import
            import fastavro

            schema = self._reader_json if self._reader_json is not None else self.source.reader_schema()
            if not isinstance(schema, dict) or schema.get("type") != "record":
                raise SchemaSourceError(
                    f"Avro reader schema from {self.source.describe()} is not a record schema; "
                    "rows need named fields"
                )
            try:
                parsed = fastavro.parse_schema(schema)
            except Exception as e:
                raise SchemaSourceError(
                    f"Avro reader schema from {self.source.describe()} is invalid: {e}"
                ) from e
            fields = [(f["name"], f["type"]) for f in schema.get("fields", [])]
            reserved = [n for n, _ in fields if is_reserved(n)]
            if reserved:
                raise SchemaSourceError(
                    f"Avro reader schema field {reserved[0]!r} uses a reserved prefix "
                    f"({', '.join(RESERVED_PREFIXES)})"
                )
            self._reader_json, self._reader, self._fields = schema, parsed, fields
        return self._reader, self._fields

    def field_dtypes(self) -> dict[str, Any]:
        _, fields = self._load_reader()
        return {name: _avro_dtype(t) for name, t in fields}

    def _writer(self, schema_id: int) -> _Writer | None:
        if schema_id in self._writers:
            return self._writers[schema_id]
        # lazy: avoids fastavro at import
        import fastavro
        from fastavro.schema import to_parsing_canonical_form

        reader, _ = self._load_reader()
        schema = self.source.writer_schema(schema_id)
        writer: _Writer | None = None
        if schema is not None:
            try:
                parsed = fastavro.parse_schema(schema)
            except Exception as e:
                raise SchemaSourceError(
                    f"Avro schema id {schema_id} from {self.source.describe()} is invalid: {e}"
                ) from e
            same = to_parsing_canonical_form(parsed) == to_parsing_canonical_form(reader)
            writer = _Writer(schema_id, parsed, None if same else reader)
        self._writers[schema_id] = writer
        return writer

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        # lazy: avoids fastavro at import
        from fastavro import schemaless_reader

        batch = as_batch(batch)
        _, fields = self._load_reader()
        failures: list[Failure] = []
        skipped: list[int] = []
        rows: list[int] = []
        records: list[dict[str, Any]] = []
        quarantine_nulls = self.null_value == "quarantine"
        for i, raw in enumerate(kafka_values(batch)):
            if raw is None:
                if quarantine_nulls:
                    failures.append(Failure(i, "decode", TOMBSTONE_REASON, "tombstone"))
                else:
                    skipped.append(i)
                continue
            if not raw or raw[0] != 0:
                failures.append(Failure(i, "decode", "no magic byte", "no magic byte"))
                continue
            if len(raw) < 5:
                failures.append(
                    Failure(
                        i,
                        "decode",
                        "Avro decode failed: shorter than the 5-byte header",
                        "Avro decode failed",
                    )
                )
                continue
            schema_id = int.from_bytes(raw[1:5], "big")
            writer = self._writers[schema_id] if schema_id in self._writers else self._writer(schema_id)
            if writer is None:
                failures.append(Failure(i, "decode", f"unknown schema id {schema_id}", "unknown schema id"))
                continue
            fo = io.BytesIO(raw)
            fo.seek(5)
            try:
                record = schemaless_reader(fo, writer.parsed, writer.reader)
            except Exception as e:
                failures.append(
                    Failure(i, "decode", f"Avro decode failed: {type(e).__name__}: {e}", "Avro decode failed")
                )
                continue
            left = len(raw) - fo.tell()
            if left:
                failures.append(
                    Failure(
                        i,
                        "decode",
                        f"Avro decode failed: {left} bytes left after the record (schema id {schema_id} "
                        "does not match the payload)",
                        "Avro decode failed",
                    )
                )
                continue
            if type(record) is not dict:  # pragma: no cover - the reader schema is a record
                failures.append(
                    Failure(i, "decode", "Avro decode failed: not a record", "Avro decode failed")
                )
                continue
            rows.append(i)
            records.append(record)
        columns = {
            name: typed_column([r.get(name) for r in records], _avro_dtype(t), flat=_avro_flat(t))
            for name, t in fields
        }
        return Decoded(events_frame(columns, batch, rows), failures, skipped)
