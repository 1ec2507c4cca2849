"""The Kafka writer against a real broker: what goes in comes out, failures fail the job.

Records are read back with a plain confluent-kafka consumer on ``assign`` (a group
``subscribe`` takes about 20 s on the embedded broker), until every partition reports EOF.
What goes in comes out and the transactional tests run on each test broker; an aborted
transaction is proven invisible to committed readers where the broker hides it (noida-db).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind.errors import ConfigError
from rewind.spark.kafka_write_options import FORMAT_NAME, WriterOptions
from rewind.spark.kafka_writer import WRITE_ONLY_FORMAT_NAME, KafkaWriteOnlySource, KafkaWriteSummary
from rewind.spark.ratelimit import LocalPacer, RateLimit
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import KEEP_FOREVER

FORMAT = FORMAT_NAME  # the combined rewind-kafka source, whose writer() is make_writer


@dataclass(frozen=True)
class Record:
    partition: Any
    offset: Any
    key: bytes | None
    value: bytes | None
    headers: tuple[Any, ...]
    timestamp_ms: int


@pytest.fixture(scope="module")
def writer_spark(spark):
    from rewind.spark import register

    register(spark)  # rewind-kafka, as a session from rewind.spark.session() has it
    spark.dataSource.register(KafkaWriteOnlySource)
    return spark


def create_topic(conf: dict[str, object], name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import NewTopic

    from rewind.kafka.clients import admin

    client = admin(dict(conf))  # kept alive until the future resolves
    client.create_topics([NewTopic(name, partitions, config=dict(KEEP_FOREVER))])[name].result(timeout=30)
    deadline = time.monotonic() + 15  # creation is asynchronous on a real cluster
    while time.monotonic() < deadline:
        topic = client.list_topics(name, timeout=5).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name} not in metadata after creation")


def read_topic(
    conf: dict[str, object], topic: str, isolation: str = "read_uncommitted", timeout_s: float = 30.0
) -> list[Record]:
    """Every record of every partition, from the beginning to the end of the log.

    Read ``read_uncommitted``, a partition's first record is at its low watermark. Once, under
    a loaded suite, a read from tansu started a partition 100 records late (its first record at
    offset 100 of a topic just written from offset 0): such a read is done once more, and a
    second late start fails."""
    from confluent_kafka import TopicPartition

    from rewind.kafka.clients import private_consumer

    records = _read_from(conf, topic, isolation, timeout_s)
    if isolation != "read_uncommitted":
        return records
    consumer = private_consumer(dict(conf), "test")
    try:
        lows = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
            for p in {r.partition for r in records}
        }
    finally:
        consumer.close()
    late = {p: low for p, low in lows.items() if min(r.offset for r in records if r.partition == p) > low}
    if not late:
        return records
    again = _read_from(conf, topic, isolation, timeout_s)
    firsts = {p: min((r.offset for r in again if r.partition == p), default=None) for p in late}
    assert all(firsts[p] == low for p, low in late.items()), f"{topic}: first offsets {firsts}, low {late}"
    return again


def _read_from(conf: dict[str, object], topic: str, isolation: str, timeout_s: float) -> list[Record]:
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    from rewind.kafka.clients import cluster_metadata, private_consumer

    partitions = sorted(cluster_metadata(dict(conf)).topics[topic].partitions)
    overrides: dict[str, Any] = {"isolation.level": isolation, "fetch.wait.max.ms": 50}
    consumer = private_consumer(dict(conf), "test", **overrides)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise AssertionError(f"read failed: {err}")
                records.append(
                    Record(
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.value(),
                        tuple(msg.headers() or ()),
                        msg.timestamp()[1],
                    )
                )
        assert not pending, f"partitions {pending} of {topic} did not reach their end in {timeout_s}s"
        return records
    finally:
        consumer.close()


def value_of(record: Record) -> bytes:
    assert record.value is not None
    return record.value


def kafka_options(bootstrap: str, **extra: Any) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, **{k: str(v) for k, v in extra.items()}}


def write(df: Any, options: dict[str, str]) -> None:
    df.write.format(FORMAT).options(**options).mode("append").save()


# --------------------------------------------------------------------------------------
# what goes in comes out


def test_all_columns_are_written_exactly(writer_spark, broker_conf, broker_bootstrap, topic_name) -> None:
    """Keys, values, headers, explicit partitions and timestamps arrive byte for byte, in order."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    create_topic(broker_conf, topic_name, partitions=3)
    base = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    rows = []
    for i in range(3000):
        key = None if i % 7 == 0 else f"k{i}".encode()
        value = None if i % 11 == 0 else bytes([i % 256]) * (i % 50) + b"\x00end"
        headers: list[tuple[str, bytes]] | None = (
            [] if i % 3 == 0 else [("seq", str(i).encode()), ("bin", b"\xff\x00" * (i % 4))]
        )
        if i % 5 == 0:
            headers = None
        ts = base + dt.timedelta(milliseconds=i)
        rows.append((key, value, headers, i % 3, ts))
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            ),
            StructField("partition", IntegerType()),
            StructField("timestamp", TimestampType()),
        ]
    )
    df = writer_spark.createDataFrame(rows, schema).coalesce(1)
    write(df, kafka_options(broker_bootstrap, topic=topic_name))

    got = read_topic(broker_conf, topic_name)
    assert len(got) == len(rows)
    for partition in range(3):
        expected = [
            (key, value, tuple(headers or ()), int(ts.timestamp() * 1000))
            for key, value, headers, p, ts in rows
            if p == partition
        ]
        actual = [(r.key, r.value, r.headers, r.timestamp_ms) for r in got if r.partition == partition]
        assert actual == expected  # one task per partition keeps the DataFrame's order


def test_string_columns_many_tasks_and_null_timestamps(
    writer_spark, kafka_conf, bootstrap, topic_name
) -> None:
    """String key/value from several tasks: each record exactly once; no timestamp = produce time."""
    create_topic(kafka_conf, topic_name, partitions=4)
    n = 20_000
    df = writer_spark.range(n).selectExpr("cast(id as string) as key", "concat('v-', id) as value")
    before = int(time.time() * 1000)
    write(df.repartition(4), kafka_options(bootstrap, topic=topic_name))
    after = int(time.time() * 1000)

    got = read_topic(kafka_conf, topic_name)
    assert sorted((r.key, r.value) for r in got) == sorted(
        (str(i).encode(), f"v-{i}".encode()) for i in range(n)
    )
    assert all(before - 1000 <= r.timestamp_ms <= after + 1000 for r in got)
    # one key, one partition: the partitioner is deterministic on the key
    by_key: dict[bytes | None, set[int]] = {}
    for r in got:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert len({p for parts in by_key.values() for p in parts}) > 1


def test_topic_column_routes_records_and_topic_option_wins(
    writer_spark, kafka_conf, bootstrap, topic_name
) -> None:
    a, b, c = f"{topic_name}-a", f"{topic_name}-b", f"{topic_name}-c"
    for t in (a, b, c):
        create_topic(kafka_conf, t)
    df = writer_spark.createDataFrame([(a, "1"), (b, "2"), (a, "3")], "topic string, value string")
    write(df, kafka_options(bootstrap))
    assert sorted(value_of(r) for r in read_topic(kafka_conf, a)) == [b"1", b"3"]
    assert [r.value for r in read_topic(kafka_conf, b)] == [b"2"]

    write(df, kafka_options(bootstrap, topic=c))  # as in Spark: the option overrides the column
    assert sorted(value_of(r) for r in read_topic(kafka_conf, c)) == [b"1", b"2", b"3"]
    assert len(read_topic(kafka_conf, a)) == 2


def test_double_timestamp_is_seconds(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    create_topic(kafka_conf, topic_name)
    df = writer_spark.createDataFrame([("x", 1714564800.123)], "value string, timestamp double")
    write(df, kafka_options(bootstrap, topic=topic_name))
    assert [r.timestamp_ms for r in read_topic(kafka_conf, topic_name)] == [1714564800123]


def test_empty_dataframe_writes_nothing(writer_spark, kafka_conf, bootstrap, topic_name, tmp_path) -> None:
    create_topic(kafka_conf, topic_name)
    summary = tmp_path / "summary.json"
    df = writer_spark.range(0).selectExpr("cast(id as string) as value")
    write(df, kafka_options(bootstrap, topic=topic_name, summaryPath=summary))
    assert read_topic(kafka_conf, topic_name) == []
    assert json.loads(summary.read_text())["records"] == 0


def test_summary_counts_records_and_bytes(writer_spark, kafka_conf, bootstrap, topic_name, tmp_path) -> None:
    create_topic(kafka_conf, topic_name, partitions=2)
    summary = tmp_path / "out" / "summary.json"
    df = writer_spark.range(1000).selectExpr("cast(id % 10 as string) as key", "repeat('y', 20) as value")
    write(df.repartition(3), kafka_options(bootstrap, topic=topic_name, summaryPath=summary))
    totals = json.loads(summary.read_text())
    assert totals["records"] == 1000
    assert totals["bytes"] == 1000 * (1 + 20)
    assert totals["tasks"] == 3
    assert len(read_topic(kafka_conf, topic_name)) == 1000


def test_transactional_writes_are_all_visible_after_commit(
    writer_spark, broker_conf, broker_bootstrap, topic_name
) -> None:
    create_topic(broker_conf, topic_name, partitions=3)
    n = 5000
    df = writer_spark.range(n).selectExpr(
        "cast(id as string) as key", "cast(cast(id as string) as binary) as value"
    )
    options = kafka_options(broker_bootstrap, topic=topic_name, transactional="true", runId=topic_name)
    write(df.repartition(4), options)
    got = read_topic(broker_conf, topic_name, isolation="read_committed")
    assert sorted(int(r.key or b"-1") for r in got) == list(range(n))

    # the same run id again: each task re-initialises its transactional id and commits again
    write(df.limit(10), options)
    assert len(read_topic(broker_conf, topic_name, isolation="read_committed")) == n + 10


# --------------------------------------------------------------------------------------
# failures fail the job, with the broker's words


def test_unknown_partition_fails_the_job_with_the_error(
    writer_spark, kafka_conf, bootstrap, topic_name
) -> None:
    create_topic(kafka_conf, topic_name, partitions=1)
    df = writer_spark.createDataFrame([("a", 0), ("b", 7)], "value string, partition int")
    with pytest.raises(Exception) as caught:
        write(df.coalesce(1), kafka_options(bootstrap, topic=topic_name))
    text = str(caught.value)
    assert "KafkaWriteError" in text
    assert "Unknown partition" in text
    assert topic_name in text and "partition 7" in text


def test_record_too_large_fails_the_job_with_the_error(
    writer_spark, kafka_conf, bootstrap, topic_name
) -> None:
    create_topic(kafka_conf, topic_name)
    df = writer_spark.range(3).selectExpr("repeat('z', 5000) as value")
    with pytest.raises(Exception) as caught:
        write(df, kafka_options(bootstrap, topic=topic_name, **{"kafka.message.max.bytes": 2000}))
    assert "Message size too large" in str(caught.value)


def test_transactional_failure_leaves_nothing_committed(
    writer_spark, broker: TestBroker, broker_conf, broker_bootstrap, topic_name
) -> None:
    """A failing transactional task aborts; committed readers never see its records.

    5,000 good records go first through a producer queue of 100, so batches of the
    transaction reach the log before the bad one fails the task (checked: an uncommitted
    reader sees them). A broker that hands aborted records to ``read_committed`` readers
    (tansu) cannot show the rest: there the test is skipped after that check.
    """
    create_topic(broker_conf, topic_name, partitions=1)
    n = 5000
    df = writer_spark.range(n + 1).selectExpr(
        "cast(id as string) as value", f"if(id = {n}, 5, 0) as partition"
    )
    options = kafka_options(
        broker_bootstrap,
        topic=topic_name,
        transactional="true",
        runId=topic_name,
        # a queue of at most 100 records: most of the 5,000 must be sent before the bad one
        **{
            "kafka.linger.ms": 0,
            "kafka.batch.num.messages": 50,
            "kafka.queue.buffering.max.messages": 100,
        },
    )
    with pytest.raises(Exception, match="Unknown partition"):
        write(df.coalesce(1), options)
    reached = read_topic(broker_conf, topic_name)
    assert len(reached) >= n - 200, f"only {len(reached)} records reached the log before the abort"
    broker.require(READ_COMMITTED)
    assert read_topic(broker_conf, topic_name, isolation="read_committed") == []


@pytest.mark.parametrize(
    ("options", "columns", "message"),
    [
        ({"topic": "t"}, "cast(id as string) as value", "kafka.bootstrap.servers"),
        ({"kafka.bootstrap.servers": "x:1"}, "cast(id as string) as value", "no topic"),
        ({"kafka.bootstrap.servers": "x:1", "topic": "t"}, "cast(id as string) as key", "'value'"),
        ({"kafka.bootstrap.servers": "x:1", "topic": "t"}, "id as value", "binary or string"),
        (
            {"kafka.bootstrap.servers": "x:1", "topic": "t"},
            "cast(id as string) as value, id as heders",
            "'heders'",
        ),
        (
            {"kafka.bootstrap.servers": "x:1", "topic": "t", "transactional": "true"},
            "cast(id as string) as value",
            "runId",
        ),
        (
            {"kafka.bootstrap.servers": "x:1", "topic": "t", "maxRecordsPerSecond": "-5"},
            "cast(id as string) as value",
            "(?i)maxrecordspersecond='-5': expected a positive number",
        ),
        (
            {"kafka.bootstrap.servers": "x:1", "topic": "t", "kafka.no.such.thing": "1"},
            "cast(id as string) as value",
            "No such configuration property",
        ),
    ],
)
def test_bad_options_and_columns_fail_before_writing(writer_spark, options, columns, message) -> None:
    df = writer_spark.range(1).selectExpr(*columns.split(", "))
    with pytest.raises(Exception, match=message):
        write(df, options)


def test_extra_columns_are_ignored_when_asked(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    create_topic(kafka_conf, topic_name)
    df = writer_spark.range(5).selectExpr("cast(id as string) as value", "id as other")
    write(df, kafka_options(bootstrap, topic=topic_name, ignoreExtraColumns="true"))
    assert len(read_topic(kafka_conf, topic_name)) == 5


@pytest.mark.parametrize("fmt", [FORMAT_NAME, WRITE_ONLY_FORMAT_NAME])
def test_overwrite_is_refused(writer_spark, bootstrap, fmt) -> None:
    df = writer_spark.range(1).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="only appends"):
        df.write.format(fmt).options(**kafka_options(bootstrap, topic="t")).mode("overwrite").save()


def test_write_only_source_writes(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    create_topic(kafka_conf, topic_name)
    df = writer_spark.range(3).selectExpr("cast(id as string) as value")
    df.write.format(WRITE_ONLY_FORMAT_NAME).options(**kafka_options(bootstrap, topic=topic_name)).mode(
        "append"
    ).save()
    assert sorted(value_of(r) for r in read_topic(kafka_conf, topic_name)) == [b"0", b"1", b"2"]


def test_options_parse_passes_kafka_properties_through() -> None:
    parsed = WriterOptions.parse(
        {"kafka.bootstrap.servers": "h:1", "kafka.compression.type": "lz4", "kafka.linger.ms": "5"}
    )
    conf = parsed.producer_conf
    assert conf["bootstrap.servers"] == "h:1"
    assert conf["compression.type"] == "lz4"
    assert conf["linger.ms"] == "5"
    assert conf["enable.idempotence"] is True
    with pytest.raises(ConfigError, match=r"transactional\.id"):
        WriterOptions.parse({"kafka.bootstrap.servers": "h:1", "kafka.transactional.id": "x"})


# --------------------------------------------------------------------------------------
# rate limit


def _send_spans(records: list[Record]) -> tuple[float, int]:
    """Seconds between the first and last produce time, and the most records in any 1 s."""
    stamps = sorted(r.timestamp_ms for r in records)
    busiest, lo = 0, 0
    for hi, stamp in enumerate(stamps):
        while stamps[lo] <= stamp - 1000:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    return (stamps[-1] - stamps[0]) / 1000, busiest


def test_records_per_second_is_shared_by_all_tasks(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    """4 tasks (2 at a time) share 4,000 records/s: 16,000 records take about 4 s, never faster."""
    create_topic(kafka_conf, topic_name, partitions=2)
    rate, n = 4000, 16_000
    df = writer_spark.range(n).selectExpr("cast(id as string) as value").repartition(4)
    started = time.monotonic()
    write(df, kafka_options(bootstrap, topic=topic_name, maxRecordsPerSecond=rate))
    elapsed = time.monotonic() - started

    got = read_topic(kafka_conf, topic_name)
    assert len(got) == n
    span, busiest = _send_spans(got)
    ideal = n / rate
    assert span >= ideal * 0.9, f"{n} records went out in {span:.2f}s, limit allows no less than {ideal}s"
    assert busiest <= rate * 1.1, f"{busiest} records in one second, limit {rate}/s"
    # not far below the limit either (loose: a loaded 2-core machine may not reach it)
    assert span <= ideal * 2.0, f"throttled too hard: {span:.2f}s for an ideal {ideal}s"
    assert elapsed >= ideal * 0.9


def test_bytes_per_second_limits_the_job(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    create_topic(kafka_conf, topic_name)
    rate, n, size = 200_000, 500, 1000  # 500 kB at 200 kB/s: 2.5 s
    df = writer_spark.range(n).selectExpr(f"repeat('b', {size}) as value").repartition(2)
    write(df, kafka_options(bootstrap, topic=topic_name, maxBytesPerSecond=rate))
    got = read_topic(kafka_conf, topic_name)
    assert len(got) == n
    span, busiest = _send_spans(got)
    ideal = n * size / rate
    assert ideal * 0.9 <= span <= ideal * 2.0
    assert busiest * size <= rate * 1.1


_HAMMER = """
import sys, time
from pathlib import Path
from rewind.spark.ratelimit import RateLimit, SharedFilePacer
pacer = SharedFilePacer(RateLimit(records_per_second=float(sys.argv[2])), Path(sys.argv[1]))
start = time.monotonic()
sent, stop = 0, start + float(sys.argv[3])
while time.monotonic() < stop:
    pacer.acquire(10, 0, time.sleep)
    sent += 10
print(sent, start, time.monotonic())
"""


def test_shared_file_pacer_holds_across_processes(tmp_path: Path) -> None:
    """Three processes pacing on one file send the limit together, not three times it."""
    rate, seconds = 3000, 1.5
    args = [sys.executable, "-c", _HAMMER, str(tmp_path / "job.pace"), str(rate), str(seconds)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    runs = [p.communicate(timeout=60)[0].split() for p in procs]
    total = sum(int(r[0]) for r in runs)
    # the processes start at different times (much so on a loaded machine): the limit holds
    # over the window in which any of them was sending (time.monotonic is system-wide)
    window = max(float(r[2]) for r in runs) - min(float(r[1]) for r in runs)
    assert total <= rate * window * 1.1 + 30, f"{total} records in {window:.2f}s at {rate}/s"
    # and not far below it: a pacer that held the three to a third of the limit between them
    # would send ~1,500. (0.8 of the limit failed once under CI's load, at 3,580 of 3,600: three
    # Python processes on two busy cores fall short of the limit by themselves.)
    assert total >= rate * seconds * 0.6, f"{total} records in {window:.2f}s at {rate}/s"


def test_pacer_choice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """numTasks splits the cap; a task on another host refuses a host-local shared cap."""
    import socket

    from pyspark.sql.types import StringType, StructField, StructType

    from rewind.spark.kafka_writer import make_writer
    from rewind.spark.ratelimit import SharedFilePacer

    schema = StructType([StructField("value", StringType())])
    base = {"kafka.bootstrap.servers": "h:1", "topic": "t", "maxRecordsPerSecond": "1000"}
    split = make_writer(schema, False, {**base, "numTasks": "4"})._pacer()
    assert isinstance(split, LocalPacer) and split.limit.records_per_second == 250
    shared = make_writer(schema, False, {**base, "rateLimitDir": str(tmp_path)})._pacer()
    assert isinstance(shared, SharedFilePacer) and shared.path.parent == tmp_path
    assert make_writer(schema, False, {"kafka.bootstrap.servers": "h:1", "topic": "t"})._pacer() is None

    writer = make_writer(schema, False, base)
    monkeypatch.setattr(socket, "gethostname", lambda: "some-other-host")
    with pytest.raises(ConfigError, match="numTasks"):
        writer._pacer()


def test_tasks_pace_through_the_drivers_budget(writer_spark, kafka_conf, bootstrap, topic_name) -> None:
    """rateLimitServer: every task of the write asks the driver's budget server (a cluster's way;
    here on local[*]), which wins over numTasks and over the host check."""
    from rewind.spark.pace_server import PACE_OPTION, PaceServer

    create_topic(kafka_conf, topic_name, partitions=2)
    server = PaceServer(RateLimit(50_000))
    try:
        opts = kafka_options(bootstrap, topic=topic_name, maxRecordsPerSecond=50_000)
        df = writer_spark.range(1000).selectExpr("cast(id as string) as value").repartition(2)
        write(df, {**opts, PACE_OPTION: server.address.to_json(), "numTasks": "2"})
        assert server.clients == 2 and server.grants >= 2  # one connection per task
    finally:
        server.close()
    assert len(read_topic(kafka_conf, topic_name)) == 1000
    options = WriterOptions.parse({**opts, PACE_OPTION: server.address.to_json()})
    assert options.rate_limit_server == server.address.to_json()


def test_local_pacer_is_exact() -> None:
    """On a clock that moves only by the waits the pacer asks for (a loaded machine's sleeps
    overshoot, which made a wall-clock sum of the waits swing): records bind, 0.1 s each."""
    now = [100.0]
    asked: list[float] = []

    def wait(seconds: float) -> None:
        asked.append(seconds)
        now[0] += seconds

    pacer = LocalPacer(RateLimit(records_per_second=1000, bytes_per_second=50_000), clock=lambda: now[0])
    waited = [pacer.acquire(100, 1000, wait) for _ in range(5)]
    assert waited == pytest.approx([0.0, 0.1, 0.1, 0.1, 0.1])
    assert asked == pytest.approx([0.1] * 4)
    assert now[0] == pytest.approx(100.4)
    # a wait that overshoots by 30 ms is won back by the next send: the schedule holds
    late = LocalPacer(RateLimit(records_per_second=1000), clock=lambda: now[0])
    late.acquire(100, 0, wait)
    assert late.acquire(100, 0, lambda s: wait(s + 0.03)) == pytest.approx(0.13)
    assert late.acquire(100, 0, wait) == pytest.approx(0.07)
    assert RateLimit(records_per_second=1000).share(4).records_per_second == 250


def test_summary_of_messages() -> None:
    from rewind.spark.kafka_write_task import KafkaWriteCommitMessage

    summary = KafkaWriteSummary.of(
        [KafkaWriteCommitMessage(0, 0, 5, 50, 1.0), None, KafkaWriteCommitMessage(1, 1, 7, 70, 2.0)]
    )
    assert (summary.tasks, summary.records, summary.bytes) == (2, 12, 120)
