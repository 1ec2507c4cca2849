"""A PostgreSQL ledger lost for a moment: restarted, or its connections cut, during a run.

Against a PostgreSQL server of the test's own (:mod:`tests.pg_cluster`), stopped and started
for real. First the ledger alone (fast): a call made during an outage waits for the database
and succeeds; an outage beyond ``ledger_retry_s`` fails in one line; a database never reached
fails at once; after an outage a lease holder's first write checks its lease; a second runner
cannot take a lease during or after an outage. Then whole runs in child processes: a run rides
out a restart (output equal to a clean run, exactly once) while a second runner is refused,
and a run whose outage outlasts the budget fails in one line and `resume` finishes it.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.core.ranges import OffsetRange
from rewind.ledger import LeaseHeld, LeaseLost, Ledger, LedgerUnavailable, connect
from tests import job_fixtures as jf
from tests.conftest import restart_port
from tests.kafka_util import create_topic
from tests.pg_cluster import PgCluster


@pytest.fixture(scope="module")
def pg() -> Iterator[PgCluster]:
    cluster = PgCluster.create()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def url(pg: PgCluster) -> Iterator[str]:
    yield pg.create_database()
    if not _up(pg):  # a failed test must not leave the next one without a server
        pg.start()


def _up(pg: PgCluster) -> bool:
    import psycopg

    try:
        psycopg.connect(pg.url(), connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def _new_run(ledger: Ledger, target: str = "iceberg:db.t") -> str:
    plan_id = f"p-{uuid.uuid4().hex[:8]}"
    ledger.save_plan(plan_id, "job", {"name": "job"}, {"units": []})
    run_id = ledger.create_run(plan_id, "job", target).id
    ledger.add_units(run_id, [OffsetRange("t", 0, 0, 10), OffsetRange("t", 0, 10, 20)])
    return run_id


def _start_after(pg: PgCluster, seconds: float) -> threading.Thread:
    def start() -> None:
        time.sleep(seconds)
        pg.start()

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread


# -- the ledger alone --------------------------------------------------------------------------


def test_a_write_during_a_restart_waits_for_the_database_and_succeeds(pg: PgCluster, url: str) -> None:
    with Ledger.open(url, retry_s=30) as ledger:
        run_id = _new_run(ledger)
        pg.stop()
        back = _start_after(pg, 2.0)
        began = time.monotonic()
        ledger.set_state(run_id, "running")  # issued while the server is down
        waited = time.monotonic() - began
        back.join()
        assert waited >= 1.5
        assert ledger.get_run(run_id).state == "running"
        ledger.audit(run_id, "after-restart")
        assert [a.action for a in ledger.audit_log(run_id)] == ["after-restart"]  # written once
        assert ledger.outage.down_since is None and ledger.outage.failures >= 1


def test_cut_connections_are_replaced_without_a_failure(pg: PgCluster, url: str) -> None:
    import psycopg

    with Ledger.open(url, retry_s=0) as ledger:  # no retry: the pool's pre-ping alone must do it
        run_id = _new_run(ledger)
        with psycopg.connect(pg.url(), autocommit=True) as admin:
            cut = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (url.rsplit("/", 1)[1],),
            ).fetchone()
        assert cut and cut[0] >= 1  # the ledger's pooled connection was cut
        assert ledger.get_run(run_id).state == "planned"
        assert ledger.outage.failures == 0


def test_an_outage_beyond_the_budget_fails_in_one_line_and_the_ledger_recovers(
    pg: PgCluster, url: str
) -> None:
    with Ledger.open(url, retry_s=1.5) as ledger:
        run_id = _new_run(ledger)
        pg.stop()
        began = time.monotonic()
        with pytest.raises(LedgerUnavailable) as caught:
            ledger.mark_running(run_id, ["t/0/0-10"])
        assert 1.0 <= time.monotonic() - began < 10
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"ledger at postgresql+psycopg://postgres@127.0.0.1:{pg.port}")
        assert "beyond ledger_retry_s (1.5 s)" in message
        began = time.monotonic()
        with pytest.raises(LedgerUnavailable):  # the budget is spent: the next call fails at once
            ledger.get_run(run_id)
        assert time.monotonic() - began < 1.0
        pg.start()
        ledger.mark_running(run_id, ["t/0/0-10"])  # the same ledger works again
        assert {u.unit_id: u.attempts for u in ledger.units(run_id)} == {"t/0/0-10": 1, "t/0/10-20": 0}


def test_a_database_never_reached_fails_at_once() -> None:
    from rewind.errors import RewindError

    url = f"postgresql://postgres@127.0.0.1:{restart_port()}/ledger"
    began = time.monotonic()
    with pytest.raises(RewindError) as opened:
        Ledger.open(url, retry_s=60)
    with Ledger(connect(url), retry_s=60) as ledger, pytest.raises(LedgerUnavailable) as used:
        ledger.get_run("r-1")
    assert time.monotonic() - began < 5  # a wrong URL is not an outage to wait out
    assert "\n" not in str(opened.value) and "\n" not in str(used.value)


def test_a_retried_state_change_whose_commit_landed_counts_as_made(url: str) -> None:
    """The connection lost while COMMIT was on its way (no real fault lands there reliably):
    the first attempt committed, so the second finds the run already in the state asked for."""
    with Ledger.open(url) as ledger:
        run_id = _new_run(ledger)
        ledger.set_state(run_id, "running")
        attempts: list[str] = []

        def commit_then_lose() -> Any:
            attempts.append(run_id)
            moved = ledger.set_state(run_id, "succeeded")
            if len(attempts) == 1:
                raise LedgerUnavailable("ledger at ... failed: server closed the connection unexpectedly")
            return moved

        assert ledger.outage.call("set_state", commit_then_lose).state == "succeeded"
        assert len(attempts) == 2
        with pytest.raises(Exception, match="cannot become succeeded"):  # not a retry: refused
            ledger.set_state(run_id, "succeeded")


def test_after_an_outage_the_holders_first_write_checks_its_lease(pg: PgCluster, url: str) -> None:
    target = "iceberg:db.fenced"
    with Ledger.open(url, retry_s=0) as ledger, Ledger.open(url) as other:
        run_id = _new_run(ledger, target)
        with ledger.keeper(target, run_id, 30, interval_s=30) as keeper:
            pg.stop()
            with pytest.raises(LedgerUnavailable):
                ledger.get_run(run_id)
            pg.start()
            before = ledger.lease(target)
            assert before is not None
            ledger.audit(run_id, "first-write-after")  # still ours: renewed in the same transaction
            renewed = ledger.lease(target)
            assert renewed is not None and renewed.heartbeat_at > before.heartbeat_at
            ledger.audit(run_id, "second-write")  # no outage since: no check
            assert ledger.lease(target) == renewed

            pg.stop()
            with pytest.raises(LedgerUnavailable):
                ledger.get_run(run_id)
            pg.start()
            # while it could not reach the database another runner took the target over
            assert other.release(target, run_id, owner=keeper.owner or _owner())
            other.acquire(target, "r-other", 60, owner="other-host:1")
            with pytest.raises(LeaseLost, match="now held by run r-other"):
                ledger.audit(run_id, "must-not-land")
            assert keeper.lost.is_set()
            with pytest.raises(LeaseLost):  # the runner's check before its next wave
                keeper.check()
        actions = [a.action for a in other.audit_log(run_id)]
        assert actions == ["first-write-after", "second-write"]
        other.release(target, "r-other", owner="other-host:1")


def test_an_outage_longer_than_the_lease_fences_the_holder(pg: PgCluster, url: str) -> None:
    target = "iceberg:db.expired"
    with Ledger.open(url, retry_s=30) as ledger:
        run_id = _new_run(ledger, target)
        with ledger.keeper(target, run_id, 2, interval_s=0.5) as keeper:
            pg.stop()
            back = _start_after(pg, 3.0)  # longer than the lease's 2 s
            with pytest.raises(LeaseLost):
                ledger.audit(run_id, "must-not-land")  # retried until back, then fenced
            back.join()
            assert keeper.lost.is_set()
        assert ledger.audit_log(run_id) == []


def test_a_second_runner_cannot_take_the_lease_during_or_after_an_outage(pg: PgCluster, url: str) -> None:
    from rewind.errors import RewindError

    target = "iceberg:db.contested"
    with Ledger.open(url, retry_s=30) as ledger:
        run_id = _new_run(ledger, target)
        with ledger.keeper(target, run_id, 30):
            pg.stop()
            with pytest.raises(RewindError) as during:  # it cannot even read the lease
                Ledger.open(url)
            assert "\n" not in str(during.value)
            pg.start()
            with Ledger.open(url) as second, pytest.raises(LeaseHeld) as after:
                second.acquire(target, "r-second", 30, owner="other-host:2")
            assert run_id in str(after.value)
            ledger.audit(run_id, "still-mine")
        assert [a.action for a in ledger.audit_log(run_id)] == ["still-mine"]  # no takeover


def _owner() -> str:
    from rewind.ledger._common import current_owner

    return current_owner()


# -- whole runs ----------------------------------------------------------------------------------

PARTITIONS = 2
RECORDS = 2400
UNIT_RECORDS = 100  # 24 units: 3 waves of 8 (`rewind run`'s default; resume_job here: 6 of 4)
RATE = 300.0  # records/s: a wave of 800 takes seconds, so the run outlasts an outage after its first
OUTAGE_S = 8.0  # longer than a wave: the run's next ledger write meets it
VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")


@dataclass
class World:
    tmp: Path
    settings: Settings
    topic: str
    reference: list[dict[str, Any]]

    def spec(self, table: str) -> dict[str, Any]:
        return jf.order_spec(
            "orders-outage",
            self.topic,
            table,
            unit_records=UNIT_RECORDS,
            run={"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 60},
            guards={"max_records_per_second": RATE},
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> World:
    """A topic and the clean run of the job over it (SQLite ledger, in this process)."""
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    tmp = tmp_path_factory.mktemp("ledger-outage")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(RECORDS, PARTITIONS, raise_every=600))
    w = World(tmp, settings, topic, [])
    clean = run_job(settings, parse_spec({**w.spec("outage.reference"), "guards": {}}))
    assert clean.state == "succeeded"
    w.reference = _stable(settings, clean.staging)
    return w


def _stable(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    rows = sorted(jf.staging_table(settings, staging).to_pylist(), key=lambda r: r["_rewind_event_id"])
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _after_first_commit(url: str, child: subprocess.Popen[str]) -> str:
    """The run's id once its first unit is done in the ledger (the child still running)."""
    deadline = time.monotonic() + 240
    with Ledger(connect(url), retry_s=0) as ledger:
        while time.monotonic() < deadline:
            assert child.poll() is None, child.communicate()[1][-3000:]
            runs = ledger.list_runs(1) if _has_tables(ledger) else []
            if runs and any(u.state == "done" for u in ledger.units(runs[0].id)):
                return runs[0].id
            time.sleep(0.2)
    raise AssertionError("the run committed no unit in 240 s")


def _has_tables(ledger: Ledger) -> bool:
    from sqlalchemy import inspect

    return inspect(ledger.engine).has_table("rewind_units")


def _rewind(world: World, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [jf.REWIND_BIN, *args], cwd=world.tmp, env=env, capture_output=True, text=True, timeout=300
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.slow
def test_a_run_rides_out_a_restart_and_no_second_runner_takes_its_lease(world: World, pg: PgCluster) -> None:
    from rewind.job.service import resume_job

    url = pg.create_database()
    table = f"outage.ridden_{uuid.uuid4().hex[:6]}"
    spec_path = jf.write_spec(world.tmp / "ridden.yaml", world.spec(table))
    env = jf.child_env(world.settings, REWIND_LEDGER_URL=url)
    log = world.settings.state_path / "rewind.log"  # where the CLI's warnings go
    seen = log.stat().st_size if log.exists() else 0
    child = subprocess.Popen(
        [jf.REWIND_BIN, "run", str(spec_path), "--json"],
        cwd=world.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        run_id = _after_first_commit(url, child)
        pg.stop()
        down = time.monotonic()
        try:  # a second runner while the database is down cannot even read the lease
            during = _rewind(world, env, "resume", run_id)
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        finally:
            pg.start()
        with pytest.raises(LeaseHeld) as after:  # nor once it is back: the first holds its lease
            resume_job(world.settings.model_copy(update={"ledger_url": url}), run_id)  # at once, in here
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err[-3000:]
    outcome = json.loads(out)
    assert outcome["state"] == "succeeded" and outcome["run_id"] == run_id
    with log.open() as lines:
        lines.seek(seen)
        assert "retrying in" in lines.read()  # the run met the outage and rode it out

    assert during.returncode == 1
    assert _one_error_line(during.stderr).startswith(f"error: ledger at postgresql+psycopg://postgres@127.0.0.1:{pg.port}")
    refused = str(after.value)
    assert refused.startswith(f"run {run_id} is still running as") and "\n" not in refused, refused

    assert _stable(world.settings, outcome["staging"]) == world.reference  # exactly once
    with Ledger.open(url) as ledger:
        units = ledger.units(run_id)
        audit = ledger.audit_log(run_id)
    assert len(units) == RECORDS // UNIT_RECORDS and all(u.state == "done" and u.attempts == 1 for u in units)
    assert not [a for a in audit if a.action == "lease-takeover"]


@pytest.mark.slow
def test_an_outage_beyond_the_budget_fails_the_run_in_one_line_and_resume_finishes_it(
    world: World, pg: PgCluster
) -> None:
    from rewind.job.service import resume_job

    url = pg.create_database()
    table = f"outage.resumed_{uuid.uuid4().hex[:6]}"
    spec_path = jf.write_spec(world.tmp / "resumed.yaml", world.spec(table))
    env = jf.child_env(world.settings, REWIND_LEDGER_URL=url, REWIND_LEDGER_RETRY_S="2")
    child = subprocess.Popen(
        [jf.REWIND_BIN, "run", str(spec_path)],
        cwd=world.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        run_id = _after_first_commit(url, child)
        pg.stop()
        try:
            _, err = child.communicate(timeout=120)
        finally:
            pg.start()
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 1, err[-3000:]
    line = _one_error_line(err)
    assert line.startswith(f"error: run {run_id} stopped: ledger at postgresql+psycopg://"), line
    assert "beyond ledger_retry_s (2 s)" in line
    assert f"`rewind resume {run_id}` once it is back" in line

    outcome = resume_job(world.settings.model_copy(update={"ledger_url": url}), run_id, units_per_wave=4)
    assert outcome.state == "succeeded"
    assert _stable(world.settings, outcome.staging) == world.reference  # exactly once
    with Ledger.open(url) as ledger:
        audit = ledger.audit_log(run_id)
    takeovers = [a.details["reason"] for a in audit if a.action == "lease-takeover"]
    assert takeovers == ["owner-dead"]  # the stopped process's lease, taken at once
