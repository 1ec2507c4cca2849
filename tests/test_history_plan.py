"""History planning as pure functions: spans, the seam, time bounds over two sources, gaps.

No broker here: :func:`rewind.history.plan._plan_partition` is fed the facts a broker and an
archive would give (a resolved Kafka partition, the archive's coverage, recorded gaps, and a
lookup over archived timestamps), and its answer is checked against the whole log.
"""

from __future__ import annotations

import bisect
import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.core.windows import EARLIEST, LATEST, BoundSpec, Timestamp, WindowRequest
from rewind.history import spans
from rewind.history.plan import HistoryPlan, _plan_partition
from rewind.kafka.read_plan import PartitionPlan

T = "orders"

span_lists = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 60)).map(lambda t: (min(t), max(t))), max_size=6
)


def as_set(items: list[tuple[int, int]]) -> set[int]:
    return {o for s, e in items for o in range(s, e)}


@given(span_lists, span_lists)
def test_spans_match_set_algebra(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    merged = spans.merge(a)
    assert as_set(merged) == as_set(a)
    assert all(e1 < s2 for (_s1, e1), (s2, _e2) in itertools.pairwise(merged))  # disjoint, sorted
    assert as_set(spans.subtract(a, b)) == as_set(a) - as_set(b)
    assert spans.total(a) == len(as_set(a))
    window = (10, 40)
    assert as_set(spans.intersect(a, window)) == as_set(a) & set(range(*window))
    assert spans.runs(sorted(as_set(a))) == merged


def kafka_partition(low: int, high: int, start: int, end: int, method: str = "offset") -> PartitionPlan:
    return PartitionPlan(T, 0, low, high, high, start, end, None, method, method)  # type: ignore[arg-type]


def window(start: object, end: object) -> WindowRequest:
    return WindowRequest(subscribe=(T,), start=BoundSpec(start), end=BoundSpec(end))  # type: ignore[arg-type]


def no_lookup(*_args: object) -> None:
    raise AssertionError("no archive lookup expected")


def test_default_seam_is_the_log_start() -> None:
    p = _plan_partition(
        kafka_partition(60, 150, 60, 150), window(EARLIEST, LATEST), (0, 100), [], [], no_lookup, "kafka"
    )
    assert (p.start, p.end, p.seam) == (0, 150, 60)
    assert [(r.start, r.end) for r in p.archive_ranges] == [(0, 60)]
    assert [(r.start, r.end) for r in p.kafka_ranges] == [(60, 150)]
    assert p.gaps == ()
    assert p.expected_archive_records == 60


def test_prefer_archive_moves_the_seam_to_the_high_water() -> None:
    p = _plan_partition(
        kafka_partition(60, 150, 60, 150), window(EARLIEST, LATEST), (0, 100), [], [], no_lookup, "archive"
    )
    assert p.seam == 100
    assert [(r.start, r.end) for r in p.archive_ranges] == [(0, 100)]
    assert [(r.start, r.end) for r in p.kafka_ranges] == [(100, 150)]


def test_lost_ranges_are_classified_and_skipped_ones_explained() -> None:
    # archive [20, 50) with a marker at 30; retention removed [0, 80); a pass recorded [40, 42) lost
    p = _plan_partition(
        kafka_partition(80, 150, 80, 150),
        window(EARLIEST, LATEST),
        (20, 50),
        [(30, 31)],
        [(40, 42)],
        no_lookup,
        "kafka",
    )
    kinds = [(g.start, g.end, g.kind) for g in p.gaps]
    assert kinds == [(0, 20, "lost"), (30, 31, "skipped"), (40, 42, "lost"), (50, 80, "lost")]
    assert "first offset" in p.gaps[0].reason and "high-water" in p.gaps[-1].reason
    assert p.expected_archive_records == 30 - 1 - 2


def test_explicit_offsets_inside_the_archive_need_no_kafka() -> None:
    p = _plan_partition(kafka_partition(80, 150, 80, 80), window(10, 40), (0, 90), [], [], no_lookup, "kafka")
    assert [(r.start, r.end) for r in p.archive_ranges] == [(10, 40)]
    assert p.kafka_ranges == ()


@settings(max_examples=300, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 30), min_size=1, max_size=40).map(lambda d: list(itertools.accumulate(d))),
    low_frac=st.floats(0, 1),
    hw_extra=st.integers(0, 10),
    t1=st.integers(-5, 400),
    width=st.integers(0, 400),
    prefer=st.sampled_from(["kafka", "archive"]),
)
def test_time_windows_resolve_over_both_sources_as_over_one_log(
    stamps: list[int], low_frac: float, hw_extra: int, t1: int, width: int, prefer: str
) -> None:
    """The whole log archived up to at least the log start: the window is exactly "first offset
    whose timestamp >= T" over the whole log, and the two sources split it without overlap."""
    n = len(stamps)
    low = int(low_frac * n)
    hw = min(n, low + hw_extra)
    t2 = t1 + width

    def first_at_or_after(ms: int, lo: int, hi: int) -> int:
        i = bisect.bisect_left(stamps, ms, lo, hi)
        return i

    def kafka_answer(ms: int) -> int:
        return first_at_or_after(ms, low, n)

    def lookup(ms: int, lo: int, hi: int) -> int | None:
        i = first_at_or_after(ms, lo, hi)
        return i if i < hi else None

    k_start = kafka_answer(t1)
    k_end = max(k_start, kafka_answer(t2))
    p = _plan_partition(
        kafka_partition(low, n, k_start, k_end, "search"),
        window(Timestamp(max(t1, 0)), Timestamp(max(t2, 0))),
        (0, hw),
        [],
        [],
        lookup,
        prefer,  # type: ignore[arg-type]
    )
    expected = [o for o in range(n) if max(t1, 0) <= stamps[o] < max(t2, 0)]
    got = sorted(as_set([(r.start, r.end) for r in (*p.archive_ranges, *p.kafka_ranges)]))
    assert got == expected
    assert not as_set([(r.start, r.end) for r in p.archive_ranges]) & as_set(
        [(r.start, r.end) for r in p.kafka_ranges]
    )
    assert all(r.end <= p.seam for r in p.archive_ranges) and all(r.start >= p.seam for r in p.kafka_ranges)
    assert all(r.start >= low for r in p.kafka_ranges)
    assert p.gaps == ()


def test_time_start_before_everything_known_is_an_upper_bound_reported_lost() -> None:
    # archive holds [40, 60) (first archived record already after T1), log starts at 60
    stamps = {o: 1000 + o for o in range(40, 100)}

    def lookup(ms: int, lo: int, hi: int) -> int | None:
        return next((o for o in range(lo, hi) if stamps[o] >= ms), None)

    p = _plan_partition(
        kafka_partition(60, 100, 60, 70, "search"),
        window(Timestamp(500), Timestamp(1070)),
        (40, 60),
        [],
        [],
        lookup,
        "kafka",
    )
    assert (p.start, p.end) == (0, 70)
    assert [(g.start, g.end, g.kind) for g in p.gaps] == [(0, 40, "lost")]


def test_plan_round_trips_through_json_and_cuts_units() -> None:
    part = _plan_partition(
        kafka_partition(80, 150, 80, 150),
        window(EARLIEST, LATEST),
        (0, 100),
        [(10, 12)],
        [],
        no_lookup,
        "kafka",
    )
    plan = HistoryPlan((T,), "lake.orders", 42, "kafka", False, (part,), ("a note",))
    again = HistoryPlan.from_json(json.dumps(json.loads(plan.to_json())))
    assert again == plan
    units = plan.units(max_offsets=30)
    assert [(u.source, u.range.start, u.range.end) for u in units] == [
        ("archive", 0, 30),
        ("archive", 30, 60),
        ("archive", 60, 80),
        ("kafka", 80, 110),
        ("kafka", 110, 140),
        ("kafka", 140, 150),
    ]
    assert units[0].expected_records == 28 and units[3].expected_records is None
    assert units[0].id == f"{T}/0/0-30"
    assert plan.summary()["skipped_offsets"] == 2
