"""Event ids made for a whole batch: the documented SHA-256 ids unchanged, a table source's ids
distinct and deterministic."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.translate.lineage import event_id, event_ids, partition_event_ids, table_event_ids

offsets = st.lists(st.integers(0, 2**62), min_size=0, max_size=40)


@given(
    topic=st.text(min_size=1, max_size=12).filter(lambda t: "/" not in t),
    partition=st.integers(0, 1000),
    offsets=offsets,
    version=st.text(max_size=5),
)
@settings(max_examples=60, deadline=None)
def test_batch_sha256_ids_are_the_documented_hash(
    topic: str, partition: int, offsets: list[int], version: str
) -> None:
    ordinals = [o % 3 for o in offsets]
    expected = [
        hashlib.sha256(f"{topic}/{partition}/{o}/t/{version}/{k}".encode()).hexdigest()[:32]
        for o, k in zip(offsets, ordinals, strict=True)
    ]
    assert partition_event_ids(topic, partition, offsets, ordinals, "t", version).to_pylist() == expected
    assert (
        event_ids([topic] * len(offsets), [partition] * len(offsets), offsets, ordinals, "t", version)
        == expected
    )
    assert [
        event_id(topic, partition, o, "t", version, k) for o, k in zip(offsets, ordinals, strict=True)
    ] == expected


@given(rows=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 5)), unique=True, max_size=200))
@settings(max_examples=60, deadline=None)
def test_table_ids_are_distinct_hex_and_deterministic(rows: list[tuple[int, int]]) -> None:
    o = np.array([r[0] for r in rows], dtype=np.int64)
    k = np.array([r[1] for r in rows], dtype=np.int64)
    ids = table_event_ids("sqlite:accounts", 2, o, k, "state", "1").to_pylist()
    assert len(set(ids)) == len(rows)
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)
    assert table_event_ids("sqlite:accounts", 2, o, k, "state", "1").to_pylist() == ids


def test_table_ids_of_a_whole_range_are_distinct_and_change_with_the_version_and_range() -> None:
    o = np.arange(200_000, dtype=np.int64)
    zero = np.zeros(len(o), dtype=np.int64)
    ids = table_event_ids("postgres:public.accounts", 0, o, zero, "state", "1").to_numpy(zero_copy_only=False)
    assert len(set(ids.tolist())) == len(o)
    newer = table_event_ids("postgres:public.accounts", 0, o[:1000], zero[:1000], "state", "2").to_pylist()
    other = table_event_ids("postgres:public.accounts", 1, o[:1000], zero[:1000], "state", "1").to_pylist()
    assert not set(newer) & set(ids.tolist()) and not set(other) & set(ids.tolist())
