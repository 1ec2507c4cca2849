"""``rewind verify RUN`` end to end: a real run (broker, Spark, Iceberg, ledger), verified
against a source-of-truth Iceberg table, gating ``promote_run``.

The truth first holds one wrong amount: the verification fails, exits 1 and promotion is
refused. The truth is then corrected: the verification passes, exits 0, and the promotion
goes through without ``--force``, because the latest ``verify`` entry of the run passed.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import Settings, load_settings
from tests.kafka_util import create_topic, produce

ORDERS = 1200
BASE = datetime(2026, 10, 1, tzinfo=UTC)
WRONG = 777
STATUSES = ("open", "paid", "shipped", "cancelled")


def order_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The translate of the job: one row per order event, as decoded."""
    return events[["_rewind_row", "order_id", "status", "amount", "placed_at"]]


def amount(i: int) -> float:
    return round((i % 500) * 1.1 + 0.25, 2)


def placed(i: int) -> datetime:
    return BASE + timedelta(minutes=5 * i)


@dataclass
class Run:
    settings: Settings
    tmp: Path
    run_id: str
    env: dict[str, str]


def truth(correct: bool) -> Any:
    import pyarrow as pa

    rows = [
        {
            "order_id": i,
            "status": STATUSES[i % 4],
            "amount": amount(i) + (1.0 if i == WRONG and not correct else 0.0),
            "placed_at": placed(i),
        }
        for i in range(ORDERS)
    ]
    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("status", pa.string()),
            ("amount", pa.float64()),
            ("placed_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Run:
    from rewind.catalog import load_catalog
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    tmp = tmp_path_factory.mktemp("verify-run")
    env = {"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}
    settings = load_settings(env=env, cwd=tmp)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, 2)
    records = []
    for i in range(ORDERS):
        value = {
            "order_id": i,
            "status": STATUSES[i % 4],
            "amount": amount(i),
            "placed_at": placed(i).isoformat(),
        }
        ts = int(placed(i).timestamp() * 1000)
        records.append((i % 2, str(i).encode(), json.dumps(value).encode(), ts))
    produce(conf, topic, records)

    schema = {"order_id": "long", "status": "string", "amount": "double", "placed_at": "timestamp"}
    spec = parse_spec(
        {
            "name": "verify-e2e",
            "source": {"kafka": {"topics": [topic]}},
            "decode": {"format": "json", "schema": schema},
            "translate": {
                "function": "tests.test_verify_run:order_rows",
                "version": "1",
                "output_schema": schema,
            },
            "key": ["order_id"],
            "sink": {"iceberg": {"table": "shop.orders"}},
            "run": {"work_unit_records": 400},
            "verify": {
                "reference": {"iceberg": "shop.orders_truth"},
                "compare": {
                    "amount": {"abs": 0.001},
                    "status": "exact",
                    "placed_at": {"timestamp_precision": "s"},
                },
                "buckets": {"time_column": "placed_at", "granularity": "hour", "category": "status"},
                "assertions": [
                    {
                        "name": "no negative amounts",
                        "sql": "SELECT count(*) FROM staging WHERE amount < 0",
                        "expect": 0,
                    },
                    {
                        "name": "orders per status",
                        "sql": "SELECT status, count(*) AS n, sum(amount) AS total "
                        "FROM staging GROUP BY status",
                        "compare_to_reference": True,
                        "rel": 0.01,
                    },
                ],
            },
        }
    )
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("shop")
    table = catalog.create_table("shop.orders_truth", schema=truth(False).schema)
    table.append(truth(False))
    outcome = run_job(settings, spec, units_per_wave=4)
    assert outcome.state == "succeeded"
    return Run(settings, tmp, outcome.run_id, env)


def cli(run: Run, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    from typer.testing import CliRunner

    from rewind.cli import app

    monkeypatch.chdir(run.tmp)
    return CliRunner().invoke(app, list(args), env=run.env)


def test_a_failed_verification_exits_1_and_blocks_promotion(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.job.publish import PromotionRefused, promote_run

    with pytest.raises(PromotionRefused, match="has not been verified"):
        promote_run(run.settings, run.run_id)
    result = cli(run, monkeypatch, "verify", run.run_id, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["passed"] is False and report["failed"] == ["values match within tolerance"]
    [row] = report["state"]["changed_sample"]
    assert row["key"] == {"order_id": WRONG} and row["columns"] == ["amount"]
    assert report["rows"]["staging"] == report["rows"]["reference"] == ORDERS
    assert {a["name"]: a["passed"] for a in report["assertions"]} == {
        "no negative amounts": True,
        "orders per status": True,
    }
    error_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(error_lines) == 1 and "verification of" in error_lines[0] and "values match" in error_lines[0]
    assert Path(report["report"]["html"]).exists() and Path(report["report"]["json"]).exists()
    with pytest.raises(PromotionRefused, match="last verification"):
        promote_run(run.settings, run.run_id)


def test_a_passed_verification_lets_promotion_proceed(
    run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.publish import promote_run
    from rewind.job.service import open_ledger

    load_catalog(run.settings).load_table("shop.orders_truth").overwrite(truth(True))
    page = tmp_path / "reports" / "verify.html"
    result = cli(run, monkeypatch, "verify", run.run_id, "--report", str(page))
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.stdout and str(page) in result.stdout.replace("\n", "")
    report = json.loads(page.with_suffix(".json").read_text())
    assert report["passed"] and report["state"]["changed"] == 0
    hours = report["buckets"]["rows"]
    assert len(hours) == ORDERS * 5 // 60 and all(h["equal"] for h in hours)
    assert {c["value"] for c in report["categories"]["rows"]} == set(STATUSES)
    assert "<svg" in page.read_text()

    ledger = open_ledger(run.settings)
    try:
        entries = [e for e in ledger.audit_log(run.run_id) if e.action == "verify"]
    finally:
        ledger.close()
    assert [e.details["passed"] for e in entries] == [False, True]
    assert entries[-1].details["rows"]["staging"] == ORDERS

    promoted = promote_run(run.settings, run.run_id)
    assert promoted["state"] == "promoted" and promoted["forced"] is False and promoted["gates_failed"] == []


def test_verify_of_an_unknown_run_is_one_line(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    result = cli(run, monkeypatch, "verify", "r-nope", "--json")
    assert result.exit_code == 1
    assert "r-nope" in result.stderr and len([x for x in result.stderr.splitlines() if x.strip()]) == 1
    assert "error" in json.loads(result.stdout)
