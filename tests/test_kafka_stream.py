"""The ``rewind-kafka`` stream reader against a real broker and real Spark.

What is proven here: a query reads every record once across runs from one checkpoint; a
crash in the middle of a batch and a stop between batches resume without loss or repeat;
``maxOffsetsPerTrigger`` bounds every batch and shares it by backlog; the starting options
are honoured; batch-only options are refused; a batch never ends past the last stable
offset (an open transaction holds a read_committed stream back, without waiting). Every
test that talks to a broker runs on each test broker (tests/brokers.py).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

from rewind.spark.kafka_options import KafkaOptionError
from rewind.spark.kafka_stream import (
    KafkaStreamReader,
    StreamDataLossError,
    StreamPositionError,
    _admit,
)
from rewind.spark.stream_restarts import transient
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic

BASE_TS = 1_760_000_000_000
TRIGGER = "100 milliseconds"


# -- helpers ----------------------------------------------------------------------------------


def new_topic(conf: dict[str, Any], partitions: int) -> str:
    topic = f"stream-{uuid.uuid4().hex[:10]}"
    create_topic(conf, topic, partitions)
    return topic


def produce(conf: dict[str, Any], topic: str, counts: dict[int, range]) -> None:
    """Records with value ``p:o`` at offset ``o`` of partition ``p`` (a fresh topic, in order).

    Timestamps are ``BASE_TS + o * 1000``.
    """
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    errors: list[str] = []
    for partition, offsets in counts.items():
        for o in offsets:
            producer.produce(
                topic,
                key=f"k{o}".encode(),
                value=f"{partition}:{o}".encode(),
                partition=partition,
                timestamp=BASE_TS + o * 1000,
                on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
            )
            producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors


def expected(counts: dict[int, range]) -> set[tuple[int, int, bytes]]:
    return {(p, o, f"{p}:{o}".encode()) for p, offsets in counts.items() for o in offsets}


def stream(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("rewind-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


class Batches:
    """A foreachBatch sink that keeps each batch's rows by batch id (idempotent: a replay
    replaces its batch) and every attempt, and can fail once on a chosen batch after
    seeing its rows, as a crash in the middle of a batch."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.fail_on = fail_on
        self.rows: dict[int, set[tuple[int, int, bytes]]] = {}
        self.attempts: list[tuple[int, set[tuple[int, int, bytes]]]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = {
            (r.partition, r.offset, bytes(r.value))
            for r in df.select("partition", "offset", "value").collect()
        }
        self.attempts.append((batch_id, rows))
        if self.fail_on == batch_id:
            self.fail_on = None
            raise RuntimeError(f"simulated crash in batch {batch_id}")
        self.rows[batch_id] = rows

    def union(self) -> list[tuple[int, int, bytes]]:
        return [row for rows in self.rows.values() for row in rows]


def offset_log(checkpoint: Path) -> dict[int, dict[str, dict[str, int]]]:
    """The source offsets Spark wrote per batch id (the checkpoint's offset log)."""
    out = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            out[int(f.name)] = json.loads(f.read_text().splitlines()[2])
    return out


def committed_batches(checkpoint: Path) -> set[int]:
    return {int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()}


def _settle(query: Any, timeout_s: float = 120) -> None:
    """Wait for the query's end; how it ended is then ``query.exception()``."""
    with contextlib.suppress(Exception):  # awaitTermination raises the query's failure
        query.awaitTermination(timeout_s)


def _first_progress(query: Any, timeout_s: float = 120) -> None:
    """Wait for the query's first micro-batch to finish, or for its end."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.lastProgress is None and time.monotonic() < deadline:
        time.sleep(0.05)


def worker_was_late(query: Any) -> bool:
    """The query ended only because a Python worker it started missed Spark's fixed wait for it
    to connect back (on a loaded machine, before anything is read): the cause Rewind's own
    streams restart for (:func:`rewind.spark.stream_restarts.transient`)."""
    error = None if query.isActive else query.exception()
    return error is not None and transient(error)


def _until_not_late(start: Callable[[], Any], wait: Callable[[Any], None], attempts: int) -> Any:
    """``start()`` a query and ``wait`` on it; again from its checkpoint while it ended only
    because a Python worker was late, at most ``attempts`` times."""
    for _ in range(attempts):
        query = start()
        wait(query)
        if not worker_was_late(query):
            break
    return query


def run_to_end(start: Callable[[], Any], attempts: int = 3) -> Any:
    """Run an availableNow query (``start()`` starts it) to its end and return it, started again
    while a Python worker was late, as Rewind's own streams are (:mod:`rewind.spark.stream_restarts`);
    any other failure is raised, as ``awaitTermination`` raises it, and what the caller checks
    after (every record once) holds across such a restart too."""
    query = _until_not_late(start, _settle, attempts)
    error = query.exception()
    if error is not None:
        raise error
    return query


def started(start: Callable[[], Any], attempts: int = 3) -> Any:
    """A query past its start: ``start()`` it and wait for its first progress (or its end),
    started again while a Python worker was late."""
    return _until_not_late(start, _first_progress, attempts)


def run_available_now(df: Any, checkpoint: Path, sink: Batches) -> None:
    run_to_end(
        lambda: (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
    )


# -- the admission rule, as a pure function -----------------------------------------------------


keys = st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([str(i) for i in range(12)]))


@given(
    backlog=st.dictionaries(keys, st.integers(0, 10_000), max_size=16),
    start=st.integers(0, 10**12),
    limit=st.integers(1, 50_000),
)
def test_admit_bounds_and_shares(backlog: dict[tuple[str, str], int], start: int, limit: int) -> None:
    current = {key: start + i for i, key in enumerate(backlog)}
    ends = _admit(current, backlog, limit)
    assert set(ends) == set(backlog)
    moves = {key: ends[key] - current[key] for key in backlog}
    assert all(0 <= moves[key] <= backlog[key] for key in backlog)  # never past a backlog
    total = sum(backlog.values())
    assert sum(moves.values()) == min(limit, total)  # never past the limit, nothing held back
    for key, waiting in backlog.items():  # all of it when it fits, else its floor share plus at most one
        if total <= limit:
            assert moves[key] == waiting
        else:
            assert limit * waiting // total <= moves[key] <= limit * waiting // total + 1


def test_admit_examples() -> None:
    current = {("t", "0"): 100, ("t", "1"): 0, ("t", "2"): 7}
    assert _admit(current, {("t", "0"): 30, ("t", "1"): 90, ("t", "2"): 0}, 40) == {
        ("t", "0"): 110,
        ("t", "1"): 30,
        ("t", "2"): 7,
    }
    # remainder to the largest backlog; a small limit still moves
    assert _admit(current, {("t", "0"): 5, ("t", "1"): 5, ("t", "2"): 5}, 1) == {
        ("t", "0"): 101,
        ("t", "1"): 0,
        ("t", "2"): 7,
    }
    assert _admit(current, {("t", "0"): 3, ("t", "1"): 0, ("t", "2"): 0}, 1000) == {
        ("t", "0"): 103,
        ("t", "1"): 0,
        ("t", "2"): 7,
    }


# -- options ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["endingOffsets", "ENDINGTIMESTAMP", "endingOffsetsByTimestamp"])
def test_batch_only_options_refused(name: str) -> None:
    canonical = next(
        n
        for n in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
        if n.lower() == name.lower()
    )
    with pytest.raises(KafkaOptionError, match=f"option {canonical} is for batch reads only"):
        KafkaStreamReader({"kafka.bootstrap.servers": "x:1", "subscribe": "t", name: "latest"})


def test_unsupported_stream_options_refused() -> None:
    with pytest.raises(KafkaOptionError, match="minOffsetsPerTrigger is not supported"):
        KafkaStreamReader({"kafka.bootstrap.servers": "x:1", "subscribe": "t", "minOffsetsPerTrigger": "5"})


def test_batch_only_option_is_a_clear_query_error(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    df = stream(spark, bootstrap, "whatever", endingOffsets="latest")
    with pytest.raises(Exception, match="endingOffsets is for batch reads only") as info:
        query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start()
        query.awaitTermination(60)
    assert "remove it from readStream" in str(info.value)


# -- the reader's planning, driven directly (no Spark) --------------------------------------------


def test_reader_planning_against_the_broker(broker_conf: dict[str, Any], broker_bootstrap: str) -> None:
    topic = new_topic(broker_conf, 11)
    produce(broker_conf, topic, {0: range(5), 1: range(12)})
    opts = {"kafka.bootstrap.servers": broker_bootstrap, "subscribe": topic, "rangesPerTask": "2"}
    reader = KafkaStreamReader(opts)
    # a new query: latestOffset before initialOffset, both from the same resolution
    latest = reader.latestOffset()
    assert latest == {topic: {"0": 5, "1": 12, **{str(p): 0 for p in range(2, 11)}}}
    assert reader.initialOffset() == {topic: {str(p): 0 for p in range(11)}}
    # partitions in numeric order, and nothing new gives the same JSON text: no empty batches
    assert list(latest[topic]) == [str(p) for p in range(11)]
    assert json.dumps(reader.latestOffset()) == json.dumps(latest)
    tasks = reader.partitions(reader.initialOffset(), latest)
    assert [sorted((r["partition"], r["start"], r["end"]) for r in t.value) for t in tasks] == [
        [(0, 0, 5), (1, 0, 12)]
    ]

    # a partition the batch's start does not name is read from its first offset (asked from
    # the broker by a reader that has not seen it)
    fresh = KafkaStreamReader({**opts, "rangesPerTask": "1"})
    tasks = fresh.partitions({topic: {"1": 10}}, {topic: {"0": 5, "1": 12, "2": 0}})
    assert sorted([(r["partition"], r["start"], r["end"]) for r in t.value] for t in tasks) == [
        [(0, 0, 5)],
        [(1, 10, 12)],
    ]

    # a batch that moves backwards would re-read: refused
    with pytest.raises(StreamPositionError, match=f"{topic}/1 back from offset 12 to 4"):
        KafkaStreamReader(opts).partitions({topic: {"0": 5, "1": 12}}, {topic: {"0": 5, "1": 4}})


def test_log_shorter_than_the_position_is_data_loss(
    broker_conf: dict[str, Any], broker_bootstrap: str
) -> None:
    """A checkpoint ahead of the log (the topic was recreated): never a silent skip."""
    topic = new_topic(broker_conf, 1)
    produce(broker_conf, topic, {0: range(5)})
    opts = {"kafka.bootstrap.servers": broker_bootstrap, "subscribe": topic}
    checkpointed = {topic: {"0": 100}}
    strict = KafkaStreamReader(opts)
    strict.partitions(checkpointed, checkpointed)  # what Spark calls first on a restart
    with pytest.raises(StreamDataLossError, match=f"{topic}/0 ends at 5, before the stream's position 100"):
        strict.latestOffset()

    lenient = KafkaStreamReader({**opts, "failOnDataLoss": "false"})
    lenient.partitions(checkpointed, checkpointed)
    end = lenient.latestOffset()
    assert end == {topic: {"0": 5}}
    assert lenient.partitions(checkpointed, end) == []  # the lost stretch is reported, not read
    produce(broker_conf, topic, {0: range(5, 8)})
    assert lenient.latestOffset() == {topic: {"0": 8}}


# -- real queries -------------------------------------------------------------------------------


def test_runs_from_one_checkpoint_read_every_record_once(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    """Parquet sink (exactly-once through its log), two availableNow runs, more data between."""
    topic = new_topic(broker_conf, 3)
    first = {0: range(60), 1: range(25), 2: range(0)}
    produce(broker_conf, topic, first)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run() -> None:
        query = run_to_end(
            lambda: (
                stream(spark, broker_bootstrap, topic)
                .select("partition", "offset", "value")
                .writeStream.format("parquet")
                .option("path", str(out))
                .option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
                .start()
            )
        )
        assert query.exception() is None

    run()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in rows) == sorted(expected(first))

    second = {0: range(60, 70), 1: range(25, 65), 2: range(0, 30)}
    produce(broker_conf, topic, second)
    run()
    rows = spark.read.parquet(str(out)).collect()
    got = [(r.partition, r.offset, bytes(r.value)) for r in rows]
    assert len(got) == len(set(got))  # no duplicates
    assert set(got) == expected(first) | expected(second)  # no loss
    assert offset_log(checkpoint)[max(offset_log(checkpoint))] == {topic: {"0": 70, "1": 65, "2": 30}}


def test_crash_and_stop_resume_exactly_once_with_a_batch_limit(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    """maxOffsetsPerTrigger=40 over backlogs 30 and 90; a crash inside batch 1, a stop right
    after its replay, then more data: every record once, every batch within the limit and
    shared by backlog, and each batch starting where the previous one ended (Spark's offset
    log). A restart that planned from the starting offsets instead of the checkpoint would
    re-read (the reader refuses) or skip; both would fail here."""
    topic = new_topic(broker_conf, 2)
    first = {0: range(30), 1: range(90)}
    produce(broker_conf, topic, first)
    checkpoint = tmp_path / "ck"
    sink = Batches(fail_on=1)
    df = stream(spark, broker_bootstrap, topic, maxOffsetsPerTrigger="40")

    def start() -> Any:
        return (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=TRIGGER)
            .start()
        )

    # run 1: batch 0 commits, batch 1 crashes after its rows were seen
    query = started(start)
    with pytest.raises(Exception, match="simulated crash in batch 1"):
        query.awaitTermination(120)
    assert committed_batches(checkpoint) == {0}
    crashed = dict(sink.attempts)[1]

    # run 2: the uncommitted batch 1 is replayed with the same offsets; stop as soon as it is
    # committed, while batch 2 may be planned, running or not yet started
    query = started(start)
    deadline = time.monotonic() + 120
    while 1 not in committed_batches(checkpoint) and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    assert [rows for bid, rows in sink.attempts if bid == 1] == [crashed, crashed]

    # run 3: more data while stopped; the restart continues from the checkpoint
    second = {0: range(30, 40), 1: range(90, 100)}
    produce(broker_conf, topic, second)
    query = started(start)
    query.processAllAvailable()
    query.stop()

    got = sink.union()
    assert len(got) == len(set(got)), "a record was delivered to the sink twice"
    assert set(got) == expected(first) | expected(second)
    for bid, rows in sink.rows.items():
        assert 0 < len(rows) <= 40, f"batch {bid} has {len(rows)} rows"
    # shares by backlog: 30 and 90 waiting, 40 admitted -> 10 and 30; then 20 and 60 -> 10 and 30
    # (batch 2's backlog depends on whether run 2 planned it before the stop)
    for bid in (0, 1):
        per_partition = [sum(1 for p, _o, _v in sink.rows[bid] if p == part) for part in (0, 1)]
        assert per_partition == [10, 30], f"batch {bid}: {per_partition}"
    assert sorted(sink.rows) == [0, 1, 2, 3], "an empty or missing micro-batch"

    # the offset log: each batch moves at most 40 offsets past the previous batch's end
    offsets = offset_log(checkpoint)
    previous = {"0": 0, "1": 0}
    for bid in sorted(offsets):
        now = offsets[bid][topic]
        moves = [now[p] - previous[p] for p in ("0", "1")]
        assert all(m >= 0 for m in moves) and 0 < sum(moves) <= 40, f"batch {bid}: {previous} -> {now}"
        got_offsets = {(p, o) for p, o, _v in sink.rows[bid]}
        assert got_offsets == {(int(p), o) for p in ("0", "1") for o in range(previous[p], now[p])}
        previous = now
    assert previous == {"0": 40, "1": 100}


def test_available_now_with_a_limit_reads_one_batch_per_run(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    """PySpark 4.1 asks a Python source for its latest offset once per availableNow run."""
    topic = new_topic(broker_conf, 1)
    produce(broker_conf, topic, {0: range(15)})
    sink = Batches()
    df = stream(spark, broker_bootstrap, topic, maxOffsetsPerTrigger="10")
    for _ in range(2):
        run_available_now(df, tmp_path / "ck", sink)
    assert [len(sink.rows[b]) for b in sorted(sink.rows)] == [10, 5]
    assert set(sink.union()) == expected({0: range(15)})


def test_starting_offsets_and_timestamp(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    topic = new_topic(broker_conf, 2)
    produce(broker_conf, topic, {0: range(50), 1: range(50)})

    by_offsets = Batches()
    run_available_now(
        stream(spark, broker_bootstrap, topic, startingOffsets=json.dumps({topic: {"0": 10, "1": -2}})),
        tmp_path / "ck1",
        by_offsets,
    )
    assert set(by_offsets.union()) == expected({0: range(10, 50), 1: range(50)})

    by_time = Batches()
    run_available_now(
        stream(spark, broker_bootstrap, topic, startingTimestamp=str(BASE_TS + 30_000)),
        tmp_path / "ck2",
        by_time,
    )
    assert set(by_time.union()) == expected({0: range(30, 50), 1: range(30, 50)})

    # latest: what exists at the start is not read, what comes after is
    from_latest = Batches()
    query = (
        stream(spark, broker_bootstrap, topic, startingOffsets="latest")
        .writeStream.foreachBatch(from_latest)
        .option("checkpointLocation", str(tmp_path / "ck3"))
        .trigger(processingTime=TRIGGER)
        .start()
    )
    try:
        query.processAllAvailable()
        assert from_latest.union() == []
        produce(broker_conf, topic, {0: range(50, 53), 1: range(50, 52)})
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(from_latest.union()) == sorted(expected({0: range(50, 53), 1: range(50, 52)}))


def test_an_open_transaction_ends_the_batch_at_the_last_stable_offset(
    spark: Any, broker: TestBroker, broker_bootstrap: str, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    """Ten committed records, then five in a transaction left open: a batch reads the ten and
    ends at offset 10 at once (a batch ending at the high watermark, 15, would wait for records
    read_committed cannot see and fail after the poll timeout). Once the transaction commits,
    the next run reads the five and ends past the commit marker."""
    broker.require(READ_COMMITTED)
    topic = new_topic(broker_conf, 1)
    produce(broker_conf, topic, {0: range(10)})
    producer = Producer({**broker_conf, "transactional.id": f"open-{topic}"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for o in range(10, 15):
        producer.produce(topic, key=f"k{o}".encode(), value=f"0:{o}".encode(), partition=0)
    producer.flush(15)

    checkpoint, sink = tmp_path / "ck", Batches()
    df = stream(spark, broker_bootstrap, topic, **{"kafkaConsumer.pollTimeoutMs": "5000"})
    run_available_now(df, checkpoint, sink)
    assert set(sink.union()) == expected({0: range(10)})
    assert offset_log(checkpoint)[max(offset_log(checkpoint))] == {topic: {"0": 10}}

    producer.commit_transaction(15)
    run_available_now(df, checkpoint, sink)
    got = sink.union()
    assert len(got) == len(set(got)) and set(got) == expected({0: range(15)})
    assert offset_log(checkpoint)[max(offset_log(checkpoint))][topic]["0"] == 16  # the marker is 15
