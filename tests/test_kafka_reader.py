"""The ``rewind-kafka`` batch reader against a real broker and real Spark.

Exactness first: every test compares what Spark returns with what was produced, record
by record. Runs on every test broker (tests/brokers.py): tansu, noida-db, and the one named
by REWIND_TEST_BOOTSTRAP; a test needing what a broker lacks is skipped there, naming it.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.kafka.resolve import resolve
from rewind.kafka.spark_options import parse_spark_options
from tests.brokers import READ_COMMITTED, TIME_INDEX, TestBroker
from tests.kafka_util import committed, create_topic, produce

BASE_TS = 1_760_000_000_000


def read(spark: Any, broker_bootstrap: str, **options: str) -> list[Any]:
    reader = spark.read.format("rewind-kafka").option("kafka.bootstrap.servers", broker_bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().collect()


@pytest.fixture(scope="module")
def loaded_topic(broker_conf: dict[str, Any]) -> tuple[str, dict[int, int]]:
    """A topic with 4 partitions holding 0, 7, 150 and 1000 records; value = 'p:o'."""
    topic = f"reader-{uuid.uuid4().hex[:8]}"
    counts = {0: 0, 1: 7, 2: 150, 3: 1000}
    create_topic(broker_conf, topic, len(counts))
    records = [
        (p, f"k{o % 13}".encode(), f"{p}:{o}".encode(), BASE_TS + o * 1000)
        for p, n in counts.items()
        for o in range(n)
    ]
    produce(broker_conf, topic, records)
    return topic, counts


def test_schema_matches_spark_kafka_source(
    spark: Any, broker_bootstrap: str, loaded_topic: tuple[str, dict[int, int]]
) -> None:
    topic, _ = loaded_topic
    df = (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", broker_bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )


def test_whole_topic_exact(
    spark: Any, broker_bootstrap: str, loaded_topic: tuple[str, dict[int, int]]
) -> None:
    topic, counts = loaded_topic
    rows = read(spark, broker_bootstrap, subscribe=topic)
    assert len(rows) == sum(counts.values())
    seen = {(r.partition, r.offset) for r in rows}
    assert seen == {(p, o) for p, n in counts.items() for o in range(n)}
    for r in rows:
        assert r.value == f"{r.partition}:{r.offset}".encode()
        assert r.key == f"k{r.offset % 13}".encode()
        assert r.topic == topic
        assert r.timestamp == datetime.fromtimestamp((BASE_TS + r.offset * 1000) / 1000, UTC).replace(
            tzinfo=None
        )
        assert r.timestampType == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_offset_windows_read_exactly_the_planned_ranges(
    spark: Any, broker_bootstrap: str, loaded_topic: tuple[str, dict[int, int]], data: st.DataObject
) -> None:
    topic, counts = loaded_topic
    starts = {str(p): data.draw(st.integers(-2, n + 3), label=f"start{p}") for p, n in counts.items()}
    ends = {
        str(p): data.draw(st.one_of(st.just(-1), st.integers(max(starts[str(p)], 0), n + 5)), label=f"end{p}")
        for p, n in counts.items()
    }
    # at least 25 per chunk: each chunk is a Spark task with its own consumer, and a window of
    # 1,000 records in chunks of 1 costs noida-db minutes (386 s for 12 examples) for no more proof
    # than chunks of 25 give (chunk boundaries inside the partitions of 150 and 1,000 records)
    max_records = data.draw(st.one_of(st.none(), st.integers(25, 400)), label="maxRecordsPerPartition")
    options = {
        "subscribe": topic,
        "startingOffsets": json.dumps({topic: starts}),
        "endingOffsets": json.dumps({topic: ends}),
    }
    if max_records:
        options["maxRecordsPerPartition"] = str(max_records)
    rows = read(spark, broker_bootstrap, **options)
    expected = set()
    for p, n in counts.items():
        lo = 0 if starts[str(p)] == -2 else (n if starts[str(p)] == -1 else min(starts[str(p)], n))
        hi = n if ends[str(p)] == -1 else min(ends[str(p)], n)
        expected |= {(p, o) for o in range(lo, hi)}
    got = [(r.partition, r.offset) for r in rows]
    assert len(got) == len(set(got)), "a record was returned twice"
    assert set(got) == expected
    # offsets of one partition come in order within the result
    for p in counts:
        offsets = [o for q, o in got if q == p]
        assert offsets == sorted(offsets)


def test_chunking_and_min_partitions(
    spark: Any, broker_bootstrap: str, loaded_topic: tuple[str, dict[int, int]]
) -> None:
    topic, counts = loaded_topic
    df = (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", broker_bootstrap)
        .option("subscribe", topic)
        .option("maxRecordsPerPartition", "100")
        .option("rangesPerTask", "1")
        .load()
    )
    # 7 -> 1 chunk, 150 -> 2, 1000 -> 10: one task per chunk with rangesPerTask=1
    assert df.rdd.getNumPartitions() == 13
    assert df.count() == sum(counts.values())
    df = (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", broker_bootstrap)
        .option("subscribe", topic)
        .option("minPartitions", "20")
        .load()
    )
    assert df.rdd.getNumPartitions() >= 20
    assert sorted((r.partition, r.offset) for r in df.collect()) == sorted(
        (p, o) for p, n in counts.items() for o in range(n)
    )


def test_headers_round_trip(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], topic_name: str
) -> None:
    from confluent_kafka import Producer

    create_topic(broker_conf, topic_name, 1)
    producer = Producer(dict(broker_conf))
    producer.produce(topic_name, value=b"a", partition=0, headers=[("h1", b"x"), ("h2", None)])
    producer.produce(topic_name, value=b"b", partition=0)
    assert producer.flush(10) == 0
    rows = read(spark, broker_bootstrap, subscribe=topic_name, includeHeaders="true")
    by_value = {r.value: r for r in rows}
    assert [(h.key, h.value) for h in by_value[b"a"].headers] == [("h1", b"x"), ("h2", None)]
    assert by_value[b"b"].headers is None  # as Spark's source: null when a record has none


def test_time_window_matches_a_correct_lookup(
    spark: Any,
    broker: TestBroker,
    broker_bootstrap: str,
    broker_conf: dict[str, Any],
    loaded_topic: tuple[str, dict[int, int]],
) -> None:
    topic, counts = loaded_topic
    t1, t2 = BASE_TS + 5_500, BASE_TS + 120_000  # offsets 6..119 of every partition
    rows = read(spark, broker_bootstrap, subscribe=topic, startingTimestamp=str(t1), endingTimestamp=str(t2))
    expected = {(p, o) for p, n in counts.items() for o in range(n) if t1 <= BASE_TS + o * 1000 < t2}
    assert {(r.partition, r.offset) for r in rows} == expected
    plan = resolve(
        broker_conf,
        parse_spark_options({"subscribe": topic, "startingTimestamp": str(t1), "endingTimestamp": str(t2)}),
    )
    methods = {p.start_method for p in plan.partitions if p.high > p.low}
    if broker.has(TIME_INDEX):  # the broker's own index answered, and the check agreed
        assert methods == {"list-offsets"}
    else:  # tansu answers 0 for every timestamp: the check refuses it and the search steps in
        assert methods == {"search"}


def test_start_below_declared_log_start_is_reported_and_not_read(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], loaded_topic: tuple[str, dict[int, int]]
) -> None:
    topic, counts = loaded_topic
    request = parse_spark_options({"subscribe": topic, "startingOffsets": "earliest"})
    plan = resolve(broker_conf, request, declared_log_start={(topic, 3): 400})
    p3 = next(p for p in plan.partitions if p.partition == 3)
    assert (p3.start, p3.end) == (400, counts[3])
    assert p3.missing_below_low is not None
    assert (p3.missing_below_low.start, p3.missing_below_low.end) == (0, 400)
    rows = read(spark, broker_bootstrap, subscribe=topic, plan=plan.to_json())
    offsets3 = sorted(r.offset for r in rows if r.partition == 3)
    assert offsets3 == list(range(400, counts[3]))
    assert len(rows) == sum(counts.values()) - 400


def test_partition_ending_on_a_transaction_marker(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], topic_name: str
) -> None:
    from confluent_kafka import Producer

    create_topic(broker_conf, topic_name, 1)
    producer = Producer({**broker_conf, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(10)
    for batch in range(3):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic_name, value=f"c{batch}-{i}".encode(), partition=0)
        producer.commit_transaction(10)
    rows = read(spark, broker_bootstrap, subscribe=topic_name)
    assert sorted(r.value for r in rows) == sorted(f"c{b}-{i}".encode() for b in range(3) for i in range(5))
    offsets = sorted(r.offset for r in rows)
    plan = resolve(broker_conf, parse_spark_options({"subscribe": topic_name}))
    # markers occupy offsets: the log ends past the last record, and the read still ends
    assert plan.partitions[0].high > offsets[-1]


def test_aborted_transactions_are_hidden(
    spark: Any, broker: TestBroker, broker_bootstrap: str, broker_conf: dict[str, Any], topic_name: str
) -> None:
    """The reader reads committed records only (tansu shows aborted ones: doctor reports it)."""
    broker.require(READ_COMMITTED)
    from confluent_kafka import Producer

    create_topic(broker_conf, topic_name, 1)
    producer = Producer({**broker_conf, "transactional.id": f"tx-{topic_name}"})
    producer.init_transactions(10)
    for batch, commit in enumerate([True, False, True, False]):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic_name, value=f"{batch}-{i}".encode(), partition=0)
        if commit:
            producer.commit_transaction(10)
        else:
            producer.abort_transaction(10)
    rows = read(spark, broker_bootstrap, subscribe=topic_name)
    assert sorted(r.value for r in rows) == sorted(f"{b}-{i}".encode() for b in (0, 2) for i in range(4))


def test_reads_never_touch_a_live_groups_offsets(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], loaded_topic: tuple[str, dict[int, int]]
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic, counts = loaded_topic
    group = f"live-{uuid.uuid4().hex[:8]}"
    live = Consumer({**broker_conf, "group.id": group, "enable.auto.commit": False})
    live.commit(offsets=[TopicPartition(topic, p, n // 2) for p, n in counts.items()], asynchronous=False)
    live.close()
    before = committed(broker_conf, group, [(topic, p) for p in counts])
    read(spark, broker_bootstrap, subscribe=topic)
    read(spark, broker_bootstrap, subscribe=topic, startingTimestamp=str(BASE_TS + 3000))
    assert committed(broker_conf, group, [(topic, p) for p in counts]) == before


def test_a_topic_with_nothing_to_read_gives_no_rows(
    spark: Any, broker_bootstrap: str, broker_conf: dict[str, Any], topic_name: str
) -> None:
    """No range to read: Spark runs one placeholder task with no partition (it used to crash)."""
    create_topic(broker_conf, topic_name, 2)
    assert read(spark, broker_bootstrap, subscribe=topic_name) == []


def test_bad_option_is_one_clear_error(
    spark: Any, broker_bootstrap: str, loaded_topic: tuple[str, dict[int, int]]
) -> None:
    topic, _ = loaded_topic
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, broker_bootstrap, subscribe=topic, startingOffsets="{not json")
    with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers"):
        spark.read.format("rewind-kafka").option("subscribe", topic).load().collect()
