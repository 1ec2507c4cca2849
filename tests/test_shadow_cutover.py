"""A whole shadow migration with a hard cutover, on real parts, while orders keep arriving.

A producer writes keyed order events for the whole test; the live service (a consumer group
in a thread) upserts them into v1. The shadow rebuilds v2 from archive + log and follows the
topic. Refused on the way, each in one line with nothing changed: a cutover before the shadow
is caught up, before verification passed, while the live group is active (its member named),
and when v1 moved after the cut line. Then the live service stops, the tail catches up and
stops, the cut line is proven and v2 is swapped in for v1; the live service resumes from the
cut line (the overlap is re-applied idempotently) on the swapped table, and the final table
equals a clean recomputation of all events: no order missing or doubled. Runs on noida-db
(a group joins in ~0.4 s there, ~20 s on tansu); the data is small.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from rewind.errors import RewindError
from rewind.shadow.cutline import cut_shadow
from rewind.shadow.cutover import cutover_hard
from rewind.shadow.start import start_shadow
from rewind.shadow.status import shadow_status
from rewind.shadow.verify import verify_shadow
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.shadow_fixtures import ROOT, prepared, refused, shadow_env

NAME = "shadow-hard"
SHADOW = {"lag_threshold": 100, "caught_up_for_s": 2, "settle_s": 10, "verify_passes": 2, "rewind_by": 5}


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except RewindError:  # not there yet (the shadow's process is still starting)
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def state(settings: Any, v1: bool = False) -> tuple[Any, ...]:
    """The shadow's state, the tables and v2's rows (and v1's, once the live service is
    stopped): what a refused command must leave unchanged."""
    status = shadow_status(settings, NAME, history=1)
    db = settings_db(settings)
    with sqlite3.connect(db) as conn:
        tables = sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        group = conn.execute("SELECT COUNT(*) FROM rewind_unit_commits").fetchone()[0]
    rows = sorted(sf.table_rows(db, status["v2"]))
    return status["state"], tables, group, rows, sorted(sf.table_rows(db, "orders")) if v1 else None


def settings_db(settings: Any) -> Path:
    return Path(settings.state_path).parent / "read_model.db"


def start_tail(env: dict[str, str], spec: Path, cwd: Path) -> subprocess.Popen[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    return subprocess.Popen(
        [str(ROOT / ".venv/bin/rewind"), "shadow", "start", str(spec), "--for", "400"],
        env=full,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_tail(tail: subprocess.Popen[str]) -> None:
    tail.send_signal(signal.SIGINT)
    try:
        tail.wait(60)
    except subprocess.TimeoutExpired:
        tail.kill()
        tail.wait(30)


def test_hard_cutover_swaps_in_a_v2_equal_to_a_clean_recomputation(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    settings, conf, topic, db, spec_path = prepared(noida_broker, spark, tmp_path, NAME, SHADOW)
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    group = f"live-{topic}"
    from rewind.spec import load_spec

    spec = load_spec(spec_path)
    sf.create_v1(settings, spec, db, "orders")
    live = sf.LiveConsumer(conf, topic, group, db, "orders")
    live.start()
    producer = sf.LiveProducer(conf, topic, 600, rate=20)
    producer.start()
    tail = None
    try:
        # history, then a tail of one sample: measured for less than caught_up_for_s; here, on
        # the warm shared Spark session (the CLI's process would start a JVM for it)
        first = start_shadow(settings, spec, stop=lambda _: True, sample_s=0.5)
        assert first["state"] == "tailing" and first["caught_up"] is False, first
        before = state(settings)
        refused(lambda: cutover_hard(settings, NAME), "not caught up", "nothing was changed")
        assert state(settings) == before

        tail = start_tail(env, spec_path, tmp_path)  # the same shadow continued by the CLI
        try:
            # a cold CLI process: its JVM and streaming query start before the first batch, which
            # took over 120 s once when the suite's four heaviest files start together
            wait_for("caught up", lambda: shadow_status(settings, NAME)["caught_up"], timeout=300)
        except AssertionError:
            tail.kill()
            out, err = tail.communicate(30)
            raise AssertionError(f"{shadow_status(settings, NAME)}\n{out[-2000:]}\n{err[-4000:]}") from None
        # the tail's speed against the live producer's 20 orders/s, from the tail's lag samples
        status = shadow_status(settings, NAME)
        speed = status["speed"]
        assert speed is not None and 10 <= speed["live_records_per_second"] <= 25, speed
        if status["caught_up"]:  # ~1x is all a caught-up tail can read, and is right
            assert speed["status"] == "ok" and speed["verdict"].startswith("caught up"), speed
        ratio = speed["records_per_second"] / speed["live_records_per_second"]
        assert abs(speed["multiple"] - ratio) <= 0.01 * ratio, speed
        assert speed["multiple"] >= 0.5 and "x real-time (live " in speed["summary"], speed
        before = state(settings)
        refused_while_caught_up(settings, "0 of the 2 verifications", "nothing was changed")
        # v2's rows and its unit commits move with the running tail, the state and the tables not
        assert state(settings)[:2] == before[:2]

        checked = verify_shadow(settings, NAME, repeat=2, every_s=1)
        assert [r["passed"] for r in checked["results"]] == [True, True], checked["results"]
        assert checked["go"] is True
        assert all(r["rows"]["staging"] == r["rows"]["reference"] > 0 for r in checked["results"])

        # the live service still runs: refused, naming its member
        refused(lambda: cutover_hard(settings, NAME), f"consumer group '{group}' is active", "orders-service")
    except BaseException:
        if tail is not None and tail.poll() is None:
            tail.kill()
            tail.wait(30)
        raise
    finally:
        last = producer.stop()
        live.stop()
    # the live group is inactive; the tail catches up to the log end, then stops
    wait_for("v2 at the log end", lambda: shadow_status(settings, NAME)["max_lag"] == 0)
    assert tail is not None
    stop_tail(tail)

    cut = cut_shadow(settings, NAME)
    assert cut["holds"] is True
    for p in cut["partitions"]:
        assert p["overlap"] == 5 and p["cut"] == p["committed"] - 5
        assert p["v2_ranges"] == [[0, p["v2_end"]]] and p["v2_end"] >= p["committed"]
    ends = {p: last // 2 + (1 if last % 2 > p else 0) for p in (0, 1)}
    assert all(p["committed"] <= ends[p["partition"]] for p in cut["partitions"])
    reread = sum(ends[p["partition"]] - p["cut"] for p in cut["partitions"])

    # v1 moves after the cut line: the swap is refused, nothing swapped; undone, it goes through
    with sqlite3.connect(db) as conn:
        old = conn.execute("SELECT amount FROM orders WHERE order_id = 1").fetchone()[0]
        conn.execute("UPDATE orders SET amount = -1 WHERE order_id = 1")
    before = state(settings, v1=True)
    refused(lambda: cutover_hard(settings, NAME), "v1 moved after the cut line", "nothing was swapped")
    assert state(settings, v1=True) == before
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE orders SET amount = ? WHERE order_id = 1", (old,))

    done = cutover_hard(settings, NAME)
    assert done["state"] == "cutover" and done["swap"]["after"]["table"].endswith("orders")
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert shadow_status(settings, NAME)["state"] == "cutover"
    assert "orders" in tables and any(t.startswith("orders__rewind_prev_") for t in tables)

    # the live service resumes from the cut line on the swapped table while orders keep coming
    live = sf.LiveConsumer(conf, topic, group, db, "orders")
    live.start()
    sf.produce_range(conf, topic, last, last + 100)
    expected = sf.expected_rows(conf, topic)
    wait_for(
        "the live service at the log end", lambda: live.applied >= reread + 100 and _at_end(db, expected)
    )
    live.stop()
    rows = sf.table_rows(db, "orders")
    assert len(rows) == len({r[0] for r in rows}) == sf.ORDERS
    assert {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == expected
    assert live.applied == reread + 100, "the live service resumed at the cut line (5 before its offsets)"


def refused_while_caught_up(settings: Any, *words: str) -> str:
    """The hard cutover refused for ``words`` while the tail is caught up: a tail whose lag
    passed the threshold for a moment (a slow micro-batch under load) is waited for again, as
    the refusal then names that first."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return refused(lambda: cutover_hard(settings, NAME), *words)
        except AssertionError as failed:
            if "not caught up" not in str(failed) or time.monotonic() > deadline:
                raise
        wait_for("caught up", lambda: shadow_status(settings, NAME)["caught_up"], timeout=120)


def _at_end(db: Path, expected: dict[int, tuple[str, float, int, int]]) -> bool:
    rows = sf.table_rows(db, "orders")
    return {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == expected


def test_refusals_name_what_to_do(tmp_path: Path) -> None:
    from rewind.config import load_settings

    settings = load_settings(env={"REWIND_STATE_DIR": str(tmp_path)}, cwd=tmp_path)
    refused(lambda: cutover_hard(settings, "nope"), "nope", "rewind shadow start")


MONITORING_S = 8  # the refusal right after the repoint falls inside it even on a loaded machine
DUAL = {**SHADOW, "verify_passes": 1, "monitoring_s": MONITORING_S}


def test_dual_write_then_repoint_then_decommission_while_orders_keep_coming(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    from rewind.dualwrite import DualWriter
    from rewind.shadow.lifecycle import abort, cutover_dual_write, decommission, repoint
    from rewind.spec import load_spec

    name = "shadow-dual"
    settings, conf, topic, db, spec_path = prepared(noida_broker, spark, tmp_path, name, DUAL)
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    group = f"live-{topic}"
    spec = load_spec(spec_path)
    sf.create_v1(settings, spec, db, "orders")
    live = sf.LiveConsumer(conf, topic, group, db, "orders")
    live.start()
    producer = sf.LiveProducer(conf, topic, 600, rate=20)
    producer.start()
    # the history here, on the warm shared Spark session; the CLI's process only tails
    assert start_shadow(settings, spec, stop=lambda _: True, sample_s=0.5)["state"] == "tailing"
    tail = start_tail(env, spec_path, tmp_path)
    try:
        wait_for("caught up", lambda: shadow_status(settings, name)["caught_up"], timeout=180)
        assert verify_shadow(settings, name)["go"] is True
        live.stop()  # the service stops to restart in dual-write; orders keep coming
        wait_for(
            "v2 past the live group",
            lambda: all(p["group_lag"] <= 0 for p in shadow_status(settings, name)["partitions"]),
        )
    except BaseException:
        producer.stop()
        live.halt.set()
        raise
    finally:
        stop_tail(tail)
    try:
        published = cutover_dual_write(settings, name)
        assert published["state"] == "dual-write" and published["v1"].endswith("orders")
        cut = {k: v for k, v in published["cut_line"].items()}

        writer = DualWriter(settings.ledger, name, f"sqlite:///{db}")
        live = sf.LiveConsumer(conf, topic, group, db, "orders", dual=writer)
        live.start()
        wait_for("dual writes", lambda: live.applied > 20)
        v2 = published["v2"]
        assert writer.tables()[0] == [published["v1"], v2]
        done = repoint(settings, name)
        swapped_at = time.monotonic()
        assert done["state"] == "repointed"
        refused(lambda: decommission(settings, name), "monitored until", "nothing was dropped")
        assert writer.tables()[0] == [published["v1"]]  # the swapped table, which is v2
        applied = live.applied
        wait_for("dual writes into the swapped table", lambda: live.applied >= applied + 20)
    finally:
        last = producer.stop()
    expected = sf.expected_rows(conf, topic)
    try:
        wait_for("the live service at the log end", lambda: _at_end(db, expected))
    except AssertionError:
        rows = {r[0]: (r[1], r[2], r[3], r[4]) for r in sf.table_rows(db, "orders")}
        bad = [(k, rows.get(k), v) for k, v in expected.items() if rows.get(k) != v][:5]
        raise AssertionError(f"{live.error!r} {live.applied} {bad}") from None
    live.stop()
    writer.close()
    rows = sf.table_rows(db, "orders")
    assert len(rows) == len({r[0] for r in rows}) == sf.ORDERS
    assert {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == expected
    ends = {p: last // 2 + (1 if last % 2 > p else 0) for p in (0, 1)}
    assert live.applied == sum(ends[p] - cut[f"{topic}/{p}"] for p in (0, 1)), "from the cut line, once"

    refused(lambda: abort(settings, name), "v2 is the live table", "nothing was dropped")
    with sqlite3.connect(db) as conn:
        before = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert any(t.startswith("orders__rewind_prev_") for t in before)
    time.sleep(max(0.0, MONITORING_S - (time.monotonic() - swapped_at)) + 0.5)
    gone = decommission(settings, name)
    assert gone["state"] == "decommissioned"
    with sqlite3.connect(db) as conn:
        after = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert not any(t.startswith("orders__rewind_prev_") for t in after) and "orders" in after
