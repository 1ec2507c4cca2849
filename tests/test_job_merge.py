"""``merge:`` end to end: a real broker, real Spark, real Iceberg, PostgreSQL and SQLite.

A topic holds the eight events of docs/merge-policies.md's worked example; the target already
holds live's rows for orders 2, 3, 5 and 7 (with their lineage, as a live writer of Rewind's
columns leaves them). Each run must leave exactly the rows its policy says, count every
decision, send ambiguous rows to the quarantine, and never leave a key twice in an Iceberg
staging branch. Bad input (a cut line naming a partition the source does not read) fails the
plan in one line and writes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rewind.config import Settings, load_settings
from rewind.spec import parse_spec
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

BASE_MS = 1_790_000_000_000
SCHEMA = {"order_id": "long", "amount": "double"}
# (partition, ms after BASE_MS, order id, amount): the worked example's events
EVENTS = [
    (0, 100, 1, 1.0),
    (0, 200, 1, 2.0),
    (0, 300, 2, 3.0),
    (1, 300, 3, 3.5),
    (0, 500, 4, 4.0),
    (1, 500, 4, 4.5),
    (1, 600, 5, 5.0),
    (0, 700, 6, 6.0),
]
# (order id, amount, ms after BASE_MS, partition, offset): live's rows in the target
LIVE = [(2, 20.0, 250, 0, 1000), (3, 30.0, 400, 1, 1001), (5, 50.0, 900, 1, 1002), (7, 70.0, 50, 0, 1003)]


@dataclass
class World:
    tmp: Path
    settings: Settings
    topic: str

    def spec(self, sink: dict[str, Any], merge: dict[str, Any], name: str = "merge-run") -> Any:
        return parse_spec(
            {
                "name": name,
                "source": {"kafka": {"topics": [self.topic]}},
                "decode": {"format": "json", "schema": dict(SCHEMA)},
                "translate": {
                    "function": "tests.job_fixtures:keep_orders",
                    "version": "1",
                    "output_schema": dict(SCHEMA),
                },
                "key": ["order_id"],
                "sink": sink,
                "merge": merge,
                "run": {"work_unit_records": 3},
            }
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> World:
    from confluent_kafka import Producer

    tmp = tmp_path_factory.mktemp("merge")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, 2)
    producer = Producer({**conf, "enable.idempotence": True})
    for partition, ms, order, amount in EVENTS:
        value = f'{{"order_id": {order}, "amount": {amount}}}'.encode()
        producer.produce(
            topic, key=str(order).encode(), value=value, partition=partition, timestamp=BASE_MS + ms
        )
    assert producer.flush(30) == 0
    return World(tmp, settings, topic)


def live_rows(schema: pa.Schema, topic: str) -> pa.Table:
    """Live's rows in the plan's output schema (every lineage column filled)."""
    n = len(LIVE)
    data: dict[str, Any] = {
        "order_id": [r[0] for r in LIVE],
        "amount": [r[1] for r in LIVE],
        "_rewind_event_id": [f"live-{r[0]}" for r in LIVE],
        "_rewind_source_topic": [topic] * n,
        "_rewind_source_partition": [r[3] for r in LIVE],
        "_rewind_source_offset": [r[4] for r in LIVE],
        "_rewind_source_timestamp": [datetime.fromtimestamp((BASE_MS + r[2]) / 1000, UTC) for r in LIVE],
        "_rewind_extracted_at": [datetime.now(UTC)] * n,
        "_rewind_transform": ["live"] * n,
        "_rewind_transform_version": ["1"] * n,
        "_rewind_run_id": ["live"] * n,
        "_rewind_synthetic": [False] * n,
    }
    return pa.Table.from_pydict({f.name: data[f.name] for f in schema}, schema=schema)


def amounts(rows: list[dict[str, Any]]) -> dict[int, float]:
    return {r["order_id"]: r["amount"] for r in rows}


def ran(world: World, spec: Any) -> Any:
    from rewind.job.service import run_job

    return run_job(world.settings, spec, units_per_wave=8)


def test_iceberg_latest_event_time_with_a_time_cut_line_and_routing(world: World) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.service import plan_job

    table = f"shop.merged_{uuid.uuid4().hex[:6]}"
    spec = world.spec(
        {"iceberg": {"table": table}},
        {
            "on_collision": "latest-event-time",
            "reject_stale_after": datetime.fromtimestamp((BASE_MS + 800) / 1000, UTC).isoformat(),
            "ambiguous": "route",
        },
    )
    schema = plan_job(world.settings, spec).output_schema()
    catalog = load_catalog(world.settings)
    catalog.create_namespace_if_not_exists("shop")
    catalog.create_table(table, schema=schema).append(live_rows(schema, world.topic))

    outcome = ran(world, spec)

    assert outcome.merged == {
        "applied": 3, "deduplicated": 1, "superseded": 1, "routed": 2, "rejected_stale": 1
    }
    assert outcome.counts.rows_out == 8 and outcome.counts.merge_decisions == outcome.merged
    rows = jf.staging_table(world.settings, outcome.staging).to_pylist()
    assert amounts(rows) == {1: 2.0, 2: 3.0, 3: 30.0, 5: 50.0, 6: 6.0, 7: 70.0}
    assert len(rows) == 6  # never a key twice
    q = jf.quarantine_rows(world.settings, outcome.quarantine_table, outcome.run_id)
    routed = [(r["stage"], r["reason"], r["partition"]) for r in q]
    assert routed == [("merge", "ambiguous", 0), ("merge", "ambiguous", 1)]
    assert [b'"amount": 4.0' in q[0]["value"], b'"amount": 4.5' in q[1]["value"]] == [True, True]
    from rewind.job.service import open_ledger

    with open_ledger(world.settings) as ledger:
        run = ledger.get_run(outcome.run_id)
        assert run.totals["merge"] == outcome.merged
        audit = ledger.audit_log(outcome.run_id)
        assert [a.details for a in audit if a.action == "merged"] == [outcome.merged]
    shown = "merge: applied 3, rejected stale 1, deduplicated 1, superseded 1, routed 2"
    show = cli_in_process.rewind(
        ["show", outcome.run_id],
        cwd=world.tmp,
        env={**jf.child_env(world.settings), "COLUMNS": "300"},  # one line per fact, unwrapped
    )
    assert show.returncode == 0, show.stderr
    assert show.stdout.count(shown) == 2  # the run's totals and its audit entry
    from rewind.verify.service import verify_run

    report = verify_run(world.settings, outcome.run_id, report_path=world.tmp / "merge.json")
    assert report["merge"] == outcome.merged and shown in report["notes"]


def test_postgres_prefer_backfill_with_an_offset_cut_line(world: World, pg_url: str) -> None:
    spec = world.spec(
        {"postgres": {"table": "order_amounts", "url": pg_url}},
        {"on_collision": "prefer-backfill", "reject_stale_after": {"offsets": {world.topic: {1: 1002}}}},
        name="merge-pg",
    )
    _sql_target(world, spec)
    outcome = ran(world, spec)
    assert outcome.merged == {
        "applied": 5, "deduplicated": 2, "superseded": 0, "routed": 0, "rejected_stale": 1
    }
    rows = _sql_rows(world, spec, outcome)
    assert amounts(rows) == {1: 2.0, 2: 3.0, 3: 3.5, 4: 4.5, 5: 50.0, 6: 6.0, 7: 70.0}


def test_sqlite_prefer_live_with_a_group_cut_line(world: World) -> None:
    from confluent_kafka import Consumer, TopicPartition

    group = f"order-svc-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({**world.settings.kafka_config(), "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(
            offsets=[TopicPartition(world.topic, 0, 5000), TopicPartition(world.topic, 1, 1002)],
            asynchronous=False,
        )
    finally:
        consumer.close()
    url = f"sqlite:///{world.tmp / 'model.db'}"
    spec = world.spec(
        {"postgres": {"table": "order_amounts", "url": url}},
        {"on_collision": "prefer-live", "reject_stale_after": {"group": group}},
        name="merge-sqlite",
    )
    _sql_target(world, spec)
    outcome = ran(world, spec)
    assert outcome.merged == {
        "applied": 3, "deduplicated": 2, "superseded": 2, "routed": 0, "rejected_stale": 1
    }
    rows = _sql_rows(world, spec, outcome)
    assert amounts(rows) == {1: 2.0, 2: 20.0, 3: 30.0, 4: 4.5, 5: 50.0, 6: 6.0, 7: 70.0}


def test_a_cut_line_naming_an_unknown_partition_fails_the_plan_and_writes_nothing(world: World) -> None:
    from rewind.catalog import load_catalog
    from rewind.errors import RewindError
    from rewind.job.service import plan_job, run_job

    table = f"shop.never_{uuid.uuid4().hex[:6]}"
    spec = world.spec(
        {"iceberg": {"table": table}},
        {"reject_stale_after": {"offsets": {world.topic: {7: 10}, "elsewhere": {0: 1}}}},
        name="merge-bad",
    )
    plan = plan_job(world.settings, spec)
    gate = next(g for g in plan.gates if g.name == "merge")
    assert not gate.ok
    assert gate.detail == (
        f"merge.reject_stale_after names elsewhere:0, {world.topic}:7, which the source does not read "
        f"({world.topic}:0, {world.topic}:1); give offsets of the source's partitions"
    )
    with pytest.raises(RewindError) as err:
        run_job(world.settings, spec)
    assert "\n" not in str(err.value)
    catalog = load_catalog(world.settings)
    assert not catalog.table_exists(table)
    if catalog.namespace_exists("shop"):  # the other tests made it; this one made nothing in it
        assert not any(t[-1].startswith(table.split(".")[1]) for t in catalog.list_tables("shop"))


# -- SQL targets ----------------------------------------------------------------------------------


def _sql_target(world: World, spec: Any) -> None:
    """The target, created through the sink itself (a new table promoted) with live's rows."""
    from rewind.core.parquet import write_parquet
    from rewind.job.components import make_sink
    from rewind.job.service import plan_job

    schema = plan_job(world.settings, spec).output_schema()
    sink = make_sink(world.settings, spec)
    try:
        run_id = f"live-{uuid.uuid4().hex[:6]}"
        staging = sink.prepare(run_id, schema)
        files = [write_parquet(sink.data_folder(staging), live_rows(schema, world.topic), "live")]
        sink.commit(staging, run_id, ["live"], files)
        sink.promote(staging)
    finally:
        sink.close()


def _sql_rows(world: World, spec: Any, outcome: Any) -> list[dict[str, Any]]:
    from rewind.job.components import make_sink

    sink = make_sink(world.settings, spec)
    try:
        return sink.read_arrow(sink.staging_from_dict(outcome.staging)).to_pylist()  # type: ignore[no-any-return]
    finally:
        sink.close()


def test_iceberg_merge_decided_in_spark_leaves_what_the_driver_does(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``merge.spark_rows: 0``: the same run's contested rows decided in Spark (the stage is
    called), with the same counts, branch and quarantine as the driver's decisions above."""
    from rewind.catalog import load_catalog
    from rewind.config import MergeSettings
    from rewind.job.service import plan_job, run_job
    from rewind.spark import merge_stage

    calls = []
    real = merge_stage.decide_in_spark

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(merge_stage, "decide_in_spark", counted)
    settings = world.settings.model_copy(update={"merge": MergeSettings(spark_rows=0)})
    table = f"shop.merged_{uuid.uuid4().hex[:6]}"
    spec = world.spec(
        {"iceberg": {"table": table}},
        {
            "on_collision": "latest-event-time",
            "reject_stale_after": datetime.fromtimestamp((BASE_MS + 800) / 1000, UTC).isoformat(),
            "ambiguous": "route",
        },
    )
    schema = plan_job(settings, spec).output_schema()
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    catalog.create_table(table, schema=schema).append(live_rows(schema, world.topic))

    outcome = run_job(settings, spec, units_per_wave=8)

    assert calls == [1]
    assert outcome.merged == {
        "applied": 3, "deduplicated": 1, "superseded": 1, "routed": 2, "rejected_stale": 1
    }
    rows = jf.staging_table(settings, outcome.staging).to_pylist()
    assert amounts(rows) == {1: 2.0, 2: 3.0, 3: 30.0, 5: 50.0, 6: 6.0, 7: 70.0} and len(rows) == 6
    q = jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
    assert [(r["stage"], r["reason"], r["partition"]) for r in q] == [
        ("merge", "ambiguous", 0), ("merge", "ambiguous", 1)
    ]
    assert [b'"amount": 4.0' in q[0]["value"], b'"amount": 4.5' in q[1]["value"]] == [True, True]
