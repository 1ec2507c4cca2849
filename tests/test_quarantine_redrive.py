"""``rewind quarantine list`` and ``redrive``: a run's quarantined records processed again after a
translate fix, into the run's own staging, exactly once (tansu, Spark, Iceberg).

The translate (:func:`picky`) raises on every fifth order until ``REWIND_TEST_FIXED`` is set
(the "fix"), and always rejects order 13; one record does not decode. After the run the
quarantine holds 8 records; the re-drive at version 2 emits the 6 the fix repairs (new event ids,
lineage naming the re-drive) and keeps 13 and the undecodable record quarantined with their
new reasons; a second re-drive writes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

import pandas as pd

from rewind.config import load_settings
from rewind.spec import parse_spec
from rewind.translate.functions import TranslateResult
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

ORDERS = 30
BROKEN = {0, 5, 10, 15, 20, 25}
UNDECODABLE_OFFSET = 30


def picky(events: pd.DataFrame) -> TranslateResult:
    if not os.environ.get("REWIND_TEST_FIXED") and events["order_id"].isin(BROKEN).any():
        raise ValueError("fifth order")
    rows = events[["_rewind_row", "order_id", "amount"]]
    bad = events["order_id"] == 13
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "unlucky"})
    return TranslateResult(rows=rows[~bad], rejects=rejects)


def test_redrive_after_a_fix(tmp_path: Any, bootstrap: str, spark: Any) -> None:
    from confluent_kafka import Producer

    from rewind.job.redrive import list_quarantine, redrive
    from rewind.job.service import open_ledger, run_job

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 1)
    producer = Producer(settings.kafka_config())
    for i in range(ORDERS):
        producer.produce(topic, value=json.dumps({"order_id": i, "amount": i * 1.5}).encode(), partition=0)
    producer.produce(topic, value=b'{"order_id": 99, "amount":', partition=0)  # offset 30
    assert producer.flush(30) == 0
    spec = parse_spec(
        {
            "name": "picky",
            "source": {"kafka": {"topics": [topic]}},
            "decode": {"format": "json", "schema": {"order_id": "long", "amount": "double"}},
            "translate": {
                "function": "tests.test_quarantine_redrive:picky",
                "version": "1",
                "output_schema": {"order_id": "long", "amount": "double"},
            },
            "key": ["order_id"],
            "sink": {"iceberg": {"table": f"shop.picky_{uuid.uuid4().hex[:6]}"}},
        }
    )
    os.environ.pop("REWIND_TEST_FIXED", None)
    outcome = run_job(settings, spec)
    assert outcome.counts.quarantined == 8 and outcome.counts.rows_out == ORDERS - 7

    listed = cli_in_process.rewind(
        ["quarantine", "list", outcome.run_id, "--json"], cwd=tmp_path, env=jf.child_env(settings)
    )
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    assert data["records"] == 8
    assert sorted(e["offset"] for e in data["entries"]) == sorted([*BROKEN, 13, UNDECODABLE_OFFSET])
    assert data["by_reason"]["translate-error: ValueError: fifth order"] == 6
    assert list_quarantine(settings, outcome.run_id, reason="unlucky")["records"] == 1

    # killed between the re-drive's quarantine commit and its sink commit: the next call
    # re-drives the same records under the same id, and nothing lands twice (checked below)
    killed = subprocess.run(
        [jf.REWIND_BIN, "quarantine", "redrive", outcome.run_id, "--translate-version", "2"],
        cwd=tmp_path,
        env=jf.child_env(settings, REWIND_TEST_FIXED="1", REWIND_FAULT="after-redrive-quarantine-commit"),
        capture_output=True, text=True, timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    os.environ["REWIND_TEST_FIXED"] = "1"
    try:
        done = redrive(settings, outcome.run_id, translate_version="2")
        again = redrive(settings, outcome.run_id, translate_version="2")
    finally:
        os.environ.pop("REWIND_TEST_FIXED", None)
    assert (done["records_read"], done["emitted"], done["quarantined"], done["filtered"]) == (8, 6, 2, 0)
    assert done["redrive"].startswith("redrive-2-") and not done["already_done"]
    assert again["records_read"] == 0 and again["note"] == "no quarantined record to re-drive"

    rows = jf.staging_table(settings, outcome.staging).to_pylist()
    assert sorted(r["order_id"] for r in rows) == sorted(i for i in range(ORDERS) if i != 13)
    redriven = [r for r in rows if r["order_id"] in BROKEN]
    assert {r["_rewind_run_id"] for r in redriven} == {f"{outcome.run_id}/{done['redrive']}"}
    assert {r["_rewind_transform_version"] for r in redriven} == {"2"}
    assert sorted(r["_rewind_event_id"] for r in redriven) == sorted(
        jf.event_id(topic, 0, i, "picky", "2", 0) for i in BROKEN
    )
    still = list_quarantine(settings, outcome.run_id)
    assert sorted((e["offset"], e["stage"], e["unit_id"] == done["redrive"]) for e in still["entries"]) == [
        (13, "translate-reject", True),
        (UNDECODABLE_OFFSET, "decode", True),
    ]
    with open_ledger(settings) as ledger:
        entries = [a.details for a in ledger.audit_log(outcome.run_id) if a.action == "redrive"]
    assert [(e["redrive"], e["emitted"], e["quarantined"]) for e in entries] == [(done["redrive"], 6, 2)]
    from rewind.job.redrive import _quarantine_rows

    units = _quarantine_rows(settings, spec.quarantine.table, outcome.run_id).column("unit_id").to_pylist()
    assert units.count(done["redrive"]) == 2, "the killed re-drive's quarantine rows once"


def test_redrive_of_an_unknown_run_is_one_line(tmp_path: Any, bootstrap: str) -> None:
    proc = cli_in_process.rewind(
        ["quarantine", "redrive", "r-nope"],
        cwd=tmp_path,
        env=jf.child_env(load_settings(env={"REWIND_STATE_DIR": str(tmp_path / "s")}, cwd=tmp_path)),
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "r-nope" in errors[0], proc.stderr
