"""Properties of chunking and task grouping: every offset read exactly once, by one task."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.core.ranges import OffsetRange, group_for_tasks

ranges_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5), st.integers(0, 500), st.integers(0, 500)),
    max_size=12,
    unique_by=lambda t: (t[0], t[1]),
).map(lambda items: [OffsetRange(t, p, lo, lo + n) for t, p, lo, n in items])


@settings(max_examples=300, deadline=None)
@given(ranges_strategy, st.integers(1, 200), st.integers(1, 6), st.one_of(st.none(), st.integers(1, 20)))
def test_grouped_chunks_cover_every_offset_once(
    ranges: list[OffsetRange], max_records: int, per_task: int, min_tasks: int | None
) -> None:
    chunks = [c for r in ranges for c in r.split(max_records)]
    tasks = group_for_tasks(chunks, per_task, min_tasks)
    seen: dict[tuple[str, int], list[int]] = {}
    for task in tasks:
        assert 0 < len(task) <= per_task
        keys = [(c.topic, c.partition) for c in task]
        assert len(keys) == len(set(keys)), "a task holds two chunks of one partition"
        for c in task:
            assert c.size <= max_records
            seen.setdefault((c.topic, c.partition), []).extend(range(c.start, c.end))
    expected = {(r.topic, r.partition): list(range(r.start, r.end)) for r in ranges if r.size}
    assert {k: sorted(v) for k, v in seen.items()} == expected
    nonempty = sum(1 for c in chunks if c.size)
    if min_tasks is not None:
        assert len(tasks) >= min(min_tasks, nonempty)


def test_split_covers_range_in_order() -> None:
    parts = OffsetRange("t", 0, 10, 35).split(10)
    assert [(p.start, p.end) for p in parts] == [(10, 20), (20, 30), (30, 35)]
    assert OffsetRange("t", 0, 5, 5).split(3) == [OffsetRange("t", 0, 5, 5)]


@settings(max_examples=200, deadline=None)
@given(ranges_strategy, st.integers(1, 200), st.integers(1, 6))
def test_tasks_in_order_return_each_partition_in_offset_order(
    ranges: list[OffsetRange], max_records: int, per_task: int
) -> None:
    chunks = [c for r in ranges for c in r.split(max_records)]
    starts: dict[tuple[str, int], list[int]] = {}
    for task in group_for_tasks(chunks, per_task):
        for c in task:
            starts.setdefault((c.topic, c.partition), []).append(c.start)
    for seen in starts.values():
        assert seen == sorted(seen)
