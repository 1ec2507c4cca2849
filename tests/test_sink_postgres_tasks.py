"""PostgreSQL units loaded by the Spark tasks (:mod:`rewind.sinks.sql.task_load`), on a real server.

The loader alone: a unit tried again (after a failure past its COPY, after its commit, or by
two attempts at once) is in staging exactly once. A whole job: a driver killed in the middle of
a wave and a task killed after its COPY, both resumed, leave staging equal to a clean run
through the driver path, with each unit and each quarantined record once.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rewind import faults
from rewind.core.counts import QUARANTINE_FILES_KEY as QUARANTINE_FILES
from rewind.core.parquet import write_parquet
from rewind.sinks.sql.encoding import uri_path
from rewind.sinks.sql.sink import SqlSink, SqlStaging
from rewind.sinks.sql.task_load import TaskLoader, task_loader
from tests import job_fixtures as jf
from tests.test_sink_postgres import SCHEMA, rows

VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")


class Crash(Exception):
    """A task's failure at a fault point (in-process: the loader's own transaction is under test)."""


def staged(url: str, staging: SqlStaging) -> dict[str, Any]:
    """Staging's rows per order id and the run's unit rows, read with psycopg."""
    with psycopg.connect(url) as conn:
        got = conn.execute(f"SELECT order_id, _rewind_source_offset FROM {staging.table}").fetchall()
        units = conn.execute(
            "SELECT unit_id, rows_out FROM rewind_unit_commits WHERE run_id = %s", (staging.run_id,)
        ).fetchall()
    return {"rows": sorted(got), "units": dict(units)}


@pytest.fixture
def loader(pg_url: str, tmp_path: Path) -> Any:
    sink = SqlSink(pg_url, f"public.orders_{uuid.uuid4().hex[:6]}", key=["order_id"], spool_dir=tmp_path)
    staging = sink.prepare(f"run-{uuid.uuid4().hex[:6]}", SCHEMA)
    found = task_loader(sink, staging, SCHEMA)
    assert isinstance(found, TaskLoader) and "postgresql://" in found.url and found.url not in repr(found)
    yield sink, staging, found
    sink.close()


def unit_file(sink: SqlSink, staging: SqlStaging, items: list[tuple[int, int, float]]) -> list[str]:
    return [write_parquet(sink.data_folder(staging), rows(staging.run_id, items), "data")]


def test_a_unit_tried_again_is_loaded_once(loader: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sink, staging, load = loader
    counts = {"records_read": 3, "emitted": 3, "rows_out": 3}
    first = [(1, 10, 1.0), (2, 11, 2.0), (3, 12, 3.0)]

    def crash_at(name: str) -> Any:
        def point(at: str) -> None:
            if at == name:
                raise Crash(at)

        return point

    # 1. a failure after the COPY, before the commit: nothing stays, not even the file
    monkeypatch.setattr(faults, "point", crash_at("postgres-unit-before-commit"))
    files = unit_file(sink, staging, first)
    with pytest.raises(Crash):
        load.load("u1", files, ["q1.parquet"], counts)
    assert staged(pg_url, staging) == {"rows": [], "units": {}}
    assert not Path(uri_path(files[0])).exists()
    # 2. tried again, failing after its commit: loaded
    monkeypatch.setattr(faults, "point", crash_at("postgres-unit-after-commit"))
    with pytest.raises(Crash):
        load.load("u1", unit_file(sink, staging, first), ["q1.parquet"], counts)
    monkeypatch.undo()
    want = {"rows": [(1, 10), (2, 11), (3, 12)], "units": {"u1": 3}}
    assert staged(pg_url, staging) == want
    # 3. tried again: skipped, with what the first attempt recorded (its quarantine file)
    recorded, loaded = load.load("u1", unit_file(sink, staging, first), ["q-retry.parquet"], counts)
    assert loaded is False and recorded[QUARANTINE_FILES] == ["q1.parquet"]
    # 4. two attempts of a new unit at once (a newer event of order 3): one loads, one waits and skips
    second = [(3, 20, 9.0), (4, 21, 4.0)]
    results: list[bool] = []
    attempts = [
        threading.Thread(
            target=lambda: results.append(load.load("u2", unit_file(sink, staging, second), [], counts)[1])
        )
        for _ in range(2)
    ]
    for t in attempts:
        t.start()
    for t in attempts:
        t.join()
    assert sorted(results) == [False, True]
    assert staged(pg_url, staging) == {
        "rows": [(1, 10), (2, 11), (3, 20), (4, 21)],
        "units": {"u1": 3, "u2": 3},
    }
    assert sink.committed_units(staging, staging.run_id) == {"u1", "u2"}


PARTITIONS = 2
RECORDS = 600
UNIT_RECORDS = 150  # 4 units, 2 per wave
RATE = 300.0  # a wave reads 300 records in > 1 s: the kill 0.5 s into the second lands before its loads


def test_killed_driver_and_failed_task_then_resume_equal_a_clean_run(
    tmp_path: Path, pg_url: str, bootstrap: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.config import load_settings
    from rewind.job.service import open_ledger, resume_job, run_job
    from rewind.spec import parse_spec
    from tests.kafka_util import create_topic

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(RECORDS, PARTITIONS, raise_every=600))

    def spec(table: str, **sections: Any) -> dict[str, Any]:
        data = jf.order_spec(
            "pg-tasks",
            topic,
            "unused.t",
            unit_records=UNIT_RECORDS,
            function="tests.job_fixtures:order_amounts",
            run={"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 60},
            **sections,
        )
        data["sink"] = {"postgres": {"table": f"public.{table}", "url": pg_url}}
        return data

    # the reference: a clean run through the driver path
    monkeypatch.setenv("REWIND_SQL_LOAD", "driver")
    reference = run_job(settings, parse_spec(spec("clean")), units_per_wave=2)
    monkeypatch.delenv("REWIND_SQL_LOAD")
    assert reference.state == "succeeded"

    # 1. the driver killed in the middle of the second wave
    path = jf.write_spec(tmp_path / "spec.yaml", spec("faulty", guards={"max_records_per_second": RATE}))
    env = jf.child_env(settings, REWIND_FAULT="mid-wave:2", REWIND_FAULT_DELAY="0.5")
    killed = jf.run_driver(tmp_path, env, "run", str(path), units_per_wave=2)
    assert killed.returncode == -9, killed.stderr[-3000:]
    with open_ledger(settings) as ledger:
        (run,) = [r for r in ledger.list_runs(5) if r.id != reference.run_id]
        assert ledger.unit_counts(run.id).done == 2  # wave 1's units; the driver died in wave 2
    # 2. resumed, every task killed right after its first unit's commit (no Spark retry here):
    # the run fails with units in the sink the ledger does not have, nor their quarantine
    with (
        jf.in_tasks(spark, REWIND_FAULT="postgres-unit-after-commit"),
        pytest.raises(Exception, match="a Spark task"),
    ):
        resume_job(settings, run.id, units_per_wave=2)
    with open_ledger(settings) as ledger:
        done_in_ledger = {u.unit_id for u in ledger.units(run.id) if u.state == "done"}
        staging = SqlStaging.from_dict(ledger.get_run(run.id).staging)
    assert SqlSink(pg_url, "unused").committed_units(staging, run.id) > done_in_ledger
    # 3. resumed to the end
    done = resume_job(settings, run.id, units_per_wave=2)
    assert done.state == "succeeded"

    def content(outcome: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        sink = SqlSink(pg_url, "unused", key=["order_id"])
        staging = SqlStaging.from_dict(outcome.staging)
        table = sink.read_arrow(staging).drop_columns(list(VOLATILE)).to_pylist()
        units = {
            u: {k: v for k, v in c.items() if k != QUARANTINE_FILES}
            for u, c in sink.committed_counts(staging, outcome.run_id).items()
        }
        sink.close()
        return sorted(table, key=lambda r: r["_rewind_event_id"]), units

    assert content(done) == content(reference)
    assert done.counts == reference.counts
    quarantined = [
        jf.quarantine_rows(settings, "rewind.rewind_quarantine", r.run_id) for r in (done, reference)
    ]
    assert [(q["partition"], q["offset"]) for q in quarantined[0]] == [
        (q["partition"], q["offset"]) for q in quarantined[1]
    ]
    assert quarantined[0]  # the job quarantines records: each once
