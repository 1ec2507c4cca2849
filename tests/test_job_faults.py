"""Idempotence, resume and fencing of backfill runs under real crashes.

A run is SIGKILLed at the named crash points of :mod:`rewind.faults` (each in its own
child process with ``REWIND_FAULT``), resumed, killed again, and finally resumed to the end.
Its staging must then equal, row for row, a clean run of the same spec: no duplicate, no
gap, the quarantine written once. Two chains cover the five points, one staging on a branch
of an existing target, one into a new staging table. Fencing is checked in-process against
leases taken directly through the ledger.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.job.runner import RunOutcome
from rewind.spec import JobSpec, parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

PARTITIONS = 2
RECORDS = 2400
UNIT_RECORDS = 300  # 8 units; the driver runs 2 per wave, so 4 waves
RATE = 500.0  # records/s: a wave reads 600 records in >1 s, so a timed kill lands inside it
VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")

@dataclass
class World:
    tmp: Path
    settings: Settings
    topic: str
    orders: list[jf.Order]
    coords: dict[int, tuple[int, int]]
    reference: RunOutcome

    def spec(self, table: str, *, paced: bool = True, **sections: Any) -> dict[str, Any]:
        """The job; ``paced`` (the chains) holds it to :data:`RATE` so that a timed kill lands
        inside a wave; the runs nobody kills go at full speed (the guard changes no row)."""
        if paced:
            sections = {"guards": {"max_records_per_second": RATE}, **sections}
        return jf.order_spec(
            "orders-faults",
            self.topic,
            table,
            unit_records=UNIT_RECORDS,
            run={"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 60},
            **sections,
        )

    def env(self, **extra: str) -> dict[str, str]:
        return jf.child_env(self.settings, **extra)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> World:
    from rewind.job.service import run_job

    tmp = tmp_path_factory.mktemp("job-faults")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, PARTITIONS)
    orders = jf.order_events(RECORDS, PARTITIONS, raise_every=600)
    coords = jf.produce_orders(conf, topic, orders)
    w = World(tmp, settings, topic, orders, coords, None)  # type: ignore[arg-type]
    w.reference = run_job(settings, parse_spec(w.spec("faults.reference", paced=False)))
    assert w.reference.state == "succeeded"
    return w


def _driver(world: World, fault: str, action: str, target: str, delay: float | None = None) -> None:
    extra = {"REWIND_FAULT": fault}
    if delay is not None:
        extra["REWIND_FAULT_DELAY"] = str(delay)
    proc = jf.run_driver(world.tmp, world.env(**extra), action, target, units_per_wave=2)
    assert proc.returncode == -9, f"{fault}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"


def _rows(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    rows = jf.staging_table(settings, staging).to_pylist()
    return sorted(rows, key=lambda r: r["_rewind_event_id"])


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _ledger(world: World) -> Any:
    from rewind.job.service import open_ledger

    return open_ledger(world.settings)


def _committed_units(world: World, spec: JobSpec, run_id: str) -> set[str]:
    from rewind.job.components import make_sink
    from rewind.sinks.iceberg import IcebergStaging

    with _ledger(world) as ledger:
        staging = ledger.get_run(run_id).staging
    if not staging:
        return set()
    return make_sink(world.settings, spec).committed_units(IcebergStaging.from_dict(staging), run_id)


def _live_row(schema: Any) -> Any:
    """One row already in the target before the backfill (what `main` holds)."""
    import pyarrow as pa

    row = {
        "order_id": 1,
        "status": "live",
        "amount": 1.0,
        "_rewind_event_id": "live-0",
        "_rewind_source_topic": "live",
        "_rewind_source_partition": 0,
        "_rewind_source_offset": 0,
        "_rewind_source_timestamp": None,
        "_rewind_extracted_at": datetime.fromtimestamp(0, UTC),
        "_rewind_transform": "live",
        "_rewind_transform_version": "0",
        "_rewind_run_id": "live",
        "_rewind_synthetic": False,
    }
    return pa.Table.from_pylist([row], schema=schema)


CHAINS = {
    # staging on a branch of an existing target; the first kill comes before any Spark work
    "branch": ["after-plan", "mid-wave", "after-sink-commit"],
    # a new read model: staging table
    "table": ["after-quarantine-commit", "after-ledger-update:2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_kill_resume_and_compare_with_a_clean_run(world: World, chain: str) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.service import plan_job, resume_job

    table = f"faults.{chain}_{uuid.uuid4().hex[:6]}"
    spec_data = world.spec(table)
    spec = parse_spec(spec_data)
    spec_path = jf.write_spec(world.tmp / f"{chain}.yaml", spec_data)
    catalog = load_catalog(world.settings)
    if chain == "branch":
        schema = plan_job(world.settings, spec).output_schema()
        catalog.create_namespace_if_not_exists("faults")
        catalog.create_table(table, schema=schema).append(_live_row(schema))

    run_id = None
    for step, fault in enumerate(CHAINS[chain]):
        if run_id is None:
            _driver(world, fault, "run", str(spec_path))
            with _ledger(world) as ledger:
                latest = ledger.list_runs(1)[0]
            assert latest.name == "orders-faults" and latest.target == f"iceberg:{table}"
            run_id = latest.id
        else:
            _driver(world, fault, "resume", run_id, delay=1.0)
        _check_after_kill(world, spec, run_id, fault, step)

    if chain == "branch":  # the last step through the CLI, as a user would (in this process:
        # a child would pay another Python and Spark start for nothing the kills have not shown)
        from typer.testing import CliRunner

        from rewind.cli import app

        env = {"REWIND_BOOTSTRAP_SERVERS": world.settings.bootstrap_servers,
               "REWIND_STATE_DIR": str(world.settings.state_path)}
        resumed = CliRunner().invoke(app, ["resume", run_id, "--json"], env=env)
        assert resumed.exit_code == 0, resumed.output[-3000:]
        outcome = json.loads(resumed.stdout)
    else:
        outcome = resume_job(world.settings, run_id).to_dict()
    assert outcome["state"] == "succeeded" and outcome["run_id"] == run_id

    # staging equals the clean run row for row: no duplicate, no gap
    got = _rows(world.settings, outcome["staging"])
    ref = _rows(world.settings, world.reference.staging)
    if chain == "branch":
        assert outcome["staging"]["branch"] == f"rewind-{run_id}"
        live = [r for r in got if r["_rewind_run_id"] == "live"]
        assert len(live) == 1  # cut from main, which still holds only the live row
        got = [r for r in got if r["_rewind_run_id"] != "live"]
        target = catalog.load_table(table)
        assert [r["_rewind_event_id"] for r in target.scan().to_arrow().to_pylist()] == ["live-0"]
        assert outcome["staging"]["base_snapshot_id"] == target.snapshot_by_name("main").snapshot_id
    assert {r["_rewind_run_id"] for r in got} == {run_id}
    ids = [r["_rewind_event_id"] for r in got]
    assert len(ids) == len(set(ids))
    assert _stable(got) == _stable(ref)
    want = jf.expected_rows(world.topic, world.orders, world.coords, "order_lines", "1")
    assert ids == [r["_rewind_event_id"] for r in want]

    # the quarantine holds each bad record of the run once
    keep = ("topic", "partition", "offset", "key", "value", "stage", "reason", "unit_id")
    quarantine = jf.quarantine_rows(world.settings, outcome["quarantine_table"], run_id)
    reference_q = jf.quarantine_rows(world.settings, world.reference.quarantine_table, world.reference.run_id)
    assert [{k: q[k] for k in keep} for q in quarantine] == [{k: q[k] for k in keep} for q in reference_q]

    # the counts agree with the clean run, and the ledger saw the crashes
    counts = ("records_read", "emitted", "rows_out", "quarantined", "filtered")
    assert {k: outcome[k] for k in counts} == {k: world.reference.to_dict()[k] for k in counts}
    with _ledger(world) as ledger:
        units = ledger.units(run_id)
        audit = ledger.audit_log(run_id)
    assert all(u.state == "done" for u in units) and len(units) == 8
    assert max(u.attempts for u in units) >= 2  # some unit was redone after a kill
    takeovers = [a for a in audit if a.action == "lease-takeover"]
    # every kill after the lease was taken left it to a dead process, which the next resume took
    # over (a kill after-plan comes before the lease)
    held_at_kill = [f for f in CHAINS[chain] if f != "after-plan"]
    assert [a.details["reason"] for a in takeovers] == ["owner-dead"] * len(held_at_kill)
    if chain == "branch":
        assert any(a.action == "reconcile" for a in audit)  # after-sink-commit: units from the sink


def _check_after_kill(world: World, spec: JobSpec, run_id: str, fault: str, step: int) -> None:
    """What each crash point must leave behind."""
    with _ledger(world) as ledger:
        run = ledger.get_run(run_id)
        units = {u.unit_id: u for u in ledger.units(run_id)}
    done = {u for u, rec in units.items() if rec.state == "done"}
    running = {u for u, rec in units.items() if rec.state == "running"}
    committed = _committed_units(world, spec, run_id)
    quarantined = {q["unit_id"] for q in jf.quarantine_rows(world.settings, spec.quarantine.table, run_id)}
    where = f"after kill at {fault} (step {step})"
    assert len(units) == 8, where
    if fault == "after-plan":
        assert run.state == "planned" and not running and not done and run.staging is None, where
    elif fault == "mid-wave":
        assert run.state == "running", where
        assert len(running) == 2 and not done and not committed, (where, running, done, committed)
        assert not quarantined, where
    elif fault == "after-quarantine-commit":
        assert len(running) == 2 and not done and not committed, where
        assert quarantined == running, where  # the quarantine of the wave is in, its output is not
    elif fault == "after-sink-commit":
        assert committed == running and len(committed) == 2 and not done, where
    elif fault == "after-ledger-update:2":
        assert len(done) == 4 and committed == done and not running, where
    else:  # pragma: no cover
        raise AssertionError(fault)


# -- fencing ----------------------------------------------------------------------------------


def test_a_second_run_is_refused_while_the_first_holds_the_lease(world: World) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.service import run_job
    from rewind.ledger import LeaseHeld

    table = f"faults.fenced_{uuid.uuid4().hex[:6]}"
    target = f"iceberg:{table}"
    with _ledger(world) as ledger:
        ledger.acquire(target, "r-the-live-holder", 60, owner="another-host:4242")
        try:
            with pytest.raises(LeaseHeld) as caught:
                run_job(world.settings, parse_spec(world.spec(table)))
            refused = ledger.list_runs(1)[0]
        finally:
            assert ledger.release(target, "r-the-live-holder", owner="another-host:4242")
    message = str(caught.value)
    assert "r-the-live-holder" in message and "another-host:4242" in message and target in message
    assert len(message.splitlines()) == 1
    assert refused.target == target and refused.state == "refused"  # not failed: nothing of it ran
    assert "r-the-live-holder" in (refused.error or "")
    catalog = load_catalog(world.settings)
    assert not [t for t in catalog.list_tables("faults") if t[1].startswith(table.split(".")[1])]


def test_a_crashed_holders_lease_expires_and_resume_takes_it_over(world: World) -> None:
    from rewind.job.components import make_sink
    from rewind.job.runner import start_run
    from rewind.job.service import plan_job, resume_job, show_run
    from rewind.ledger import LeaseHeld

    table = f"faults.expiry_{uuid.uuid4().hex[:6]}"
    spec = parse_spec(
        {**world.spec(table, paced=False), "run": {"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 4}}
    )
    ttl = spec.run.lease_ttl_s
    plan = plan_job(world.settings, spec)
    target = make_sink(world.settings, spec).target
    # the run's process crashed on another host while holding the lease: nobody can prove it
    # dead, so only the expiry frees the target
    with _ledger(world) as ledger:
        run_id = start_run(ledger, plan, target)
        ledger.set_state(run_id, "running")
        lease = ledger.acquire(target, run_id, ttl, owner="crashed-host:777")
    with pytest.raises(LeaseHeld) as caught:
        resume_job(world.settings, run_id)
    assert "crashed-host:777" in str(caught.value) and run_id in str(caught.value)
    # the refused attempt did not touch the run another process may still be running
    shown = show_run(world.settings, run_id)
    assert shown["state"] == "running" and shown["error"] is None

    time.sleep(max(0.0, (lease.expires_at - _now()).total_seconds()) + 0.2)
    # nobody runs it any more: shown as stale, naming the lease's end and its holder
    shown = show_run(world.settings, run_id)
    assert (shown["state"], shown["ledger_state"]) == ("stale", "running")
    expired = lease.expires_at.isoformat(timespec="seconds")
    assert f"lease expired at {expired}, held by pid 777 on crashed-host" in shown["state_detail"]
    assert shown["lease"]["host"] == "crashed-host" and shown["lease"]["pid"] == "777"
    outcome = resume_job(world.settings, run_id)
    assert outcome.state == "succeeded"
    assert outcome.counts.records_read == RECORDS
    with _ledger(world) as ledger:
        takeovers = [a for a in ledger.audit_log(run_id) if a.action == "lease-takeover"]
        assert ledger.lease(target) is None  # released at the end
    assert len(takeovers) == 1
    assert takeovers[0].details["reason"] == "expired"
    assert takeovers[0].details["previous_owner"] == "crashed-host:777"
    ids = [r["_rewind_event_id"] for r in _rows(world.settings, outcome.staging)]
    assert ids == [r["_rewind_event_id"] for r in _rows(world.settings, world.reference.staging)]


def _now() -> datetime:
    return datetime.now(UTC)


def test_a_killed_runs_lease_shows_it_possibly_dead_and_resume_takes_over_at_once(world: World) -> None:
    """A process on this host that died (kill -9) holding an unexpired lease: the run is shown
    possibly-dead with that pid, and resume takes it over without waiting for the expiry."""
    import socket

    from rewind.job.components import make_sink
    from rewind.job.runner import start_run
    from rewind.job.service import list_runs, plan_job, resume_job, show_run

    table = f"faults.killed_{uuid.uuid4().hex[:6]}"
    spec = parse_spec(
        {**world.spec(table, paced=False), "run": {"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 600}}
    )
    plan = plan_job(world.settings, spec)
    target = make_sink(world.settings, spec).target
    gone = subprocess.Popen(["sleep", "60"])
    gone.kill()
    gone.wait()
    owner = f"{socket.gethostname()}:{gone.pid}"
    with _ledger(world) as ledger:
        run_id = start_run(ledger, plan, target)
        ledger.set_state(run_id, "running")
        ledger.acquire(target, run_id, 600, owner=owner)
    shown = show_run(world.settings, run_id)
    assert shown["state"] == "possibly-dead", shown["state_detail"]
    assert f"pid {gone.pid} on {socket.gethostname()} is gone" in shown["state_detail"]
    assert [r["state"] for r in list_runs(world.settings) if r["run_id"] == run_id] == ["possibly-dead"]

    began = time.monotonic()
    outcome = resume_job(world.settings, run_id)
    assert outcome.state == "succeeded" and time.monotonic() - began < 300  # not the 600 s lease
    assert show_run(world.settings, run_id)["state"] == "succeeded"


def test_a_run_that_lost_its_lease_stops_before_writing_again(world: World) -> None:
    from rewind.core.console import QuietConsole
    from rewind.job.components import make_sink
    from rewind.job.service import run_job, show_run
    from rewind.ledger import LeaseLost

    table = f"faults.usurped_{uuid.uuid4().hex[:6]}"
    spec = parse_spec({**world.spec(table), "run": {"work_unit_records": UNIT_RECORDS, "lease_ttl_s": 3}})
    target = make_sink(world.settings, spec).target
    seen: list[str] = []
    noticed = threading.Event()

    class Noticed(logging.Handler):
        """The run's lease keeper logs the LeaseLost its next heartbeat meets."""

        def emit(self, record: logging.LogRecord) -> None:
            if "lost its lease" in record.getMessage():
                noticed.set()

    class Usurper(QuietConsole):
        def run_progress(self, progress: Any) -> None:
            """After the first wave another run takes the target (as after an expiry)."""
            usurp(progress)

    def usurp(progress: Any) -> None:
        if seen:
            return
        seen.append(progress.run_id)
        with _ledger(world) as ledger:
            assert ledger.release(target, progress.run_id)
            ledger.acquire(target, "r-usurper", 60, owner="other-host:1")
        # the keeper's next heartbeat (every ttl/3 s) finds it gone, before the next wave
        assert noticed.wait(spec.run.lease_ttl_s + 5), "the lease keeper never noticed the loss"

    keeper_log = logging.getLogger("rewind.ledger.leases")
    handler = Noticed(logging.ERROR)
    keeper_log.addHandler(handler)
    try:
        with pytest.raises(LeaseLost) as caught:
            run_job(world.settings, spec, console=Usurper(), units_per_wave=2)
    finally:
        keeper_log.removeHandler(handler)
        with _ledger(world) as ledger:
            ledger.release(target, "r-usurper", owner="other-host:1")
    run_id = seen[0]
    # held by the usurper, or no longer held when the heartbeat fell between its release and acquire
    assert "r-usurper" in str(caught.value) or "(no longer held)" in str(caught.value)
    shown = show_run(world.settings, run_id)
    assert shown["state"] == "failed" and "lost its lease" in shown["error"]
    assert shown["units_by_state"] == {"done": 2, "pending": 6}
    assert len(_committed_units(world, spec, run_id)) == 2  # nothing written after the loss
