"""Leases on real SQLite and real PostgreSQL: one live run per target, across threads and processes."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from rewind.ledger import LeaseHeld, LeaseKeeper, LeaseLost, Ledger, connect

TABLES = ("rewind_audit", "rewind_leases", "rewind_units", "rewind_runs", "rewind_plans")
TARGET = "iceberg:analytics.order_totals"
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    pg: str = request.getfixturevalue("pg_url")
    return pg


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = Ledger.open(url, user="alice")
    with led.engine.begin() as conn:  # the PostgreSQL database is shared by the module's tests
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
    yield led
    led.close()


def takeovers(ledger: Ledger) -> list[dict[str, Any]]:
    return [e.details for e in ledger.audit_log() if e.action == "lease-takeover"]


# -- one process -----------------------------------------------------------------------------


def test_a_held_target_names_its_holder_owner_and_expiry(ledger: Ledger) -> None:
    lease = ledger.acquire(TARGET, "r-123", 30)
    assert (lease.target, lease.holder) == (TARGET, "r-123")
    assert re.fullmatch(r".+:\d+", lease.owner)
    assert lease.acquired_at == lease.heartbeat_at
    assert lease.expires_at - lease.acquired_at == timedelta(seconds=30)  # the ttl asked for
    assert lease.expires_at.utcoffset() == timedelta(0)

    with pytest.raises(LeaseHeld) as err:
        ledger.acquire(TARGET, "r-456", 30)
    held = err.value
    assert (held.target, held.holder, held.owner, held.expires_at) == (
        TARGET,
        "r-123",
        lease.owner,
        lease.expires_at,
    )
    assert re.fullmatch(
        rf"target {re.escape(TARGET)} is held by run r-123 \({re.escape(lease.owner)}\) until "
        r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\dZ; wait, or `rewind resume r-123` if that run is dead",
        str(held),
    )
    assert ledger.lease(TARGET) == lease  # the refused attempt changed nothing
    assert ledger.lease("iceberg:other") is None
    assert ledger.acquire("iceberg:other", "r-456", 30).holder == "r-456"  # other targets are free


def test_acquiring_again_renews_the_lease(ledger: Ledger) -> None:
    first = ledger.acquire(TARGET, "r-1", 30)
    time.sleep(0.05)
    again = ledger.acquire(TARGET, "r-1", 60)
    assert again.acquired_at == first.acquired_at
    assert again.heartbeat_at > first.heartbeat_at and again.expires_at > first.expires_at
    assert takeovers(ledger) == []


def test_an_expired_lease_is_taken_over_and_audited(ledger: Ledger) -> None:
    old = ledger.acquire(TARGET, "r-old", 0.5)
    with pytest.raises(LeaseHeld):
        ledger.acquire(TARGET, "r-new", 0.5)
    time.sleep(0.6)
    new = ledger.acquire(TARGET, "r-new", 30)
    assert new.holder == "r-new" and new.acquired_at > old.acquired_at
    [entry] = [e for e in ledger.audit_log("r-new") if e.action == "lease-takeover"]
    assert entry.user == "alice"
    assert entry.details["target"] == TARGET and entry.details["reason"] == "expired"
    assert entry.details["previous_holder"] == "r-old" and entry.details["previous_owner"] == old.owner

    with pytest.raises(LeaseLost, match=r"run r-old lost its lease on .* \(now held by run r-new "):
        ledger.heartbeat(TARGET, "r-old", 30)
    assert ledger.release(TARGET, "r-old") is False  # the old holder cannot drop the new lease
    assert ledger.lease(TARGET) == new


def test_heartbeat_extends_and_release_frees(ledger: Ledger) -> None:
    first = ledger.acquire(TARGET, "r-1", 0.5)
    for _ in range(4):  # 0.8 s in all: past the first ttl, kept alive by heartbeats
        time.sleep(0.2)
        beat = ledger.heartbeat(TARGET, "r-1", 0.5)
    assert beat.expires_at > first.expires_at and beat.acquired_at == first.acquired_at
    with pytest.raises(LeaseHeld):
        ledger.acquire(TARGET, "r-2", 0.5)

    assert ledger.release(TARGET, "r-2") is False
    assert ledger.release(TARGET, "r-1") is True
    assert ledger.lease(TARGET) is None
    with pytest.raises(LeaseLost, match="no longer held"):
        ledger.heartbeat(TARGET, "r-1", 0.5)
    assert ledger.acquire(TARGET, "r-2", 0.5).holder == "r-2"
    assert takeovers(ledger) == []  # a released target is free, not taken over
    with pytest.raises(ValueError, match="ttl must be positive"):
        ledger.acquire(TARGET, "r-2", 0)


def test_the_same_run_in_another_live_process_is_refused(ledger: Ledger) -> None:
    elsewhere = "other-host:4242"  # cannot be checked from here, so it counts as alive
    ledger.acquire(TARGET, "r-1", 0.5, owner=elsewhere)
    with pytest.raises(LeaseHeld, match=r"run r-1 is still running as other-host:4242 \(its lease on") as err:
        ledger.acquire(TARGET, "r-1", 0.5)
    assert err.value.holder == "r-1"
    with pytest.raises(LeaseLost):  # and this process may not heartbeat someone else's lease
        ledger.heartbeat(TARGET, "r-1", 0.5)

    time.sleep(0.6)
    lease = ledger.acquire(TARGET, "r-1", 30)  # once expired, the resume takes it over
    assert lease.owner != elsewhere
    assert [(t["reason"], t["previous_owner"]) for t in takeovers(ledger)] == [("expired", elsewhere)]
    with pytest.raises(LeaseLost, match="now held by run r-1"):
        ledger.heartbeat(TARGET, "r-1", 30, owner=elsewhere)  # the old process is fenced out


# -- several threads and processes -----------------------------------------------------------


def test_racing_threads_one_wins(ledger: Ledger) -> None:
    workers = 6
    barrier = threading.Barrier(workers)
    winners: list[str] = []
    refused: list[str] = []

    def race(i: int) -> None:
        barrier.wait()
        try:
            winners.append(ledger.acquire(TARGET, f"r-{i}", 30).holder)
        except LeaseHeld as exc:
            refused.append(exc.holder)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(winners) == 1 and refused == winners * (workers - 1)


def _race_worker(url: str, holder: str, owner: str | None, barrier: Any, out: Any) -> None:
    led = Ledger(connect(url))
    try:
        barrier.wait(timeout=60)
        try:
            lease = led.acquire(TARGET, holder, 30, owner=owner)
            out.put((holder, "won", lease.owner))
        except LeaseHeld as exc:
            out.put((holder, "held", exc.holder))
    except Exception as exc:
        out.put((holder, "error", repr(exc)))
    finally:
        led.close()


def run_processes(
    url: str, holders: list[str], owners: list[str | None] | None = None
) -> list[tuple[str, str, str]]:
    barrier = SPAWN.Barrier(len(holders))
    out = SPAWN.Queue()
    procs = [
        SPAWN.Process(target=_race_worker, args=(url, h, owners[i] if owners else None, barrier, out))
        for i, h in enumerate(holders)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return results


def test_racing_processes_exactly_one_wins(ledger: Ledger, url: str) -> None:
    results = run_processes(url, [f"r-{i}" for i in range(4)])
    assert [r for r in results if r[1] == "error"] == []
    won = [r for r in results if r[1] == "won"]
    assert len(won) == 1
    winner = won[0][0]
    assert sorted(r[2] for r in results if r[1] == "held") == [winner] * 3
    lease = ledger.lease(TARGET)
    assert lease is not None and (lease.holder, lease.owner) == (winner, won[0][2])
    assert takeovers(ledger) == []


def test_a_resume_takes_the_lease_of_its_dead_process_at_once(ledger: Ledger, url: str) -> None:
    # a process acquires for r-1 with a long ttl and dies without releasing
    [(holder, outcome, dead_owner)] = run_processes(url, ["r-1"])
    assert (holder, outcome) == ("r-1", "won")
    with pytest.raises(LeaseHeld):  # another run still waits for the expiry
        ledger.acquire(TARGET, "r-2", 30)
    lease = ledger.acquire(TARGET, "r-1", 30)  # the same run, this process: the owner is provably dead
    assert lease.owner != dead_owner
    [takeover] = takeovers(ledger)
    assert (takeover["reason"], takeover["previous_owner"]) == ("owner-dead", dead_owner)


# -- the keeper ------------------------------------------------------------------------------


def test_the_keeper_holds_the_lease_past_its_ttl_and_releases_it(ledger: Ledger) -> None:
    with ledger.keeper(TARGET, "r-1", 0.5) as keeper:
        assert keeper.lease is not None and keeper.interval_s == pytest.approx(0.5 / 3)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # three ttls
            with pytest.raises(LeaseHeld):
                ledger.acquire(TARGET, "r-2", 0.5)
            time.sleep(0.25)
        assert not keeper.lost.is_set()
        keeper.check()
        assert keeper.expires_at is not None and keeper.expires_at > keeper.lease.acquired_at
    assert ledger.lease(TARGET) is None
    with pytest.raises(LeaseHeld), ledger.keeper(TARGET, "r-2", 30):  # entering acquires
        ledger.acquire(TARGET, "r-3", 30)
    assert ledger.lease(TARGET) is None


def test_the_keeper_reports_a_lost_lease(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real_heartbeat = ledger.heartbeat

    def stalled_heartbeat(*args: Any, **kwargs: Any) -> Any:  # a process paused (GC, swap, SIGSTOP)
        gate.wait(10)
        return real_heartbeat(*args, **kwargs)

    monkeypatch.setattr(ledger, "heartbeat", stalled_heartbeat)
    with LeaseKeeper(ledger, TARGET, "r-1", 0.5) as keeper:
        time.sleep(0.6)  # no heartbeat got through: the lease expired
        with pytest.raises(LeaseLost):
            keeper.check()  # the keeper knows before the database tells it
        ledger.acquire(TARGET, "r-2", 30)  # another run takes over
        gate.set()  # the paused heartbeat resumes, and finds the lease gone
        assert keeper.lost.wait(5)
        with pytest.raises(LeaseLost):
            keeper.check()
    lease = ledger.lease(TARGET)
    assert lease is not None and lease.holder == "r-2"  # leaving the block did not release r-2's lease
    assert [t["previous_holder"] for t in takeovers(ledger)] == ["r-1"]


def test_the_keeper_learns_of_a_takeover_from_its_heartbeat(ledger: Ledger) -> None:
    with ledger.keeper(TARGET, "r-1", 30, interval_s=0.1) as keeper:
        with ledger.engine.begin() as conn:  # someone forces the lease away (e.g. an operator)
            conn.execute(text("UPDATE rewind_leases SET holder = 'r-2'"))
        assert keeper.lost.wait(5)
        assert isinstance(keeper.error, LeaseLost) and keeper.error.now_held_by == "r-2"
        assert "run r-1 lost its lease" in str(keeper.error)
