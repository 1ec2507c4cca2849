"""JSON values made a column at a time are byte for byte orjson's object of each row."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.core.json_fallback import json_default
from rewind.sinks.kafka.json_values import json_values
from rewind.sinks.kafka.records import json_ready

TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any]]] = {
    "i": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "i8": (pa.int8(), st.integers(-128, 127)),
    "f": (pa.float64(), st.floats(width=64)),
    "f32": (pa.float32(), st.floats(width=32)),
    "b": (pa.bool_(), st.booleans()),
    "s": (pa.string(), st.text(max_size=8)),
    "ls": (pa.large_string(), st.text(alphabet='ab"\\/\u2028é\x7f', max_size=6)),
    "ts": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2100, 1, 1), timezones=st.just(dt.UTC)),
    ),
    "tsn": (pa.timestamp("ms"), st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2100, 1, 1))),
    "d": (pa.date32(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
    "dec": (pa.decimal128(9, 2), st.decimals(-(10**6), 10**6, places=2, allow_nan=False)),
    "bin": (pa.binary(), st.binary(max_size=5)),
    "list": (pa.list_(pa.int32()), st.lists(st.integers(-5, 5), max_size=3)),
    "struct": (pa.struct([("x", pa.string())]), st.fixed_dictionaries({"x": st.text(max_size=3)})),
}


def per_row(batch: pa.RecordBatch, names: list[str]) -> list[bytes]:
    """What the produce loop made before: a dict of json_ready values per row, orjson.dumps."""
    columns = [json_ready(batch.column(n)) for n in names]
    return [
        orjson.dumps(dict(zip(names, row, strict=True)), default=json_default)
        for row in zip(*columns, strict=True)
    ]


@st.composite
def batches(draw: st.DrawFn) -> pa.RecordBatch:
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(0, 6))
    arrays = []
    for name in names:
        kind, values = TYPES[name]
        column = draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n))
        arrays.append(pa.array(column, kind))
    return pa.RecordBatch.from_arrays(arrays, names=[f'{n} "q"' if n == "b" else n for n in names])


@given(batch=batches())
@settings(max_examples=100, deadline=None)
def test_column_at_a_time_is_the_per_row_bytes(batch: pa.RecordBatch) -> None:
    names = batch.schema.names
    assert json_values(batch, names) == per_row(batch, names)
    part = batch.slice(1, 3)  # buffers at an offset, as a batch cut from a table
    assert json_values(part, names) == per_row(part, names)


def test_control_characters_nulls_and_non_finite_floats() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "s": pa.array(["a\nb", None, "\x01", 'q"\\'], pa.string()),
            "f": pa.array([float("nan"), None, float("inf"), 1.0], pa.float64()),
            "n": pa.nulls(4),
            "dict": pa.array(["x", "y", None, "x"]).dictionary_encode(),
            "dec": pa.array(
                [decimal.Decimal("1.50"), None, decimal.Decimal("-2.00"), None], pa.decimal128(5, 2)
            ),
        }
    )
    out = json_values(batch, batch.schema.names)
    assert out == per_row(batch, batch.schema.names)
    assert out[0] == b'{"s":"a\\nb","f":null,"n":null,"dict":"x","dec":"1.50"}'
    assert json_values(batch, []) == [b"{}"] * 4
