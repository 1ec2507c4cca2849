"""The JSON values of a batch of output rows, built a column at a time.

Byte for byte what ``orjson.dumps({column: value, ...})`` of each row gives with the value types
of :func:`rewind.sinks.kafka.records.json_ready` (the format in that module's docstring), but
made by Arrow kernels over whole columns and joined once per batch, instead of a dict and a
``dumps`` call per row (~0.4 µs a row in a re-produce's produce loop):

* integers: Arrow's decimal text; booleans ``true``/``false``;
* floats: ONE ``orjson.dumps`` of the column's list, split at the commas (a float's JSON has
  none): orjson's shortest form (``1.0``, ``1e-7``), non-finite values ``null``;
* text: quoted, ``\\`` and ``"`` escaped by Arrow; a batch whose column holds a control
  character (which JSON escapes as ``\\n``, ``\\u0001``...) takes orjson value by value;
* timestamps, dates, times, decimals: their text (as ``json_ready`` makes it), quoted;
* anything else (binary, lists, structs, maps): orjson value by value;
* null: ``null``.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import orjson

from rewind.core.json_fallback import json_default

if TYPE_CHECKING:
    import pyarrow as pa


def json_values(batch: pa.RecordBatch, names: list[str]) -> list[bytes]:
    """One compact JSON object of the columns ``names`` per row of ``batch``."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    if not names or n == 0:
        return [b"{}"] * n
    pieces: list[Any] = []
    text = b"{"
    for i, name in enumerate(names):
        text += (b"," if i else b"") + orjson.dumps(name) + b":"
        column, quote = _texts(batch.column(name))
        if quote:  # no null: the quotes go into the text around the column
            text += b'"'
        pieces += [pa.scalar(text, pa.binary()), column]
        text = b'"' if quote else b""
    pieces.append(pa.scalar(text + b"}", pa.binary()))
    joined = pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.binary()))
    return _plain(joined)


def json_texts(column: pa.Array) -> pa.Array:
    """Each value of ``column`` as its JSON text (binary, no nulls: ``null`` instead)."""
    text, quote = _texts(column)
    return _quoted(text) if quote else text


def _texts(column: pa.Array) -> tuple[pa.Array, bool]:
    """:func:`json_texts`, or (``True``) the text of a column without nulls still to be quoted."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if len(column) == 0:
        return pa.array([], pa.binary()), False
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_null(kind):
        return pa.repeat(pa.scalar(b"null", pa.binary()), len(column)), False
    if pa.types.is_integer(kind):
        return _or_null(column.cast(pa.string())), False
    if pa.types.is_boolean(kind):
        return _or_null(pc.if_else(column, "true", "false")), False
    if pa.types.is_floating(kind):
        return _floats(column), False
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        control, special = _scan(column)
        if control:
            return _each(column.to_pylist()), False
        if special:
            column = pc.replace_substring(pc.replace_substring(column, "\\", "\\\\"), '"', '\\"')
        return _quote(column)
    if pa.types.is_timestamp(kind):
        return _quote(pa.array(_iso(column), pa.string()))
    if pa.types.is_date(kind) or pa.types.is_time(kind) or pa.types.is_decimal(kind):
        return _quote(column.cast(pa.string()))
    return _each(json_ready(column)), False


def _scan(column: pa.Array) -> tuple[bool, bool]:
    """Does the text of ``column`` hold a control character; a quote or a backslash? (numpy over
    its UTF-8 bytes: no byte of a multi-byte character is below 0x80)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    _validity, offsets, data = column.buffers()
    if data is None:
        return False, False
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    ends = np.frombuffer(offsets, dtype=width)[column.offset : column.offset + len(column) + 1]
    text = np.frombuffer(data, dtype=np.uint8)[int(ends[0]) : int(ends[-1])]
    return bool((text < 0x20).any()), bool(((text == 0x22) | (text == 0x5C)).any())


def _or_null(text: pa.Array) -> pa.Array:
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.fill_null(text.cast(pa.binary()), pa.scalar(b"null", pa.binary()))


def _quote(text: pa.Array) -> tuple[pa.Array, bool]:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return (text.cast(pa.binary()), True) if text.null_count == 0 else (_quoted(text), False)


def _quoted(text: pa.Array) -> pa.Array:
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    quote = pa.scalar(b'"', pa.binary())
    return _or_null(
        pc.binary_join_element_wise(quote, text.cast(pa.binary()), quote, pa.scalar(b"", pa.binary()))
    )


def _floats(column: pa.Array) -> pa.Array:
    """ONE ``orjson.dumps`` of the column's list; the values are cut out of its text at the commas
    (a float's JSON has none) by numpy, straight into an Arrow buffer: a ``split`` and an array of
    one bytes object per value cost ~3x the ``dumps``."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    values = column.to_numpy(zero_copy_only=False).tolist()  # nulls become NaN, which orjson writes null
    body = np.frombuffer(orjson.dumps(values), dtype=np.uint8)[1:-1]
    commas = body == ord(",")
    starts = np.flatnonzero(commas) + 1 - np.arange(1, len(values), dtype=np.int64)  # commas taken out
    offsets = np.concatenate([[0], starts, [len(body) - len(values) + 1]]).astype(np.int32)
    data = body[~commas]
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _each(values: list[Any]) -> pa.Array:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    dumps = orjson.dumps
    return pa.array([dumps(v, default=json_default) for v in values], pa.binary())


# -- columns as Python values (the produce call's lists, and orjson's input) ---------------


def _plain(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column as Python values; the numpy path (5-20x faster) when it has no nulls."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    kind = column.type
    fast = (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or (
            (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind))
            and column.null_count == 0
        )
    )
    if fast:
        return list(column.to_numpy(zero_copy_only=False).tolist())
    return list(column.to_pylist())


def _iso(column: pa.Array) -> list[Any]:
    """ISO-8601 text of a timestamp column (``T`` separator, ``Z`` when zoned), nulls kept."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    text = column.cast(pa.timestamp("us", column.type.tz), safe=False).cast(pa.string())
    return _plain(pc.replace_substring(text, " ", "T"))


def json_ready(column: pa.Array) -> list[Any]:
    """A column as values orjson writes the documented way (see the module docstring)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_timestamp(kind):
        return _iso(column)
    if pa.types.is_date(kind) or pa.types.is_time(kind) or pa.types.is_decimal(kind):
        return _plain(column.cast(pa.string()))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        b64 = base64.b64encode
        return [None if v is None else b64(v).decode() for v in column.to_pylist()]
    if pa.types.is_floating(kind):
        return _plain(pc.if_else(pc.is_finite(column), column, pa.scalar(None, kind)))
    return _plain(column)
