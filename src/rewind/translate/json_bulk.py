"""Bulk JSON decode: a whole batch of values parsed by Arrow's JSON reader in one call.

Parsing value by value in Python (orjson or the stdlib) and building columns from the Python
objects is what bounded a JSON job's rate. Here the values are joined by newlines and read by
:func:`pyarrow.json.read_json` as one newline-delimited document, so the columns come out typed
without a Python object per field.

It only ever accelerates, never changes a result: the bulk path answers ``None`` (and the
caller decodes the batch record by record, as before) whenever Arrow could read the batch
differently from the per-record decoder — a value that does not look like one flat object
(``{`` first, ``}`` last, no line break), a possible integer beyond 64 bits, an escaped
surrogate, invalid UTF-8, anything Arrow refuses (bad JSON, NaN, duplicate keys, a field that
changes type), nested objects or lists, a reserved field name, or a value Arrow's types cannot
carry exactly for the schema's caster. So a batch holding a malformed value is quarantined one
record at a time with the same reasons; the clean batches, the common case, take one C call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from rewind.core.columns import is_reserved
from rewind.translate.decoder import TOMBSTONE_REASON, Decoded, events_frame
from rewind.translate.failures import Failure

FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
"""Finite doubles of at least this magnitude become infinity as float32 (the largest float32
is 2**128 - 2**104, and half its last place rounds up): a ``float`` field refuses them."""

_OPEN, _CLOSE, _NL = ord("{"), ord("}"), ord("\n")
# Arrow types whose ``to_pylist`` gives exactly the Python objects the stdlib parser would
# (a double does not: 1 and 1.0 are both 1.0 there, and nested values lose missing keys)
_EXACT = (pa.int64(), pa.string(), pa.bool_(), pa.null())


def _flat_objects(values: pa.Array) -> pa.Buffer | None:
    """The values joined by newlines, or None if one may not be a one-line object."""
    buffers = values.buffers()
    if buffers[2] is None:
        return None
    offsets = np.frombuffer(buffers[1], dtype=np.int32)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8)
    if (np.diff(offsets) < 2).any():
        return None
    if not ((data[offsets[:-1]] == _OPEN).all() and (data[offsets[1:] - 1] == _CLOSE).all()):
        return None
    blob = data[offsets[0] : offsets[-1]].tobytes()
    if b"\n" in blob or b"\r" in blob or b"\\ud" in blob or b"\\uD" in blob:
        return None
    joined = pc.binary_join_element_wise(values, pa.scalar(b""), pa.scalar(b"\n"))
    ends = np.frombuffer(joined.buffers()[1], dtype=np.int32)
    start, end = ends[joined.offset], ends[joined.offset + len(joined)]
    return joined.buffers()[2][int(start) : int(end)]


# the schema types Arrow's reader can be told directly (a wrong JSON type is then an error)
_ARROW_TYPES = {
    "string": pa.string(),
    "int": pa.int64(),
    "long": pa.int64(),
    "float": pa.float64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}


def _explicit(schema: Mapping[str, str] | None) -> pj.ParseOptions | None:
    """Parse options reading only the schema's fields, when every one has a plain Arrow type."""
    if schema is None or any(t not in _ARROW_TYPES for t in schema.values()):
        return None
    arrow = pa.schema([(name, _ARROW_TYPES[t]) for name, t in schema.items()])
    return pj.ParseOptions(explicit_schema=arrow, unexpected_field_behavior="ignore")


def _read(values: pa.Array, schema: Mapping[str, str] | None) -> pa.Table | None:
    if values.type != pa.binary():
        values = values.cast(pa.binary())
    joined = _flat_objects(values)
    if joined is None:
        return None
    parse = _explicit(schema)
    try:
        values.cast(pa.string())  # validates UTF-8
        table = pj.read_json(
            pa.BufferReader(joined),
            read_options=pj.ReadOptions(use_threads=False, block_size=joined.size + 1),
            parse_options=parse,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError, ValueError):
        return None
    if table.num_rows != len(values) or any(is_reserved(n) for n in table.column_names):
        return None
    return table


_PANDAS_TYPES = {pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _nullable(col: pa.ChunkedArray, dtype: str) -> Any:
    """A nullable pandas array (``Int64``, ``Int32``, ``boolean``) without Python objects."""
    return col.to_pandas(types_mapper=_PANDAS_TYPES.get).array.astype(dtype)


def _schemaless(table: pa.Table) -> dict[str, Any] | None:
    fields: dict[str, Any] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        t = col.type
        if t == pa.int64():
            fields[name] = _nullable(col, "Int64")
        elif t == pa.bool_():
            fields[name] = _nullable(col, "boolean")
        elif t == pa.float64():
            fields[name] = col.to_numpy()  # nulls → NaN
        elif t == pa.string():
            fields[name] = col.to_numpy()
        elif t == pa.null():
            fields[name] = np.full(len(col), None, dtype=object)
        else:
            return None
    return fields


def _vectorized(col: pa.ChunkedArray, type_name: str) -> Any:
    """The typed column when Arrow's values cast as the per-record caster would; else None."""
    t = col.type
    if t == pa.null():
        return None
    if type_name in ("long", "int"):
        bits = 64 if type_name == "long" else 32
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)
        dtype = "Int64" if bits == 64 else "Int32"
        if t == pa.int64():
            mn, mx = pc.min_max(col).values()
            if mn.as_py() is None or (lo <= mn.as_py() and mx.as_py() < hi):
                return _nullable(col, dtype)
        return None  # a double may have been an integer literal Arrow rounded: not exact
    if type_name in ("double", "float"):
        if t in (pa.int64(), pa.float64()):
            out = col.cast(pa.float64()).to_numpy()
            if type_name == "double":
                return out
            if np.any(np.isfinite(out) & (np.abs(out) >= FLOAT32_OVERFLOW)):
                return None  # record by record: those records fail their cast, by name
            return out.astype(np.float32)
        return None
    if type_name == "boolean" and t == pa.bool_():
        return _nullable(col, "boolean")
    if type_name == "string" and t == pa.string():
        return col.to_numpy()
    return None


def _schema_fields(
    table: pa.Table,
    schema: Mapping[str, str],
    cast_values: Callable[..., tuple[dict[str, Any], list[int]]],
    rows: list[int],
    failures: list[Failure],
) -> tuple[dict[str, Any], list[int]] | None:
    names = set(table.column_names)
    ready: dict[str, Any] = {}
    for name, type_name in schema.items():
        if name not in names:
            continue
        col = table.column(name)
        typed = _vectorized(col, type_name)
        if typed is not None:
            ready[name] = typed
        elif col.type not in _EXACT:
            return None  # the caster must see the stdlib's objects: decode record by record

    def values_of(name: str) -> list[Any]:
        return table.column(name).to_pylist() if name in names else [None] * table.num_rows

    return cast_values(dict(schema), rows, values_of, failures, ready)


def bulk_decode(
    batch: pa.RecordBatch,
    schema: Mapping[str, str] | None,
    quarantine_nulls: bool,
    cast_values: Callable[..., tuple[dict[str, Any], list[int]]],
) -> Decoded | None:
    """The batch decoded in one Arrow call, or None when it must be decoded record by record.

    ``cast_values`` is the JSON decoder's per-field caster (the one the per-record path uses),
    called with the columns Arrow could not type exactly, so cast failures read the same.
    """
    values = batch.column("value")
    n = len(values)
    if n == 0:
        return None
    failures: list[Failure] = []
    skipped: list[int] = []
    if values.null_count:
        nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        null_rows = np.flatnonzero(nulls).tolist()
        if quarantine_nulls:
            failures = [Failure(i, "decode", TOMBSTONE_REASON, "tombstone") for i in null_rows]
        else:
            skipped = null_rows
        rows = np.flatnonzero(~nulls).tolist()
        values = values.filter(pa.array(~nulls))
        if not len(values):
            return None
    else:
        rows = list(range(n))
    table = _read(values, schema)
    if table is None:
        return None
    if schema is None:
        fields = _schemaless(table)
        if fields is None:
            return None
    else:
        out = _schema_fields(table, schema, cast_values, rows, failures)
        if out is None:
            return None
        fields, rows = out
        failures.sort(key=lambda f: f.row)
    return Decoded(events_frame(fields, batch, rows), failures, skipped)

