"""A reconstruction killed and resumed: every policy's events exactly once, in business order.

A history of 1,500 policies in 6 key ranges (2 per wave, paced so a wave takes seconds) is
killed with SIGKILL in the middle of a wave (the driver, its Spark and the tasks producing their
units' transactions), resumed with a task killed after its unit's events and marker were flushed
but before its transaction committed, and resumed to the end. A ``read_committed`` consumer then
reads each policy's events exactly once and in business order (the same sequence a clean
reconstruction makes), and the ledger's counts add up (states in = consumed + quarantined +
filtered). Needs a broker whose read_committed hides aborted records (noida-db; tansu shows them).
"""

from __future__ import annotations

import random
import subprocess
import uuid
from pathlib import Path

import pytest

from rewind.config import load_settings
from tests import job_fixtures as jf
from tests import reconstruct_fixtures as rx
from tests import reproduce_fixtures as rf
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic

RATE = 800.0  # states/s: a wave of 2 units of ~600 states takes ~1.5 s, so a timed kill lands inside it


def _child(tmp: Path, env: dict[str, str], action: str, target: str) -> subprocess.CompletedProcess[str]:
    return jf.run_driver(tmp, env, action, target, units_per_wave=2)


def test_a_killed_reconstruction_resumes_to_every_event_once_in_order(
    tmp_path: Path, broker: TestBroker, request: pytest.FixtureRequest
) -> None:
    broker.require(READ_COMMITTED)
    spark = request.getfixturevalue("spark")  # after the skip: a broker that skips starts no Spark
    from rewind.job.service import resume_job
    from rewind.ledger import Ledger
    from tests.test_reconstruct import _expected_events

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    conf = settings.kafka_config()
    topic = f"policies-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 6)
    rng = random.Random(21)
    history = rx.random_history(rng, 1500, 4)
    url = rx.sqlite_history(tmp_path / "legacy.db", history, rng.sample(range(len(history)), len(history)))
    source = {
        "sqlite": {"url": url, "table": "policy_history"},
        "key": "policy_id",
        "where": "TRUE",
        "key_ranges": 6,
        "reconstruct": {"time": "effective_from", "tie": ["change_seq"]},
    }
    spec = rx.spec("reconstruct-faults", source, topic, guards={"max_records_per_second": RATE})
    path = jf.write_spec(tmp_path / "spec.yaml", spec)

    # 1. the driver killed in the middle of the first wave
    killed = _child(
        tmp_path, jf.child_env(settings, REWIND_FAULT="mid-wave", REWIND_FAULT_DELAY="1.0"), "run", str(path)
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    with Ledger.open(settings.ledger) as ledger:
        (run,) = ledger.list_runs(5)
    # 2. a task killed after its unit's events and marker were flushed, before the commit (in
    # this process: only the driver's kill needs a child)
    with (
        jf.in_tasks(spark, REWIND_FAULT="reproduce-before-end"),
        pytest.raises(Exception, match="a Spark task"),
    ):
        resume_job(settings, run.id, units_per_wave=2)
    with Ledger.open(settings.ledger) as ledger:
        assert ledger.get_run(run.id).state == "failed"
        assert ledger.unit_counts(run.id).done < 6
    # 3. to the end, in this process
    done = resume_job(settings, run.id, units_per_wave=2)
    assert done.state == "succeeded" and done.run_id == run.id

    records = [r for r in rf.read_topic(conf, topic) if r.headers.get("rewind.run-id") == run.id]
    got: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        got.setdefault(r.key, []).append((r.value["type"], r.headers["rewind.effective-time"][:10]))
    assert got == _expected_events(history)  # each event once, each policy's in business order
    everything = rf.read_topic(conf, topic, isolation="read_uncommitted")
    assert len(everything) > len(records)  # aborted attempts reached the log; read_committed hid them
    with Ledger.open(settings.ledger) as ledger:
        totals = ledger.unit_counts(run.id).counts
    assert (totals.records_read, totals.emitted, totals.quarantined, totals.filtered) == (
        len(history),
        len(history),
        0,
        0,
    )
    assert totals.rows_out == len(records)


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWIND_FAULT", raising=False)
