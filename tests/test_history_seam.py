"""History across the seam between the archive and Kafka, against a real broker, Spark and Iceberg.

Most tests move the seam with a *declared* log start per partition (``declared_log_start``,
the documented setting production leaves unset), so that hypothesis can choose seams freely
on any broker. The last test moves the real log start with DeleteRecords (each broker that
has it: noida-db) and checks that the seam follows it with nothing declared.

To prove where each record came from, the archive of this module is rewritten once so that
every archived value starts with ``A|`` (keeping coordinates, timestamps and the archive's
high-water): a record read from the archive carries the mark, one read from Kafka does not.
The properties, with hypothesis-chosen seams and windows (in offsets and in time): records
below the declared start come from the archive only, records at or above it from Kafka
only, and the window returns every record exactly once.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.config import Settings, load_settings
from rewind.core.ranges import OffsetRange
from rewind.core.windows import BoundSpec, Timestamp, WindowRequest
from rewind.history.archive import archive_once
from rewind.history.exceptions import HistoryGapError
from rewind.history.files import plan_files
from rewind.history.iterate import iter_history
from rewind.history.plan import plan_history
from rewind.history.read import read_history, read_ranges_from_archive
from rewind.history.schema import archive_state, open_archive
from tests.brokers import DELETE_RECORDS, TestBroker
from tests.kafka_util import create_topic

BASE_TS = 1_760_000_000_000
ARCHIVED = 120  # offsets [0, 120) of each partition are archived
TAIL = 30  # then 30 more are produced, in Kafka only


@dataclass
class World:
    settings: Settings
    topic: str
    table: str


def produce(conf: dict[str, Any], topic: str, start: int, count: int) -> None:
    """Offset ``o`` of both partitions: value ``p:o``, timestamp ``BASE_TS + o * 1000``."""
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    for o in range(start, start + count):
        for p in (0, 1):
            producer.produce(
                topic,
                key=b"k%d" % (o % 5),
                value=b"%d:%d" % (p, o),
                partition=p,
                timestamp=BASE_TS + o * 1000,
            )
    assert producer.flush(30) == 0


def mark_archive(settings: Settings, table: str) -> None:
    """Rewrite every archived value as ``A|value``, file by file, keeping coordinates and state."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from rewind.catalog import load_catalog

    iceberg = load_catalog(settings).load_table(table)
    old = [task.file for task in iceberg.scan().plan_files()]
    new = []
    for data_file in old:
        with iceberg.io.new_input(data_file.file_path).open() as stream:
            rows = pq.read_table(stream)
        marked = pc.binary_join_element_wise(pa.scalar(b"A|"), rows["value"], b"")
        rows = rows.set_column(rows.schema.get_field_index("value"), "value", marked)
        path = data_file.file_path.replace(".parquet", "-marked.parquet")
        with iceberg.io.new_output(path).create() as out:
            pq.write_table(rows, out)
        new.append(path)
    tx = iceberg.transaction()
    with tx.update_snapshot(snapshot_properties=archive_state(iceberg).properties()).overwrite() as rewrite:
        for data_file in old:
            rewrite.delete_data_file(data_file)
        for path in new:
            rewrite.append_data_file(parquet_file_to_data_file(iceberg.io, iceberg.metadata, path))
    tx.commit_transaction()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> World:
    tmp = tmp_path_factory.mktemp("seam")
    s = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp)}, cwd=tmp)
    topic = f"seam-{uuid.uuid4().hex[:8]}"
    table = f"lake.seam_{uuid.uuid4().hex[:8]}"
    create_topic(s.kafka_config(), topic, 2)
    produce(s.kafka_config(), topic, 0, ARCHIVED)
    archive_once(s, [topic], table, spark=spark)
    mark_archive(s, table)
    produce(s.kafka_config(), topic, ARCHIVED, TAIL)
    return World(s, topic, table)


def window_of(kind: str, a: int, b: int) -> WindowRequest:
    if kind == "offsets":
        return WindowRequest(subscribe=("x",), start=BoundSpec(a), end=BoundSpec(b))
    return WindowRequest(subscribe=("x",), start=BoundSpec(Timestamp(a)), end=BoundSpec(Timestamp(b)))


def expected_offsets(kind: str, a: int, b: int) -> list[int]:
    total = ARCHIVED + TAIL
    if kind == "offsets":
        return list(range(min(a, total), min(b, total)))
    return [o for o in range(total) if a <= BASE_TS + o * 1000 < b]


def check(rows: list[tuple[int, int, bytes]], seams: dict[int, int], kind: str, a: int, b: int) -> None:
    coords = [(p, o) for p, o, _v in rows]
    assert len(coords) == len(set(coords)), "a record came twice"
    for p in (0, 1):
        assert sorted(o for q, o in coords if q == p) == expected_offsets(kind, a, b), p
    for p, o, value in rows:
        from_archive = value.startswith(b"A|")
        assert from_archive == (o < seams[p]), (p, o, seams[p], value)
        assert value.removeprefix(b"A|") == b"%d:%d" % (p, o)


bounds = st.one_of(
    st.tuples(st.just("offsets"), st.integers(0, 150), st.integers(0, 160)).map(
        lambda t: (t[0], min(t[1], t[2]), max(t[1], t[2]))
    ),
    st.tuples(st.just("times"), st.integers(-3000, 152_000), st.integers(0, 160_000)).map(
        lambda t: ("times", BASE_TS + min(t[1], t[1] + t[2]), BASE_TS + t[1] + t[2])
    ),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seam0=st.integers(0, ARCHIVED), seam1=st.integers(0, ARCHIVED), window=bounds, chunk=st.integers(7, 500)
)
def test_a_window_across_the_seam_returns_every_record_once_from_the_right_source(
    world: World, seam0: int, seam1: int, window: tuple[str, int, int], chunk: int
) -> None:
    kind, a, b = window
    a = max(a, 0)
    seams = {0: seam0, 1: seam1}
    declared = {(world.topic, p): s for p, s in seams.items()}
    chunks = list(
        iter_history(
            world.settings,
            [world.topic],
            world.table,
            window_of(kind, a, b),
            chunk_rows=chunk,
            declared_log_start=declared,
        )
    )
    assert all(t.num_rows <= chunk for t in chunks) and all(t.num_rows == chunk for t in chunks[:-1])
    rows = [(r["partition"], r["offset"], r["value"]) for t in chunks for r in t.to_pylist()]
    check(rows, seams, kind, a, b)


def test_spark_reads_the_same_window_and_checks_the_archive_count(world: World, spark: Any) -> None:
    seams = {0: 37, 1: 101}
    a, b = BASE_TS + 20_500, BASE_TS + 140_000  # between records 20 and 21; inside the tail
    plan = plan_history(
        world.settings,
        [world.topic],
        world.table,
        window_of("times", a, b),
        declared_log_start={(world.topic, p): s for p, s in seams.items()},
    )
    assert [(r.start, r.end) for r in plan.archive_ranges()] == [(21, 37), (21, 101)]
    assert [(r.start, r.end) for r in plan.kafka_ranges()] == [(37, 140), (101, 140)]
    again = type(plan).from_json(plan.to_json())
    df = read_history(spark, world.settings, again, verify=True)
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = [(r.partition, r.offset, bytes(r.value)) for r in df.collect()]
    check(rows, seams, "times", a, b)


def test_archive_reads_plan_only_the_files_of_the_ranges(world: World, spark: Any) -> None:
    from rewind.catalog import load_catalog

    iceberg = open_archive(load_catalog(world.settings), world.table)
    everything = plan_files(iceberg, [OffsetRange(world.topic, p, 0, ARCHIVED) for p in (0, 1)])
    only_one = plan_files(iceberg, [OffsetRange(world.topic, 1, 10, 20)])
    assert 0 < len(only_one) < len(everything)
    df = read_ranges_from_archive(
        spark,
        world.settings,
        world.table,
        [OffsetRange(world.topic, 1, 10, 20), OffsetRange(world.topic, 0, 5, 7)],
    )
    got = sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())
    assert got == sorted(
        [(1, o, b"A|1:%d" % o) for o in range(10, 20)] + [(0, o, b"A|0:%d" % o) for o in (5, 6)]
    )


def test_event_time_order_merges_partitions_by_timestamp(world: World) -> None:
    declared = {(world.topic, 0): 50, (world.topic, 1): 90}
    chunks = list(
        iter_history(
            world.settings,
            [world.topic],
            world.table,
            chunk_rows=64,
            order="event_time",
            declared_log_start=declared,
            include_headers=True,
        )
    )
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    assert chunks[0].schema.names == names
    rows = [(r["timestamp"], r["partition"], r["offset"]) for t in chunks for r in t.to_pylist()]
    assert len(rows) == 2 * (ARCHIVED + TAIL)
    assert rows == sorted(rows)
    assert all(r["headers"] is None for t in chunks for r in t.to_pylist())  # none were produced


def test_a_deliberate_gap_is_detected_exactly_and_classified_lost(world: World) -> None:
    # the archive holds [0, 120); a declared start at 135 means [120, 135) left Kafka unarchived
    declared = {(world.topic, 0): 135, (world.topic, 1): 60}
    with pytest.raises(HistoryGapError, match=rf"{world.topic}/0 \[120, 135\)") as err:
        plan_history(world.settings, [world.topic], world.table, declared_log_start=declared)
    assert "\n" not in str(err.value) and f"{world.topic}/1" not in str(err.value)
    plan = plan_history(
        world.settings, [world.topic], world.table, declared_log_start=declared, allow_gaps=True
    )
    [gap] = plan.lost()
    assert (gap.partition, gap.start, gap.end, gap.kind) == (0, 120, 135, "lost")
    assert "high-water 120" in gap.reason
    rows = [
        (r["partition"], r["offset"])
        for t in iter_history(
            world.settings, [world.topic], world.table, declared_log_start=declared, allow_gaps=True
        )
        for r in t.to_pylist()
    ]
    assert sorted(o for p, o in rows if p == 0) == [*range(0, 120), *range(135, 150)]
    assert sorted(o for p, o in rows if p == 1) == list(range(150))


def test_an_archive_started_after_retention_reports_its_start_as_lost(world: World, spark: Any) -> None:
    table = f"lake.late_{uuid.uuid4().hex[:8]}"
    archive_once(world.settings, [world.topic], table, spark=spark, declared_log_start={(world.topic, 0): 30})
    retention = {(world.topic, 0): 40}  # and later retention removed [0, 40) from Kafka
    with pytest.raises(HistoryGapError, match=rf"{world.topic}/0 \[0, 30\)"):
        plan_history(world.settings, [world.topic], table, declared_log_start=retention)
    plan = plan_history(world.settings, [world.topic], table, allow_gaps=True, declared_log_start=retention)
    assert [(g.start, g.end, g.kind) for g in plan.lost()] == [(0, 30, "lost")]
    assert "first offset 30" in plan.lost()[0].reason
    later = plan_history(
        world.settings, [world.topic], table, window_of("offsets", 30, 200), declared_log_start=retention
    )
    assert later.lost() == [] and [(r.start, r.end) for r in later.archive_ranges()][:1] == [(30, 40)]


def test_query_command_runs_sql_over_the_history_view(world: World, spark: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rewind.cli import app

    env = {
        "REWIND_BOOTSTRAP_SERVERS": world.settings.bootstrap_servers,
        "REWIND_STATE_DIR": str(world.settings.state_path),
    }
    sql = (
        "SELECT partition, count(*) AS n, sum(CASE WHEN substring(value, 1, 2) = X'417C' THEN 1 ELSE 0 END) "
        "AS archived FROM history GROUP BY partition ORDER BY partition"
    )
    result = CliRunner().invoke(
        app,
        [
            "query",
            sql,
            "--history",
            world.topic,
            "--archive",
            world.table,
            "--from",
            json.dumps({world.topic: {"0": 10, "1": 10}}),
            "--to",
            "latest",
            "--declared-log-start",
            json.dumps({world.topic: {"0": 50, "1": 70}}),
            "--json",
        ],
        env=env,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["columns"] == ["partition", "n", "archived"]
    assert data["rows"] == [[0, 140, 40], [1, 140, 60]]
    assert data["plan"]["archive_offsets"] == 100 and data["plan"]["lost"] == []


def test_the_seam_follows_the_real_log_start(
    broker: TestBroker, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Archive [0, 120) of two partitions, 30 more in Kafka only, then DeleteRecords moves
    the log start to 100 and 45: with nothing declared, the plan reads below each log start
    from the archive and from there on from Kafka, every record once; deleting past the
    archive's high-water (to 135) makes [120, 135) a lost gap named exactly."""
    broker.require(DELETE_RECORDS)
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    tmp = tmp_path_factory.mktemp("real-seam")
    env = {"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp)}
    s = load_settings(env=env, cwd=tmp)
    topic, table = f"rseam-{uuid.uuid4().hex[:8]}", f"lake.rseam_{uuid.uuid4().hex[:8]}"
    create_topic(s.kafka_config(), topic, 2)
    produce(s.kafka_config(), topic, 0, ARCHIVED)
    archive_once(s, [topic], table, spark=spark)
    mark_archive(s, table)
    produce(s.kafka_config(), topic, ARCHIVED, TAIL)
    admin = AdminClient(s.kafka_config())  # kept: a collected client never resolves its futures

    def delete_below(starts: dict[int, int]) -> None:
        request = [TopicPartition(topic, p, o) for p, o in starts.items()]
        for fut in admin.delete_records(request).values():
            fut.result(timeout=15)

    seams = {0: 100, 1: 45}
    delete_below(seams)
    plan = plan_history(s, [topic], table)
    assert plan.lost() == []
    assert sorted((r.partition, r.start, r.end) for r in plan.archive_ranges()) == [(0, 0, 100), (1, 0, 45)]
    chunks = iter_history(s, [topic], table)
    rows = [(r["partition"], r["offset"], r["value"]) for t in chunks for r in t.to_pylist()]
    check(rows, seams, "offsets", 0, ARCHIVED + TAIL)

    delete_below({0: 135})
    with pytest.raises(HistoryGapError, match=rf"{topic}/0 \[120, 135\)"):
        plan_history(s, [topic], table)
