"""Ctrl-C during a run: the run is ``interrupted`` (not ``failed``) and ``rewind resume`` ends it.

The run is a real ``rewind run`` child process, sent SIGINT while a rate-limited wave reads;
PySpark's handler cancels the Spark job, whose error must not be mistaken for a failure.
The signal is sent when the wave is seen reading (its units marked running in the ledger and
its Spark tasks pacing their reads ahead of the clock), never after a guessed delay, and the
test then proves it landed mid-wave: no unit done, nothing committed to staging or quarantine.
"""

from __future__ import annotations

import signal
import struct
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from rewind.config import Settings, load_settings
from rewind.job.service import open_ledger, resume_job
from rewind.spark.ratelimit import default_state_dir
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.test_cli_errors import REWIND

RECORDS = 1200
UNITS = 4  # 300 records each, one wave (a run does up to 8 units per wave)
RATE = 200.0  # records/s: the wave reads for 6 s, the signal comes within ~0.1 s of its start
QUARANTINE = "interrupt.rewind_quarantine"  # the default: beside the staging table


def _run(settings: Settings, name: str) -> Any:
    with open_ledger(settings) as ledger:
        runs = [r for r in ledger.list_runs() if r.name == name]
    return runs[0] if runs else None


def _unit_states(settings: Settings, run_id: str) -> list[str]:
    with open_ledger(settings) as ledger:
        return [u.state for u in ledger.units(run_id)]


def _reading(run_id: str) -> bool:
    """The wave's Spark tasks are reading: the run's shared read-pacing state exists and has
    reads reserved past now (two doubles, the next free time for records and for bytes)."""
    path = default_state_dir() / f"read-{run_id}.pace"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return False
    return len(raw) == 16 and struct.unpack("<dd", raw)[0] > time.monotonic()


def _wait_mid_wave(child: subprocess.Popen[str], settings: Settings, name: str) -> str:
    """The run's id once its wave is reading and none of its units is done."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and child.poll() is None:
        run = _run(settings, name)
        if run is not None and _reading(run.id):
            states = _unit_states(settings, run.id)
            assert Counter(states) == {"running": UNITS}, states  # the wave started, none committed
            return str(run.id)
        time.sleep(0.1)
    child.kill()
    raise AssertionError(f"the wave was never seen reading: {child.communicate()[1][-2000:]}")


def test_ctrl_c_interrupts_the_run_and_resume_finishes_it(bootstrap: str, spark: Any, tmp_path: Path) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    orders = jf.order_events(RECORDS, 2)
    coords = jf.produce_orders(settings.kafka_config(), topic, orders)
    name = "orders-interrupt"
    spec = jf.order_spec(
        name,
        topic,
        "interrupt.staging",
        unit_records=RECORDS // UNITS,
        guards={"max_records_per_second": RATE},
        run={"work_unit_records": RECORDS // UNITS},
    )
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    child = subprocess.Popen(
        [REWIND, "run", str(path)],
        cwd=tmp_path,
        env=jf.child_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_id = _wait_mid_wave(child, settings, name)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0

    # it landed mid-wave: the run is interrupted, no unit of the wave is done, nothing is
    # committed to staging or to the quarantine (a cancelled wave leaves no half of itself)
    run = _run(settings, name)
    assert (run.id, run.state) == (run_id, "interrupted"), (run.state, run.error, err[-2000:])
    assert run.error is not None and "rewind resume" in run.error
    states = _unit_states(settings, run_id)
    assert len(states) == UNITS and "done" not in states, states
    assert set(states) <= {"running", "failed"}, states
    assert jf.staging_table(settings, run.staging).num_rows == 0
    assert jf.quarantine_rows(settings, QUARANTINE, run_id) == []

    outcome = resume_job(settings, run_id)
    assert (outcome.state, outcome.quarantine_table) == ("succeeded", QUARANTINE)
    assert outcome.counts.records_read == RECORDS
    rows = jf.staging_table(settings, outcome.staging).to_pylist()
    expected = jf.expected_rows(topic, orders, coords, "order_lines", "1")
    assert sorted(r["_rewind_event_id"] for r in rows) == [r["_rewind_event_id"] for r in expected]
    fates = Counter(o.fate for o in orders)
    quarantined = RECORDS - fates["row"] - fates["double"] - fates["filtered"]
    assert len(jf.quarantine_rows(settings, QUARANTINE, run_id)) == quarantined
