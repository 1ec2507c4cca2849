"""``guards.max_quarantine_ratio``: a run whose translate fails on its records stops after the
wave that shows it, failed with its top reasons, and cannot be promoted; after a fix
``rewind resume`` continues; a guard changed on resume is honoured and recorded.

The translate is broken while a flag file named after the topic exists (the fix is the file's
removal: the same spec, as a user's fixed module would be). Units of 250 records, two per wave:
the guard, which waits for 1,000 records, trips after the second wave.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import Settings, load_settings
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

RECORDS = 3000
UNIT = 250
FLAGS = Path(tempfile.gettempdir()) / "rewind-test-broken-translates"


def broken_until_fixed(events: pd.DataFrame) -> pd.DataFrame:
    """Raises on every record while ``FLAGS/<topic>`` exists; then keeps the orders."""
    if len(events) and (FLAGS / str(events["_src_topic"].iloc[0])).exists():
        raise ValueError("the translate is broken")
    return events[["_rewind_row", "order_id", "status", "amount"]]


def spec(topic: str, table: str, **guards: Any) -> Any:
    function = "tests.test_quarantine_guard:broken_until_fixed"
    data = jf.order_spec("guarded", topic, table, unit_records=UNIT, function=function)
    data["run"] = {"work_unit_records": UNIT}
    if guards:
        data["guards"] = guards
    return parse_spec(data)


@pytest.fixture
def broken(tmp_path: Path, bootstrap: str, spark: Any) -> Any:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-guard-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    # well-formed orders only: every quarantined record is the translate's doing
    orders = [o for o in jf.order_events(RECORDS, 2) if o.fate in ("row", "double", "filtered")]
    jf.produce_orders(settings.kafka_config(), topic, orders)
    FLAGS.mkdir(exist_ok=True)
    flag = FLAGS / topic
    flag.touch()
    yield settings, topic, flag, len(orders)
    flag.unlink(missing_ok=True)


def units_done(settings: Settings, run_id: str) -> tuple[int, int]:
    from rewind.job.service import open_ledger

    with open_ledger(settings) as ledger:
        units = ledger.units(run_id)
        return sum(u.state == "done" for u in units), len(units)


def test_a_run_that_quarantines_everything_stops_after_a_wave_and_resumes_after_the_fix(broken: Any) -> None:
    from rewind.job.publish import promote_run
    from rewind.job.quarantine_guard import QuarantineGuardTripped
    from rewind.job.service import list_runs, resume_job, run_job, show_run

    settings, topic, flag, n = broken
    table = f"guard.orders_{topic[-8:]}"
    with pytest.raises(QuarantineGuardTripped) as tripped:
        run_job(settings, spec(topic, table), units_per_wave=2)
    line = str(tripped.value)
    assert "\n" not in line and line.startswith(
        "guards.max_quarantine_ratio: 1,000 of 1,000 records read (100.0%)"
    )
    assert "translate-error: ValueError 1,000" in line
    [listed] = list_runs(settings)
    run_id = listed["run_id"]
    done, total = units_done(settings, run_id)
    assert listed["state"] == "failed" and done == 4 < total  # two waves, then stopped
    shown = show_run(settings, run_id)
    assert shown["error"].endswith(line)
    assert any(e["action"] == "quarantine-guard" for e in shown["history"])
    with pytest.raises(Exception, match="failed"):
        promote_run(settings, run_id)

    # the fix: resume continues with the units left, which the guard now lets through
    flag.unlink()
    outcome = resume_job(settings, run_id, units_per_wave=2)
    assert outcome.state == "succeeded" and outcome.counts.records_read == n
    assert outcome.counts.quarantined == 1000  # quarantined before the fix: still there (redrive)
    assert units_done(settings, run_id) == (total, total)


def test_a_guard_changed_on_resume_is_honoured_and_audited(broken: Any, tmp_path: Path) -> None:
    from rewind.job.quarantine_guard import QuarantineGuardTripped
    from rewind.job.service import list_runs, resume_job, run_job, show_run

    settings, topic, _, n = broken
    table = f"guard.orders_{topic[-8:]}"
    with pytest.raises(QuarantineGuardTripped):
        guarded = spec(topic, table, max_quarantine_ratio=0.5, min_records_before_ratio=400)
        run_job(settings, guarded, units_per_wave=2)
    [listed] = list_runs(settings)
    run_id = listed["run_id"]
    assert units_done(settings, run_id)[0] == 2  # the first wave read 500 > 400: stopped there

    # any other change is refused
    from rewind.errors import RewindError

    other = spec(topic, f"{table}_other", max_quarantine_ratio=None, min_records_before_ratio=400)
    with pytest.raises(RewindError, match="not the spec of this run"):
        resume_job(settings, run_id, spec=other)

    # the same job with the guard switched off: accepted, recorded, and the run goes to the end
    off = spec(topic, table, max_quarantine_ratio=None, min_records_before_ratio=400)
    outcome = resume_job(settings, run_id, units_per_wave=2, spec=off)
    assert outcome.state == "succeeded" and outcome.counts.quarantined == n
    changed = [e for e in show_run(settings, run_id)["history"] if e["action"] == "guard-changed"]
    assert [e["details"] for e in changed] == [{"max_quarantine_ratio": None}]


def test_below_the_guard_a_run_succeeds(broken: Any) -> None:
    from rewind.job.service import run_job

    settings, topic, flag, n = broken
    flag.unlink()
    outcome = run_job(settings, spec(topic, f"guard.ok_{topic[-8:]}"), units_per_wave=4)
    assert (
        outcome.state == "succeeded" and outcome.counts.quarantined == 0 and outcome.counts.records_read == n
    )
