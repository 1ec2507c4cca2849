"""The reconsume rows and the handover compare-and-set, on real SQLite and real PostgreSQL.

The concurrency tests race real threads and real processes on one row and check the
invariant the exactly-once guarantee rests on: an offset the existing side recorded as
skipped (its claim held) is always below the handover offset, and one handover wins.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.ledger import Ledger, NotFound
from rewind.ledger.handover import HandoverTable, TempStep
from rewind.ledger.reconsumes import ReconsumeStateError, ReconsumeStore, temp_group_name

TP0 = ("orders", 0)
TP1 = ("orders", 1)
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('ledger') / 'ledger.db'}"
    pg: str = request.getfixturevalue("pg_url")
    return pg


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = Ledger.open(url, user="alice")
    yield led
    led.close()


def started(ledger: Ledger, starts: dict[tuple[str, int], int], mode: str = "handover") -> str:
    rid = f"rc-{uuid.uuid4().hex[:8]}"
    store = ReconsumeStore(ledger.engine)
    store.save_plan(rid, live_group="orders-svc", mode=mode, topics=["orders"], plan={"x": 1})  # type: ignore[arg-type]
    store.start(rid, starts)
    return rid


# -- lifecycle --------------------------------------------------------------------------------


def test_plan_start_finish_and_the_refusals(ledger: Ledger) -> None:
    store = ReconsumeStore(ledger.engine)
    rid = f"rc-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NotFound, match=rid):
        store.get(rid)
    first = store.save_plan(rid, live_group="g", mode="handover", topics=["orders"], plan={"v": 1})
    assert (first.state, first.temp_group, first.plan) == ("planned", temp_group_name(rid), {"v": 1})
    again = store.save_plan(rid, live_group="g", mode="parallel", topics=["orders"], plan={"v": 2})
    assert (again.mode, again.plan) == ("parallel", {"v": 2})  # a planned one may be re-planned

    rec = store.start(rid, {TP0: 10, TP1: 0})
    assert rec.state == "started" and rec.started_at is not None
    assert store.start(rid, {TP0: 10, TP1: 0}).state == "started"  # a re-run: no-op
    with pytest.raises(ReconsumeStateError, match="other start offsets"):
        store.start(rid, {TP0: 11, TP1: 0})
    with pytest.raises(ReconsumeStateError, match="already started"):
        store.save_plan(rid, live_group="g", mode="handover", topics=["orders"], plan={})
    rows = store.rows(rid)
    assert [(r.tp, r.start_offset, r.owner) for r in rows] == [(TP0, 10, "temporary"), (TP1, 0, "temporary")]

    table = HandoverTable(ledger.engine, rid)
    assert table.record_temp({TP0: TempStep(last=19, position=20, handover="idle")}) == {TP0: 20}
    pending = r"1 partition\(s\) not handed over yet: orders/1 \(not started\)"
    with pytest.raises(ReconsumeStateError, match=pending):
        store.finish(rid)
    assert store.get(rid).state == "started"  # nothing changed
    assert table.record_temp({TP1: TempStep(last=4, position=5, handover="idle")}) == {TP1: 5}
    done = store.finish(rid)
    assert done.state == "finished" and done.finished_at is not None
    assert store.finish(rid).finished_at == done.finished_at  # idempotent
    actions = [e.action for e in ledger.audit_log() if e.details.get("reconsume") == rid]
    assert actions == ["reconsume-plan", "reconsume-plan", "reconsume-start", "reconsume-finish"]


def test_claims_and_handovers_follow_the_offsets(ledger: Ledger) -> None:
    rid = started(ledger, {TP0: 100, TP1: 0})
    table = HandoverTable(ledger.engine, rid)
    # caught_up needs an existing side that recorded something
    assert table.record_temp({TP0: TempStep(last=149, position=150, handover="caught_up")}) == {}
    assert table.claim({TP0: 300}) == {TP0: None}  # skipped up to 300: the temporary side owes it
    assert table.claim({TP0: 250}) == {TP0: None}  # a late, older claim never lowers e
    assert table.existing() == {TP0: (300, None), TP1: (None, None)}
    # the temporary side has handled up to 300 exclusive: not past e yet
    assert table.record_temp({TP0: TempStep(last=299, position=300, handover="caught_up")}) == {}
    assert table.record_temp({TP0: TempStep(last=300, position=301, handover="caught_up")}) == {TP0: 301}
    assert table.claim({TP0: 400, TP1: 7}) == {TP0: 301, TP1: None}
    rows = {r.tp: r for r in table.load().values()}
    row = rows[TP0]
    assert (row.existing_last_offset, row.temp_last_offset, row.handover_offset) == (300, 300, 301)
    assert rows[TP0].handed_over_at is not None and rows[TP0].owner == "existing"
    assert table.record_temp({TP0: TempStep(last=None, position=500, handover="now")}) == {}  # set once
    with pytest.raises(KeyError, match="orders/9"):
        table.claim({("orders", 9): 1})


def test_idle_hands_over_without_an_existing_side_and_progress_is_recorded(ledger: Ledger) -> None:
    rid = started(ledger, {TP0: 0})
    table = HandoverTable(ledger.engine, rid)
    assert table.record_temp({TP0: TempStep(last=41, position=42)}) == {}
    assert table.load()[TP0].temp_last_offset == 41
    assert table.record_temp({TP0: TempStep(last=None, position=42, handover="idle")}) == {TP0: 42}
    row = table.load()[TP0]
    assert (row.temp_last_offset, row.handover_offset, row.existing_last_offset) == (41, 42, None)


# -- races ------------------------------------------------------------------------------------


def _existing(url: str, rid: str, offsets: list[int], out: list[tuple[int, int | None]]) -> None:
    led = Ledger.open(url)
    try:
        table = HandoverTable(led.engine, rid)
        for b in offsets:
            out.append((b, table.claim({TP0: b})[TP0]))
    finally:
        led.close()


def _temporary(url: str, rid: str, positions: list[int], out: list[tuple[int, bool]]) -> None:
    led = Ledger.open(url)
    try:
        table = HandoverTable(led.engine, rid)
        for n in positions:
            won = TP0 in table.record_temp({TP0: TempStep(last=n - 1, position=n, handover="caught_up")})
            out.append((n, won))
            if won:
                return
    finally:
        led.close()


def check_invariant(ledger: Ledger, rid: str, claims: list[tuple[int, int | None]],
                    tries: list[tuple[int, bool]]) -> int | None:
    h = HandoverTable(ledger.engine, rid).load()[TP0].handover_offset
    wins = [n for n, won in tries if won]
    assert len(wins) <= 1, f"two handovers won: {wins}"
    assert wins == ([h] if h is not None else [])
    for b, seen in claims:
        if seen is None:  # the existing side skipped up to b: the temporary side must handle b
            assert h is None or b < h, f"skipped offset {b} is at or above the handover {h}"
        else:
            assert seen == h
    return h


def monotone(draw: Any, size: int) -> list[int]:
    steps = draw(st.lists(st.integers(1, 40), min_size=1, max_size=size))
    out, at = [], 0
    for s in steps:
        at += s
        out.append(at)
    return out


@st.composite
def schedules(draw: Any) -> tuple[list[list[int]], list[list[int]]]:
    existing = [monotone(draw, 25) for _ in range(draw(st.integers(1, 2)))]  # 2: a rebalance's zombie
    temporary = [monotone(draw, 25) for _ in range(draw(st.integers(1, 2)))]
    return existing, temporary


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=schedules())
def test_threads_racing_on_one_row_never_both_own_an_offset(ledger: Ledger, url: str, plan: Any) -> None:
    existing, temporary = plan
    rid = started(ledger, {TP0: 0})
    claims: list[tuple[int, int | None]] = []
    tries: list[tuple[int, bool]] = []
    threads = [threading.Thread(target=_existing, args=(url, rid, o, claims)) for o in existing]
    threads += [threading.Thread(target=_temporary, args=(url, rid, p, tries)) for p in temporary]
    random.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    check_invariant(ledger, rid, claims, tries)


def _proc_existing(url: str, work: list[tuple[str, list[int]]], queue: Any, barrier: Any) -> None:
    for rid, offsets in work:
        barrier.wait()  # every round starts together, so the four really race
        out: list[tuple[int, int | None]] = []
        _existing(url, rid, offsets, out)
        queue.put(("e", rid, out))


def _proc_temporary(url: str, work: list[tuple[str, list[int]]], queue: Any, barrier: Any) -> None:
    for rid, positions in work:
        barrier.wait()
        out: list[tuple[int, bool]] = []
        _temporary(url, rid, positions, out)
        queue.put(("t", rid, out))


def test_processes_racing_on_one_row_never_both_own_an_offset(ledger: Ledger, url: str) -> None:
    """Two existing-side and two temporary-side processes race through five reconsumes; then
    a temporary position past every claim hands over each reconsume no process handed over.

    (The jump is made after the race: made inside it, it can come before any claim when the
    temporary processes win the start, and caught-up needs a claim, so it may rightly lose.)"""
    rng = random.Random(1313)
    rids = [started(ledger, {TP0: 0}) for _ in range(5)]
    queue, barrier = SPAWN.Queue(), SPAWN.Barrier(4)
    procs = []
    for target in (_proc_existing, _proc_existing, _proc_temporary, _proc_temporary):
        work = [(rid, sorted(rng.sample(range(1, 400), 40))) for rid in rids]
        procs.append(SPAWN.Process(target=target, args=(url, work, queue, barrier)))
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in range(len(procs) * len(rids))]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    for rid in rids:
        claims = [c for kind, r, out in results if kind == "e" and r == rid for c in out]
        tries = [t for kind, r, out in results if kind == "t" and r == rid for t in out]
        assert len(claims) == 80
        if not any(won for _, won in tries):  # past every claim (all below 400): it must win
            _temporary(url, rid, [1000], tries)
            assert tries[-1] == (1000, True)
        assert check_invariant(ledger, rid, claims, tries) is not None


def test_two_sides_writing_two_partitions_in_opposite_orders_never_deadlock(ledger: Ledger, url: str) -> None:
    """Each side's batch updates several rows in one transaction; given its partitions in the
    opposite order to the other side's, it still locks them in the same order (a PostgreSQL
    deadlock otherwise fails one side's batch). A pause after each row's update holds the
    first lock long enough for the other side to take its first one."""
    from sqlalchemy import event

    def pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE REWIND_HANDOVER"):
            time.sleep(0.02)

    rid = started(ledger, {TP0: 0, TP1: 0})
    errors: list[BaseException] = []

    def side(write: Any) -> None:
        led = Ledger.open(url)
        event.listen(led.engine, "after_cursor_execute", pause)
        try:
            table = HandoverTable(led.engine, rid)
            for n in range(1, 16):
                write(table, n)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            led.close()

    existing = threading.Thread(target=side, args=(lambda t, n: t.claim({TP1: n, TP0: n}),))
    temporary = threading.Thread(
        target=side, args=(lambda t, n: t.record_temp({TP0: TempStep(n, n + 1), TP1: TempStep(n, n + 1)}),)
    )
    for t in (existing, temporary):
        t.start()
    for t in (existing, temporary):
        t.join(timeout=120)
    assert errors == []
    rows = HandoverTable(ledger.engine, rid).load()
    assert [(rows[tp].existing_last_offset, rows[tp].temp_last_offset) for tp in (TP0, TP1)] == [(15, 15)] * 2


def test_a_service_imports_the_library_without_spark_or_arrow() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rewind.reconsume; "
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas', 'pyiceberg', 'py4j') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
