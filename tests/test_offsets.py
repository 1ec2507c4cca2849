"""The offset resolver against a real broker, its option parser, and its plan arithmetic.

Broker tests run on each test broker (tests/brokers.py); expected answers are computed from
what was produced (delivery reports give offsets and timestamps), never from the broker's own
lookups. Where a broker's gaps change *how* a bound is found (tansu's ListOffsets ``latest``
and by-timestamp answers), the tests assert the fallback there and the direct answer on a
broker that has the capability. DeleteRecords moving the log start runs where it exists.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.core.ranges import OffsetRange
from rewind.core.windows import EARLIEST, LATEST, BoundSpec, Timestamp, WindowRequest
from rewind.errors import PlanError
from rewind.kafka import clients
from rewind.kafka.probes import ProbeRead, ProbeRecord, time_job
from rewind.kafka.read_plan import PartitionPlan, ReadPlan
from rewind.kafka.resolve import resolve
from rewind.kafka.spark_options import parse_spark_options
from tests.brokers import DELETE_RECORDS, TIME_INDEX, TestBroker
from tests.brokers import LATEST as LATEST_CAPABILITY
from tests.kafka_util import KEEP_FOREVER

BASE = 1_700_000_000_000
TIMEOUT = 15.0


# -- helpers -------------------------------------------------------------------------------


def create_topic(conf: dict[str, Any], name: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    admin = clients.admin(conf)
    new = NewTopic(name, partitions, 1, config=dict(KEEP_FOREVER))
    for fut in admin.create_topics([new], operation_timeout=TIMEOUT).values():
        fut.result(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=TIMEOUT).topics.get(name)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} did not appear")


def topic_exists(conf: dict[str, Any], name: str) -> bool:
    return name in clients.admin(conf).list_topics(timeout=TIMEOUT).topics


@dataclass(frozen=True)
class Produced:
    """Offsets and timestamps of the records of one partition, from delivery reports."""

    records: tuple[tuple[int, int], ...]  # (offset, timestamp)
    high: int

    def first_at_or_after(self, ts: int) -> int:
        """What a correct time lookup answers: the first offset with timestamp >= ts, else high."""
        return next((off for off, t in self.records if t >= ts), self.high)


def produce(
    conf: dict[str, Any], topic: str, stamps: Mapping[int, Sequence[int]], **overrides: Any
) -> dict[int, Produced]:
    """Produce one record per timestamp; linger so that records share batches."""
    producer = clients.producer(conf, **{"linger.ms": 50, "batch.num.messages": 10000, **overrides})
    delivered: dict[int, list[tuple[int, int]]] = {p: [] for p in stamps}
    errors: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err:
            errors.append(str(err))
        else:
            delivered[msg.partition()].append((msg.offset(), msg.timestamp()[1]))

    for partition, times in stamps.items():
        for i, ts in enumerate(times):
            producer.produce(topic, value=b"v%d" % i, partition=partition, timestamp=ts, on_delivery=report)
            if i % 5000 == 4999:
                producer.poll(0)
    assert producer.flush(TIMEOUT) == 0 and not errors, errors[:1]
    out = {}
    for partition, recs in delivered.items():
        recs.sort()
        out[partition] = Produced(tuple(recs), recs[-1][0] + 1 if recs else 0)
    return out


def by_partition(plan: ReadPlan) -> dict[int, PartitionPlan]:
    return {p.partition: p for p in plan.partitions}


# -- windows given as offsets: a property over several topic layouts -----------------------

LAYOUT_PARTITIONS = (1, 2, 3, 5)


@pytest.fixture(scope="module")
def layouts(broker_conf: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Topics of 1 to 5 partitions holding random record counts, including empty partitions."""
    rng = random.Random(20240611)
    out = []
    for count in LAYOUT_PARTITIONS:
        topic = f"t-layout-{uuid.uuid4().hex[:8]}"
        create_topic(broker_conf, topic, count)
        sizes = [rng.choice([0, 1, 2, 7, 33, 150, 400]) for _ in range(count)]
        sizes[rng.randrange(count)] = 0 if count > 1 else sizes[0]
        produce(broker_conf, topic, {p: [BASE + i for i in range(n)] for p, n in enumerate(sizes)})
        out.append((topic, sizes))
    return out


@st.composite
def offset_windows(draw: st.DrawFn, n_layouts: int) -> tuple[int, list[tuple[int, int, int | None]]]:
    """A layout index and, per partition, (start, end, declared log start) drawn around the data."""
    index = draw(st.integers(0, n_layouts - 1))
    parts = []
    for _ in range(LAYOUT_PARTITIONS[index]):
        start = draw(st.one_of(st.just(EARLIEST), st.just(LATEST), st.integers(0, 450)))
        end_floor = start if start >= 0 else 0
        end = draw(st.one_of(st.just(LATEST), st.integers(end_floor, 460)))
        declared = draw(st.one_of(st.none(), st.integers(0, 400)))
        parts.append((start, end, declared))
    return index, parts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_offset_windows_resolve_to_clamped_ranges(
    broker_conf: dict[str, Any], layouts: list[tuple[str, list[int]]], data: st.DataObject
) -> None:
    index, parts = data.draw(offset_windows(len(layouts)))
    topic, sizes = layouts[index]
    starts = {str(p): s for p, (s, _e, _d) in enumerate(parts)}
    ends = {str(p): e for p, (_s, e, _d) in enumerate(parts)}
    declared = {(topic, p): min(d, sizes[p]) for p, (_s, _e, d) in enumerate(parts) if d is not None}
    request = parse_spark_options(
        {
            "subscribe": topic,
            "startingOffsets": json.dumps({topic: starts}),
            "endingOffsets": json.dumps({topic: ends}),
        }
    )
    plan = resolve(broker_conf, request, timeout_s=TIMEOUT, declared_log_start=declared)

    assert [(p.topic, p.partition) for p in plan.partitions] == [(topic, p) for p in range(len(sizes))]
    for p, (start, end, _d) in enumerate(parts):
        got = plan.partitions[p]
        high = sizes[p]
        low = declared.get((topic, p), 0)
        raw_start = {EARLIEST: low, LATEST: high}.get(start, start)
        raw_end = high if end == LATEST else end
        want_start = min(max(raw_start, low), high)
        want_end = max(min(raw_end, high), want_start)
        assert (got.low, got.high) == (low, high)
        assert got.range == OffsetRange(topic, p, want_start, want_end)
        if start >= 0 and start < min(raw_end, low):
            assert got.missing_below_low == OffsetRange(topic, p, start, min(raw_end, low))
        elif start == EARLIEST and min(raw_end, low) > 0:  # history that retention removed
            assert got.missing_below_low == OffsetRange(topic, p, 0, min(raw_end, low))
        else:
            assert got.missing_below_low is None
        if end >= 0 and end > high:
            assert any("clamped" in n for n in got.notes)
    assert plan.total_offsets == sum(r.size for r in plan.ranges())


def test_latest_is_the_true_end_when_list_offsets_under_reports(
    broker: TestBroker, broker_conf: dict[str, Any], topic_name: str
) -> None:
    create_topic(broker_conf, topic_name, 2)
    produce(broker_conf, topic_name, {0: [BASE + i for i in range(5000)], 1: [BASE]}, **{"linger.ms": 200})
    plan = resolve(broker_conf, WindowRequest(subscribe=(topic_name,)), timeout_s=TIMEOUT)
    parts = by_partition(plan)
    assert parts[0].range == OffsetRange(topic_name, 0, 0, 5000)
    assert parts[1].range == OffsetRange(topic_name, 1, 0, 1)
    assert (parts[0].start_method, parts[0].end_method) == ("earliest", "latest")
    if not broker.has(LATEST_CAPABILITY):  # tansu answers the base offset of the last batch + 1
        assert parts[0].listed_high < 5000
        assert (
            f"ListOffsets under-reported latest on {topic_name}/0: {parts[0].listed_high} < 5000"
            in parts[0].notes
        )
        assert any("under-reported" in n for n in plan.notes)
    else:
        assert parts[0].listed_high == 5000 and not parts[0].notes


# -- windows given as times -----------------------------------------------------------------

# partition 0: duplicates (3 records per timestamp); 1: empty; 2: sparse; 3: a single record
TIMED = {
    0: [BASE + 10 * (i // 3) for i in range(300)],
    1: [],
    2: [BASE + 100 * i + 5 for i in range(40)],
    3: [BASE + 1000],
}


@pytest.fixture(scope="module")
def timed(broker_conf: dict[str, Any]) -> tuple[str, dict[int, Produced]]:
    topic = f"t-timed-{uuid.uuid4().hex[:8]}"
    create_topic(broker_conf, topic, len(TIMED))
    return topic, produce(broker_conf, topic, TIMED)


WINDOWS = {
    "before-all-to-after-all": (BASE - 5000, BASE + 10**7),
    "exact-duplicate-timestamps": (BASE + 10 * 50, BASE + 10 * 60),
    "between-records": (BASE + 123, BASE + 1001),
    "after-all": (BASE + 10**6, BASE + 10**7),
    "empty-window": (BASE + 500, BASE + 500),
    "ends-before-all": (BASE - 5000, BASE - 1),
}


@pytest.mark.parametrize("window", WINDOWS.values(), ids=WINDOWS.keys())
def test_time_windows_match_a_correct_lookup(
    broker: TestBroker,
    broker_conf: dict[str, Any],
    timed: tuple[str, dict[int, Produced]],
    window: tuple[int, int],
) -> None:
    topic, produced = timed
    t1, t2 = window
    plan = resolve(
        broker_conf,
        parse_spark_options({"subscribe": topic, "startingTimestamp": str(t1), "endingTimestamp": str(t2)}),
        timeout_s=TIMEOUT,
    )
    for part in plan.partitions:
        data = produced[part.partition]
        assert part.range == OffsetRange(
            topic, part.partition, data.first_at_or_after(t1), data.first_at_or_after(t2)
        ), part.notes
        assert part.missing_below_low is None
        if not broker.has(TIME_INDEX):  # tansu answers 0 for every timestamp: right only when 0 is
            for bound, method in ((part.start, part.start_method), (part.end, part.end_method)):
                assert method == ("list-offsets" if bound == 0 or data.high == 0 else "search"), part.notes
            if part.start_method == "search":
                assert any("binary search" in n for n in part.notes)
        else:  # the broker's time index answered, and the check by reading agreed
            assert (part.start_method, part.end_method) == ("list-offsets", "list-offsets"), part.notes
    wrong = any("answered wrongly" in n for n in plan.notes)
    if broker.has(TIME_INDEX):
        assert not wrong, plan.notes
    elif t1 > BASE:
        assert wrong, plan.notes


def test_by_timestamp_json_per_partition(
    broker_conf: dict[str, Any], timed: tuple[str, dict[int, Produced]]
) -> None:
    topic, produced = timed
    starts = {"0": BASE + 30, "1": BASE, "2": BASE + 1505, "3": BASE + 1000}
    ends = {"0": BASE + 31, "1": BASE + 10, "2": BASE + 1506, "3": BASE + 1000}
    plan = resolve(
        broker_conf,
        parse_spark_options(
            {
                "subscribe": topic,
                "startingOffsetsByTimestamp": json.dumps({topic: starts}),
                "endingOffsetsByTimestamp": json.dumps({topic: ends}),
                "startingOffsets": "latest",  # lower precedence: ignored
            }
        ),
        timeout_s=TIMEOUT,
    )
    for part in plan.partitions:
        data = produced[part.partition]
        assert (part.start, part.end) == (
            data.first_at_or_after(starts[str(part.partition)]),
            data.first_at_or_after(ends[str(part.partition)]),
        )
    assert by_partition(plan)[0].range.size == 3  # three records share BASE + 30
    assert by_partition(plan)[2].range.size == 1
    assert "startingOffsets is ignored: startingOffsetsByTimestamp takes precedence" in plan.notes


def test_start_timestamp_after_the_log_with_strategy_error(
    broker_conf: dict[str, Any], timed: tuple[str, dict[int, Produced]]
) -> None:
    topic, _ = timed
    options = {
        "assign": json.dumps({topic: [2]}),
        "startingTimestamp": str(BASE + 10**6),
        "startingOffsetsByTimestampStrategy": "error",
    }
    with pytest.raises(PlanError, match=rf"no record at or after startingTimestamp .* on {topic}/2"):
        resolve(broker_conf, parse_spark_options(options), timeout_s=TIMEOUT)


def test_out_of_order_timestamps_give_a_crossing_point(broker_conf: dict[str, Any], topic_name: str) -> None:
    """Documented limit: with timestamps going backwards the bound is *a* crossing of T."""
    create_topic(broker_conf, topic_name, 1)
    stamps = [BASE + s for s in (100, 300, 200, 400, 150, 500)]
    produce(broker_conf, topic_name, {0: stamps})
    plan = resolve(
        broker_conf,
        parse_spark_options({"subscribe": topic_name, "startingTimestamp": str(BASE + 250)}),
        timeout_s=TIMEOUT,
    )
    start = plan.partitions[0].start
    assert stamps[start] >= BASE + 250 and stamps[start - 1] < BASE + 250


# -- the log start moved by DeleteRecords -------------------------------------------------------


def test_delete_records_moves_the_log_start_and_the_gap_is_named(
    broker: TestBroker, broker_conf: dict[str, Any], topic_name: str
) -> None:
    """After DeleteRecords up to 40, `earliest` starts at 40 and says [0, 40) left Kafka; an
    explicit start offset below 40 names exactly the offsets that are gone; a time window
    whose records were deleted starts at the new log start."""
    broker.require(DELETE_RECORDS)
    from confluent_kafka import TopicPartition

    create_topic(broker_conf, topic_name, 2)
    produced = produce(broker_conf, topic_name, {0: [BASE + 10 * i for i in range(100)], 1: [BASE]})
    assert produced[0].high == 100
    admin = clients.admin(broker_conf)  # kept: a collected client never resolves its futures
    for fut in admin.delete_records([TopicPartition(topic_name, 0, 40)]).values():
        assert fut.result(timeout=TIMEOUT).low_watermark == 40

    plan = by_partition(resolve(broker_conf, WindowRequest(subscribe=(topic_name,)), timeout_s=TIMEOUT))
    assert (plan[0].low, plan[0].range) == (40, OffsetRange(topic_name, 0, 40, 100))
    assert plan[0].missing_below_low == OffsetRange(topic_name, 0, 0, 40)
    assert (plan[1].low, plan[1].missing_below_low) == (0, None)

    explicit = resolve(
        broker_conf,
        parse_spark_options({"assign": json.dumps({topic_name: [0]}),
                             "startingOffsets": json.dumps({topic_name: {"0": 25}})}),
        timeout_s=TIMEOUT,
    )
    assert explicit.partitions[0].range == OffsetRange(topic_name, 0, 40, 100)
    assert explicit.partitions[0].missing_below_low == OffsetRange(topic_name, 0, 25, 40)

    by_time = resolve(
        broker_conf,
        parse_spark_options({"assign": json.dumps({topic_name: [0]}),
                             "startingTimestamp": str(BASE + 100), "endingTimestamp": str(BASE + 600)}),
        timeout_s=TIMEOUT,
    )
    assert by_time.partitions[0].range == OffsetRange(topic_name, 0, 40, 60)


# -- transactions: markers occupy offsets ---------------------------------------------------


def test_transaction_markers_gaps_and_a_partition_ending_on_a_marker(
    broker_conf: dict[str, Any], topic_name: str
) -> None:
    create_topic(broker_conf, topic_name, 2)
    producer = clients.producer(broker_conf, **{"transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(TIMEOUT)
    delivered: dict[int, list[tuple[int, int]]] = {0: [], 1: []}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        delivered[msg.partition()].append((msg.offset(), msg.timestamp()[1]))

    ts = BASE
    for txn in range(4):  # partition 0: four committed transactions of 5; partition 1: the last one
        producer.begin_transaction()
        for _ in range(5):
            ts += 10
            producer.produce(
                topic_name, b"x", partition=0 if txn < 3 else 1, timestamp=ts, on_delivery=report
            )
        producer.commit_transaction(TIMEOUT)
    plain = clients.producer(broker_conf)  # partition 0 then ends on plain records
    for _ in range(3):
        ts += 10
        plain.produce(topic_name, b"y", partition=0, timestamp=ts, on_delivery=report)
    assert plain.flush(TIMEOUT) == 0
    producer.flush(TIMEOUT)

    recs = {p: sorted(v) for p, v in delivered.items()}
    offsets0 = [o for o, _ in recs[0]]
    assert offsets0[5] > offsets0[4] + 1, "a commit marker should sit between transactions"
    data = {
        0: Produced(tuple(recs[0]), offsets0[-1] + 1),
        1: Produced(tuple(recs[1]), recs[1][-1][0] + 2),
    }  # ends on its commit marker

    plan = resolve(broker_conf, WindowRequest(subscribe=(topic_name,)), timeout_s=TIMEOUT)
    assert [p.high for p in plan.partitions] == [data[0].high, data[1].high]

    # bounds right after a marker, on a marker's neighbour, and after the trailing marker
    for t1, t2 in ((recs[0][5][1], recs[0][11][1]), (recs[0][4][1] + 1, ts + 1), (BASE, recs[1][2][1])):
        plan = resolve(
            broker_conf,
            parse_spark_options(
                {"subscribe": topic_name, "startingTimestamp": str(t1), "endingTimestamp": str(t2)}
            ),
            timeout_s=TIMEOUT,
        )
        for part in plan.partitions:
            want = data[part.partition]
            assert (part.start, part.end) == (want.first_at_or_after(t1), want.first_at_or_after(t2)), (
                part.notes
            )


# -- policies -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small(broker_conf: dict[str, Any]) -> tuple[str, dict[int, Produced]]:
    """Partition 0: 50 records 10 ms apart; partition 1: 10 records; partition 2: empty."""
    topic = f"t-small-{uuid.uuid4().hex[:8]}"
    create_topic(broker_conf, topic, 3)
    return topic, produce(
        broker_conf,
        topic,
        {0: [BASE + 10 * i for i in range(50)], 1: [BASE + 10 * i for i in range(10)], 2: []},
    )


def test_window_after_the_log_and_end_above_high(
    broker_conf: dict[str, Any], small: tuple[str, dict[int, Produced]]
) -> None:
    topic, _ = small
    plan = resolve(
        broker_conf,
        parse_spark_options(
            {
                "subscribe": topic,
                "startingOffsets": json.dumps({topic: {"0": 70, "1": 2, "2": -2}}),
                "endingOffsets": json.dumps({topic: {"0": 90, "1": 500, "2": -1}}),
            }
        ),
        timeout_s=TIMEOUT,
    )
    p0, p1, p2 = plan.partitions
    assert p0.range == OffsetRange(topic, 0, 50, 50)
    assert any("after the end of the log" in n for n in p0.notes)
    assert p1.range == OffsetRange(topic, 1, 2, 10) and p1.end_method == "offset"
    assert f"endingOffsets offset 500 on {topic}/1 is after the high watermark 10: clamped to 10" in p1.notes
    assert p2.range == OffsetRange(topic, 2, 0, 0)  # an empty partition: [high, high)
    assert plan.chunks() == [OffsetRange(topic, 1, 2, 10)]


def test_declared_log_start_acts_as_the_low_watermark(
    broker_conf: dict[str, Any], small: tuple[str, dict[int, Produced]]
) -> None:
    topic, _ = small
    declared = {(topic, 0): 30}

    def plan_for(options: dict[str, str]) -> PartitionPlan:
        plan = resolve(
            broker_conf,
            parse_spark_options({"assign": json.dumps({topic: [0]}), **options}),
            timeout_s=TIMEOUT,
            declared_log_start=declared,
        )
        return plan.partitions[0]

    explicit = plan_for({"startingOffsets": json.dumps({topic: {"0": 10}})})
    assert (explicit.low, explicit.range, explicit.missing_below_low) == (
        30,
        OffsetRange(topic, 0, 30, 50),
        OffsetRange(topic, 0, 10, 30),
    )
    assert any("no longer in Kafka" in n for n in explicit.notes)
    assert any("declared log start 30" in n for n in explicit.notes)

    below_only = plan_for(
        {"startingOffsets": json.dumps({topic: {"0": 5}}), "endingOffsets": json.dumps({topic: {"0": 20}})}
    )
    assert (below_only.range, below_only.missing_below_low) == (
        OffsetRange(topic, 0, 30, 30),
        OffsetRange(topic, 0, 5, 20),
    )

    earliest = plan_for({})  # "from the beginning" includes what retention removed
    assert (earliest.start_method, earliest.range, earliest.missing_below_low) == (
        "earliest",
        OffsetRange(topic, 0, 30, 50),
        OffsetRange(topic, 0, 0, 30),
    )
    latest = plan_for({"startingOffsets": "latest"})
    assert (latest.range, latest.missing_below_low) == (OffsetRange(topic, 0, 50, 50), None)

    # a time bound before the first record still in Kafka: the records that left may belong
    before = plan_for({"startingTimestamp": str(BASE - 1)})
    assert (before.range, before.missing_below_low) == (
        OffsetRange(topic, 0, 30, 50),
        OffsetRange(topic, 0, 0, 30),
    )
    assert any("upper bound" in n for n in before.notes)
    inside = plan_for({"startingTimestamp": str(BASE + 400)})
    assert (inside.range, inside.missing_below_low) == (OffsetRange(topic, 0, 40, 50), None)

    with pytest.raises(
        PlanError, match=rf"declared log start 99 of {topic}/0 is after its high watermark 50"
    ):
        resolve(broker_conf, WindowRequest(subscribe=(topic,)), declared_log_start={(topic, 0): 99})
    with pytest.raises(PlanError, match=rf"declared log start names {topic}/7, which does not exist"):
        resolve(broker_conf, WindowRequest(subscribe=(topic,)), declared_log_start={(topic, 7): 1})


def test_mixed_bounds_that_cross_give_an_empty_range(
    broker_conf: dict[str, Any], small: tuple[str, dict[int, Produced]]
) -> None:
    topic, _ = small
    plan = resolve(
        broker_conf,
        parse_spark_options(
            {
                "assign": json.dumps({topic: [0]}),
                "startingTimestamp": str(BASE + 300),  # offset 30
                "endingOffsets": json.dumps({topic: {"0": 20}}),
            }
        ),
        timeout_s=TIMEOUT,
    )
    part = plan.partitions[0]
    assert part.range == OffsetRange(topic, 0, 30, 30)
    assert any("resolved to start 30 after end 20" in n for n in part.notes)


def test_unknown_topics_and_partitions_are_errors_and_not_created(
    broker_conf: dict[str, Any], small: tuple[str, dict[int, Produced]]
) -> None:
    topic, _ = small
    ghost = f"t-ghost-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PlanError, match=f"topic '{ghost}' named in subscribe does not exist"):
        resolve(broker_conf, parse_spark_options({"subscribe": f"{topic},{ghost}"}), timeout_s=TIMEOUT)
    assert not topic_exists(broker_conf, ghost)  # tansu creates a topic that Metadata names
    with pytest.raises(PlanError, match=rf"partition {topic}/3 named in assign does not exist"):
        resolve(broker_conf, parse_spark_options({"assign": json.dumps({topic: [0, 3]})}), timeout_s=TIMEOUT)
    with pytest.raises(PlanError, match=rf"startingOffsets does not name {topic}/1, {topic}/2; "):
        resolve(
            broker_conf,
            parse_spark_options({"subscribe": topic, "startingOffsets": json.dumps({topic: {"0": 0}})}),
            timeout_s=TIMEOUT,
        )
    with pytest.raises(PlanError, match=rf"endingOffsets names {topic}/5, which is not part"):
        resolve(
            broker_conf,
            parse_spark_options(
                {"assign": json.dumps({topic: [0]}), "endingOffsets": json.dumps({topic: {"0": 1, "5": 1}})}
            ),
            timeout_s=TIMEOUT,
        )


def test_subscribe_pattern(broker_conf: dict[str, Any], small: tuple[str, dict[int, Produced]]) -> None:
    topic, _ = small
    plan = resolve(
        broker_conf,
        parse_spark_options({"subscribePattern": topic.replace("small", "sm.ll")}),
        timeout_s=TIMEOUT,
    )
    assert [(p.topic, p.partition) for p in plan.partitions] == [(topic, 0), (topic, 1), (topic, 2)]
    nothing = resolve(
        broker_conf, parse_spark_options({"subscribePattern": "no-such-topic-.*"}), timeout_s=TIMEOUT
    )
    assert nothing.partitions == () and "matched 0 topics" in nothing.notes[0]


# -- the time check and search, as pure logic over an in-memory log ------------------------


def run_time_job(
    log: Sequence[tuple[int, int]], ts: int, listed: int, low: int, high: int
) -> tuple[int, str, tuple[str, ...]]:
    """Answer the job's reads from ``log`` ((offset, timestamp) with gaps) like a fetch would."""
    job = time_job(("t", 0), "startingTimestamp", ts, listed, low, high)
    records = None
    try:
        while True:
            read: ProbeRead = job.send(records) if records is not None else next(job)
            assert low <= read.start <= high
            records = []
            for off, t in log:
                if read.start <= off < high:
                    records.append(ProbeRecord(off, t))
                    if off >= read.until:
                        break
    except StopIteration as stop:
        return stop.value.offset, stop.value.method, stop.value.notes


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int]:
    """A log with gaps (markers, compaction) and non-decreasing timestamps, and its high."""
    offset, ts, log = 0, BASE, []
    for _ in range(draw(st.integers(0, 40))):
        offset += draw(st.sampled_from([1, 1, 1, 2, 5]))
        ts += draw(st.sampled_from([0, 0, 1, 10]))
        log.append((offset, ts))
    return log, offset + draw(st.integers(1, 3))


@settings(max_examples=300, deadline=None)
@given(data=logs(), probe=st.integers(-20, 500), listed=st.integers(-1, 60), low_cut=st.integers(0, 200))
def test_time_job_finds_the_first_record_at_or_after_t(
    data: tuple[list[tuple[int, int]], int], probe: int, listed: int, low_cut: int
) -> None:
    log, high = data
    low = min(low_cut, high)
    kept = [(o, t) for o, t in log if o >= low]
    ts = BASE + probe
    want = next((o for o, t in kept if t >= ts), high)
    got, method, _notes = run_time_job(log, ts, listed, low, high)
    assert got == want
    if listed == want and low <= listed < high:
        assert method == "list-offsets"  # a right answer is accepted as it is


def test_time_job_reports_timestamps_going_backwards() -> None:
    """Out of order: the answer is a crossing of T, and the plan says the bound is approximate."""
    log = [(0, 100), (1, 300), (2, 200)]
    offset, method, notes = run_time_job(log, 150, listed=2, low=0, high=3)
    assert (offset, method) == (1, "search")
    assert any("timestamps go backwards on t/0 (offset 1: 300, offset 2: 200)" in n for n in notes)


# -- option parsing -------------------------------------------------------------------------


def test_defaults_and_subscriptions() -> None:
    req = parse_spark_options({"subscribe": " a, b ,,a "})
    assert req.subscribe == ("a", "b")
    assert req.start == BoundSpec(EARLIEST, option="startingOffsets")
    assert req.end == BoundSpec(LATEST, option="endingOffsets")
    assert req.assign == () and req.subscribe_pattern is None and req.fail_on_data_loss
    assert parse_spark_options({"assign": '{"b":[1,0],"a":[2]}'}).assign == (("a", 2), ("b", 0), ("b", 1))
    assert parse_spark_options({"subscribePattern": "ord.*"}).subscribe_pattern == "ord.*"


def test_keys_are_case_insensitive_and_extras_are_carried() -> None:
    req = parse_spark_options(
        {
            "SUBSCRIBE": "a",
            "startingoffsets": "LATEST",
            "EndingOffsets": '{"a":{"0":5}}',
            "minPartitions": "8",
            "maxrecordsperpartition": "1000",
            "failOnDataLoss": "False",
            "kafka.bootstrap.servers": "h:9092",
            "Kafka.Security.Protocol": "SSL",
            "includeHeaders": "true",
        }
    )
    assert req.subscribe == ("a",)
    assert req.start.default == LATEST
    assert req.end == BoundSpec(None, {("a", 0): 5}, option="endingOffsets")
    assert (req.min_partitions, req.max_records_per_partition, req.fail_on_data_loss) == (8, 1000, False)
    assert req.kafka_params == {"bootstrap.servers": "h:9092", "Security.Protocol": "SSL"}


def test_offsets_json_and_timestamps() -> None:
    req = parse_spark_options(
        {
            "subscribe": "t",
            "startingOffsets": '{"t":{"0":23,"1":-2,"2":-1}}',
            "endingOffsets": '{"t":{"0":30,"1":-1}}',
        }
    )
    assert req.start.overrides == {("t", 0): 23, ("t", 1): EARLIEST, ("t", 2): LATEST}
    assert req.start.default is None
    assert req.end.overrides == {("t", 0): 30, ("t", 1): LATEST}
    req = parse_spark_options({"subscribe": "t", "startingTimestamp": "1000", "endingTimestamp": "2000"})
    assert (req.start, req.end) == (
        BoundSpec(Timestamp(1000), option="startingTimestamp"),
        BoundSpec(Timestamp(2000), option="endingTimestamp"),
    )
    req = parse_spark_options(
        {
            "subscribe": "t",
            "startingOffsetsByTimestamp": '{"t":{"0":1000,"1":5}}',
            "endingOffsetsByTimestamp": '{"t":{"0":3000,"1":6}}',
        }
    )
    assert req.start.overrides == {("t", 0): Timestamp(1000), ("t", 1): Timestamp(5)}
    assert req.end.option == "endingOffsetsByTimestamp"


def test_precedence_timestamp_over_by_timestamp_over_offsets() -> None:
    req = parse_spark_options(
        {
            "subscribe": "t",
            "startingTimestamp": "1000",
            "startingOffsetsByTimestamp": '{"t":{"0":5}}',
            "startingOffsets": "latest",
            "endingOffsetsByTimestamp": '{"t":{"0":2000}}',
            "endingOffsets": "latest",
        }
    )
    assert req.start == BoundSpec(Timestamp(1000), option="startingTimestamp")
    assert req.end == BoundSpec(None, {("t", 0): Timestamp(2000)}, option="endingOffsetsByTimestamp")
    assert req.notes == (
        "startingOffsetsByTimestamp is ignored: startingTimestamp takes precedence",
        "startingOffsets is ignored: startingTimestamp takes precedence",
        "endingOffsets is ignored: endingOffsetsByTimestamp takes precedence",
    )


BAD_OPTIONS = {
    "no-subscription": (
        {},
        "exactly one of the options subscribe, subscribePattern, assign is required; none",
    ),
    "two-subscriptions": ({"subscribe": "a", "assign": '{"a":[0]}'}, "got subscribe and assign"),
    "empty-subscribe": ({"subscribe": " , "}, "bad subscribe ' , ': no topic named"),
    "bad-pattern": ({"subscribePattern": "a("}, "bad subscribePattern 'a(': not a regular expression"),
    "assign-not-json": ({"assign": "a:0"}, "bad assign 'a:0': not valid JSON"),
    "assign-empty": ({"assign": "{}"}, "bad assign '{}': no topic named"),
    "assign-bad-partition": ({"assign": '{"a":[-1]}'}, "partition -1 of topic 'a' is not a partition number"),
    "start-not-json": (
        {"subscribe": "a", "startingOffsets": "{oops"},
        "bad startingOffsets '{oops': not valid JSON",
    ),
    "start-word": (
        {"subscribe": "a", "startingOffsets": "newest"},
        "bad startingOffsets 'newest': not valid JSON (Expecting value at column 1); expected \"earliest\"",
    ),
    "start-negative": ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "a/0: offset -3 is negative"),
    "start-float": ({"subscribe": "a", "startingOffsets": '{"a":{"0":1.5}}'}, "a/0: 1.5 is not an integer"),
    "start-partition-key": (
        {"subscribe": "a", "startingOffsets": '{"a":{"x":1}}'},
        "partition 'x' of topic 'a' is not a partition number",
    ),
    "start-shape": (
        {"subscribe": "a", "startingOffsets": '{"a":[1]}'},
        "topic 'a' must map partitions to values",
    ),
    "end-earliest": (
        {"subscribe": "a", "endingOffsets": "earliest"},
        "bad endingOffsets 'earliest': a window can't end at earliest; expected \"latest\"",
    ),
    "end-earliest-json": (
        {"subscribe": "a", "endingOffsets": '{"a":{"0":-2}}'},
        "a/0: an ending offset can't be earliest (-2)",
    ),
    "timestamp-word": (
        {"subscribe": "a", "startingTimestamp": "yesterday"},
        "bad startingTimestamp 'yesterday': not an integer; expected milliseconds since the epoch",
    ),
    "timestamp-negative": (
        {"subscribe": "a", "endingTimestamp": "-5"},
        "bad endingTimestamp '-5': must be >= 0",
    ),
    "by-timestamp-negative": (
        {"subscribe": "a", "endingOffsetsByTimestamp": '{"a":{"0":-1}}'},
        "bad endingOffsetsByTimestamp",
    ),
    "by-timestamp-not-object": (
        {"subscribe": "a", "startingOffsetsByTimestamp": "[1]"},
        "not a JSON object of topics",
    ),
    "reversed-offsets": (
        {"subscribe": "a", "startingOffsets": '{"a":{"0":9}}', "endingOffsets": '{"a":{"0":3}}'},
        "startingOffsets offset 9 is after endingOffsets offset 3 on a/0",
    ),
    "reversed-times": (
        {"subscribe": "a", "startingTimestamp": "2000", "endingTimestamp": "1000"},
        "endingTimestamp 1000 is before startingTimestamp 2000",
    ),
    "reversed-mixed-times": (
        {"subscribe": "a", "startingTimestamp": "2000", "endingOffsetsByTimestamp": '{"a":{"0":1000}}'},
        "endingOffsetsByTimestamp 1000 is before startingTimestamp 2000 on a/0",
    ),
    "min-partitions": ({"subscribe": "a", "minPartitions": "0"}, "bad minPartitions '0': must be >= 1"),
    "max-records": (
        {"subscribe": "a", "maxRecordsPerPartition": "lots"},
        "bad maxRecordsPerPartition 'lots'",
    ),
    "fail-on-data-loss": ({"subscribe": "a", "failOnDataLoss": "maybe"}, "bad failOnDataLoss 'maybe'"),
    "strategy": (
        {"subscribe": "a", "startingOffsetsByTimestampStrategy": "skip"},
        "bad startingOffsetsByTimestampStrategy 'skip'",
    ),
    "case-duplicates": ({"subscribe": "a", "SUBSCRIBE": "b"}, "option SUBSCRIBE is given twice"),
}


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_options_give_one_line_naming_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(PlanError) as info:
        parse_spark_options(options)
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    named = [k for k in options if k.lower() in text.lower()]
    assert named or "subscribe, subscribePattern, assign" in text


def test_multiline_json_is_shown_on_one_line() -> None:
    with pytest.raises(PlanError) as info:
        parse_spark_options({"subscribe": "a", "startingOffsets": '{\n  "a": {"0": "x"}\n}'})
    assert str(info.value).startswith(
        'bad startingOffsets \'{ "a": {"0": "x"} }\': a/0: \'x\' is not an integer'
    )


def test_programmatic_requests_are_checked() -> None:
    with pytest.raises(PlanError, match="exactly one of"):
        WindowRequest()
    with pytest.raises(PlanError, match="endingOffsets can't be earliest"):
        WindowRequest(subscribe=("a",), end=BoundSpec(EARLIEST, option="endingOffsets"))
    with pytest.raises(PlanError, match="is not a bound"):
        BoundSpec(-7)
    with pytest.raises(PlanError, match="milliseconds since the epoch"):
        Timestamp(-1)


# -- plan arithmetic: chunks and JSON -------------------------------------------------------


def plan_of(ranges: Sequence[OffsetRange]) -> ReadPlan:
    return ReadPlan(
        tuple(PartitionPlan(r.topic, r.partition, 0, r.end, r.end, r.start, r.end) for r in ranges)
    )


@st.composite
def plans(draw: st.DrawFn) -> ReadPlan:
    ranges = []
    for topic in ("a", "b")[: draw(st.integers(1, 2))]:
        for partition in range(draw(st.integers(0, 4))):
            start = draw(st.integers(0, 1000))
            ranges.append(OffsetRange(topic, partition, start, start + draw(st.integers(0, 300))))
    return plan_of(ranges)


@settings(max_examples=300, deadline=None)
@given(
    plan=plans(),
    max_records=st.one_of(st.none(), st.integers(1, 120)),
    min_partitions=st.one_of(st.none(), st.integers(1, 40)),
)
def test_chunks_cover_exactly_within_limits(
    plan: ReadPlan, max_records: int | None, min_partitions: int | None
) -> None:
    chunks = plan.chunks(max_records, min_partitions)
    assert all(c.size > 0 for c in chunks)
    assert chunks == sorted(chunks, key=lambda c: (c.topic, c.partition, c.start))
    for r in plan.ranges():  # exact cover, no overlap: consecutive pieces from start to end
        pieces = [c for c in chunks if (c.topic, c.partition) == (r.topic, r.partition)]
        edges = [r.start] + [c.end for c in pieces]
        assert [c.start for c in pieces] == edges[:-1] and edges[-1] == r.end
    if max_records is not None:
        assert all(c.size <= max_records for c in chunks)
    if min_partitions is not None:
        assert len(chunks) >= min(min_partitions, plan.total_offsets)
    if min_partitions is None and max_records is None:
        assert chunks == [r for r in plan.ranges() if r.size]


def test_chunks_are_balanced() -> None:
    plan = plan_of([OffsetRange("a", 0, 0, 100), OffsetRange("a", 1, 0, 10), OffsetRange("a", 2, 5, 5)])
    assert [c.size for c in plan.chunks(min_partitions=4)] == [34, 33, 33, 10]
    assert [c.size for c in plan.chunks(max_records_per_partition=60)] == [50, 50, 10]
    with pytest.raises(PlanError, match="minPartitions must be positive"):
        plan.chunks(min_partitions=0)


@settings(max_examples=100, deadline=None)
@given(plan=plans(), notes=st.lists(st.text(max_size=20), max_size=3), low=st.integers(0, 5))
def test_plan_json_round_trip(plan: ReadPlan, notes: list[str], low: int) -> None:
    parts = tuple(
        PartitionPlan(
            p.topic,
            p.partition,
            low,
            p.high,
            p.listed_high - 1 if p.listed_high else 0,
            p.start,
            p.end,
            OffsetRange(p.topic, p.partition, 0, low) if low else None,
            "search",
            "offset",
            tuple(notes),
        )
        for p in plan.partitions
    )
    full = ReadPlan(parts, tuple(notes))
    assert ReadPlan.from_json(full.to_json()) == full
    assert json.loads(full.to_json())["version"] == 1
