"""The ledger repository on real SQLite and real PostgreSQL: plans, runs, units, audit."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from rewind.core.ranges import OffsetRange
from rewind.errors import RewindError
from rewind.ledger import (
    SCHEMA_VERSION,
    TRANSITIONS,
    IllegalTransition,
    Ledger,
    LedgerError,
    LedgerUnavailable,
    NotFound,
    PlanConflict,
    UnitResult,
    UnitStateError,
    connect,
    ensure_schema,
    unit_id,
)
from rewind.secrets import MASK

TABLES = ("rewind_audit", "rewind_leases", "rewind_units", "rewind_runs", "rewind_plans")
SPEC = {"name": "orders", "source": {"topics": ["orders"]}, "window": {"start": "2024-01-01"}}
PLAN = {"units": [{"topic": "orders", "partition": 0, "start": 0, "end": 100}], "version": 1}


def ledger_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return ledger_url(request.param, request, tmp_path)


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = Ledger.open(url, user="alice")
    with led.engine.begin() as conn:  # the PostgreSQL database is shared by the module's tests
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
    yield led
    led.close()


def new_run(
    ledger: Ledger, *, name: str = "orders", run_id: str | None = None, target: str = "iceberg:a.b"
) -> str:
    ledger.save_plan("p-1", "orders", SPEC, PLAN)
    return ledger.create_run("p-1", name, target, run_id=run_id).id


def ranges(*spans: tuple[int, int, int]) -> list[OffsetRange]:
    return [OffsetRange("orders", p, s, e) for p, s, e in spans]


def is_utc(value: datetime | None) -> bool:
    return value is not None and value.tzinfo is not None and value.utcoffset() == UTC.utcoffset(None)


# -- schema ----------------------------------------------------------------------------------


def test_an_early_ledger_gets_the_tables_and_a_newer_one_is_refused(url: str) -> None:
    engine = connect(url)
    try:
        with engine.begin() as conn:  # a ledger made before the repository: the version row only
            for table in (*TABLES, "rewind_schema"):
                conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(
                text(
                    "CREATE TABLE rewind_schema "
                    "(id INTEGER PRIMARY KEY, version INTEGER NOT NULL, created_at TIMESTAMP)"
                )
            )
            conn.execute(text(f"INSERT INTO rewind_schema (id, version) VALUES (1, {SCHEMA_VERSION})"))
        assert ensure_schema(engine) == SCHEMA_VERSION
        with Ledger(engine) as led:
            led.save_plan("p-1", "orders", SPEC, PLAN)  # the new tables exist
        engine = connect(url)
        newer = SCHEMA_VERSION + 1
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE rewind_schema SET version = {newer}"))
        with pytest.raises(
            RewindError,
            match=rf"schema v{newer}, newer than this Rewind understands \(v{SCHEMA_VERSION}\); upgrade",
        ):
            ensure_schema(engine)
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE rewind_schema SET version = {SCHEMA_VERSION}"))
    finally:
        engine.dispose()


# -- plans -----------------------------------------------------------------------------------


def test_saving_a_plan_twice_is_a_no_op(ledger: Ledger) -> None:
    first = ledger.save_plan("p-1", "orders", SPEC, PLAN)
    # same content, other key order, given as JSON text: still the same plan
    again = ledger.save_plan(
        "p-1",
        "orders",
        '{"window": {"start": "2024-01-01"}, "source": {"topics": ["orders"]}, "name": "orders"}',
        dict(reversed(PLAN.items())),
    )
    assert again == first
    assert first.spec == SPEC and first.plan == PLAN
    assert is_utc(first.created_at)
    assert ledger.get_plan("p-1") == first


def test_a_plan_id_with_other_content_is_a_conflict(ledger: Ledger) -> None:
    ledger.save_plan("p-1", "orders", SPEC, PLAN)
    with pytest.raises(PlanConflict, match="plan p-1 is already in the ledger with a different plan") as err:
        ledger.save_plan("p-1", "orders", SPEC, {**PLAN, "version": 2})
    assert err.value.differs == ["plan"]
    with pytest.raises(PlanConflict, match="different name, spec"):
        ledger.save_plan("p-1", "totals", {**SPEC, "name": "totals"}, PLAN)
    assert ledger.get_plan("p-1").plan == PLAN  # nothing was overwritten


def test_plan_secrets_are_masked_and_unknown_ids_are_not_found(ledger: Ledger) -> None:
    spec = {
        **SPEC,
        "kafka": {"sasl.password": "Pa55-word", "bootstrap.servers": "b:9092"},
        "catalog": {"uri": "postgresql://cat:Cat-Secret@db/cat"},
    }
    stored = ledger.save_plan("p-2", "orders", spec, PLAN)
    assert stored.spec["kafka"] == {"sasl.password": MASK, "bootstrap.servers": "b:9092"}
    assert stored.spec["catalog"]["uri"] == f"postgresql://cat:{MASK}@db/cat"
    with pytest.raises(NotFound, match="no plan 'nope' in the ledger"):
        ledger.get_plan("nope")
    with pytest.raises(NotFound, match=r"no run 'r-nope' in the ledger; `rewind runs` lists the runs"):
        ledger.get_run("r-nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        ledger.save_plan("p-3", "orders", "{not json", PLAN)


# -- runs ------------------------------------------------------------------------------------


def test_a_run_is_created_planned_with_who_and_where(ledger: Ledger) -> None:
    ledger.save_plan("p-1", "orders", SPEC, PLAN)
    run = ledger.create_run(
        "p-1",
        "orders",
        "iceberg:analytics.order_totals",
        staging={"table": "analytics.order_totals", "branch": "rewind-r1"},
    )
    assert run.id.startswith("r-") and run.state == "planned"
    assert (run.plan_id, run.name, run.target) == ("p-1", "orders", "iceberg:analytics.order_totals")
    assert (run.user, run.host, run.pid) == ("alice", socket.gethostname(), os.getpid())  # this process
    assert is_utc(run.created_at) and run.started_at is None and run.finished_at is None
    assert run.staging == {"table": "analytics.order_totals", "branch": "rewind-r1"}
    assert ledger.get_run(run.id) == run

    with pytest.raises(NotFound, match="no plan 'p-missing'"):
        ledger.create_run("p-missing", "orders", "iceberg:a.b")
    with pytest.raises(LedgerError, match=f"run {run.id} already exists"):
        ledger.create_run("p-1", "orders", "iceberg:a.b", run_id=run.id)


def test_run_lifecycle_with_a_resume(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    started = ledger.set_state(run_id, "running")
    assert started.state == "running" and is_utc(started.started_at) and started.finished_at is None

    failed = ledger.set_state(run_id, "failed", error="broker at kafka://u:Broker-Pw@b:9092 went away")
    assert failed.state == "failed" and is_utc(failed.finished_at)
    assert failed.error == f"broker at kafka://u:{MASK}@b:9092 went away"

    resumed = ledger.set_state(run_id, "running")  # resume: failed -> running
    assert resumed.started_at == started.started_at  # the first start is kept
    assert resumed.finished_at is None and resumed.error is None

    again = ledger.set_state(run_id, "running")  # a resume of a run whose process died
    assert again.state == "running"

    done = ledger.set_state(
        run_id, "succeeded", totals={"records_read": 100}, staging={"branch": "rewind-x", "token": "tok-123"}
    )
    assert done.state == "succeeded" and done.totals == {"records_read": 100}
    assert done.staging == {"branch": "rewind-x", "token": MASK}
    assert done.finished_at is not None and done.finished_at >= done.started_at  # type: ignore[operator]

    assert ledger.set_state(run_id, "promoted").state == "promoted"
    assert ledger.set_state(run_id, "rolled_back").state == "rolled_back"
    assert ledger.set_state(run_id, "promoted").finished_at == done.finished_at


@pytest.mark.parametrize(
    ("path", "wanted"),
    [
        ([], "succeeded"),
        ([], "promoted"),
        (["running", "succeeded"], "running"),
        (["running", "succeeded"], "failed"),
        (["running", "interrupted"], "succeeded"),
        (["running", "succeeded", "promoted"], "running"),
        (["running", "failed"], "promoted"),
    ],
)
def test_illegal_transitions_are_refused(ledger: Ledger, path: list[str], wanted: str) -> None:
    run_id = new_run(ledger)
    for state in path:
        ledger.set_state(run_id, state)  # type: ignore[arg-type]
    before = ledger.get_run(run_id)
    with pytest.raises(IllegalTransition, match=f"run {run_id} is {before.state}; it cannot become {wanted}"):
        ledger.set_state(run_id, wanted, error="should not be stored")  # type: ignore[arg-type]
    assert ledger.get_run(run_id) == before


def test_unknown_states_and_runs_are_refused(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    with pytest.raises(ValueError, match="unknown run state 'done'"):
        ledger.set_state(run_id, "done")  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        ledger.set_state("r-missing", "running")
    assert all(targets <= set(TRANSITIONS) for targets in TRANSITIONS.values())


def test_only_one_of_racing_promotions_wins(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.set_state(run_id, "running")
    ledger.set_state(run_id, "succeeded")
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def promote() -> None:
        barrier.wait()
        try:
            ledger.set_state(run_id, "promoted")
            outcomes.append("won")
        except IllegalTransition:
            outcomes.append("refused")

    threads = [threading.Thread(target=promote) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["refused", "refused", "refused", "won"]


def test_list_runs_newest_first_with_limit_and_name(ledger: Ledger) -> None:
    ids = [new_run(ledger, name="orders" if i % 2 == 0 else "payments", run_id=f"r-{i}") for i in range(5)]
    assert [r.id for r in ledger.list_runs()] == ids[::-1]
    assert [r.id for r in ledger.list_runs(limit=2)] == ["r-4", "r-3"]
    assert [r.id for r in ledger.list_runs(name="payments")] == ["r-3", "r-1"]
    assert ledger.list_runs(name="nothing") == []
    with pytest.raises(ValueError):
        ledger.list_runs(limit=0)


def test_datetimes_come_back_aware_utc_and_naive_ones_are_refused(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    with ledger.engine.connect() as conn:
        raw = conn.execute(text("SELECT created_at FROM rewind_runs")).scalar()
    if ledger.engine.dialect.name == "sqlite":
        assert isinstance(raw, str) and "+" not in raw  # stored naive, as UTC wall clock
    run = ledger.get_run(run_id)
    assert is_utc(run.created_at)
    assert abs((datetime.now(UTC) - run.created_at).total_seconds()) < 60


# -- units -----------------------------------------------------------------------------------


def test_add_units_is_idempotent(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    assert ledger.add_units(run_id, ranges((0, 0, 100), (0, 100, 200), (1, 0, 50))) == 3
    ledger.mark_running(run_id, ["orders/0/0-100"])
    assert ledger.add_units(run_id, ranges((0, 0, 100), (1, 50, 80))) == 1
    got = ledger.units(run_id)
    assert [u.unit_id for u in got] == [
        "orders/0/0-100",
        "orders/0/100-200",
        "orders/1/0-50",
        "orders/1/50-80",
    ]
    assert got[0].state == "running"  # adding again did not reset it
    assert (got[1].state, got[1].attempts, got[1].start_offset, got[1].end_offset) == ("pending", 0, 100, 200)
    assert unit_id("orders", 1, 50, 80) == got[3].unit_id
    with pytest.raises(NotFound):
        ledger.add_units("r-missing", ranges((0, 0, 1)))


def result(
    uid: str,
    read: int,
    *,
    quarantined: int = 0,
    filtered: int = 0,
    rows: int | None = None,
    reasons: dict[str, Any] | None = None,
) -> UnitResult:
    emitted = read - quarantined - filtered
    return UnitResult(
        uid, read, emitted, emitted if rows is None else rows, quarantined, filtered, reasons or {}
    )


def test_pending_units_after_partial_completion(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.add_units(run_id, ranges((0, 0, 10), (0, 10, 20), (1, 0, 10), (1, 10, 20)))
    all_ids = [u.unit_id for u in ledger.pending_units(run_id)]
    ledger.mark_running(run_id, all_ids)
    ledger.complete_units(run_id, [result("orders/0/0-10", 10), result("orders/1/10-20", 10)])
    ledger.fail_units(run_id, ["orders/1/0-10"], "decode blew up; postgresql://u:Db-Pass@h/d")

    pending = ledger.pending_units(run_id)
    assert [(u.unit_id, u.state) for u in pending] == [
        ("orders/0/10-20", "running"),
        ("orders/1/0-10", "failed"),
    ]
    failed = pending[1]
    assert failed.error == f"decode blew up; postgresql://u:{MASK}@h/d" and is_utc(failed.finished_at)

    ledger.mark_running(run_id, ["orders/1/0-10"])
    retried = {u.unit_id: u for u in ledger.units(run_id)}["orders/1/0-10"]
    assert (retried.state, retried.attempts, retried.error, retried.finished_at) == ("running", 2, None, None)

    done = {u.unit_id: u for u in ledger.units(run_id)}["orders/0/0-10"]
    assert (done.state, done.records_read, done.attempts) == ("done", 10, 1)
    assert is_utc(done.started_at) and is_utc(done.finished_at)


def test_complete_units_refuses_unknown_units_and_changes_nothing(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.add_units(run_id, ranges((0, 0, 10), (0, 10, 20), (0, 20, 30)))
    before = ledger.units(run_id)
    batch = [result("orders/0/0-10", 10), result("orders/9/0-10", 10), result("orders/0/20-30", 10)]
    with pytest.raises(UnitStateError, match=f"run {run_id}: unknown units: orders/9/0-10"):
        ledger.complete_units(run_id, batch)
    assert ledger.units(run_id) == before


def test_a_failure_in_the_middle_of_complete_units_changes_nothing(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.add_units(run_id, ranges((0, 0, 10), (0, 10, 20), (0, 20, 30)))
    ledger.mark_running(run_id, [u.unit_id for u in ledger.units(run_id)])
    before = ledger.units(run_id)
    updates: list[str] = []

    def crash_on_second_unit_update(*args: Any) -> None:
        statement: str = args[2]
        if statement.lstrip().upper().startswith("UPDATE REWIND_UNITS SET STATE"):
            updates.append(statement)
            if len(updates) == 2:
                raise RuntimeError("connection lost in the middle of complete_units")

    event.listen(ledger.engine, "before_cursor_execute", crash_on_second_unit_update)
    try:
        with pytest.raises(RuntimeError, match="connection lost"):
            ledger.complete_units(run_id, [result(u.unit_id, 10) for u in before])
    finally:
        event.remove(ledger.engine, "before_cursor_execute", crash_on_second_unit_update)
    assert len(updates) == 2  # the first unit's UPDATE did run before the crash
    assert ledger.units(run_id) == before
    assert ledger.unit_counts(run_id).done == 0

    ledger.complete_units(run_id, [result(u.unit_id, 10) for u in before])  # the retry goes through
    assert ledger.unit_counts(run_id).all_done


def test_completing_a_done_unit_again(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.add_units(run_id, ranges((0, 0, 10), (0, 10, 20)))
    ledger.complete_units(run_id, [result("orders/0/0-10", 10, quarantined=1, reasons={"decode": 1})])
    first = ledger.units(run_id)
    # a resume repeating what the sink already holds: same counts, nothing changes
    ledger.complete_units(run_id, [result("orders/0/0-10", 10, quarantined=1, reasons={"decode": 1})])
    assert ledger.units(run_id) == first
    with pytest.raises(UnitStateError, match="units already done with different counts: orders/0/0-10"):
        ledger.complete_units(run_id, [result("orders/0/10-20", 10), result("orders/0/0-10", 9)])
    assert ledger.units(run_id) == first  # orders/0/10-20 was not completed either
    with pytest.raises(UnitStateError, match="cannot start units already done: orders/0/0-10"):
        ledger.mark_running(run_id, ["orders/0/10-20", "orders/0/0-10"])
    with pytest.raises(UnitStateError, match="cannot fail unknown units: nope"):
        ledger.fail_units(run_id, ["nope"], "x")
    assert ledger.units(run_id) == first
    with pytest.raises(ValueError, match="appears twice"):
        ledger.complete_units(run_id, [result("orders/0/10-20", 1), result("orders/0/10-20", 1)])


def test_unit_counts_sum_the_units(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    ledger.add_units(run_id, ranges((0, 0, 100), (1, 0, 100), (2, 0, 100), (3, 0, 100)))
    ledger.mark_running(run_id, ["orders/0/0-100", "orders/1/0-100", "orders/2/0-100"])
    ledger.complete_units(
        run_id,
        [
            result(
                "orders/0/0-100",
                100,
                quarantined=3,
                filtered=7,
                rows=120,
                reasons={"decode": 2, "translate-reject": {"no id": 1}},
            ),
            result(
                "orders/1/0-100", 98, quarantined=2, reasons={"decode": 1, "translate-reject": {"no id": 1}}
            ),
        ],
    )
    ledger.fail_units(run_id, ["orders/2/0-100"], "boom")
    counts = ledger.unit_counts(run_id)
    assert counts.units == 4 and counts.done == 2 and not counts.all_done
    assert counts.by_state == {"done": 2, "failed": 1, "pending": 1}
    assert (counts.records_read, counts.emitted, counts.rows_out) == (198, 186, 216)
    assert (counts.quarantined, counts.filtered) == (5, 7)
    assert counts.conserved
    assert counts.reasons == {"decode": 3, "translate-reject": {"no id": 2}}
    assert counts.to_dict()["records_read"] == 198
    empty = ledger.unit_counts("r-none")
    assert (empty.units, empty.records_read, empty.reasons, empty.all_done) == (0, 0, {}, False)


def test_unit_results_are_checked() -> None:
    with pytest.raises(ValueError, match="records_read must be a count >= 0"):
        UnitResult("u", -1, 0, 0)
    with pytest.raises(ValueError, match="emitted must be a count"):
        UnitResult("u", 1, True, 0)
    assert UnitResult("u", 10, 7, 9, 2, 1).conserved
    assert not UnitResult("u", 10, 7, 9, 2, 0).conserved


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_reasons_must_be_counts(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    with Ledger.open(ledger_url(backend, request, tmp_path)) as led:
        run_id = new_run(led, run_id=f"r-reasons-{backend}")
        led.add_units(run_id, ranges((0, 0, 10)))
        with pytest.raises(ValueError, match="reason 'decode' must map to a count"):
            led.complete_units(
                run_id, [result("orders/0/0-10", 10, quarantined=1, reasons={"decode": "one"})]
            )
        # a reason that merely mentions a secret keeps its count
        led.complete_units(
            run_id, [result("orders/0/0-10", 10, quarantined=1, reasons={"missing password field": 1})]
        )
        assert led.unit_counts(run_id).reasons == {"missing password field": 1}


# -- audit -----------------------------------------------------------------------------------


def test_audit_masks_secrets_and_keeps_order(ledger: Ledger) -> None:
    run_id = new_run(ledger)
    first = ledger.audit(
        run_id,
        "run",
        {
            "spec": "orders.yaml",
            "kafka": {"sasl.password": "Kafka-Pa55", "security.protocol": "SASL_SSL"},
            "catalog": "postgresql://cat:Cat-Pa55@db/cat",
            "at": datetime(2024, 1, 2, tzinfo=UTC),
        },
    )
    ledger.audit(run_id, "promote", {"snapshot": 42})
    ledger.audit("r-other", "cleanup")
    ledger.audit(None, "cleanup", {"removed": ["r-1", "r-2"]})

    log = ledger.audit_log(run_id)
    assert [e.action for e in log] == ["run", "promote"]
    assert log[0] == first
    assert first.user == "alice" and is_utc(first.at) and first.run_id == run_id
    assert first.details == {
        "spec": "orders.yaml",
        "kafka": {"sasl.password": MASK, "security.protocol": "SASL_SSL"},
        "catalog": f"postgresql://cat:{MASK}@db/cat",
        "at": "2024-01-02T00:00:00+00:00",
    }
    with ledger.engine.connect() as conn:
        raw = " ".join(str(v) for v in conn.execute(text("SELECT details FROM rewind_audit")).scalars())
    assert "Kafka-Pa55" not in raw and "Cat-Pa55" not in raw

    everything = ledger.audit_log()
    assert [e.action for e in everything] == ["run", "promote", "cleanup", "cleanup"]
    assert [e.action for e in ledger.audit_log(limit=2)] == ["cleanup", "cleanup"]
    with pytest.raises(ValueError, match="non-empty"):
        ledger.audit(run_id, " ")
    with pytest.raises(TypeError, match="cannot be stored as JSON"):
        ledger.audit(run_id, "run", {"obj": object()})


# -- failures of the database itself ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_unreachable_ledger_is_a_one_line_masked_error(backend: str, tmp_path: Path) -> None:
    if backend == "sqlite":
        engine = create_engine(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'ledger.db'}")
        secret = None
    else:
        secret = "Ledger-Pw-77"
        from tests.conftest import free_port

        engine = connect(f"postgresql://rewind:{secret}@127.0.0.1:{free_port()}/ledger")
    with Ledger(engine, user="bob") as led, pytest.raises(LedgerUnavailable) as err:
        led.get_run("r-1")
    message = str(err.value)
    assert message.startswith("ledger at ") and "failed:" in message and "\n" not in message
    if secret:
        assert secret not in message and f":{MASK}@" in message
