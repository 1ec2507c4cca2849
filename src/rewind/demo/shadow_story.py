"""``rewind demo --story shadow``: migrate ``order_totals`` to a v2 with a new field, live.

The live service keeps ``order_totals`` (SQLite) from the ``orders`` topic: an aggregate, each
order's row folded from all its events (total, item count, status...); its next release adds
``discount`` (what the order got off at payment). Instead of a migration script, the demo
rebuilds v2 from all history with ``rewind shadow`` and the job's own translate + fold
(``translate.fold``) while new orders keep arriving:

1. the scene as in the repair story (topic, archive below the seam), v1 built by the live
   service (a consumer group) from the whole topic, and a producer of new orders that runs
   until the end;
2. ``shadow start``: the history (archive + log) folded into v2, then the live tail (a thread
   here), each micro-batch folded with v2's rows of its orders;
3. caught up (lag under the threshold for ``caught_up_for_s``), ``shadow verify`` (twice) on
   settled keys (v2 against v1 on their common columns);
4. the live service stops, the tail passes its offsets and stops, ``shadow cutover --hard``
   proves the cut line (where v2 ends: a fold absorbs no overlap) and swaps v2 in; the new
   release of the service resumes from the cut line on the swapped table;
5. the producer stops; ``order_totals`` must equal a clean recomputation of every event
   (history and live), with ``discount`` on every row: no order missing, and no event counted
   twice or missed.

Every check raises :class:`DemoFailed` naming the step. Each play is a new shadow (its name
ends with the time) on a fresh SQLite file; the ledger keeps them all.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from rewind.demo import orders as domain
from rewind.demo.errors import DemoFailed
from rewind.demo.live import OrderProducer, TotalsService, sqlite_time
from rewind.demo.scene import PARTITIONS, Say, Window, set_scene
from rewind.demo.story import DemoResult, expect
from rewind.embedded.stack import Stack
from rewind.errors import RewindError
from rewind.job.planner import build_plan
from rewind.shadow.cutover import cutover_hard
from rewind.shadow.status import shadow_status
from rewind.shadow.verify import verify_shadow
from rewind.sinks.sql.types import sqlite_type
from rewind.spark import session
from rewind.spec import parse_spec

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.demo.scene import Scene

TABLE = "order_totals"


def shadow_spec(scene: Scene, name: str, db: Path, group: str, verifications: int = 2) -> dict[str, Any]:
    """The job spec of the migration, as a user would write it in YAML."""
    return {
        "name": name,
        "description": "order_totals v2 (with discount) folded from all history, cut over while live",
        "source": {
            "history": {
                "topics": [scene.topic],
                "archive": scene.archive_table,
                "declared_log_start": {scene.topic: {str(p): o for p, o in scene.log_start.items()}},
            }
        },
        "decode": {"format": "json", "schema": domain.DECODE_SCHEMA},
        "translate": {
            "function": "rewind.demo.orders:order_totals_partials_v2",
            "fold": "rewind.demo.orders:fold_order_totals_v2",
            "version": "2",
            "output_schema": domain.ORDER_TOTALS_V2_SCHEMA,
        },
        "key": ["order_id"],
        "sink": {"postgres": {"table": TABLE, "url": f"sqlite:///{db}", "mode": "upsert"}},
        "run": {"work_unit_records": 25_000},
        "shadow": {
            "live_group": group,
            "lag_threshold": 100,
            "caught_up_for_s": 3,
            "trigger_s": 0.5,
            "settle_s": 20,
            "verify_passes": verifications,
        },
    }


def expected_totals(events: Iterable[dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """A clean recomputation: every valid event folded into its order, one at a time, in order."""
    rows: dict[str, dict[str, Any]] = {}
    for data in events:
        if domain.valid_event(data):
            rows[data["order_id"]] = domain.fold_event(rows.get(data["order_id"]), data, True)
    return {k: _shown(v) for k, v in rows.items()}


def _shown(row: dict[str, Any]) -> tuple[Any, ...]:
    times = [None if row[c] is None else sqlite_time(row[c]) for c in ("placed_at", "last_event_time")]
    money = (row["cents"] / 100, row["discount_cents"] / 100)
    return (row["customer_id"], row["status"], money[0], row["item_count"], *times, money[1])


COLUMNS = [*domain.ORDER_TOTALS_V2_SCHEMA]


def read_totals(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(f'SELECT {", ".join(COLUMNS)} FROM "{TABLE}"').fetchall()


def _wait(step: str, what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except RewindError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise DemoFailed(f"demo step '{step}': {what} did not happen in {timeout:g} s")


def _create_v1(settings: Settings, spec: Any, db: Path) -> None:
    """v1 as the live service keeps it: the job's columns but ``discount``, unique on the key."""
    db.unlink(missing_ok=True)
    schema = build_plan(settings, spec).output_schema()
    cols = ", ".join(f'"{f.name}" {sqlite_type(f.type)}' for f in schema if f.name != "discount")
    with sqlite3.connect(db) as conn:
        conn.execute(f'CREATE TABLE "{TABLE}" ({cols})')
        conn.execute(f'CREATE UNIQUE INDEX "{TABLE}_key" ON "{TABLE}" (order_id)')


class _Tail(threading.Thread):
    """``rewind shadow start`` (the tail) in a thread until ``halt``."""

    def __init__(self, settings: Settings, spec: Any) -> None:
        super().__init__(daemon=True, name="demo-shadow-tail")
        self.settings, self.spec = settings, spec
        self.halt = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        # lazy: avoids sqlalchemy at import
        from rewind.shadow.start import start_shadow

        try:
            self.result = start_shadow(
                self.settings, self.spec, stop=lambda _: self.halt.is_set(), sample_s=1.0
            )
        except BaseException as exc:  # raised by stop()
            self.error = exc

    def stop(self) -> dict[str, Any]:
        self.halt.set()
        self.join(120)
        if self.error is not None or self.result is None:
            raise DemoFailed(f"demo step 'tail': the shadow's tail failed: {self.error}")
        return self.result


def run_shadow_story(
    settings: Settings,
    *,
    events: int = 200_000,
    seed: int = 7,
    prefix: str = "demo",
    orders_per_s: float = 20.0,
    verifications: int = 2,
    say: Say = lambda _: None,
    start_stack: bool = True,
) -> DemoResult:
    """Play the migration (see the module docstring); returns the steps and the summary."""
    result = DemoResult()
    began = time.monotonic()
    t0 = time.monotonic()
    if start_stack:
        Stack(settings).up()
    spark = session(settings, app_name="rewind-demo")
    result.step("stack up", t0)

    t0 = time.monotonic()
    scene = set_scene(
        settings, spark, events=events, seed=seed, prefix=prefix, window=Window.default(), say=say
    )
    result.scene = scene
    conf = settings.kafka_config()
    name = f"{prefix}-order-totals-{int(time.time())}"
    group = f"{prefix}-order-totals-service"
    db = settings.state_dir / f"{prefix}-order-totals.sqlite"
    spec = parse_spec(shadow_spec(scene, name, db, group, verifications), "demo shadow spec")
    _create_v1(settings, spec, db)
    v1 = TotalsService(conf, scene.topic, group, db, TABLE, discount=False)
    v1.start()
    _wait("v1", "the live service reading the whole topic", lambda: v1.applied >= scene.events, 600)
    producer = OrderProducer(conf, scene.topic, PARTITIONS, orders_per_s, seed)
    producer.start()
    say(
        f"[bold]1. live[/]: the order_totals service (group {escape(group)}) folds every event into v1 "
        f"in {escape(str(db))} ({len(read_v1(db)):,} orders); new orders arrive at {orders_per_s:g}/s"
    )
    result.step("scene", t0, **scene.facts(), v1_orders=len(read_v1(db)))

    tail = None
    try:
        t0 = time.monotonic()
        say(
            f"[bold]2. shadow start[/] {escape(name)}: "
            "the history (archive + log) folded into v2, then the live tail (each batch folded into v2)"
        )
        # one start: the history, then the tail continues in the same call (a first start
        # stopped after the history would start and stop a streaming query for nothing)
        tail = started = _Tail(settings, spec)
        tail.start()
        status = _wait(
            "caught up",
            "the shadow catching up",
            lambda: not started.is_alive() or _caught_up(settings, name),
            600,
        )
        if not started.is_alive():  # its error, or a tail that stopped by itself
            started.stop()
            raise DemoFailed("demo step 'shadow start': the shadow's tail stopped before it caught up")
        run_id = status["run_id"]
        why = status["caught_up_reason"]
        say(f"   caught up: v2 is {status['max_lag']} offsets behind the log at most ({why})")
        result.step("shadow start", t0, run_id=run_id, max_lag=status["max_lag"])

        t0 = time.monotonic()
        checked = verify_shadow(settings, name, repeat=verifications, every_s=1)
        passed = [r["passed"] for r in checked["results"]]
        compared = [r["rows"]["staging"] for r in checked["results"]]
        ok = passed == [True] * verifications and checked["go"]
        expect(ok, "verify", f"v2 differs from v1: {checked['results']}")
        expect(min(compared) > 0, "verify", "no settled order was compared")
        say(f"   verified {verifications}x: {compared[-1]:,} settled orders equal in v1 and v2: go")
        result.step("verify", t0, compared=compared[-1], unsettled=checked["results"][-1]["unsettled_keys"])

        t0 = time.monotonic()
        v1.stop()
        _wait(
            "cutover",
            "v2 passing the live service's offsets",
            lambda: all(p["group_lag"] <= 0 for p in shadow_status(settings, name)["partitions"]),
            300,
        )
        tailed = tail.stop()
        tail = None
        done = cutover_hard(settings, name)
    except BaseException:
        if tail is not None:
            tail.halt.set()
        producer.halt.set()
        v1.halt.set()
        raise
    cut = done.get("swap", {})
    expect(done["state"] == "cutover", "cutover", f"the shadow is {done['state']}")
    v2 = TotalsService(conf, scene.topic, group, db, TABLE, discount=True)
    v2.start()
    say(
        f"[bold]3. cutover --hard[/]: cut line proven, v2 swapped in ({escape(str(cut))}); "
        "the new service resumes"
    )
    result.step("cutover", t0, tail_batches=tailed["batches"], swap=cut)

    t0 = time.monotonic()
    # orders keep arriving, now written by the new release into the swapped table: a few
    # more are produced before the producer stops (the final check needs them all applied)
    more = len(producer.produced) + 10
    _wait(
        "final", "new orders after the cutover", lambda: len(producer.produced) >= more or producer.error, 60
    )
    produced = producer.stop()
    history = domain.generate(events, partitions=PARTITIONS, seed=seed)
    expected = expected_totals([*history.valid, *produced])
    try:
        _wait("final", "order_totals equal to a clean recomputation", lambda: _equal(db, expected), 300)
    except DemoFailed:
        found = {r[0]: tuple(r[1:]) for r in read_totals(db)}
        bad = [(k, found.get(k), v) for k, v in expected.items() if found.get(k) != v][:3]
        raise DemoFailed(
            f"demo step 'final': order_totals differs from a clean recomputation, e.g. {bad} "
            f"({len(found):,} rows, {len(expected):,} expected)"
        ) from None
    finally:
        v2.stop()
    rows = read_totals(db)
    expect(len(rows) == len(expected), "final", f"{len(rows)} rows for {len(expected)} orders")
    expect(all(r[-1] is not None for r in rows), "final", "a row without discount")
    say(
        f"[bold]4. done[/]: order_totals has {len(rows):,} orders, each with discount, equal to a clean "
        f"fold of {events:,} history events and {len(produced):,} live ones, none counted twice"
    )
    result.step("final", t0, orders=len(rows), live_events=len(produced))
    result.summary = {
        "shadow": name,
        "run_id": run_id,
        "orders": len(rows),
        "live_events": len(produced),
        "verified_orders": compared[-1],
        "seconds": round(time.monotonic() - began, 1),
    }
    return result


def read_v1(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(f'SELECT order_id FROM "{TABLE}"').fetchall()


def _caught_up(settings: Settings, name: str) -> dict[str, Any] | None:
    status = shadow_status(settings, name)
    return status if status["caught_up"] else None


def _equal(db: Path, expected: dict[str, tuple[Any, ...]]) -> bool:
    rows = read_totals(db)
    return len(rows) == len(expected) and {r[0]: tuple(r[1:]) for r in rows} == expected
