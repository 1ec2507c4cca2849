"""``rewind verify RUN --spec SPEC`` and ``--verify-file FILE``: a new verify section for an
existing staging, without running the backfill again.

A real run (broker, Spark, Iceberg, ledger) stages 600 orders; the source of truth holds every
seventh amount 0.004 higher (a rounding the old system did). The plan's verify section compares
amounts within 0.001: the verification fails and promotion is refused. The same spec with 0.01
passes; the ledger records which section each verdict used, the promotion follows the latest
verdict, and records it. A spec that changes anything but ``verify:`` is refused.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from rewind.config import Settings, load_settings
from tests.kafka_util import create_topic, produce

ORDERS = 600
OFF_BY = 0.004  # every 7th amount of the truth: outside abs 0.001, inside abs 0.01
SCHEMA = {"order_id": "long", "status": "string", "amount": "double"}


def order_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The translate of the job: one row per order event."""
    return events[["_rewind_row", "order_id", "status", "amount"]]


def amount(i: int) -> float:
    return round((i % 300) * 1.1 + 0.25, 2)


def verify_section(tolerance: float) -> dict[str, Any]:
    return {
        "reference": {"iceberg": "shop.orders_truth"},
        "compare": {"amount": {"abs": tolerance}, "status": "exact"},
    }


@dataclass
class Run:
    settings: Settings
    tmp: Path
    env: dict[str, str]
    spec: dict[str, Any]
    run_id: str

    def spec_file(self, name: str, **changes: Any) -> Path:
        data = json.loads(json.dumps(self.spec))
        data.update(changes)
        path = self.tmp / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def verifications(self) -> list[Any]:
        from rewind.job.service import open_ledger

        ledger = open_ledger(self.settings)
        try:
            return [e for e in ledger.audit_log(self.run_id) if e.action == "verify"]
        finally:
            ledger.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Run:
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    tmp = tmp_path_factory.mktemp("verify-override")
    env = {"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}
    settings = load_settings(env=env, cwd=tmp)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, 2)
    status = ("open", "paid", "shipped")
    values = [{"order_id": i, "status": status[i % 3], "amount": amount(i)} for i in range(ORDERS)]
    records = [(i % 2, str(i).encode(), json.dumps(v).encode(), None) for i, v in enumerate(values)]
    produce(conf, topic, records)
    spec = {
        "name": "verify-override",
        "source": {"kafka": {"topics": [topic]}},
        "decode": {"format": "json", "schema": SCHEMA},
        "translate": {
            "function": "tests.test_verify_override:order_rows",
            "version": "1",
            "output_schema": SCHEMA,
        },
        "key": ["order_id"],
        "sink": {"iceberg": {"table": "shop.orders"}},
        "run": {"work_unit_records": 300},
        "verify": verify_section(0.001),
    }
    truth = [{**v, "amount": v["amount"] + (OFF_BY if i % 7 == 0 else 0.0)} for i, v in enumerate(values)]
    schema = pa.schema([("order_id", pa.int64()), ("status", pa.string()), ("amount", pa.float64())])
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    table = catalog.create_table("shop.orders_truth", schema=schema)
    table.append(pa.Table.from_pylist(truth, schema=schema))
    outcome = run_job(settings, parse_spec(spec), units_per_wave=4)
    assert outcome.state == "succeeded"
    return Run(settings, tmp, env, spec, outcome.run_id)


def cli(run: Run, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from typer.testing import CliRunner

    from rewind.cli import app

    monkeypatch.chdir(run.tmp)
    return CliRunner().invoke(app, list(args), env=run.env)


def error_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    return str(lines[0])


def test_a_looser_tolerance_given_later_lets_the_run_be_promoted(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.job.publish import PromotionRefused, promote_run
    from rewind.spec import Verify
    from rewind.verify.service import verify_digest

    off = len(range(0, ORDERS, 7))
    tight = cli(run, monkeypatch, "verify", run.run_id, "--json")
    assert tight.exit_code == 1, tight.output
    report = json.loads(tight.stdout)
    assert report["passed"] is False and report["state"]["changed"] == off
    tight_digest = verify_digest(Verify(**verify_section(0.001)))
    assert report["verify_section"] == {"source": "plan", "digest": tight_digest}
    with pytest.raises(PromotionRefused, match="last verification"):
        promote_run(run.settings, run.run_id)

    loose_spec = run.spec_file("loose.yaml", verify=verify_section(0.01))
    loose = cli(run, monkeypatch, "verify", run.run_id, "--spec", str(loose_spec), "--json")
    assert loose.exit_code == 0, loose.output
    report = json.loads(loose.stdout)
    assert report["passed"] is True and report["state"]["changed"] == 0
    assert report["state"]["within_tolerance"] == off
    loose_digest = verify_digest(Verify(**verify_section(0.01)))
    assert report["verify_section"] == {"source": "spec", "digest": loose_digest}
    entries = run.verifications()
    assert [(e.details["passed"], e.details["verify_section"]["source"]) for e in entries] == [
        (False, "plan"),
        (True, "spec"),
    ]
    assert entries[0].details["verify_section"]["digest"] == tight_digest != loose_digest

    # the latest verdict is the gate: the plan's section again fails, and blocks promotion again
    again = cli(run, monkeypatch, "verify", run.run_id, "--json")
    assert again.exit_code == 1
    with pytest.raises(PromotionRefused, match="last verification"):
        promote_run(run.settings, run.run_id)
    section = run.tmp / "loose-verify.yaml"
    section.write_text(yaml.safe_dump({"verify": verify_section(0.01)}))
    human = cli(run, monkeypatch, "verify", run.run_id, "--verify-file", str(section))
    assert human.exit_code == 0, human.output
    assert f"verify section: --verify-file's (digest {loose_digest})" in human.stdout

    promoted = promote_run(run.settings, run.run_id)
    assert promoted["state"] == "promoted" and promoted["forced"] is False
    assert promoted["verification"]["passed"] is True
    assert promoted["verification"]["verify_section"] == {"source": "file", "digest": loose_digest}
    assert [e.details["passed"] for e in run.verifications()] == [False, True, False, True]


def test_a_spec_that_changes_more_than_verify_is_refused(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    before = len(run.verifications())
    other = run.spec_file(
        "other.yaml", verify=verify_section(0.01), run={"work_unit_records": 300, "lease_ttl_s": 30}
    )
    line = error_line(cli(run, monkeypatch, "verify", run.run_id, "--spec", str(other), "--json"))
    assert "run.lease_ttl_s" in line and "only verify may differ" in line and "30" in line
    renamed = run.spec_file("renamed.yaml", key=["status"], verify=verify_section(0.01))
    assert "key.0" in error_line(cli(run, monkeypatch, "verify", run.run_id, "--spec", str(renamed)))
    both = cli(run, monkeypatch, "verify", run.run_id, "--spec", str(other), "--verify-file", str(other))
    assert "not both" in error_line(both)
    assert len(run.verifications()) == before  # nothing was verified, nothing recorded


def test_a_verify_file_is_checked_like_a_spec(
    run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"verify": {"compare": {"amount": {"abs": "tiny"}}}}))
    line = error_line(cli(run, monkeypatch, "verify", run.run_id, "--verify-file", str(bad)))
    assert line.startswith(f"error: {bad}: verify.compare.amount.abs: ") and "'tiny'" in line
    whole = tmp_path / "whole.yaml"
    whole.write_text(yaml.safe_dump({**run.spec, "verify": verify_section(0.01)}))
    line = error_line(cli(run, monkeypatch, "verify", run.run_id, "--verify-file", str(whole)))
    assert "decode, key, name, run, sink, source, translate: a verify file holds only" in line
    assert "--spec" in line
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump({"reference": {"target": True}, "mode": "merge"}))
    line = error_line(cli(run, monkeypatch, "verify", run.run_id, "--verify-file", str(bare)))
    assert "verify.mode: not allowed (got 'merge'); allowed: match, repair" in line
