"""Zoned timestamp columns reach a translate exactly as ``to_pandas()`` made them (unit, values,
nulls and the time zone object), through the cheaper conversion of the decoders."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.translate.decoder import pandas_timestamps


@given(
    values=st.lists(
        st.one_of(st.none(), st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1))), max_size=8
    ),
    unit=st.sampled_from(["s", "ms", "us", "ns"]),
    zone=st.sampled_from(["UTC", "Europe/Paris", "+02:00", "America/New_York", "Asia/Kolkata"]),
    cut=st.integers(0, 3),
)
@settings(max_examples=30, deadline=None)
def test_the_same_array_as_to_pandas(
    values: list[dt.datetime | None], unit: str, zone: str, cut: int
) -> None:
    stamped = [None if v is None else v.replace(tzinfo=dt.UTC) for v in values]
    column = pa.array(stamped, pa.timestamp(unit, tz=zone)).slice(min(cut, len(values)))
    want = column.to_pandas().array
    got = pandas_timestamps(column)
    assert got.dtype == want.dtype and got.dtype.tz is want.dtype.tz
    assert [str(v) for v in got] == [str(v) for v in want]
