"""A re-produce killed and resumed: exactly the selected entities once, for read_committed readers.

A run of 3,000 accounts in 6 key ranges (2 per wave, paced so a wave takes seconds) is killed
with SIGKILL in the middle of a wave (the driver, its Spark and the tasks producing their units'
transactions), resumed with a task killed after its unit's records and marker were flushed but
before its transaction committed, and resumed to the end. A ``read_committed`` consumer then
reads every selected entity exactly once (and the ``read_uncommitted`` view proves aborted
attempts did reach the log), the quarantine holds each rejected row once, and the ledger's
counts add up. Needs a broker whose read_committed hides aborted records (noida-db; tansu
shows them, see docs/embedded-broker.md).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from rewind.config import load_settings
from tests import job_fixtures as jf
from tests import reproduce_fixtures as rf
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic

ACCOUNTS = rf.accounts(3000)
RATE = 600.0  # rows/s: a wave of 2 units of 500 rows takes ~1.7 s, so a timed kill lands inside it


def _child(tmp: Path, env: dict[str, str], action: str, target: str) -> subprocess.CompletedProcess[str]:
    return jf.run_driver(tmp, env, action, target, units_per_wave=2)


def test_a_killed_re_produce_resumes_to_exactly_the_selected_entities_once(
    tmp_path: Path, broker: TestBroker, request: pytest.FixtureRequest
) -> None:
    broker.require(READ_COMMITTED)
    spark = request.getfixturevalue("spark")  # after the skip: a broker that skips starts no Spark
    from rewind.job.service import resume_job
    from rewind.ledger import Ledger

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    conf = settings.kafka_config()
    topic = f"accounts-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 6)
    url = rf.sqlite_accounts(tmp_path / "accounts.db", ACCOUNTS)
    source = {"sqlite": {"url": url, "table": "accounts"}, "key": "id", "where": "TRUE", "key_ranges": 6}
    spec = rf.spec("reproduce-faults", source, topic, guards={"max_records_per_second": RATE})
    path = jf.write_spec(tmp_path / "spec.yaml", spec)

    # 1. the driver killed in the middle of the first wave
    killed = _child(
        tmp_path, jf.child_env(settings, REWIND_FAULT="mid-wave", REWIND_FAULT_DELAY="1.0"), "run", str(path)
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    with Ledger.open(settings.ledger) as ledger:
        (run,) = ledger.list_runs(5)
    # 2. a task killed after its unit's records and marker were flushed, before the commit (in
    # this process: only the driver's kill needs a child)
    with (
        jf.in_tasks(spark, REWIND_FAULT="reproduce-before-end"),
        pytest.raises(Exception, match="a Spark task"),
    ):
        resume_job(settings, run.id, units_per_wave=2)
    with Ledger.open(settings.ledger) as ledger:
        assert ledger.get_run(run.id).state == "failed"
        assert ledger.unit_counts(run.id).done < 6  # the failed wave committed nothing of its own
    # 3. to the end, in this process
    done = resume_job(settings, run.id, units_per_wave=2)
    assert done.state == "succeeded" and done.run_id == run.id

    records = [r for r in rf.read_topic(conf, topic) if r.headers.get("rewind.run-id") == run.id]
    good = [a for a in ACCOUNTS if not a.rejected]
    assert sorted(int(r.key) for r in records) == [a.id for a in good]  # each exactly once
    by_id = {a.id: a for a in ACCOUNTS}
    assert all(r.value == by_id[int(r.key)].message() for r in records)
    everything = rf.read_topic(conf, topic, isolation="read_uncommitted")
    assert len(everything) > len(records) + 6  # aborted attempts reached the log; read_committed hid them
    quarantined = jf.quarantine_rows(settings, "rewind.rewind_quarantine", run.id)
    assert sorted(int(q["key"]) for q in quarantined) == [a.id for a in ACCOUNTS if a.rejected]
    with Ledger.open(settings.ledger) as ledger:
        assert ledger.get_run(run.id).state == "succeeded"
        totals = ledger.unit_counts(run.id).counts
    assert (totals.records_read, totals.emitted, totals.quarantined, totals.filtered) == (
        len(ACCOUNTS),
        len(good),
        len(ACCOUNTS) - len(good),
        0,
    )


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWIND_FAULT", raising=False)
