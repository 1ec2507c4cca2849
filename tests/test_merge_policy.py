"""Merge decisions (:mod:`rewind.core.merge`) and the spec's ``merge:`` section, without I/O.

Each policy is checked on one small table with the exact rows it must keep, and by
properties over random rows: every row gets exactly one decision (the counts add up to the
rows given), at most one row per key is applied, the applied row of a key is never older than
another row of the run with that key, and a key whose live row is past the cut line is never
applied. The end-to-end runs on real sinks are in ``tests/test_job_merge.py``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.core.counts import MERGE_DECISIONS, RecordCounts
from rewind.core.merge import MergePolicy, decide
from rewind.errors import SpecError
from rewind.spec import parse_spec

TOPIC = "orders"


def table(rows: list[tuple[int, float, int, int, int]]) -> pa.Table:
    """Rows of (key, value, event time us, partition, offset) with Rewind's lineage columns."""
    return pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.int64()),
            "v": pa.array([r[1] for r in rows], pa.float64()),
            "_rewind_source_timestamp": pa.array([r[2] for r in rows], pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
            "_rewind_source_topic": pa.array([TOPIC] * len(rows), pa.string()),
            "_rewind_source_partition": pa.array([r[3] for r in rows], pa.int32()),
            "_rewind_source_offset": pa.array([r[4] for r in rows], pa.int64()),
        }
    )


RUN = table(
    [
        (1, 1.0, 100, 0, 1),  # key 1: two events, the later one wins
        (1, 2.0, 200, 0, 2),
        (2, 3.0, 300, 0, 3),  # key 2: newer than live's row
        (3, 3.5, 300, 1, 1),  # key 3: older than live's row
        (4, 4.0, 500, 0, 4),  # key 4: two values at the same time
        (4, 4.5, 500, 1, 2),
        (5, 5.0, 600, 1, 3),  # key 5: live wrote it after the cut line
        (6, 6.0, 700, 0, 5),  # key 6: live never wrote it
    ]
)
LIVE = table([(2, 20.0, 250, 0, 100), (3, 30.0, 400, 1, 101), (5, 50.0, 900, 1, 102), (7, 70.0, 50, 0, 103)])


def applied(result: Any) -> dict[int, float]:
    keys, values = result.applied.column("k").to_pylist(), result.applied.column("v").to_pylist()
    return dict(zip(keys, values, strict=True))


@pytest.mark.parametrize(
    ("policy", "kept", "counts"),
    [
        (
            MergePolicy("latest-event-time", "route", cut_time_us=800),
            {1: 2.0, 2: 3.0, 6: 6.0},
            {"applied": 3, "deduplicated": 1, "superseded": 1, "routed": 2, "rejected_stale": 1},
        ),
        (
            MergePolicy("prefer-backfill", cut_offsets={(TOPIC, 1): 102}),
            {1: 2.0, 2: 3.0, 3: 3.5, 4: 4.5, 6: 6.0},
            {"applied": 5, "deduplicated": 2, "superseded": 0, "routed": 0, "rejected_stale": 1},
        ),
        (
            MergePolicy("prefer-live", cut_offsets={(TOPIC, 1): 102}),
            {1: 2.0, 4: 4.5, 6: 6.0},
            {"applied": 3, "deduplicated": 2, "superseded": 2, "routed": 0, "rejected_stale": 1},
        ),
        (
            # live's rows have later offsets on the same partitions: live wins everywhere it wrote
            MergePolicy("latest-offset"),
            {1: 2.0, 4: 4.5, 6: 6.0},
            {"applied": 3, "deduplicated": 2, "superseded": 3, "routed": 0, "rejected_stale": 0},
        ),
    ],
    ids=["latest-event-time+route+time-cut", "prefer-backfill+offset-cut", "prefer-live", "latest-offset"],
)
def test_each_policy_keeps_exactly_the_rows_it_says(
    policy: MergePolicy, kept: dict[int, float], counts: dict[str, int]
) -> None:
    result = decide(RUN, LIVE, ["k"], policy)
    assert applied(result) == kept
    assert result.counts == counts
    replaced = set(result.replaced.column("k").to_pylist())
    assert replaced == set(kept) & set(LIVE.column("k").to_pylist())


def test_ambiguous_rows_are_routed_whole_and_the_key_left_alone() -> None:
    result = decide(RUN, None, ["k"], MergePolicy(ambiguous="route"))
    assert sorted(result.routed.column("v").to_pylist()) == [4.0, 4.5]
    assert 4 not in applied(result)
    same_value = table([(9, 1.0, 10, 0, 1), (9, 1.0, 10, 1, 1)])
    assert decide(same_value, None, ["k"], MergePolicy(ambiguous="route")).counts["routed"] == 0


def test_a_tie_with_live_is_ambiguous_too() -> None:
    run, live = table([(1, 1.0, 10, 0, 5)]), table([(1, 9.0, 10, 1, 7)])
    result = decide(run, live, ["k"], MergePolicy("latest-event-time", "route"))
    assert result.counts["routed"] == 1 and result.applied.num_rows == 0


def test_composite_keys() -> None:
    run = RUN.append_column("k2", pa.array([0, 1, 0, 0, 0, 0, 0, 0], pa.int64()))
    result = decide(run, None, ["k", "k2"], MergePolicy())
    applied_keys = zip(
        result.applied.column("k").to_pylist(), result.applied.column("k2").to_pylist(), strict=True
    )
    # key 1 splits into (1, 0) and (1, 1); the two rows of (4, 0) become one
    assert sorted(applied_keys) == [(1, 0), (1, 1), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0)]
    assert result.counts["deduplicated"] == 1


rows_strategy = st.lists(
    st.tuples(
        st.integers(0, 6),
        st.sampled_from([1.0, 2.0, 3.0]),
        st.integers(0, 20),
        st.integers(0, 2),
        st.integers(0, 50),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    rows=rows_strategy,
    live=rows_strategy,
    on_collision=st.sampled_from(["prefer-live", "prefer-backfill", "latest-event-time", "latest-offset"]),
    ambiguous=st.sampled_from(["route", "latest-offset"]),
    cut=st.none() | st.integers(0, 20),
)
def test_every_row_gets_exactly_one_decision(
    rows: list[Any], live: list[Any], on_collision: Any, ambiguous: Any, cut: int | None
) -> None:
    run, there = table(rows), table(live)
    policy = MergePolicy(on_collision, ambiguous, cut_time_us=cut)
    result = decide(run, there, ["k"], policy)
    assert set(result.counts) == set(MERGE_DECISIONS)
    assert sum(result.counts.values()) == len(rows)
    assert RecordCounts(rows_out=len(rows), merge_decisions=result.counts).balanced
    keys = result.applied.column("k").to_pylist()
    assert len(keys) == len(set(keys)) == result.counts["applied"]
    assert result.routed.num_rows == result.counts["routed"]
    times = result.applied.column(2).cast(pa.int64()).to_pylist()
    for k, ts in zip(keys, times, strict=True):
        assert all(r[2] <= ts for r in rows if r[0] == k), k
        if cut is not None:
            latest_live = max((r[2] for r in live if r[0] == k), default=None)
            assert latest_live is None or latest_live < cut


def test_the_law_counts_merge_decisions() -> None:
    decisions = {"applied": 2, "deduplicated": 1}
    ok = RecordCounts(records_read=3, emitted=3, rows_out=3, merge_decisions=decisions)
    assert ok.balanced and RecordCounts.from_dict(ok.to_dict()) == ok
    assert not RecordCounts(records_read=3, emitted=3, rows_out=3, merge_decisions={"applied": 2}).balanced
    assert ok.merge(ok).merge_decisions == {"applied": 4, "deduplicated": 2}


SPEC: dict[str, Any] = {
    "name": "m",
    "source": {"kafka": {"topics": ["orders"]}},
    "decode": "json",
    "translate": {"function": "tests.job_fixtures:keep_orders", "version": "1"},
    "key": ["order_id"],
    "sink": {"iceberg": {"table": "shop.t"}},
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"sink": {"kafka": {}}},
            "merge: policy on_collision latest-event-time does not fit sink.kafka; a backfill topic is a log",
        ),
        (
            {"sink": {"postgres": {"table": "t", "url": "sqlite:///x.db", "mode": "append"}}},
            "merge: policy on_collision latest-event-time does not fit sink.postgres in mode append",
        ),
        ({"key": []}, "merge: needs a key"),
        (
            {"merge": {"reject_stale_after": {"time": "2026-01-01T00:00:00Z", "group": "svc"}}},
            "more than one cut line given",
        ),
        ({"merge": {"on_collision": "newest"}}, "merge.on_collision"),
        (
            {"merge": {"reject_stale_after": {"offsets": {"orders": {"0": -4}}}}},
            "a negative partition or offset",
        ),
    ],
)
def test_bad_merge_sections_are_one_line(change: dict[str, Any], message: str) -> None:
    spec = {**SPEC, "merge": {}, **change}
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bare_time_is_a_cut_line_and_defaults_are_written_out() -> None:
    spec = parse_spec({**SPEC, "merge": {"reject_stale_after": "2026-10-01T00:00:00Z"}})
    assert spec.canonical()["merge"] == {
        "on_collision": "latest-event-time",
        "reject_stale_after": {"time": "2026-10-01T00:00:00Z"},
        "dedup": "key",
        "ambiguous": "latest-offset",
    }


def _as_rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 30),
            st.sampled_from([1.0, 2.0]),
            st.integers(0, 5),
            st.integers(0, 1),
            st.integers(0, 9),
        ),
        max_size=40,
    ),
    live=rows_strategy,
    on_collision=st.sampled_from(["prefer-live", "prefer-backfill", "latest-event-time", "latest-offset"]),
    ambiguous=st.sampled_from(["route", "latest-offset"]),
    cut=st.none() | st.integers(0, 5),
    cut_offsets=st.none() | st.dictionaries(st.integers(0, 2), st.integers(0, 50), max_size=3),
)
def test_deciding_only_the_contested_rows_decides_like_deciding_all(
    rows: list[Any],
    live: list[Any],
    on_collision: Any,
    ambiguous: Any,
    cut: int | None,
    cut_offsets: dict[int, int] | None,
) -> None:
    """The fast paths (uncontested rows applied as they are, a key each side holds once decided
    from the two rows' lineage in numpy, only the rest through the sort and join) give the
    decisions, rows and replaced keys of the full path, row for row."""
    from rewind.core.merge import _decide_all

    run, there = table(rows), table(live)
    offsets = None if cut_offsets is None else {(TOPIC, p): o for p, o in cut_offsets.items()}
    policy = MergePolicy(on_collision, ambiguous, cut_time_us=cut, cut_offsets=offsets)
    fast, full = decide(run, there, ["k"], policy), _decide_all(run, there, ["k"], policy)
    assert fast.counts == full.counts
    assert _as_rows(fast.applied) == _as_rows(full.applied)
    assert _as_rows(fast.routed) == _as_rows(full.routed)
    assert sorted(fast.replaced.column("k").to_pylist()) == sorted(full.replaced.column("k").to_pylist())
    assert list(fast.applied_positions) == sorted(fast.applied_positions)


def test_string_and_null_keys_take_the_encoded_path() -> None:
    run = pa.table(
        {
            "k": pa.array(["a", None, "b", None, "c"]),
            "_rewind_source_timestamp": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "_rewind_source_topic": pa.array(["t"] * 5),
            "_rewind_source_partition": pa.array([0] * 5, pa.int32()),
            "_rewind_source_offset": pa.array([1, 2, 3, 4, 5], pa.int64()),
        }
    )
    live = run.slice(2, 1)  # "b" meets live, the two nulls are one key written twice
    result = decide(run, live, ["k"], MergePolicy("prefer-live"))
    assert result.counts == {
        "applied": 3,
        "deduplicated": 1,
        "superseded": 1,
        "rejected_stale": 0,
        "routed": 0,
    }
    assert result.applied.column("k").to_pylist() == ["a", None, "c"]
    assert result.applied.column("_rewind_source_offset").to_pylist() == [1, 4, 5]


@pytest.mark.parametrize(
    "on_collision", ["prefer-live", "prefer-backfill", "latest-event-time", "latest-offset"]
)
def test_pairs_at_the_edges_decide_like_deciding_all(on_collision: Any) -> None:
    """Keys each side holds once, at the edges the numpy pairs path must get right: the same
    event on both sides, equal offsets, equal times across partitions (left to the general
    path), a live row exactly at the offset cut line."""
    from rewind.core.merge import _decide_all

    run = table(
        [(1, 1.0, 10, 0, 7), (2, 2.0, 10, 0, 3), (3, 3.0, 10, 1, 2), (4, 4.0, 30, 1, 9), (5, 5.0, 5, 0, 1)]
    )
    live = table(
        [(1, 1.0, 10, 0, 7), (2, 9.0, 20, 0, 3), (3, 8.0, 10, 0, 4), (4, 7.0, 40, 1, 12), (5, 6.0, 1, 0, 2)]
    )
    for policy in (
        MergePolicy(on_collision),
        MergePolicy(on_collision, "route", cut_offsets={(TOPIC, 1): 12}),
    ):
        fast, full = decide(run, live, ["k"], policy), _decide_all(run, live, ["k"], policy)
        assert fast.counts == full.counts, policy
        assert _as_rows(fast.applied) == _as_rows(full.applied), policy
        assert sorted(fast.replaced.column("k").to_pylist()) == sorted(full.replaced.column("k").to_pylist())
