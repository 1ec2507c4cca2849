"""Avro values of the Kafka sink (``sink.kafka.encode: avro``): output rows → Confluent-framed Avro.

A value is the Confluent wire format: magic byte 0, the writer schema's id (4 bytes, big
endian), then the Avro binary encoding of the record, whose fields are written in the
schema's order (:mod:`rewind.sinks.kafka.avro_fit` decides which column feeds which field).

Encoding is column-wise over an Arrow batch, not record by record: each field becomes one or
two binary columns (zig-zag varints built with numpy for ints, longs, lengths, enum indexes
and union branches; little-endian bytes for floats and doubles; the bytes of strings as they
are), a field without a column is its encoded default, and one Arrow kernel
(``binary_join_element_wise``) concatenates the pieces row by row. Only nested fields and
decimals are written by fastavro value by value. ``bench/avro_encode.py`` compares it with
fastavro's own ``schemaless_writer`` loop over the same rows.

Values that break the schema where the plan cannot see them (a null in a field without
``null``, a string that is no symbol of an enum, bytes of the wrong size for a ``fixed``) are
found by :meth:`AvroValues.check`, which the commit runs over all its files before it
produces anything; the error names the column, the field and the source record of the row.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rewind.core.columns import SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC
from rewind.sinks.kafka.avro_fit import AvroSchemaMismatch, FieldCodec, plan_fields, standalone, type_text

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from rewind.translate.avro_schemas import WriterSchema

SOURCE_COLUMNS = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET)
"""Read with the checked columns, so an error can name the row's source record."""


def zigzag(value: int) -> bytes:
    """One zig-zag varint (Avro's int and long)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varints(values: np.ndarray) -> pa.Array:
    """Zig-zag varints of an int64 array as a binary array, built with numpy (no Python loop)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    v = np.ascontiguousarray(values, dtype=np.int64)
    zz = ((v << 1) ^ (v >> 63)).view(np.uint64)
    lengths = np.ones(len(zz), dtype=np.int32)
    rest = zz >> np.uint64(7)
    while rest.any():
        lengths += rest > 0
        rest >>= np.uint64(7)
    offsets = np.zeros(len(zz) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    starts = offsets[:-1]
    for k in range(int(lengths.max()) if len(lengths) else 0):
        if k == 0:
            pos, z, more = starts, zz, lengths > 1
        else:
            rows = lengths > k
            pos, z, more = starts[rows] + k, zz[rows] >> np.uint64(7 * k), lengths[rows] > k + 1
        data[pos] = (z & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
    return pa.Array.from_buffers(pa.binary(), len(zz), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _fixed_width(values: np.ndarray) -> pa.Array:
    """Each element's little-endian bytes as a binary array (floats, doubles, booleans)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    width = values.dtype.itemsize
    offsets = np.arange(len(values) + 1, dtype=np.int32) * width
    data = np.ascontiguousarray(values).view(np.uint8)
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _numbers(column: pa.Array, codec: FieldCodec) -> np.ndarray:
    """An int/long field's values as int64 (times in the unit of the logical type, nulls 0)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    kind = column.type
    if pa.types.is_timestamp(kind):
        unit = "ms" if (codec.logical or "").endswith("millis") else "us"
        column = column.cast(pa.timestamp(unit, kind.tz), safe=False)
    elif pa.types.is_date(kind):
        column = column.cast(pa.date32()).cast(pa.int32())
    elif pa.types.is_time(kind):
        millis = codec.logical == "time-millis"
        column = column.cast(pa.time32("ms") if millis else pa.time64("us"), safe=False)
        column = column.cast(pa.int32() if millis else pa.int64())
    column = column.cast(pa.int64()) if not pa.types.is_int64(column.type) else column
    return column.fill_null(0).to_numpy(zero_copy_only=False)


def _value_pieces(column: pa.Array, codec: FieldCodec) -> list[pa.Array]:
    """The binary pieces of a field's value branch (nulls encoded as placeholders)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = codec.kind
    if kind in ("int", "long"):
        return [varints(_numbers(column, codec))]
    if kind in ("float", "double"):
        dtype = "<f4" if kind == "float" else "<f8"
        as_float = column.cast(pa.float32() if kind == "float" else pa.float64())
        return [_fixed_width(as_float.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype))]
    if kind == "boolean":
        return [_fixed_width(column.cast(pa.uint8()).fill_null(0).to_numpy(zero_copy_only=False))]
    if kind == "enum":
        index = pc.index_in(column, value_set=pa.array(codec.symbols, column.type))
        return [varints(index.fill_null(0).to_numpy(zero_copy_only=False))]
    raw = column.cast(pa.binary()) if not pa.types.is_binary(column.type) else column
    if raw.null_count:
        raw = raw.fill_null(b"")
    if kind == "fixed":
        return [raw]
    lengths = pc.binary_length(raw).to_numpy(zero_copy_only=False)
    return [varints(lengths.astype(np.int64)), raw]


class AvroValues:
    """Encodes output batches as Confluent-framed Avro values of one writer schema.

    Built on the driver at plan time (the gate: :func:`plan_fields` raises when the output
    does not fit) and again by the commit from the schema pinned in the staging; plain data
    and picklable until first used.
    """

    def __init__(self, writer: WriterSchema, schema: pa.Schema, columns: list[str]) -> None:
        self.writer = writer
        self.codecs = plan_fields(schema, columns, writer)
        self.header = b"\x00" + int(writer.schema_id).to_bytes(4, "big")
        self._parsed: dict[str, Any] = {}

    @property
    def columns(self) -> list[str]:
        """The output columns the values are made of."""
        return [c.column for c in self.codecs if c.column is not None]

    def checked_columns(self) -> tuple[list[str], list[str]]:
        """(columns whose nulls are refused, columns whose values are checked one by one)."""
        nulls = [c.column for c in self.codecs if c.column is not None and not c.nullable]
        values = [
            c.column for c in self.codecs if c.column is not None and c.kind in ("enum", "fixed", "generic")
        ]
        return nulls, values

    # -- checking ---------------------------------------------------------------------------

    def check(self, batch: pa.RecordBatch) -> None:
        """Raise :class:`AvroSchemaMismatch` for the first value the schema cannot hold."""
        # lazy: avoids numpy, pyarrow at import
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        names = set(batch.schema.names)
        for codec in self.codecs:
            if codec.column is None or codec.column not in names:
                continue
            column = _flat(batch.column(codec.column))
            if column.null_count and not codec.nullable:
                row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                raise AvroSchemaMismatch(
                    f"sink.kafka: output column {codec.column} is null in the row of {_source(batch, row)}, "
                    "and "
                    f"Avro field {codec.name} ({type_text(codec.avro)}) of the writer schema "
                    f"({self.writer.where}) has no null; make the field nullable "
                    f'(["null", ...] with default null) or fill the column in the translate'
                )
            if codec.kind == "enum":
                index = pc.index_in(column, value_set=pa.array(codec.symbols, column.type))
                bad = pc.and_(pc.is_valid(column), pc.is_null(index))
                if pc.any(bad).as_py():
                    row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
                    raise AvroSchemaMismatch(
                        f"sink.kafka: value {column[row].as_py()!r} of output column {codec.column} (row of "
                        f"{_source(batch, row)}) is not a symbol of Avro enum {codec.name} "
                        f"({', '.join(codec.symbols)}); map it in the translate or add the symbol"
                    )
            elif codec.kind == "fixed" and not pa.types.is_fixed_size_binary(column.type):
                lengths = pc.binary_length(column)
                bad = pc.fill_null(pc.not_equal(lengths, codec.size), False)
                if pc.any(bad).as_py():
                    row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
                    raise AvroSchemaMismatch(
                        f"sink.kafka: output column {codec.column} holds {lengths[row].as_py()} bytes "
                        "in the row "
                        f"of {_source(batch, row)}, and Avro field {codec.name} is a fixed of {codec.size}"
                    )
            elif codec.kind == "generic":
                self._generic(codec, column, batch)

    # -- encoding ---------------------------------------------------------------------------

    def encode_array(self, batch: pa.RecordBatch) -> pa.Array:
        """The batch's values as one binary array (header included)."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc

        n = batch.num_rows
        pieces: list[Any] = [pa.scalar(self.header, pa.binary())]
        arrays = 0
        for codec in self.codecs:
            if codec.column is None:
                pieces.append(pa.scalar(codec.default, pa.binary()))
                continue
            column = _flat(batch.column(codec.column))
            if codec.kind == "generic":
                pieces.append(self._generic(codec, column, batch))
                arrays += 1
                continue
            if codec.kind == "null":
                if codec.null_branch is not None and isinstance(codec.avro, list):
                    pieces.append(pa.scalar(zigzag(codec.null_branch), pa.binary()))
                continue
            if pa.types.is_dictionary(column.type):
                column = column.cast(column.type.value_type)
            values = _value_pieces(column, codec)
            nulls = column.null_count
            if nulls and not codec.nullable:
                self.check(batch)  # raises, naming the row
            if codec.branch is not None:
                branch = pa.scalar(zigzag(codec.branch), pa.binary())
                if nulls:
                    missing = column.is_null()
                    none = pa.scalar(zigzag(codec.null_branch or 0), pa.binary())
                    pieces.append(pc.if_else(missing, none, branch))
                    empty = pa.scalar(b"", pa.binary())
                    values = [pc.if_else(missing, empty, v) for v in values]
                else:
                    pieces.append(branch)
            pieces.extend(values)
            arrays += len(values)
        if arrays == 0:  # every field is a default or a constant: one value for all rows
            constant = b"".join(p.as_py() for p in pieces)
            return pa.array([constant] * n, pa.binary())
        joined = pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.binary()))
        if joined.null_count:  # pragma: no cover - every null is handled or refused above
            self.check(batch)
            raise AvroSchemaMismatch("sink.kafka: a value could not be encoded")
        return joined

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        """The batch's values as bytes, ready for ``produce``."""
        return list(self.encode_array(batch).to_numpy(zero_copy_only=False).tolist())

    def _generic(self, codec: FieldCodec, column: pa.Array, batch: pa.RecordBatch) -> pa.Array:
        """A nested or decimal field written by fastavro, value by value."""
        # lazy: avoids fastavro, pyarrow at import
        import fastavro
        import pyarrow as pa

        parsed = self._parsed.get(codec.name)
        if parsed is None:
            record = {
                "type": "record",
                "name": "rewind_field",
                "fields": [{"name": "v", "type": standalone(codec.avro)}],
            }
            parsed = self._parsed[codec.name] = fastavro.parse_schema(record, _force=True)
        write = fastavro.schemaless_writer
        out: list[bytes] = []
        for i, value in enumerate(column.to_pylist()):
            buffer = io.BytesIO()
            try:
                write(buffer, parsed, {"v": _python(value, codec.avro)})
            except Exception as e:
                raise AvroSchemaMismatch(
                    f"sink.kafka: output column {codec.column} in the row of {_source(batch, i)} does not "
                    f"fit Avro field {codec.name} ({type_text(codec.avro)}) of the writer schema "
                    f"({self.writer.where}): "
                    f"{type(e).__name__}: {e}"
                ) from e
            out.append(buffer.getvalue())
        return pa.array(out, pa.binary())

    # -- reading back -----------------------------------------------------------------------

    def decode(self, values: Iterable[bytes | None]) -> list[dict[str, Any]]:
        """Values written by :meth:`encode` → records (for reading a run's topic back)."""
        # lazy: avoids fastavro at import
        import fastavro

        parsed = self._parsed.get("")
        if parsed is None:
            parsed = self._parsed[""] = fastavro.parse_schema(self.writer.schema, _force=True)
        records: list[dict[str, Any]] = []
        for value in values:
            if value is None or value[:5] != self.header:
                got = "null" if value is None else f"header {bytes(value[:5]).hex()}"
                raise ValueError(
                    f"a value of the topic is not Avro of schema id {self.writer.schema_id} ({got})"
                )
            buffer = io.BytesIO(value)
            buffer.seek(5)
            record = fastavro.schemaless_reader(buffer, parsed, None)
            assert isinstance(record, dict), "the writer schema is a record"
            records.append(record)
        return records


def _flat(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _source(batch: pa.RecordBatch, row: int) -> str:
    """``<topic>/<partition>/<offset>`` of a row's source record, or its row number."""
    names = batch.schema.names
    if all(c in names for c in SOURCE_COLUMNS):
        return "/".join(str(batch.column(c)[row].as_py()) for c in SOURCE_COLUMNS)
    return f"row {row}"


def _python(value: Any, avro: Any) -> Any:
    """A value from Arrow's ``to_pylist`` as fastavro takes it: maps are lists of pairs there."""
    if value is None:
        return None
    branches = [b for b in (avro if isinstance(avro, list) else [avro]) if b != "null"]
    if len(branches) != 1 or not isinstance(branches[0], dict):
        return value
    kind = branches[0]
    base = kind.get("type")
    if base == "map" and isinstance(value, list):
        return {k: _python(v, kind.get("values")) for k, v in value}
    if base == "array" and isinstance(value, list):
        return [_python(v, kind.get("items")) for v in value]
    if base in ("record", "error") and isinstance(value, dict):
        types = {f["name"]: f["type"] for f in kind.get("fields", [])}
        return {k: _python(v, types.get(k)) for k, v in value.items()}
    return value
