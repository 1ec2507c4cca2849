"""Rewind on Spark Connect: the CLI as a user runs it with ``spark.remote``, against a Spark
Connect server started from the PySpark distribution (:mod:`tests.spark_connect`).

Every command runs in a child ``rewind`` process with ``REWIND_SPARK_REMOTE=sc://...`` (the
client holds no JVM; the server runs the Spark work), and its result is compared row for row
with the same job run locally, in this process, on the tests' ``local[*]`` session: a plan
with a SQL translate (the sample runs in Spark), runs into an Iceberg and a SQL (SQLite) sink,
verify, promote and rollback, a fold into a ``replace-window`` read model (the window on an
output column), the continuous archive and ``rewind query`` over the archive and Kafka.
Lineage columns that differ between any two runs (``_rewind_run_id``,
``_rewind_extracted_at``) are left out of the comparison.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.spec import parse_spec
from tests import fold_fixtures as ff
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.spark_connect import EXTERNAL_REMOTE, java_missing, late_worker_marker, spark_connect_server

PARTITIONS = 2
RECORDS = 400
VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")
SQL_QUERY = (
    "SELECT _rewind_row, order_id, CAST(ROUND(amount * 100) AS BIGINT) AS cents "
    "FROM events WHERE status <> 'test' AND amount > 0"
)
MINUTE = ff.MINUTE
FOLD_ORDERS = 100  # one every 15 s: 25 minutes of orders, ~550 events
FOLD_SOURCE = (4 * MINUTE, 22 * MINUTE)
FOLD_REPLACED = (8 * MINUTE, 16 * MINUTE)

pytestmark = pytest.mark.skipif(java_missing() is not None, reason=str(java_missing()))


@dataclass
class World:
    tmp: Path
    settings: Settings
    remote: str
    topic: str

    def env(self) -> dict[str, str]:
        env = jf.child_env(self.settings, REWIND_SPARK_REMOTE=self.remote)
        del env["REWIND_SPARK_CONF"]  # JVM options of a local driver: the server has its own
        return env

    def rewind(self, *args: str, timeout: float = 240, rc: int = 0) -> Any:
        """``rewind ARGS --json`` on Spark Connect, exiting ``rc``; its one JSON object."""
        proc = subprocess.run(
            [jf.REWIND_BIN, *args, "--json"],
            cwd=self.tmp,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == rc, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    def spec_file(self, spec: dict[str, Any]) -> Path:
        return jf.write_spec(self.tmp / f"{spec['name']}.yaml", spec)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Iterator[World]:
    """The orders topic, settings whose state both sides share, and the server (one per module);
    ``spark`` is the local session the local runs use."""
    tmp = tmp_path_factory.mktemp("connect")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-connect-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(RECORDS, PARTITIONS, raise_every=150))
    with spark_connect_server(tmp / "connect") as remote:
        yield World(tmp, settings, remote, topic)


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without the columns that differ between any two runs, in event id order."""
    out = [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]
    return sorted(out, key=lambda r: str(r["_rewind_event_id"]))


def _iceberg_rows(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    return _stable(jf.staging_table(settings, staging).to_pylist())


def _main_rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    from rewind.catalog import load_catalog

    iceberg = load_catalog(settings).load_table(table)
    return _stable(iceberg.scan().to_arrow().to_pylist())


def _quarantine(settings: Settings, table: str, run_id: str) -> list[tuple[Any, ...]]:
    rows = jf.quarantine_rows(settings, table, run_id)
    return [(r["topic"], r["partition"], r["offset"], r["reason"]) for r in rows]


def _local_run(world: World, spec: dict[str, Any]) -> Any:
    from rewind.job.service import run_job

    outcome = run_job(world.settings, parse_spec(spec))
    assert outcome.state == "succeeded"
    return outcome


def _counts(outcome: dict[str, Any]) -> dict[str, Any]:
    keys = ("records_read", "emitted", "rows_out", "quarantined", "filtered", "quarantine_reasons", "folded")
    return {k: outcome.get(k) for k in keys}


# -- what a Connect client asks for instead of a SparkContext -------------------------------------

PROBE = """
import json, sys, time
from pyspark.sql import SparkSession
from rewind.spark.pace_server import needs_pace_server
from rewind.spark.progress_channel import TaskReporter, driver_addresses, open_listener
from rewind.spark.topology import default_parallelism, master, tasks_on_this_host

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
with open_listener(spark) as listener:
    address = listener.address

    def count(batches):
        with TaskReporter(address, every_s=0) as reporter:
            for batch in batches:
                reporter.add("unit-1", batch.num_rows)
                yield batch

    spark.range(0, 1000, 1, 2).mapInArrow(count, "id long").collect()
    deadline = time.monotonic() + 10
    while listener.counts.records({"unit-1": 1000}) < 1000 and time.monotonic() < deadline:
        time.sleep(0.05)
    progress = listener.counts.records({"unit-1": 1000})
print(json.dumps({
    "master": master(spark),
    "parallelism": default_parallelism(spark),
    "on_this_host": tasks_on_this_host(spark),
    "addresses": driver_addresses(spark),
    "pace_server": needs_pace_server(spark),
    "progress": progress,
}))
"""


def test_a_connect_client_learns_the_servers_master_parallelism_and_gets_live_progress(
    world: World,
) -> None:
    """In a child: a Connect session in this process would turn PySpark's remote mode on for
    every later test."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, world.remote],
        env=world.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {
        "master": "local[2]",
        "parallelism": 2,  # the server's, not this host's cores
        "on_this_host": True,
        "addresses": ["127.0.0.1", "127.0.0.1"],  # its tasks reach this client on the loopback
        "pace_server": False,  # they share a pacing file on their one host
        "progress": 1000,  # counts from the server's tasks, while they ran
    }


# -- plan and run ---------------------------------------------------------------------------------


def _sql_spec(world: World, name: str, sink: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "source": {"kafka": {"topics": [world.topic]}},
        "decode": {"format": "json", "schema": dict(jf.ORDER_SCHEMA)},
        "translate": {
            "sql": SQL_QUERY,
            "version": "1",
            "output_schema": {"order_id": "long", "cents": "long"},
        },
        "key": ["order_id"],
        "sink": sink,
        "run": {"work_unit_records": 100},
    }


def _plan_view(plan: dict[str, Any]) -> dict[str, Any]:
    """What a plan decides, without what it measured (estimates, sample timings); the id is a
    digest of the spec and every unit's range."""
    units = plan["units"]
    return {
        "plan_id": plan["plan_id"],
        "units": units if isinstance(units, int) else len(units),
        "offsets": plan["offsets"],
        "output_columns": plan["output_columns"],
        "gates": sorted((g["name"], g["ok"], g.get("detail")) for g in plan["gates"]),
    }


def test_plan_with_a_sql_translate_equals_the_local_plan(world: World) -> None:
    from rewind.job.service import plan_job

    spec = _sql_spec(world, "connect-plan", {"iceberg": {"table": "connect.planned"}})
    local = plan_job(world.settings, parse_spec(spec)).to_dict()
    remote = world.rewind("plan", str(world.spec_file(spec)))
    assert remote["ok"] is True, remote["gates"]
    assert _plan_view(remote) == _plan_view(local)


def _iceberg_spec(world: World, name: str, table: str, reference: str) -> dict[str, Any]:
    return jf.order_spec(
        name,
        world.topic,
        table,
        unit_records=100,
        verify={
            "reference": {"iceberg": reference},
            "compare": {"amount": {"abs": 0.001}, "status": "exact"},
            "assertions": [
                {
                    "name": "no negative amounts",
                    "sql": "SELECT count(*) FROM staging WHERE amount < 0",
                    "expect": 0,
                }
            ],
        },
    )


@pytest.fixture(scope="module")
def truth(world: World) -> str:
    """A reference for verify: what the job should write, with a few orders wrong on purpose."""
    import pyarrow as pa

    from rewind.catalog import load_catalog

    rows = {}
    for o in jf.order_events(RECORDS, PARTITIONS, raise_every=150):
        if o.fate in ("row", "double") and o.amount is not None:
            amount = o.amount + 1 if o.index % 37 == 0 else o.amount
            rows[o.order_id] = {"order_id": o.order_id, "status": o.status, "amount": amount}
    rows.pop(1010, None)  # missing from the reference
    schema = pa.schema([("order_id", pa.int64()), ("status", pa.string()), ("amount", pa.float64())])
    catalog = load_catalog(world.settings)
    catalog.create_namespace_if_not_exists("connect")
    name = f"connect.truth_{uuid.uuid4().hex[:6]}"
    catalog.create_table(name, schema=schema).append(pa.Table.from_pylist(list(rows.values()), schema=schema))
    return name


@pytest.fixture(scope="module")
def iceberg_runs(world: World, truth: str) -> tuple[Any, dict[str, Any]]:
    """The same order_lines job into two new Iceberg tables: locally, then on Spark Connect."""
    local = _local_run(world, _iceberg_spec(world, "connect-ice-local", "connect.orders_local", truth))
    spec = _iceberg_spec(world, "connect-ice-remote", "connect.orders_remote", truth)
    remote = world.rewind("run", str(world.spec_file(spec)))
    assert remote["state"] == "succeeded", remote
    return local, remote


def test_a_run_into_iceberg_equals_the_local_run(world: World, iceberg_runs: tuple[Any, Any]) -> None:
    local, remote = iceberg_runs
    assert _counts(remote) == _counts(local.to_dict())
    assert remote["quarantined"] > 0 and remote["filtered"] > 0  # every fate is in the topic
    rows = _iceberg_rows(world.settings, remote["staging"])
    assert len(rows) == remote["rows_out"]
    assert rows == _iceberg_rows(world.settings, local.staging)
    assert _quarantine(world.settings, remote["quarantine_table"], remote["run_id"]) == _quarantine(
        world.settings, local.quarantine_table, local.run_id
    )


_TIMES = {"run_id", "seconds", "generated_at", "report", "report_path", "html", "json", "staging"}


def _verdict(report: Any) -> Any:
    """A verify report without its run, timings and file paths, at any depth."""
    if isinstance(report, dict):
        return {k: _verdict(v) for k, v in report.items() if k not in _TIMES}
    if isinstance(report, list):
        return [_verdict(v) for v in report]
    return report


def test_verify_promote_and_rollback_equal_the_local_ones(
    world: World, iceberg_runs: tuple[Any, Any]
) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.publish import promote_run, rollback_run
    from rewind.verify.service import verify_run

    local, remote = iceberg_runs
    local_report = verify_run(world.settings, local.run_id)
    remote_report = world.rewind("verify", remote["run_id"], rc=1)
    assert _verdict(remote_report) == _verdict(local_report)
    assert remote_report["passed"] is False  # the reference differs on purpose

    promote_run(world.settings, local.run_id, force=True, reason="the reference is wrong on purpose")
    world.rewind("promote", remote["run_id"], "--force", "--reason", "the reference is wrong on purpose")
    promoted = _main_rows(world.settings, "connect.orders_remote")
    assert len(promoted) == remote["rows_out"]
    assert promoted == _main_rows(world.settings, "connect.orders_local")

    rollback_run(world.settings, local.run_id)
    world.rewind("rollback", remote["run_id"])
    catalog = load_catalog(world.settings)  # the runs created their targets: rolled back, gone
    assert not catalog.table_exists("connect.orders_remote")
    assert not catalog.table_exists("connect.orders_local")


def _sql_rows(world: World, spec: dict[str, Any], staging: dict[str, Any]) -> list[dict[str, Any]]:
    from rewind.job.components import make_sink

    sink = make_sink(world.settings, parse_spec(spec))
    try:
        return _stable(sink.read_arrow(sink.staging_from_dict(staging)).to_pylist())  # type: ignore[attr-defined]
    finally:
        sink.close()


def test_a_sql_translate_into_a_sql_sink_equals_the_local_run(world: World) -> None:
    url = f"sqlite:///{world.tmp / 'model.db'}"
    local_spec = _sql_spec(world, "connect-sql-local", {"postgres": {"table": "cents_local", "url": url}})
    remote_spec = _sql_spec(world, "connect-sql-remote", {"postgres": {"table": "cents_remote", "url": url}})
    local = _local_run(world, local_spec)
    remote = world.rewind("run", str(world.spec_file(remote_spec)))
    assert remote["state"] == "succeeded", remote
    assert _counts(remote) == _counts(local.to_dict())
    rows = _sql_rows(world, remote_spec, remote["staging"])
    assert len(rows) == remote["rows_out"] > 0
    assert rows == _sql_rows(world, local_spec, local.staging)


# -- a fold into a replace-window read model --------------------------------------------------------


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def _fold_spec(topic: str, base: int, name: str, target: str, **sink: Any) -> dict[str, Any]:
    """tests/test_job_fold.py's repair, smaller: orders placed in the replaced window (on the
    output column ``placed_at``) recomputed by a fold, the target's other rows kept."""
    window = {
        "mode": "replace-window",
        "window_column": "placed_at",
        "window_from": _iso(base + FOLD_REPLACED[0]),
        "window_to": _iso(base + FOLD_REPLACED[1]),
    }
    return {
        "name": name,
        "source": {
            "kafka": {
                "topics": [topic],
                "from": _iso(base + FOLD_SOURCE[0]),
                "to": _iso(base + FOLD_SOURCE[1]),
            }
        },
        "decode": {"format": "json", "schema": dict(ff.DECODE_SCHEMA)},
        "translate": {
            "function": "tests.fold_fixtures:order_partials",
            "fold": "tests.fold_fixtures:fold_orders",
            "version": "1",
            "output_schema": dict(ff.MODEL_SCHEMA),
        },
        "key": ["order_id"],
        "sink": {"iceberg": {"table": target, **(sink or window)}},
        "run": {"work_unit_records": 150},
    }


def test_a_fold_into_a_replace_window_read_model_equals_the_local_run(world: World) -> None:
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.job.service import plan_job
    from tests.test_job_fold import _target_row

    conf = world.settings.kafka_config()
    topic = f"orders-fold-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, PARTITIONS)
    base = (int(time.time()) // 60 - 60) * MINUTE
    events = ff.order_history(FOLD_ORDERS, base)
    ff.produce_events(conf, topic, events, PARTITIONS)

    # two targets as the live service left them: every order (placed_at right, the rest
    # wrong) and one the topic does not have
    appended = parse_spec(_fold_spec(topic, base, "fold-schema", "models.unused", mode="append"))
    schema = plan_job(world.settings, appended).output_schema()
    placed = {e.order_id: e.at_ms for e in events if e.type == "placed"}
    placed[90_001] = base + 12 * MINUTE
    rows = [_target_row(o, ms, schema.names) for o, ms in sorted(placed.items())]
    catalog = load_catalog(world.settings)
    catalog.create_namespace_if_not_exists("models")
    for side in ("local", "remote"):
        catalog.create_table(f"models.totals_{side}", schema=schema).append(
            pa.Table.from_pylist(rows, schema=schema)
        )

    local = _local_run(world, _fold_spec(topic, base, "fold-local", "models.totals_local"))
    spec = _fold_spec(topic, base, "fold-remote", "models.totals_remote")
    remote = world.rewind("run", str(world.spec_file(spec)))
    assert remote["state"] == "succeeded", remote
    assert _counts(remote) == _counts(local.to_dict())
    assert remote["folded"]["outside_window"] > 0 and remote["folded"]["rows_out"] > 20
    got = _iceberg_rows(world.settings, remote["staging"])
    assert got == _iceberg_rows(world.settings, local.staging)
    lo, hi = ff.ts(base + FOLD_REPLACED[0]), ff.ts(base + FOLD_REPLACED[1])
    kept = [r for r in _stable(rows) if not (r["placed_at"] is not None and lo <= r["placed_at"] < hi)]
    assert [r for r in got if r["status"] == "v1"] == kept  # the target's rows outside the window
    assert len(got) == len(kept) + remote["folded"]["rows_out"]


# -- the continuous archive and a query over it ---------------------------------------------------


def _archived(settings: Settings, table: str) -> list[dict[str, Any]]:
    """Every archived row but the time of its pass, in offset order."""
    from tests.test_archive import archived_rows

    rows = [{k: v for k, v in r.items() if k != "archived_at"} for r in archived_rows(settings, table)]
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _wait_hw(settings: Settings, table: str, want: dict[tuple[str, int], int], child: Any) -> None:
    from rewind.catalog import load_catalog
    from rewind.history.schema import archive_state, open_archive

    catalog = load_catalog(settings)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert child.poll() is None, child.communicate()[1][-3000:]
        if catalog.table_exists(table):
            hw = archive_state(open_archive(catalog, table)).hw
            if all(hw.get(tp, -1) >= n for tp, n in want.items()):
                return
        time.sleep(0.5)
    raise AssertionError(f"{table} did not reach {want}")


@pytest.fixture(scope="module")
def archives(world: World) -> tuple[str, str, str]:
    """A topic archived continuously on Spark Connect (a catch-up pass, then micro-batches of
    records produced while it runs, stopped with Ctrl-C), and in one local pass. The server's
    first foreachBatch worker for it starts too late to connect back (on a server this module
    started), so the stream's start fails once and is retried."""
    from rewind.history.archive import archive_once
    from tests.test_archive import produce as produce_records

    conf = world.settings.kafka_config()
    topic = f"archived-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, PARTITIONS)
    produce_records(conf, topic, PARTITIONS, 0, 200)
    remote_table, local_table = "hist.remote", "hist.local"
    if not EXTERNAL_REMOTE:
        late_worker_marker(world.tmp / "connect").touch()
    child = subprocess.Popen(
        [
            jf.REWIND_BIN,
            "archive",
            topic,
            "--table",
            remote_table,
            "--continuous",
            "--trigger-seconds=1",
            "--json",
        ],
        cwd=world.tmp,
        env=world.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C must reach it even when this test runs in a background job (SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _wait_hw(world.settings, remote_table, {(topic, 0): 100, (topic, 1): 100}, child)
        produce_records(conf, topic, PARTITIONS, 200, 100)  # picked up by the stream
        _wait_hw(world.settings, remote_table, {(topic, 0): 150, (topic, 1): 150}, child)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-3000:]
    passes = json.loads(out)["passes"]
    assert passes[0]["mode"] == "once" and {p["mode"] for p in passes[1:]} == {"continuous"}
    assert sum(p["records"] for p in passes) == 300
    assert sum(p["partitions"][f"{topic}/0"]["records"] for p in passes) == 150

    archive_once(world.settings, [topic], local_table)
    return topic, remote_table, local_table


def test_a_stream_whose_foreach_batch_worker_was_late_starts_on_a_retry(
    world: World, archives: tuple[str, str, str]
) -> None:
    if EXTERNAL_REMOTE:
        pytest.skip("the late worker is staged on a server this module starts")
    assert not late_worker_marker(world.tmp / "connect").exists(), "the late worker was never started"
    log = (world.settings.state_path / "rewind.log").read_text()
    retried = [line for line in log.splitlines() if "continuous archive of hist.remote failed" in line]
    assert len(retried) == 1, log[-3000:]
    assert "Python worker failed to connect back" in retried[0] and "restart 1 " in retried[0]


def test_the_continuous_archive_equals_a_local_pass(world: World, archives: tuple[str, str, str]) -> None:
    _topic, remote_table, local_table = archives
    remote = _archived(world.settings, remote_table)
    assert [(r["partition"], r["offset"]) for r in remote] == [(p, o) for p in (0, 1) for o in range(150)]
    assert remote == _archived(world.settings, local_table)


def test_a_query_over_archive_and_kafka_equals_the_local_one(
    world: World, archives: tuple[str, str, str]
) -> None:
    from rewind.history.service import run_query

    topic, remote_table, _ = archives
    sql = (
        "SELECT partition, count(*) AS n, min(offset) AS lo, max(offset) AS hi, "
        "sum(length(value)) AS bytes FROM history GROUP BY partition ORDER BY partition"
    )
    declared = json.dumps({topic: {"0": 60, "1": 90}})  # below it from the archive, above from Kafka
    args = ["--history", topic, "--archive", remote_table, "--declared-log-start", declared]
    remote = world.rewind("query", sql, *args)
    local = run_query(world.settings, sql, [topic], remote_table, declared_log_start=declared)
    assert (
        remote["rows"]
        == local["rows"]
        == [[0, 150, 0, 149, local["rows"][0][4]], [1, 150, 0, 149, local["rows"][1][4]]]
    )
    assert remote["plan"] == local["plan"]
    assert remote["plan"]["archive_offsets"] == 150 and remote["plan"]["kafka_offsets"] == 150


# -- compensate: the diff and the units' transactions in the server's tasks -------------------------


def test_a_compensate_on_connect_brings_production_to_the_verified_state(
    world: World, bootstrap: str
) -> None:
    """v1 promoted and v2 staged and verified (locally, as ``tests/test_compensate.py`` makes
    them); ``rewind compensate`` on the server writes what brings production's rows to the
    verified ones. Connect shows the client no plan, so the changes are shuffled once more into
    the planned units; run again, it writes nothing."""
    from tests.test_compensate import OUT_PARTITIONS, applied, make_case, read_topic, retract_and_correct

    case = make_case(world.tmp / "compensate", bootstrap, "iceberg")
    client = replace(world, settings=case.settings(bootstrap))  # the case's state, the same server
    conf = client.settings.kafka_config()
    out = f"stock-model-{uuid.uuid4().hex[:8]}"
    create_topic(conf, out, OUT_PARTITIONS)

    production, verified, differing = case.expected
    done = client.rewind("compensate", case.run_id, "--topic", out)
    assert not done["already_done"]
    assert done["counts"] == retract_and_correct(production, verified, differing)
    msgs = read_topic(conf, out)
    assert applied(msgs, case.run_id, production, done["messages"], done["units"]) == verified
    again = client.rewind("compensate", case.run_id, "--topic", out)
    assert again["already_done"] and again["messages"] == done["messages"]
