"""The read loop of every Kafka range (:mod:`rewind.spark.kafka_fetch`), outside Spark.

A range smaller than a batch used to wait out ``consume``'s one-second timeout at its end,
since ``consume`` returns when it holds the number of messages asked for: every task of a
run paid a second per range, however small. The loop now asks for no more than can still
come. Runs on every test broker (tests/brokers.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.core.ranges import OffsetRange
from rewind.spark.kafka_fetch import _wanted, fetch_ranges
from tests.kafka_util import create_topic, produce

RECORDS = 300


@pytest.fixture(scope="module")
def topic(broker_conf: dict[str, Any]) -> str:
    name = f"fetch-{uuid.uuid4().hex[:8]}"
    create_topic(broker_conf, name, 2)
    produce(broker_conf, name, [(p, None, f"{p}:{o}".encode(), None) for p in (0, 1) for o in range(RECORDS)])
    return name


def offsets(conf: dict[str, Any], ranges: list[OffsetRange]) -> list[tuple[int, int]]:
    return [
        (p, o)
        for batch in fetch_ranges(conf, ranges)
        for p, o in zip(batch.column(3).to_pylist(), batch.column(4).to_pylist(), strict=True)
    ]


def test_small_ranges_end_without_waiting_out_the_consume_timeout(
    broker_conf: dict[str, Any], topic: str
) -> None:
    """Five reads, inside the log and at its end: each returns exactly its offsets, and the
    five take less than the five seconds the old loop could not take less than."""
    cases = [
        [OffsetRange(topic, 0, 0, 10)],
        [OffsetRange(topic, 0, 100, 200)],
        [OffsetRange(topic, 1, RECORDS - 50, RECORDS)],  # ends at the log's end: an EOF event
        [OffsetRange(topic, 0, 250, RECORDS), OffsetRange(topic, 1, 0, 1)],
        [OffsetRange(topic, 1, 7, 8)],
    ]
    began = time.monotonic()
    for ranges in cases:
        got = offsets(broker_conf, ranges)
        assert got == [(r.partition, o) for r in ranges for o in range(r.start, r.end)]
    assert time.monotonic() - began < 4.5


@given(
    parts=st.dictionaries(
        st.integers(0, 7),
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)),
        min_size=1,
        max_size=8,
    ),
    batch=st.integers(1, 50_000),
)
def test_never_asks_for_more_than_can_come_nor_more_than_a_batch(
    parts: dict[int, tuple[int, int]], batch: int
) -> None:
    """What can still come of a gapless range is its offsets left plus one end-of-partition
    event: asking for no more than that, ``consume`` returns as soon as they are there."""
    positions = {("t", p): start for p, (start, _left) in parts.items()}
    ends = {("t", p): start + left + 1 for p, (start, left) in parts.items()}
    open_parts = set(ends)
    wanted = _wanted(open_parts, positions, ends, batch)
    can_come = sum(ends[tp] - positions[tp] + 1 for tp in open_parts)
    assert 1 <= wanted <= batch
    assert wanted <= can_come
    assert wanted == min(batch, can_come)
