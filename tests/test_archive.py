"""``rewind archive`` against a real broker, real Spark and a real Iceberg SQL catalog.

Proven here: passes are incremental and exact (every offset once, every column as produced,
the high-water in the same commit as the data); the schema is the documented one and stays
the same across passes; offsets the broker skips (transaction markers) are recorded as gaps;
aborted transactions are not archived where the broker honours ``read_committed`` (and the
embedded broker's failure to is detected, not faked); a pass racing another is refused;
compaction keeps every row and the high-water; a continuous archive picks up new records and
a replayed micro-batch commits nothing twice. Crashes mid-commit: ``test_archive_faults.py``.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from rewind.config import Settings, load_settings
from rewind.core.ranges import OffsetRange
from rewind.history.archive import ContinuousArchive, archive_once
from rewind.history.archive_pass import ArchivePass, commit_pass, plan_pass, write_ranges
from rewind.history.compact import compact_archive
from rewind.history.exceptions import ArchiveConflictError
from rewind.history.schema import (
    COLUMNS,
    HW_PROPERTY,
    archive_state,
    iceberg_schema,
    open_archive,
    recorded_gaps,
    summary_properties,
)
from rewind.kafka.capabilities import probe_capabilities
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic

BASE_TS = 1_760_000_000_000


@pytest.fixture(scope="module")
def hist(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> Settings:
    tmp = tmp_path_factory.mktemp("archive")
    return load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp)}, cwd=tmp)


def produce(
    conf: dict[str, Any], topic: str, partitions: int, start: int, count: int
) -> list[dict[str, Any]]:
    """Records ``i`` in [start, start+count) to partition ``i % partitions``; every third has headers."""
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    sent = []
    for i in range(start, start + count):
        headers = [("h", b"%d" % i), ("empty", None)] if i % 3 == 0 else None
        value = None if i % 17 == 0 else b"value-%d" % i  # tombstones too
        rec = {"partition": i % partitions, "key": b"k%d" % (i % 7), "value": value, "ts": BASE_TS + i * 1000}
        producer.produce(
            topic,
            key=rec["key"],
            value=value,
            partition=rec["partition"],
            timestamp=rec["ts"],
            headers=headers,
        )
        rec["headers"] = headers
        sent.append(rec)
    assert producer.flush(30) == 0
    return sent


def archived_rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    """Every archived row, read from the table's live files with pyarrow.

    Not through pyiceberg's ``scan().to_arrow()``: pyiceberg 0.12 turns a null list (a record
    without headers) into an empty list when it reads.
    """
    import pyarrow.parquet as pq

    from rewind.catalog import load_catalog

    iceberg = load_catalog(settings).load_table(table)
    rows: list[dict[str, Any]] = []
    for task in iceberg.scan().plan_files():
        with iceberg.io.new_input(task.file.file_path).open() as stream:
            rows += pq.read_table(stream).to_pylist()
    return rows


def assert_exactly(rows: list[dict[str, Any]], topic: str, expected: dict[int, int]) -> None:
    """Every offset [0, n) of each partition exactly once."""
    counts = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    assert all(c == 1 for c in counts.values()), [k for k, c in counts.items() if c > 1][:5]
    for partition, n in expected.items():
        got = sorted(o for (t, p, o) in counts if t == topic and p == partition)
        assert got == list(range(n)), (partition, got[:5], len(got), n)


def test_passes_are_incremental_exact_and_keep_the_schema(hist: Settings, spark: Any) -> None:
    conf = hist.kafka_config()
    topic = f"arch-{uuid.uuid4().hex[:8]}"
    table = f"lake.a_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    sent = produce(conf, topic, 2, 0, 300)

    first = archive_once(hist, [topic], table, spark=spark)
    assert first.committed and first.records == 300 and first.skipped_offsets == 0
    assert first.partitions == {
        f"{topic}/0": {"from": 0, "to": 150, "records": 150, "skipped": 0},
        f"{topic}/1": {"from": 0, "to": 150, "records": 150, "skipped": 0},
    }
    from rewind.catalog import load_catalog

    iceberg = load_catalog(hist).load_table(table)
    schema_before = iceberg.schema()
    assert schema_before == iceberg_schema() and [f.name for f in schema_before.fields] == list(COLUMNS)
    assert str(iceberg.spec().fields[0].transform) == "day"
    props = summary_properties(iceberg.current_snapshot())
    assert json.loads(props[HW_PROPERTY]) == {f"{topic}/0": 150, f"{topic}/1": 150}

    sent += produce(conf, topic, 2, 300, 101)
    second = archive_once(hist, [topic], table, spark=spark, via="reader")  # the rewind-kafka reader path
    assert second.records == 101
    assert second.partitions[f"{topic}/0"]["from"] == 150
    third = archive_once(hist, [topic], table, spark=spark)
    assert not third.committed and third.records == 0

    iceberg = load_catalog(hist).load_table(table)
    assert iceberg.schema() == schema_before  # stable across runs
    assert archive_state(iceberg).hw == {(topic, 0): 201, (topic, 1): 200}
    rows = archived_rows(hist, table)
    assert_exactly(rows, topic, {0: 201, 1: 200})
    by_coord = {(r["partition"], r["offset"]): r for r in rows}
    positions = Counter()
    for rec in sent:  # each partition's records land at consecutive offsets in send order
        offset = positions[rec["partition"]]
        positions[rec["partition"]] += 1
        row = by_coord[(rec["partition"], offset)]
        assert (row["key"], row["value"]) == (rec["key"], rec["value"])
        assert int(row["timestamp"].timestamp() * 1000) == rec["ts"]
        assert row["event_date"] == row["timestamp"].date()
        assert row["timestamp_type"] == 0
        expected_headers = [{"key": k, "value": v} for k, v in rec["headers"]] if rec["headers"] else None
        assert row["headers"] == expected_headers


def test_transaction_markers_are_recorded_as_skipped_gaps(hist: Settings, spark: Any) -> None:
    conf = hist.kafka_config()
    topic = f"arch-tx-{uuid.uuid4().hex[:8]}"
    table = f"lake.tx_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    producer = Producer({**conf, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(15)
    for t in range(3):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=b"t%d-%d" % (t, i), partition=0)
        producer.commit_transaction(15)

    result = archive_once(hist, [topic], table, spark=spark)
    records = sorted(r["offset"] for r in archived_rows(hist, table))
    assert len(records) == 15
    from rewind.catalog import load_catalog

    high = archive_state(open_archive(load_catalog(hist), table)).hw[(topic, 0)]
    assert high == 15 + 3  # each transaction's commit marker took an offset; the partition ends on one
    expected_gaps = [(o, o + 1) for o in range(high) if o not in set(records)]
    gaps = recorded_gaps(load_catalog(hist), table)
    assert gaps == {((topic, 0), "skipped"): expected_gaps}
    assert result.skipped_offsets == len(expected_gaps) == 3


def test_aborted_transactions_are_not_archived(hist: Settings, broker: TestBroker, spark: Any) -> None:
    """Run on each broker: where aborted records are shown to read_committed (tansu) the probe
    must say so and the archive cannot be checked for it; elsewhere (noida-db) it is."""
    hist = hist.model_copy(
        update={"kafka": hist.kafka.model_copy(update={"bootstrap_servers": broker.bootstrap})}
    )
    if not broker.has(READ_COMMITTED):
        caps = {c.name: c for c in probe_capabilities(hist.kafka_config(), join_timeout_s=1.0)}
        assert caps["read_committed"].status == "wrong-answer", caps["read_committed"]
    broker.require(READ_COMMITTED)
    conf = hist.kafka_config()
    topic = f"arch-abort-{uuid.uuid4().hex[:8]}"
    table = f"lake.ab_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    producer = Producer({**conf, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(15)
    for t, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, value=b"%s-%d-%d" % (b"ok" if commit else b"aborted", t, i), partition=0)
        if commit:
            producer.commit_transaction(15)
        else:
            producer.flush(15)  # the aborted records reach the log (abort purges what is queued)
            producer.abort_transaction(15)
    archive_once(hist, [topic], table, spark=spark)
    rows = archived_rows(hist, table)
    assert sorted(r["value"] for r in rows) == sorted(b"ok-%d-%d" % (t, i) for t in (0, 2) for i in range(4))
    from rewind.catalog import load_catalog

    skipped = recorded_gaps(load_catalog(hist), table)[((topic, 0), "skipped")]
    assert sum(e - s for s, e in skipped) >= 4 + 3  # the aborted records and the markers


def test_a_pass_racing_another_is_refused(hist: Settings, spark: Any) -> None:
    from rewind.catalog import load_catalog

    conf = hist.kafka_config()
    topic = f"arch-race-{uuid.uuid4().hex[:8]}"
    table = f"lake.race_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    produce(conf, topic, 1, 0, 40)
    catalog = load_catalog(hist)
    archive_once(hist, [topic], table, spark=spark, catalog=catalog)
    produce(conf, topic, 1, 40, 10)
    slow_table = open_archive(catalog, table)
    slow: ArchivePass = plan_pass(hist, [topic], slow_table, table)
    written = write_ranges(spark, hist, slow, f"{slow_table.location()}/data")
    archive_once(hist, [topic], table, spark=spark, catalog=catalog)  # the other writer wins
    with pytest.raises(ArchiveConflictError, match="another writer committed"):
        commit_pass(catalog, slow_table, slow, written)
    assert_exactly(archived_rows(hist, table), topic, {0: 50})


def test_compaction_keeps_every_row_and_the_high_water(hist: Settings, spark: Any) -> None:
    from rewind.catalog import load_catalog

    conf = hist.kafka_config()
    topic = f"arch-cmp-{uuid.uuid4().hex[:8]}"
    table = f"lake.cmp_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    for start in (0, 60, 120):
        produce(conf, topic, 2, start, 60)
        archive_once(hist, [topic], table, spark=spark)
    catalog = load_catalog(hist)
    before_rows = sorted(
        (r["partition"], r["offset"], r["value"], r["timestamp"]) for r in archived_rows(hist, table)
    )
    before_files = len(list(catalog.load_table(table).scan().plan_files()))
    hw = archive_state(catalog.load_table(table)).hw

    result = compact_archive(hist, table)
    assert result.committed and result.files_before == before_files == 6 and result.files_after == 2

    after = catalog.load_table(table)
    assert len(list(after.scan().plan_files())) == 2
    assert sorted(
        (r["partition"], r["offset"], r["value"], r["timestamp"]) for r in archived_rows(hist, table)
    ) == (before_rows)
    assert archive_state(after).hw == hw and summary_properties(after.current_snapshot())[HW_PROPERTY]
    produce(conf, topic, 2, 180, 10)
    assert archive_once(hist, [topic], table, spark=spark).records == 10
    assert_exactly(archived_rows(hist, table), topic, {0: 95, 1: 95})


def test_continuous_archive_picks_up_new_records(hist: Settings, spark: Any) -> None:
    from rewind.history.archive import start_continuous

    conf = hist.kafka_config()
    topic = f"arch-cont-{uuid.uuid4().hex[:8]}"
    table = f"lake.cont_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    produce(conf, topic, 2, 0, 40)
    runner = start_continuous(spark, hist, [topic], table, trigger_seconds=0.5)
    try:
        assert runner.wait_for({(topic, 0): 20, (topic, 1): 20}, 60)
        produce(conf, topic, 2, 40, 30)
        assert runner.wait_for({(topic, 0): 35, (topic, 1): 35}, 60), runner.query.exception()
        produce(conf, topic, 2, 70, 30)
        assert runner.wait_for({(topic, 0): 50, (topic, 1): 50}, 60), runner.query.exception()
    finally:
        runner.stop()
    assert [r.mode for r in runner.results][:1] == ["once"] and any(
        r.mode == "continuous" for r in runner.results
    )
    assert_exactly(archived_rows(hist, table), topic, {0: 50, 1: 50})


def test_a_replayed_micro_batch_commits_nothing_twice(hist: Settings, spark: Any, tmp_path: Path) -> None:
    """A batch killed after its Iceberg commit is replayed by Spark: the table's high-water wins."""
    from rewind.catalog import load_catalog

    conf = hist.kafka_config()
    topic = f"arch-replay-{uuid.uuid4().hex[:8]}"
    table = f"lake.replay_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    produce(conf, topic, 1, 0, 30)
    catalog = load_catalog(hist)
    archive_once(hist, [topic], table, spark=spark, catalog=catalog)  # hw 30
    produce(conf, topic, 1, 30, 20)
    # the offset log of a query whose batch 0 read [30, 50)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n" + json.dumps({topic: {"0": 50}}) + "\n")
    runner = ContinuousArchive(spark, hist, catalog, [topic], table, tmp_path, {(topic, 0): 30})

    def batch() -> Any:
        reader = spark.read.format("rewind-kafka").option(
            "ranges", json.dumps([OffsetRange(topic, 0, 30, 50).to_dict()])
        )
        for key, value in conf.items():
            reader = reader.option(f"kafka.{key}", str(value))
        return reader.option("includeHeaders", "true").load()

    runner.on_batch(batch(), 0)
    runner.on_batch(batch(), 0)  # the replay
    assert len(runner.results) == 1 and runner.results[0].records == 20
    assert_exactly(archived_rows(hist, table), topic, {0: 50})


def test_offsets_gone_before_archiving_fail_the_pass_or_are_recorded_lost(hist: Settings, spark: Any) -> None:
    from rewind.catalog import load_catalog
    from rewind.history.exceptions import ArchiveLossError, HistoryGapError
    from rewind.history.plan import plan_history

    conf = hist.kafka_config()
    topic = f"arch-loss-{uuid.uuid4().hex[:8]}"
    table = f"lake.loss_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    produce(conf, topic, 1, 0, 50)
    archive_once(hist, [topic], table, spark=spark)
    produce(conf, topic, 1, 50, 50)
    retention = {(topic, 0): 80}  # [50, 80) left Kafka before the next pass
    with pytest.raises(ArchiveLossError, match=r"offsets \[50, 80\)"):
        archive_once(hist, [topic], table, spark=spark, declared_log_start=retention)
    result = archive_once(hist, [topic], table, spark=spark, declared_log_start=retention, allow_loss=True)
    assert result.lost == [{"topic": topic, "partition": 0, "start": 50, "end": 80}] and result.records == 20
    assert recorded_gaps(load_catalog(hist), table)[((topic, 0), "lost")] == [(50, 80)]
    with pytest.raises(HistoryGapError, match=rf"{topic}/0 \[50, 80\)"):
        plan_history(hist, [topic], table, declared_log_start=retention)
    plan = plan_history(hist, [topic], table, declared_log_start={(topic, 0): 100}, allow_gaps=True)
    assert [(g.start, g.end, g.kind) for g in plan.gaps()] == [(50, 80, "lost")]
    assert plan.partitions[0].expected_archive_records == 70
