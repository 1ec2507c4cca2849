"""The Kafka topic sink against each test broker (tests/brokers.py).

What is checked, and how per broker capability:

* the record format both ways (no broker);
* prepare creates the topic like its source (partitions, copied configs, retention off) and
  finds it again on resume; an explicit topic that holds records is refused;
* commit writes key, JSON value, lineage headers, source partition and source timestamp, and
  records the units; a repeated commit writes nothing;
* a commit killed (SIGKILL) mid-produce, before its marker, or before its transaction ends
  leaves the units uncommitted (or, on a broker that shows aborted records, committed exactly
  when its data is visible), and resume leaves every row in the topic exactly once — on
  every broker. Where brokers differ is atomicity: with working read_committed the killed
  transaction's records are hidden (resume produces them all again); on a broker whose
  read_committed shows aborted records (the doctor's probe says ``wrong-answer``, as on
  tansu 0.6) they are visible, and resume finds and skips them; where read_committed works
  (noida-db) the test reads the topic after the kill and sees none of them;
* promote records the true end offsets and the record count; rollback withdraws; cleanup is
  refused while published and then deletes the topic;
* one job end to end: run_job into a topic, read back through Spark, promote, roll back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from rewind.config import load_settings
from rewind.core.parquet import write_parquet
from rewind.sinks.kafka.bookkeeping import BOOKKEEPING_TOPIC, KafkaStaging
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.records import HEADER_NAMES, RecordEncoder, decode_records
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.translate.lineage import LINEAGE_SCHEMA, event_id
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic, produce

USER = [("order_id", pa.int64()), ("status", pa.string()), ("amount", pa.float64())]
SCHEMA = pa.schema(USER + list(LINEAGE_SCHEMA))
BASE_MS = 1_760_000_000_000
EXTRACTED = datetime(2026, 11, 1, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[1]


# -- helpers -----------------------------------------------------------------------------------


def output_rows(src: str, partition: int, start: int, end: int, run_id: str) -> pa.Table:
    """The output rows a 1:1 translate gives for source offsets [start, end) of one partition."""
    offsets = list(range(start, end))
    n = len(offsets)
    return pa.table(
        {
            "order_id": [partition * 1_000_000 + o for o in offsets],
            "status": ["paid" if o % 3 else "shipped" for o in offsets],
            "amount": [o * 1.25 for o in offsets],
            "_rewind_event_id": [event_id(src, partition, o, "orders", "1", 0) for o in offsets],
            "_rewind_source_topic": [src] * n,
            "_rewind_source_partition": [partition] * n,
            "_rewind_source_offset": offsets,
            "_rewind_source_timestamp": [datetime.fromtimestamp((BASE_MS + o) / 1000, UTC) for o in offsets],
            "_rewind_extracted_at": [EXTRACTED] * n,
            "_rewind_transform": ["orders"] * n,
            "_rewind_transform_version": ["1"] * n,
            "_rewind_run_id": [run_id] * n,
            "_rewind_synthetic": [True] * n,
        },
        schema=SCHEMA,
    )


def unit(src: str, partition: int, start: int, end: int) -> str:
    return f"{src}/{partition}/{start}-{end}"


def write_units(sink: KafkaTopicSink, staging: KafkaStaging, units: list[tuple[int, int, int]]) -> list[str]:
    folder = sink.data_folder(staging)
    src = sink.source_topics[0]
    return [
        write_parquet(folder, output_rows(src, p, s, e, staging.run_id), f"u{p}-{s}") for p, s, e in units
    ]


def counts_extra(unit_ids: list[str]) -> dict[str, str]:
    return {"rewind.unit-counts": json.dumps({u: {"records_read": 1, "rows_out": 1} for u in unit_ids})}


@dataclass
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: dict[str, bytes]


def read_topic(conf: dict[str, Any], topic: str, timeout_s: float = 30.0) -> tuple[list[Rec], dict[int, int]]:
    """Every record a read_committed consumer sees, and the high watermarks from its fetches."""
    admin = AdminClient(dict(conf))
    parts = sorted(admin.list_topics(topic=topic, timeout=10).topics[topic].partitions)
    consumer = Consumer(
        {
            **conf,
            "group.id": f"t-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Rec] = []
        pending = set(parts)
        deadline = time.monotonic() + timeout_s
        while pending:
            assert time.monotonic() < deadline, f"{topic}: no end of partition on {pending}"
            for msg in consumer.consume(num_messages=5000, timeout=0.5):
                err = msg.error()
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    pending.discard(partition)
                    continue
                headers: dict[str, Any] = dict(msg.headers() or [])
                out.append(Rec(partition, offset, msg.key(), msg.value(), msg.timestamp()[1], headers))
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1] for p in parts}
        return out, highs
    finally:
        consumer.close()


def topic_configs(conf: dict[str, Any], topic: str) -> dict[str, str]:
    admin = AdminClient(dict(conf))
    [fut] = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return {name: entry.value for name, entry in fut.result(timeout=10).items()}


def topic_exists(conf: dict[str, Any], topic: str) -> bool:
    return topic in AdminClient(dict(conf)).list_topics(timeout=10).topics


def new_sink(conf: dict[str, Any], src: str, tmp: Path, **kwargs: Any) -> KafkaTopicSink:
    return KafkaTopicSink(conf, source_topics=[src], key=["order_id"], spool_dir=tmp / "spool", **kwargs)


# -- the record format ---------------------------------------------------------------------------


def test_record_format_round_trip() -> None:
    """Every documented type survives encode → Kafka record → decode; keys follow the rules."""
    user = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("price", pa.decimal128(10, 2)),
            ("seen", pa.timestamp("us", "UTC")),
            ("day", pa.date32()),
            ("blob", pa.binary()),
            ("ok", pa.bool_()),
            ("ratio", pa.float64()),
        ]
    )
    schema = pa.schema(list(user) + list(LINEAGE_SCHEMA))
    base = output_rows("orders", 1, 10, 13, "r-1")
    table = pa.table(
        {
            "id": [1, 2, None],
            "name": ["a", 'quote " and \n newline', None],
            "price": [Decimal("12.50"), Decimal("-0.01"), None],
            "seen": [datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), None, EXTRACTED],
            "day": [datetime(2026, 1, 2).date(), None, datetime(1999, 12, 31).date()],
            "blob": [b"\x00\xff", None, b""],
            "ok": [True, False, None],
            "ratio": [0.5, float("nan"), None],
            **{name: base.column(name) for name in LINEAGE_SCHEMA.names},
        },
        schema=schema,
    )
    batch = table.to_batches()[0]
    encoder = RecordEncoder(schema, ["name"])
    encoded = encoder.encode(batch)
    values = encoder.values(encoded)
    assert json.loads(values[0]) == {
        "id": 1,
        "name": "a",
        "price": "12.50",
        "seen": "2026-01-02T03:04:05.678901Z",
        "day": "2026-01-02",
        "blob": "AP8=",
        "ok": True,
        "ratio": 0.5,
    }
    assert json.loads(values[1])["ratio"] is None  # NaN: JSON has none
    assert encoded.keys[:2] == ["a", 'quote " and \n newline']
    assert encoded.timestamps == [BASE_MS + 10, BASE_MS + 11, BASE_MS + 12]
    assert [h[0] for h in encoded.headers[0]] == list(HEADER_NAMES)
    assert dict(encoded.headers[2])["rewind.source"] == "orders/1/12"
    assert dict(encoded.headers[0])["rewind.extracted-at"] == "2026-11-01T00:00:00.000000Z"
    # keys: a number as JSON text, several columns as a JSON object, none as the event id
    assert RecordEncoder(schema, ["id"]).encode(batch).keys == [b"1", b"2", None]
    composite = RecordEncoder(schema, ["id", "ok"]).encode(batch).keys
    assert json.loads(composite[0]) == {"id": 1, "ok": True}
    assert RecordEncoder(schema, []).encode(batch).keys == encoded.event_ids

    header = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    records = pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.binary()),
            pa.array(
                [datetime.fromtimestamp(ms / 1000, UTC) for ms in encoded.timestamps],
                pa.timestamp("us", "UTC"),
            ),
            pa.array([[(k, str(v).encode()) for k, v in h] for h in encoded.headers], header),
        ],
        names=["value", "timestamp", "headers"],
    )
    back = decode_records(records, schema).to_pydict()
    expected = table.to_pydict()
    expected["ratio"] = [0.5, None, None]
    assert back == expected
    assert decode_records(records, schema, run_id="another-run").num_rows == 0


# -- a committed staging, shared by the tests below ----------------------------------------------


@dataclass
class Staged:
    conf: dict[str, Any]
    src: str
    sink: KafkaTopicSink
    staging: KafkaStaging
    units: list[str]
    commits: list[dict[str, Any]]
    tmp: Path


SOURCE_PARTITIONS = 3
ROWS_PER_UNIT = 400


@pytest.fixture(scope="module")
def staged(broker_conf: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Staged:
    conf = dict(broker_conf)
    tmp = tmp_path_factory.mktemp("sink-kafka")
    src = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(conf)
    new = NewTopic(
        src, SOURCE_PARTITIONS, 1, config={"max.message.bytes": "2000000", "retention.ms": "3600000"}
    )
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=15)
    deadline = time.monotonic() + 15
    while len(admin.list_topics(topic=src, timeout=5).topics[src].partitions) < SOURCE_PARTITIONS:
        assert time.monotonic() < deadline, f"{src} not in metadata"
        time.sleep(0.05)
    sink = new_sink(conf, src, tmp)
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    staging = sink.prepare(run_id, SCHEMA, new_run=True)  # as the runner does for a run's first attempt
    spans = [(p, 0, ROWS_PER_UNIT) for p in range(SOURCE_PARTITIONS)]
    units = [unit(src, p, s, e) for p, s, e in spans]
    files = write_units(sink, staging, spans)
    first = sink.commit(staging, run_id, units[:2], files[:2], extra=counts_extra(units[:2]))
    second = sink.commit(staging, run_id, units[2:], files[2:], extra=counts_extra(units[2:]))
    return Staged(conf, src, sink, staging, units, [first, second], tmp)


def test_prepare_creates_the_topic_like_its_source(staged: Staged) -> None:
    staging = staged.staging
    assert staging.topic == f"{staged.src}.backfill.{staging.run_id}"
    assert staging.partitions == SOURCE_PARTITIONS and staging.created
    meta = AdminClient(dict(staged.conf)).list_topics(topic=staging.topic, timeout=10).topics[staging.topic]
    assert len(meta.partitions) == SOURCE_PARTITIONS
    configs = topic_configs(staged.conf, staging.topic)
    assert configs["max.message.bytes"] == "2000000"  # copied from the source
    assert configs["retention.ms"] == "-1"  # not copied: the records carry old source timestamps
    assert configs["message.timestamp.type"] == "CreateTime"
    # resume: the same staging, from the bookkeeping the new run's prepare wrote, and no second topic
    again = new_sink(staged.conf, staged.src, staged.tmp).prepare(staging.run_id, SCHEMA)
    assert again == staging
    # an explicit topic that holds records is not a backfill's own topic
    explicit = new_sink(staged.conf, staged.src, staged.tmp, topic=staging.topic)
    with pytest.raises(KafkaSinkError, match="already exists and holds"):
        explicit.check(SCHEMA)
    with pytest.raises(KafkaSinkError, match="already exists and holds"):
        explicit.prepare(f"r-{uuid.uuid4().hex[:8]}", SCHEMA)


def test_a_run_reads_its_log_from_its_prepared_record(staged: Staged) -> None:
    """The bookkeeping partition holds every run that hashes to it: a prepared run reads its own
    records from its ``prepared`` record on, and finds there all it finds from the start."""
    from rewind.sinks.kafka.bookkeeping import bookkeeping_partition, read_run_log, staged_run_log

    conf, partition = staged.conf, bookkeeping_partition(staged.staging.run_id)
    # a second run in the same partition, after the first run's records
    ids = (f"r-{uuid.uuid4().hex[:8]}" for _ in range(1000))
    later_id = next(r for r in ids if bookkeeping_partition(r) == partition)
    later = new_sink(conf, staged.src, staged.tmp).prepare(later_id, SCHEMA, new_run=True)
    assert later.log_start > staged.staging.log_start  # past the first run's prepared record and commits
    for staging, units in ((staged.staging, set(staged.units)), (later, set())):
        consumer = Consumer({**conf, "group.id": f"t-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(BOOKKEEPING_TOPIC, partition, staging.log_start)])
            first = consumer.poll(10)
        finally:
            consumer.close()
        assert first is not None and first.error() is None
        assert (first.offset(), first.key()) == (staging.log_start, f"{staging.run_id}/prepared".encode())
        whole = read_run_log(conf, BOOKKEEPING_TOPIC, staging.run_id)
        own = staged_run_log(conf, staging)
        assert own.units() == whole.units() == units
        assert (own.commits, own.prepared) == (whole.commits, whole.prepared)
        assert own.prepared_offset == whole.prepared_offset == staging.log_start
    # resumed, the later run finds its staging, offset included, again
    assert new_sink(conf, staged.src, staged.tmp).prepare(later_id, SCHEMA) == later
    # a staging recorded before Rewind kept the offset reads the whole partition, as it did
    older = KafkaStaging.from_dict({k: v for k, v in staged.staging.to_dict().items() if k != "log_start"})
    assert older.log_start == 0
    assert staged_run_log(conf, older).units() == set(staged.units)


def test_commit_writes_keyed_records_with_lineage(staged: Staged) -> None:
    staging, run_id = staged.staging, staged.staging.run_id
    assert [c["rows"] for c in staged.commits] == [2 * ROWS_PER_UNIT, ROWS_PER_UNIT]
    assert staged.sink.committed_units(staging, run_id) == set(staged.units)
    assert set(staged.sink.committed_counts(staging, run_id)) == set(staged.units)
    records, _highs = read_topic(staged.conf, staging.topic)
    assert len(records) == SOURCE_PARTITIONS * ROWS_PER_UNIT
    by_source = {}
    for rec in records:
        src_topic, partition, offset = rec.headers["rewind.source"].decode().split("/")
        assert src_topic == staged.src
        by_source[(int(partition), int(offset))] = rec
    for p in range(SOURCE_PARTITIONS):
        for o in range(ROWS_PER_UNIT):
            rec = by_source[(p, o)]
            order_id = p * 1_000_000 + o
            assert rec.partition == p  # same partition count: the source partition is kept
            assert rec.key == str(order_id).encode()
            assert json.loads(rec.value or b"") == {
                "order_id": order_id,
                "status": "paid" if o % 3 else "shipped",
                "amount": o * 1.25,
            }
            assert rec.timestamp == BASE_MS + o
            assert rec.headers == {
                "rewind.event-id": event_id(staged.src, p, o, "orders", "1", 0).encode(),
                "rewind.source": f"{staged.src}/{p}/{o}".encode(),
                "rewind.transform": b"orders",
                "rewind.version": b"1",
                "rewind.run-id": run_id.encode(),
                "rewind.synthetic": b"true",
                "rewind.extracted-at": b"2026-11-01T00:00:00.000000Z",
            }
    # per-key (and per source partition) order is the source's
    for p in range(SOURCE_PARTITIONS):
        mine = sorted((r for r in records if r.partition == p), key=lambda r: r.offset)
        assert [int(r.headers["rewind.source"].split(b"/")[2]) for r in mine] == list(range(ROWS_PER_UNIT))
    # a repeated commit is a no-op
    again = staged.sink.commit(staging, run_id, staged.units[:1], [], extra=counts_extra(staged.units[:1]))
    assert again["produced"] == 0
    assert len(read_topic(staged.conf, staging.topic)[0]) == len(records)


def test_records_are_placed_by_key_when_partition_counts_differ(staged: Staged) -> None:
    """Another partition count: the murmur2 partitioner places each record by key, as Java would."""
    sink = new_sink(staged.conf, staged.src, staged.tmp, partitions=2, transactional=True)
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    staging = sink.prepare(run_id, SCHEMA)
    assert staging.partitions == 2 and not staging.same_partition_topics
    files = write_units(sink, staging, [(0, 0, 200), (1, 0, 200)])
    sink.commit(staging, run_id, [unit(staged.src, 0, 0, 200), unit(staged.src, 1, 0, 200)], files)
    records, _ = read_topic(staged.conf, staging.topic)
    assert len(records) == 400
    # the partitions a plain producer with the same partitioner picks for the same keys
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    create_topic(staged.conf, probe, 2)
    placed: dict[Any, Any] = {}
    producer = Producer({**staged.conf, "partitioner": "murmur2_random"})
    for rec in records:
        assert rec.key is not None
        producer.produce(
            probe, b"", rec.key, on_delivery=lambda _e, m: placed.__setitem__(m.key(), m.partition())
        )
    assert producer.flush(15) == 0
    assert {r.key: r.partition for r in records} == placed
    assert {r.partition for r in records} == {0, 1}


# -- crashes -----------------------------------------------------------------------------------

KILLED_ROWS_PER_UNIT = 12_000  # a file is read in batches of 20k rows: one batch per unit

_COMMIT_SCRIPT = """
import json, sys
from rewind.sinks.kafka.bookkeeping import KafkaStaging
from rewind.sinks.kafka.sink import KafkaTopicSink
args = json.loads(sys.argv[1])
sink = KafkaTopicSink(
    args["conf"], source_topics=[args["src"]], key=["order_id"], spool_dir=args["spool"],
    bookkeeping=args["staging"]["bookkeeping"],
)
staging = KafkaStaging.from_dict(args["staging"])
sink.commit(staging, staging.run_id, args["units"], args["files"], extra=args["extra"])
print("committed")
"""


@pytest.mark.parametrize(
    ("fault", "transactional"),
    [
        ("kafka-commit-mid-produce:2", True),
        ("kafka-commit-before-marker", False),
        ("kafka-commit-before-end", True),
    ],
)
def test_a_killed_commit_resumes_exactly_once(
    staged: Staged, broker: TestBroker, fault: str, transactional: bool
) -> None:
    conf, src = staged.conf, staged.src
    sink = new_sink(conf, src, staged.tmp, transactional=transactional)
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    staging = sink.prepare(run_id, SCHEMA)
    spans = [(p, 0, KILLED_ROWS_PER_UNIT) for p in range(SOURCE_PARTITIONS)]
    units = [unit(src, p, s, e) for p, s, e in spans]
    files = write_units(sink, staging, spans)
    rows = KILLED_ROWS_PER_UNIT * SOURCE_PARTITIONS
    args = {
        "conf": conf,
        "src": src,
        "spool": str(staged.tmp / "spool"),
        "staging": staging.to_dict(),
        "units": units,
        "files": files,
        "extra": counts_extra(units),
    }
    env = {**os.environ, "REWIND_FAULT": fault, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", _COMMIT_SCRIPT, json.dumps(args)], env=env, capture_output=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]

    # resume, as the runner does it: prepare finds the staging again (fencing a zombie
    # transaction that holds rewind.commits back), then the sink says which units are done
    resumed = new_sink(conf, src, staged.tmp, transactional=transactional)
    assert resumed.prepare(run_id, SCHEMA) == staging
    held = resumed.committed_units(staging, run_id)
    aborted_visible = staging.read_committed != "supported"
    if transactional and not aborted_visible:
        # the killed transaction was fenced and aborted: a committed reader sees none of it
        assert read_topic(conf, staging.topic)[0] == []
    if fault == "kafka-commit-before-end" and aborted_visible:
        # the marker of the fenced transaction is visible, and so is all its data
        assert held == set(units)
    else:
        assert held == set()
    result = resumed.commit(staging, run_id, units, files, extra=counts_extra(units))

    records, highs = read_topic(conf, staging.topic)
    ids = [r.headers["rewind.event-id"] for r in records]
    expected = {event_id(src, p, o, "orders", "1", 0).encode() for p, s, e in spans for o in range(s, e)}
    assert len(ids) == rows and set(ids) == expected  # every row exactly once
    assert resumed.committed_units(staging, run_id) == set(units)
    if fault == "kafka-commit-before-marker":
        assert result["already_present"] == rows  # everything had landed: only the marker was written
    elif held:
        assert result.get("repeat")
    elif aborted_visible:
        # the broker shows the aborted attempt's records (doctor: read_committed wrong-answer);
        # resume found them and did not write them again
        assert 0 < result["already_present"] < rows
    else:
        assert result["already_present"] == 0 and result["produced"] == rows
    if transactional:
        assert staging.read_committed in ("supported", "wrong-answer")
        # what the doctor's probe says: the gap on tansu, working on noida-db
        assert staging.read_committed == ("supported" if broker.has(READ_COMMITTED) else "wrong-answer")
        # transaction markers occupy offsets: the topic spans more offsets than records
        assert sum(highs.values()) > rows


# -- publishing --------------------------------------------------------------------------------


def test_promote_rollback_cleanup(staged: Staged) -> None:
    sink, staging = staged.sink, staged.staging
    records, highs = read_topic(staged.conf, staging.topic)
    swap = sink.promote(staging)
    assert not swap.already_done and swap.before is None
    assert swap.after["end_offsets"] == {str(p): h for p, h in highs.items()}
    assert swap.after["records"] == len(records) == sum(highs.values())  # not transactional: no gaps
    assert (sink.publication(staging.run_id) or {}).get("state") == "published"
    assert sink.promote(staging).already_done
    with pytest.raises(KafkaSinkError, match="rollback"):
        sink.cleanup(staging)
    assert topic_exists(staged.conf, staging.topic)

    back = sink.rollback(staging, swap.to_dict())
    assert not back.already_done and back.after["state"] == "withdrawn"
    assert sink.rollback(staging, swap.to_dict()).already_done
    assert (sink.publication(staging.run_id) or {}).get("state") == "withdrawn"

    done = sink.cleanup(staging)
    assert done["deleted"] and done["spool_removed"]
    assert not topic_exists(staged.conf, staging.topic)
    assert sink.cleanup(staging)["already_gone"]
    with pytest.raises(KafkaSinkError, match="cleanup"):
        sink.prepare(staging.run_id, SCHEMA)
    assert topic_exists(staged.conf, BOOKKEEPING_TOPIC)


# -- one job end to end ----------------------------------------------------------------------


def test_job_end_to_end(broker_bootstrap: str, spark: Any, tmp_path: Path) -> None:
    from rewind.job.components import make_sink
    from rewind.job.publish import promote_run, rollback_run
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker_bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    conf = settings.kafka_config()
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 2)
    events: list[tuple[int, bytes | None, bytes | None, int | None]] = []
    for i in range(600):
        status = "test" if i % 10 == 0 else "paid"
        amount = -1.0 if i % 25 == 1 else i * 0.5
        value = json.dumps({"order_id": i, "status": status, "amount": amount}).encode()
        events.append((i % 2, str(i).encode(), value, BASE_MS + i))
    produce(conf, src, events)
    target = f"{src}-backfill"
    spec = parse_spec(
        {
            "name": "orders-to-topic",
            "source": {"kafka": {"topics": [src]}},
            "decode": {
                "format": "json",
                "schema": {"order_id": "long", "status": "string", "amount": "double"},
            },
            "translate": {
                "function": "tests.job_fixtures:order_amounts",
                "version": "1",
                "output_schema": {"order_id": "long", "status": "string", "amount": "double"},
            },
            "key": ["order_id"],
            "sink": {"kafka": {"topic": target, "transactional": True}},
            "run": {"work_unit_records": 300},
        }
    )
    outcome = run_job(settings, spec)  # 2 units, one wave
    assert outcome.state == "succeeded"
    kept = [i for i in range(600) if i % 10 != 0 and i % 25 != 1]
    assert outcome.counts.rows_out == len(kept)

    sink = make_sink(settings, spec)
    assert isinstance(sink, KafkaTopicSink)
    staging = sink.staging_from_dict(outcome.staging)
    rows = sink.read(spark, staging).orderBy("order_id").collect()
    assert [r["order_id"] for r in rows] == kept
    first = rows[0].asDict()
    assert first["amount"] == kept[0] * 0.5 and first["_rewind_synthetic"] is True
    assert first["_rewind_source_topic"] == src and first["_rewind_source_offset"] == kept[0] // 2
    stamp = first["_rewind_source_timestamp"]  # Spark gives naive times in the session zone (UTC)
    assert stamp.replace(tzinfo=UTC) == datetime.fromtimestamp((BASE_MS + kept[0]) / 1000, UTC)

    promoted = promote_run(settings, outcome.run_id, force=True, reason="test: not verified")
    assert promoted["state"] == "promoted" and promoted["forced"]
    assert promoted["swap"]["after"]["records"] == len(kept)
    rolled = rollback_run(settings, outcome.run_id)
    assert rolled["swap"]["after"] == {"topic": target, "state": "withdrawn"}
    assert sink.cleanup(staging)["deleted"]
