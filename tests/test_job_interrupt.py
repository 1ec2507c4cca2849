"""Ctrl-C during a run: the run is ``interrupted`` (not ``failed``) and ``rewind resume`` ends it.

The run is a real ``rewind run`` child process, sent SIGINT while a rate-limited wave reads;
PySpark's handler cancels the Spark job, whose error must not be mistaken for a failure.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from rewind.config import Settings, load_settings
from rewind.job.service import open_ledger, resume_job
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.test_cli_errors import REWIND


def _state(settings: Settings, name: str) -> tuple[str, str, str | None] | None:
    with open_ledger(settings) as ledger:
        runs = [r for r in ledger.list_runs() if r.name == name]
    return (runs[0].id, runs[0].state, runs[0].error) if runs else None


def test_ctrl_c_interrupts_the_run_and_resume_finishes_it(bootstrap: str, spark: Any, tmp_path: Path) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    jf.produce_orders(settings.kafka_config(), topic, jf.order_events(1600, 2))
    name = "orders-interrupt"
    spec = jf.order_spec(
        name,
        topic,
        "interrupt.staging",
        unit_records=400,
        guards={"max_records_per_second": 200.0},  # a wave reads for seconds: the signal lands in it
        run={"work_unit_records": 400},
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
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = _state(settings, name)
        if found and found[1] == "running":
            break
        time.sleep(0.5)
    time.sleep(8)  # into the first wave's reads
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert child.returncode != 0
    found = _state(settings, name)
    assert found is not None
    run_id, state, error = found
    assert state == "interrupted", (state, error, err[-2000:])
    assert error is not None and "rewind resume" in error
    outcome = resume_job(settings, run_id)
    assert outcome.state == "succeeded"
    assert outcome.counts.records_read == 1600
