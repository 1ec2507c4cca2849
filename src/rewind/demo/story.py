"""``rewind demo``: a production repair of the ``order_totals`` read model, end to end.

The story (see docs/quickstart.md): a fulfilment service's ``orders`` topic holds 60 days of
order events; the older 50 days have aged out into the lake archive (declared beyond the
log's start, as the embedded broker cannot expire records); the live projection "v1" built
``order_totals`` in an Iceberg table and in SQLite, and a release subtracted discounts twice
for orders placed in a 5-day window that straddles the seam between lake and log. The demo:

1. sets the scene: topic, v1 read model, archive (:func:`set_scene`);
2. plans the repair from history (archive below the seam, Kafka above) and prints the plan;
3. runs v2 (translate + fold) into a staging branch, with progress;
4. verifies staging against production: only orders inside the window differ, by their
   discount;
5. promotes, shows the corrected totals, rolls back, promotes again;
6. repairs the SQLite copy of the read model with the same job (sink ``postgres``, SQLite URL);
7. prints the report's path and a one-screen summary.

Every step checks its result against what the generated data says it must be (exact counts,
exact rows) and raises :class:`DemoFailed` naming the step otherwise: the demo is a test too.
A second run on the same stack starts from a clean scene (it drops and recreates its topic and
tables); the ledger keeps every run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from rewind.core.console import QuietConsole, RunProgress
from rewind.demo import orders as domain
from rewind.demo.errors import DemoFailed
from rewind.demo.scene import Say, Scene, Window, read_sqlite_model, set_scene
from rewind.embedded.stack import Stack
from rewind.job.publish import promote_run, rollback_run
from rewind.spark import session
from rewind.spec import parse_spec
from rewind.verify.service import verify_run

if TYPE_CHECKING:
    import pandas as pd

    from rewind.config import Settings


def expect(condition: bool, step: str, message: str) -> None:
    if not condition:
        raise DemoFailed(f"demo step '{step}': {message}")


@dataclass
class DemoResult:
    """What the demo did: per step seconds and facts, and the summary."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    scene: Scene | None = None

    def step(self, name: str, started: float, **facts: Any) -> dict[str, Any]:
        entry = {"step": name, "seconds": round(time.monotonic() - started, 2), **facts}
        self.steps.append(entry)
        return entry


def repair_spec(scene: Scene, window: Window) -> dict[str, Any]:
    """The job spec of the repair, as a user would write it in YAML."""
    return {
        "name": "repair-order-totals",
        "description": "Recompute order_totals for orders placed while v1 subtracted discounts twice",
        "source": {
            "history": {
                "topics": [scene.topic],
                "archive": scene.archive_table,
                "from": window.bug_from.isoformat(),
                "to": window.read_to.isoformat(),
                "declared_log_start": {scene.topic: {str(p): o for p, o in scene.log_start.items()}},
            }
        },
        "decode": {"format": "json", "schema": domain.DECODE_SCHEMA},
        "translate": {
            "function": "rewind.demo.orders:order_deltas_v2",
            "fold": "rewind.demo.orders:fold_order_totals",
            "version": "2",
            "output_schema": domain.READ_MODEL_SCHEMA,
        },
        "key": ["order_id"],
        "sink": {
            "iceberg": {
                "table": scene.model_table,
                "mode": "replace-window",
                "window_column": "placed_at",
                "window_from": window.bug_from.isoformat(),
                "window_to": window.bug_to.isoformat(),
            }
        },
        "run": {"work_unit_records": 25_000},
        "verify": {
            "reference": {"target": True},
            "buckets": {"time_column": "placed_at", "granularity": "day", "category": "status"},
        },
    }


def run_demo(
    settings: Settings,
    *,
    events: int = 1_000_000,
    seed: int = 7,
    prefix: str = "demo",
    say: Say = lambda _: None,
    report_path: Path | None = None,
    start_stack: bool = True,
) -> DemoResult:
    """Play the story on the embedded stack (started if needed); see the module docstring.

    ``start_stack=False`` plays it on whatever the settings name (the tests' broker and catalog).
    """
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import run_job

    result = DemoResult()
    began = time.monotonic()
    window = Window.default()

    t0 = time.monotonic()
    if start_stack:
        Stack(settings).up()
    spark = session(settings, app_name="rewind-demo")
    result.step("stack up", t0)

    t0 = time.monotonic()
    scene = set_scene(settings, spark, events=events, seed=seed, prefix=prefix, window=window, say=say)
    result.scene = scene
    result.step("scene", t0, **scene.facts())

    spec = parse_spec(repair_spec(scene, window), "demo spec")
    t0 = time.monotonic()
    plan = _plan(settings, spec, scene, window, say)
    result.step("plan", t0, plan_id=plan.plan_id, units=len(plan.units))

    t0 = time.monotonic()
    say("[bold]3. run v2[/] (translate per event, fold per order) into a staging branch")
    outcome = run_job(settings, plan.plan_id, console=_SayConsole(say))
    run_id = outcome.run_id
    _check_run(outcome.to_dict(), scene)
    result.step("run", t0, run_id=run_id, **_run_facts(outcome.to_dict()))
    say(f"   run {run_id}: {_run_line(outcome.to_dict())}")

    t0 = time.monotonic()
    say("[bold]4. verify[/] staging against production (the target's main)")
    path = report_path or settings.state_dir / "reports" / f"{prefix}-{run_id}-verify.html"
    report = verify_run(settings, run_id, path)
    _check_verify(report, scene)
    result.step("verify", t0, passed=report["passed"], changed=report["changes"]["changed"])
    say(
        f"   passed: {report['rows']['staging']:,} rows compared; "
        f"{report['changes']['changed']:,} orders changed, "
        "all placed inside the window; nothing outside it differs"
    )

    t0 = time.monotonic()
    say("[bold]5. promote[/], roll back, promote again")
    promote_run(settings, run_id)
    _check_main(scene, "correct", "after promote", say)
    rollback_run(settings, run_id)
    _check_main(scene, "v1", "after rollback", say)
    promote_run(settings, run_id)
    _check_main(scene, "correct", "after the second promote", say)
    result.step("promote/rollback/promote", t0)

    t0 = time.monotonic()
    sql_run = _repair_sqlite_copy(settings, scene, window, say)
    result.step("sqlite copy", t0, run_id=sql_run)

    result.summary = _summary(outcome.to_dict(), report, scene, time.monotonic() - began)
    return result


def sqlite_spec(scene: Scene, window: Window) -> dict[str, Any]:
    """The same repair, into the service's SQLite copy of the read model (upserts on the key)."""
    spec = repair_spec(scene, window)
    spec["name"] = "repair-order-totals-sqlite"
    spec["sink"] = {
        "postgres": {
            "table": "order_totals",
            "url": f"sqlite:///{scene.sqlite_path}",
            "mode": "upsert",
            "window_column": "placed_at",
            "window_from": window.bug_from.isoformat(),
            "window_to": window.bug_to.isoformat(),
        }
    }
    return spec


def _repair_sqlite_copy(settings: Settings, scene: Scene, window: Window, say: Say) -> str:
    """Step 6: the same job into SQLite: run, verify, promote; the copy must equal the correct model."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import run_job

    step = "sqlite copy"
    say(
        f"[bold]6. the SQLite copy[/] of the read model ({scene.sqlite_path.name}): "
        "the same job, sink postgres"
    )
    outcome = run_job(settings, parse_spec(sqlite_spec(scene, window), "demo sqlite spec"))
    _check_run(outcome.to_dict(), scene)
    report = verify_run(
        settings, outcome.run_id, settings.state_dir / "reports" / f"{outcome.run_id}-verify.json"
    )
    _check_verify(report, scene)
    promote_run(settings, outcome.run_id)
    diff = _differences(read_sqlite_model(scene.sqlite_path), scene.correct)
    expect(diff == 0, step, f"the SQLite copy differs from the correct read model on {diff} orders")
    say(
        f"   run {outcome.run_id}: {_run_line(outcome.to_dict())}; verified "
        f"({report['changes']['changed']:,} orders changed); promoted: SQLite == the correct read model"
    )
    return outcome.run_id


def _plan(settings: Settings, spec: Any, scene: Scene, window: Window, say: Say) -> Any:
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import plan_job

    say(
        f"[bold]2. plan[/] the repair of orders placed "
        f"{window.bug_from:%Y-%m-%d} .. {window.bug_to:%Y-%m-%d} "
        f"(reading to {window.read_to:%Y-%m-%d}: orders last up to {domain.ORDER_LIFETIME.days} days)"
    )
    plan = plan_job(settings, spec)
    expect(plan.ok, "plan", f"gates failed: {[g.detail for g in plan.failed_gates()]}")
    sources = {u.source for u in plan.units}
    expect(sources == {"archive", "kafka"}, "plan", f"the window should cross the seam, units read {sources}")
    records = sum(u.end - u.start for u in plan.units)
    expect(
        records == scene.in_read_window,
        "plan",
        f"plan covers {records} offsets, the topic has {scene.in_read_window} in the window",
    )
    for line in _plan_lines(plan):
        say(f"   {escape(line)}")
    return plan


def _plan_lines(plan: Any) -> list[str]:
    by_source: dict[str, list[int]] = {}
    for unit in plan.units:
        by_source.setdefault(unit.source, []).append(unit.end - unit.start)
    lines = [f"plan {plan.plan_id}: {len(plan.units)} units"]
    for source, sizes in sorted(by_source.items()):
        lines.append(f"  from {source:7s}: {len(sizes):3d} units, {sum(sizes):,} records")
    for gate in plan.gates:
        lines.append(f"  gate {gate.name}: {'ok' if gate.ok else 'FAILED'} {gate.detail}")
    return lines


class _SayConsole(QuietConsole):
    """The run's progress told as lines of the story."""

    def __init__(self, say: Say) -> None:
        self.say = say

    def run_progress(self, progress: RunProgress) -> None:
        p = progress
        self.say(f"   {p.units_done}/{p.units_total} units, {p.counts.records_read:,} records read")


def _run_facts(outcome: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "records_read",
        "emitted",
        "quarantined",
        "filtered",
        "quarantine_reasons",
        "folded",
        "records_per_s",
    )
    return {k: outcome.get(k) for k in keys}


def _run_line(outcome: dict[str, Any]) -> str:
    folded = outcome.get("folded") or {}
    return (
        f"read {outcome['records_read']:,}, quarantined {outcome['quarantined']:,}, "
        f"{folded.get('rows_in', 0):,} partial rows folded into {folded.get('rows_out', 0):,} orders "
        f"({folded.get('outside_window', 0):,} outside the window dropped), "
        f"{outcome.get('records_per_s') or 0:,} records/s"
    )


def _check_run(outcome: dict[str, Any], scene: Scene) -> None:
    step = "run"
    expect(outcome["state"] == "succeeded", step, f"run ended {outcome['state']}")
    expect(
        outcome["records_read"] == scene.in_read_window,
        step,
        f"read {outcome['records_read']} records, the window holds {scene.in_read_window}",
    )
    expect(
        outcome["quarantined"] == sum(scene.malformed_in_window.values()),
        step,
        f"quarantined {outcome['quarantined']}, the window holds {scene.malformed_in_window} malformed",
    )
    folded = outcome.get("folded") or {}
    expect(
        folded.get("rows_out") == scene.orders_in_bug_window,
        step,
        f"folded into {folded.get('rows_out')} orders, "
        f"{scene.orders_in_bug_window} were placed in the window",
    )


def _check_verify(report: dict[str, Any], scene: Scene) -> None:
    step = "verify"
    expect(report["passed"], step, f"verification failed: {report['failed']}")
    changed = report["changes"]["changed"]
    expect(
        changed == scene.orders_wrong_in_v1,
        step,
        f"{changed} orders changed, v1 got {scene.orders_wrong_in_v1} wrong",
    )
    expect(
        report["changes"]["missing"] == 0 and report["changes"]["extra"] == 0,
        step,
        f"the repair added or removed orders: {report['changes']}",
    )


def _check_main(scene: Scene, which: str, step: str, say: Say) -> None:
    main = scene.read_model()
    wanted = scene.correct if which == "correct" else scene.v1
    diff = _differences(main, wanted)
    expect(diff == 0, step, f"main differs from the {which} read model on {diff} orders")
    sample = scene.sample_ids
    rows = main[main["order_id"].isin(sample)].set_index("order_id")
    shown = ", ".join(f"{oid} {rows.loc[oid, 'total']:.2f}" for oid in sample)
    say(f"   {step}: main == the {which} read model ({len(main):,} orders); e.g. {shown}")


def _differences(a: pd.DataFrame, b: pd.DataFrame) -> int:
    cols = list(domain.READ_MODEL_SCHEMA)
    a = a[cols].sort_values("order_id").reset_index(drop=True)
    b = b[cols].sort_values("order_id").reset_index(drop=True)
    if len(a) != len(b) or not (a["order_id"] == b["order_id"]).all():
        return abs(len(a) - len(b)) or int((a["order_id"] != b["order_id"]).sum())
    differs = ~((a == b) | (a.isna() & b.isna())).all(axis=1)
    return int(differs.sum())


def _summary(outcome: dict[str, Any], report: dict[str, Any], scene: Scene, seconds: float) -> dict[str, Any]:
    folded = outcome.get("folded") or {}
    return {
        "events_in_topic": scene.events,
        "run_id": outcome["run_id"],
        "records_read": outcome["records_read"],
        "rows_written": folded.get("rows_out", outcome["rows_out"]),
        "quarantined": outcome["quarantined"],
        "quarantine_reasons": outcome["quarantine_reasons"],
        "orders_repaired": report["changes"]["changed"],
        "run_seconds": outcome["seconds"],
        "records_per_s": outcome["records_per_s"],
        "demo_seconds": round(seconds, 1),
        "report": (report.get("report") or {}).get("html"),
    }
