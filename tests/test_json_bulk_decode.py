"""Bulk JSON decode (Arrow's reader over a whole batch) gives exactly the per-record decode.

Pure Python: Kafka-shaped Arrow batches are built here. Hypothesis mixes clean values with every
kind of bad or awkward one (invalid JSON and UTF-8, non-objects, NaN, duplicate keys, big
integers, line breaks, surrogates, nested values, tombstones, values that cannot be cast) and
checks rows, dtypes and quarantine reasons against :meth:`JsonDecoder.decode_each`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.core.arrow import kafka_record_schema
from rewind.translate.json_bulk import bulk_decode
from rewind.translate.json_decoder import JsonDecoder, cast_columns

FIELDS = ["id", "status", "amount", "ok", "at", "extra"]


def batch_of(values: list[bytes | None]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict(
        {
            "key": [b"k%d" % i for i in range(n)],
            "value": pa.array(values, type=pa.binary()),
            "topic": ["t"] * n,
            "partition": [0] * n,
            "offset": list(range(100, 100 + n)),
            "timestamp": [datetime(2024, 1, 1, tzinfo=UTC)] * n,
            "timestampType": [0] * n,
        },
        schema=kafka_record_schema(False),
    )


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31) - 5, 2**31 + 5),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["12", " 7 ", "true", "False", "2024-01-02T03:04:05", "2024-01-02", "1.5", "x"]),
)
values_ = st.one_of(
    scalars, st.lists(st.integers(0, 3), max_size=2), st.fixed_dictionaries({"n": st.integers(0, 3)})
)


@st.composite
def good_value(draw: Any, stable: bool) -> bytes:
    """A flat object; ``stable`` keeps each field to one JSON type so most batches go bulk."""
    names = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=5))
    if stable:
        typed = {"id": st.integers(0, 2**40), "status": st.text(max_size=4), "amount": st.floats(-1e6, 1e6),
                 "ok": st.booleans(), "at": st.sampled_from(["2024-01-02T03:04:05", "2024-05-06"]),
                 "extra": st.none()}
        obj = {n: draw(st.one_of(st.none(), typed[n])) for n in names}
    else:
        obj = {n: draw(values_) for n in names}
    return json.dumps(obj, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))).encode()


bad_values = st.sampled_from(
    [
        None,
        b"",
        b"   ",
        b"{",
        b"[1, 2]",
        b"5",
        b'"s"',
        b"null",
        b'{"id": NaN}',
        b'{"id": 1, "id": 2}',
        b'{"id": 1}{"id": 2}',
        b'{"id": 1} {"id": 2}',
        b'{\n"id": 3\n}',
        b'{"status": "\\ud800"}',
        b'{"status": "\xff"}',
        b'\xef\xbb\xbf{"id": 1}',
        b'{"_rewind_x": 1}',
        b'{"id": 99999999999999999999999}',
        b'{"id": 1.5}',
        b'{"id": "nope"}',
        b'{"amount": "1e3"}',
        b'{"status": {"a": 1}}',
        b'{"status": "a\tb"}',
        b'{"id": 3.0}',
    ]
)


@st.composite
def batches(draw: Any) -> list[bytes | None]:
    stable = draw(st.booleans())
    good = good_value(stable)
    mix = st.one_of(good, bad_values) if draw(st.booleans()) else good
    return draw(st.lists(mix, min_size=1, max_size=12))


SCHEMAS: list[dict[str, str] | None] = [
    None,
    {"id": "long", "status": "string", "amount": "double", "ok": "boolean"},
    {"id": "int", "amount": "float", "status": "string"},
    {"id": "long", "at": "timestamp", "status": "json", "extra": "date"},
    {"id": "string", "ok": "json", "amount": "long"},
]


def assert_same(decoder: JsonDecoder, values: list[bytes | None]) -> None:
    batch = batch_of(values)
    bulk, each = decoder.decode(batch), decoder.decode_each(batch)
    pd.testing.assert_frame_equal(bulk.events, each.events)
    assert [(f.row, f.stage, f.reason, f.label) for f in bulk.failures] == [
        (f.row, f.stage, f.reason, f.label) for f in each.failures
    ]
    assert bulk.skipped == each.skipped


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=batches(), schema=st.sampled_from(SCHEMAS), nulls=st.sampled_from(["quarantine", "skip"]))
def test_bulk_and_per_record_decode_agree(values: list[bytes | None], schema: Any, nulls: Any) -> None:
    assert_same(JsonDecoder(schema, null_value=nulls), values)


def test_clean_batches_take_the_bulk_path() -> None:
    objs = [{"id": i, "status": f"s{i}", "amount": i / 7, "ok": i % 2 == 0} for i in range(50)]
    values: list[bytes | None] = [json.dumps(o).encode() for o in objs]
    values[3] = None  # a tombstone does not force the per-record path
    batch = batch_of(values)
    for schema in SCHEMAS[:3]:
        out = bulk_decode(batch, schema, True, cast_columns)
        assert out is not None
        assert [f.row for f in out.failures] == [3]
        assert_same(JsonDecoder(schema), values)


def test_a_malformed_value_sends_its_batch_record_by_record() -> None:
    values = [b'{"id": 1}', b'{"id": 2', b'{"id": 3}']
    batch = batch_of(values)
    assert bulk_decode(batch, None, True, cast_columns) is None
    out = JsonDecoder().decode(batch)
    assert out.events["id"].tolist() == [1, 3]
    assert [(f.row, f.label) for f in out.failures] == [(1, "decode: invalid JSON")]


def test_a_cast_failure_in_bulk_names_the_field() -> None:
    values = [b'{"id": 1, "at": "2024-01-02"}', b'{"id": 2, "at": "soon"}']
    out = bulk_decode(batch_of(values), {"id": "long", "at": "timestamp"}, True, cast_columns)
    assert out is not None
    assert [(f.row, f.reason) for f in out.failures] == [(1, "field 'at': cannot cast 'soon' to timestamp")]
    assert out.events["id"].tolist() == [1]


def test_a_float_beyond_float32_is_a_cast_failure_not_infinity() -> None:
    """A ``float`` field stores float32: a finite value it cannot hold is quarantined by name,
    on both paths, where it used to become infinity (a value lost without a trace)."""
    import numpy as np

    from rewind.translate.json_bulk import FLOAT32_OVERFLOW

    largest = float(np.finfo(np.float32).max)
    values = [
        json.dumps({"id": 1, "amount": largest}).encode(),
        json.dumps({"id": 2, "amount": -1e39}).encode(),
        json.dumps({"id": 3, "amount": 2.5}).encode(),
        json.dumps({"id": 4, "amount": FLOAT32_OVERFLOW}).encode(),
        json.dumps({"id": 5, "amount": np.nextafter(FLOAT32_OVERFLOW, 0.0)}).encode(),  # rounds down
    ]
    schema = {"id": "long", "amount": "float"}
    assert bulk_decode(batch_of(values), schema, True, cast_columns) is None  # record by record
    decoder = JsonDecoder(schema)
    for out in (decoder.decode(batch_of(values)), decoder.decode_each(batch_of(values))):
        assert out.events["id"].tolist() == [1, 3, 5]
        amounts = out.events["amount"].to_numpy()
        assert amounts.dtype == np.float32 and np.isfinite(amounts).all()
        assert amounts.tolist() == [largest, 2.5, largest]
        assert [(f.row, f.reason) for f in out.failures] == [
            (1, "field 'amount': cannot cast -1e+39 to float"),
            (3, f"field 'amount': cannot cast {FLOAT32_OVERFLOW!r} to float"),
        ]
    # in range, the batch stays on the bulk path
    assert bulk_decode(batch_of([values[0], values[2], values[4]]), schema, True, cast_columns) is not None


def test_a_sliced_batch_reads_only_its_own_values() -> None:
    values: list[bytes | None] = [json.dumps({"id": i, "status": f"s{i}"}).encode() for i in range(20)]
    values[7] = None
    batch = batch_of(values).slice(5, 10)  # the value buffers start at an offset
    assert bulk_decode(batch, None, True, cast_columns) is not None
    bulk, each = JsonDecoder().decode(batch), JsonDecoder().decode_each(batch)
    pd.testing.assert_frame_equal(bulk.events, each.events)
    assert bulk.events["id"].tolist() == [5, 6, 8, 9, 10, 11, 12, 13, 14]
    assert [f.row for f in bulk.failures] == [2]
