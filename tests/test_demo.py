"""The demo is a test too: the whole repair story at a reduced size, twice on the same stack.

``run_demo`` checks every step against what the generated data says (exact counts, exact
rows of the read model after promote, rollback and promote again) and raises ``DemoFailed``
otherwise; these tests run it on the tests' broker, Spark and catalog, then check what the
story left behind from the outside: the ledger, the report, the table's history.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from rewind.config import Settings
from rewind.demo import orders as domain
from rewind.demo.errors import DemoFailed
from rewind.demo.scene import Window
from rewind.demo.story import _check_main, run_demo
from rewind.job.service import open_ledger, show_run
from tests import job_fixtures as jf
from tests.brokers import TestBroker


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"demo_{uuid.uuid4().hex[:8]}"


def test_the_story_runs_end_to_end_and_leaves_a_report(
    settings: Settings, spark: object, prefix: str, tmp_path: Path
) -> None:
    lines: list[str] = []
    report = tmp_path / "report.html"
    result = run_demo(
        settings,
        events=24_000,
        seed=11,
        prefix=prefix,
        say=lines.append,
        report_path=report,
        start_stack=False,
    )
    s, scene = result.summary, result.scene
    assert scene is not None
    assert [step["step"] for step in result.steps] == [
        "stack up",
        "scene",
        "plan",
        "run",
        "verify",
        "promote/rollback/promote",
        "sqlite copy",
    ]
    assert s["records_read"] == scene.in_read_window
    assert s["quarantined"] == sum(scene.malformed_in_window.values())
    assert s["orders_repaired"] == scene.orders_wrong_in_v1 > 0
    assert s["rows_written"] == scene.orders_in_bug_window
    assert report.exists() and report.with_suffix(".json").exists()
    assert json.loads(report.with_suffix(".json").read_text())["passed"] is True
    assert any(line.startswith("[bold]2. plan") for line in lines)

    with open_ledger(settings) as ledger:
        actions = [e.action for e in ledger.audit_log(s["run_id"])]
        assert ledger.get_run(s["run_id"]).state == "promoted"
    assert [a for a in actions if a in ("verify", "promote", "rollback")] == [
        "verify",
        "promote",
        "rollback",
        "promote",
    ]
    swaps = [h for h in show_run(settings, s["run_id"])["history"] if h["action"] in ("promote", "rollback")]
    assert [h["details"]["after"] for h in swaps][::2] == [swaps[0]["details"]["after"]] * 2
    assert swaps[1]["details"]["after"] == swaps[0]["details"]["before"]  # rollback restored main
    # production now reads the corrected model; the check the demo makes can fail
    with pytest.raises(DemoFailed, match="differs from the v1 read model"):
        _check_main(scene, "v1", "after the demo", lambda _: None)


def test_a_second_run_on_the_same_stack_starts_from_a_clean_scene(
    settings: Settings, spark: object, prefix: str
) -> None:
    result = run_demo(settings, events=12_000, seed=12, prefix=prefix, start_stack=False)
    scene = result.scene
    assert scene is not None
    # the topic, archive and table were recreated: the read model holds only this run's orders
    assert len(scene.read_model()) == len(scene.correct)
    assert result.summary["records_read"] == scene.in_read_window


def test_the_repair_window_straddles_the_seam() -> None:
    window = Window.default()
    assert window.bug_from < window.seam < window.bug_to < window.read_to
    assert window.read_to - window.bug_to == domain.ORDER_LIFETIME


def test_the_shadow_story_migrates_order_totals_while_orders_keep_arriving(
    noida_broker: TestBroker, spark: object, tmp_path: Path
) -> None:
    """``rewind demo --story shadow`` at a reduced size on noida-db (a group joins in ~0.4 s
    there; ~20 s on tansu). The story checks its own results and raises DemoFailed; here the
    outcome is checked again from the outside: the SQLite file and the ledger."""
    from rewind.config import load_settings
    from rewind.demo.scene import PARTITIONS
    from rewind.demo.shadow_story import expected_totals, read_totals, run_shadow_story
    from rewind.shadow.status import shadow_status

    settings = load_settings(
        env={
            "REWIND_STATE_DIR": str(tmp_path / "state"),
            "REWIND_BOOTSTRAP_SERVERS": noida_broker.bootstrap,
            "REWIND_SPARK_CONF": jf.QUICK_SPARK_CONF,
        },
        cwd=tmp_path,
    )
    lines: list[str] = []
    prefix = f"shd_{uuid.uuid4().hex[:6]}"
    result = run_shadow_story(
        settings,
        events=6_000,
        seed=5,
        prefix=prefix,
        orders_per_s=10,
        verifications=1,
        say=lines.append,
        start_stack=False,
    )
    assert [s["step"] for s in result.steps] == [
        "stack up",
        "scene",
        "shadow start",
        "verify",
        "cutover",
        "final",
    ]
    s = result.summary
    assert s["live_events"] > 0 and s["verified_orders"] > 0
    assert shadow_status(settings, s["shadow"])["state"] == "cutover"

    rows = {r[0]: tuple(r[1:]) for r in read_totals(settings.state_dir / f"{prefix}-order-totals.sqlite")}
    history = expected_totals(domain.generate(6_000, partitions=PARTITIONS, seed=5).valid)
    live = {k: v for k, v in rows.items() if k not in history}
    assert {k: rows[k] for k in history} == history  # every history order: the fold of its events, once
    assert len(live) > 0 and len(rows) == s["orders"] == len(history) + len(live)
    assert all(v[-1] is not None for v in live.values())  # the new release writes discount
    assert any(line.startswith("[bold]3. cutover --hard") for line in lines)
