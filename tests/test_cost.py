"""The cost model: exact arithmetic from known inputs, prices with currencies, and the plan's
estimate on a real broker (tansu) in raw numbers (--json) and human units.

The hand-computed figures below are what an operator would compute with a calculator: if the
model counted a byte or a second differently, they would differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rewind.config import load_settings
from rewind.core.cost import (
    DEFAULT_COMMIT_S_PER_UNIT,
    DEFAULT_RECORDS_PER_CORE_SECOND,
    DEFAULT_SPARK_STARTUP_S,
    CostInputs,
    Price,
    PriceError,
    describe,
    estimate,
    human_bytes,
    human_seconds,
    parse_price,
)
from rewind.errors import ConfigError
from tests import job_fixtures as jf
from tests.kafka_util import create_topic


def test_exact_arithmetic_with_prices_and_a_remote_broker() -> None:
    prices = {
        "core_hour": Price(0.05, "USD"),
        "gb_egress": Price(0.09, "USD"),
        "gb_object_read": Price(0.0004, "USD"),
    }
    est = estimate(
        CostInputs(
            kafka_records=3_000_000,
            archive_records=1_000_000,
            avg_record_bytes=250.0,
            units=16,
            cores=4,
            records_per_core_second=20_000.0,
            commit_s_per_unit=0.5,
            spark_startup_s=10.0,
            broker_remote=True,
            prices=prices,
        )
    )
    assert est["bytes_from_broker"] == 750_000_000  # 3M x 250 B
    assert est["bytes_from_archive"] == 250_000_000
    assert est["egress_bytes"] == 750_000_000
    assert est["core_seconds"] == 200.0  # 4M / 20k
    assert est["compute_seconds"] == 50.0  # on 4 cores
    assert est["commit_seconds"] == 8.0  # 16 x 0.5
    assert est["eta_seconds"] == 68.0  # 10 + 50 + 8
    money = est["money"]
    assert money["currency"] == "USD"
    assert money["compute"] == round(0.05 * 200 / 3600, 4) == 0.0028
    assert money["egress"] == 0.0675  # 0.75 GB x 0.09
    assert money["object_read"] == 0.0001  # 0.25 GB x 0.0004
    assert money["total"] == round(0.05 * 200 / 3600 + 0.0675 + 0.0001, 4)
    lines = describe(est)
    assert lines[0] == (
        "read: 750.0 MB from the broker (remote: egress), 250.0 MB from the archive "
        "(bytes per record: sample)"
    )
    assert lines[2] == "ETA: 1m 08s = Spark start-up 10.0s + processing 50.0s + commits 8.0s"
    assert lines[3].startswith("cost: 0.0704 USD (compute 0.0028, egress 0.0675, object_read 0.0001)")


def test_a_local_broker_costs_no_egress_and_no_prices_no_money() -> None:
    est = estimate(
        CostInputs(kafka_records=94_220, archive_records=0, avg_record_bytes=100.0, units=1, cores=2)
    )
    assert est["egress_bytes"] == 0 and "money" not in est
    assert est["rate_source"] == "default"
    assert est["core_seconds"] == round(94_220 / DEFAULT_RECORDS_PER_CORE_SECOND, 3)
    # one unit is one task: it keeps one of the two cores busy
    assert est["eta_seconds"] == round(
        DEFAULT_SPARK_STARTUP_S + 94_220 / DEFAULT_RECORDS_PER_CORE_SECOND / 1 + DEFAULT_COMMIT_S_PER_UNIT, 3
    )


def test_a_rehearsals_measured_bytes_per_record_replace_the_samples(tmp_path: Path) -> None:
    from rewind.core.units import WorkUnit
    from rewind.job.cost import cost_estimate

    settings = load_settings(env={"REWIND_STATE_DIR": str(tmp_path)}, cwd=tmp_path)
    units = (WorkUnit("t", 0, 0, 1000, "archive"), WorkUnit("t", 0, 1000, 4000))
    sampled = cost_estimate(settings, units, {"avg_record_bytes": 500.0})
    assert (sampled["bytes_from_archive"], sampled["bytes_from_broker"]) == (500_000, 1_500_000)
    assert sampled["bytes_source"] == "sample"
    rates = {"records_per_core_second": 1000.0, "bytes_per_record": {"kafka": 120.0, "archive": 80.5}}
    measured = cost_estimate(settings, units, {"avg_record_bytes": 500.0}, {**rates, "rehearsal_id": "rh-1"})
    assert (measured["bytes_from_archive"], measured["bytes_from_broker"]) == (80_500, 360_000)
    assert measured["bytes_source"] == "rehearsal rh-1"
    assert describe(measured)[0].endswith("(bytes per record: rehearsal rh-1)")
    kafka_only = {"bytes_per_record": {"kafka": 100.0}, "rehearsal_id": "r"}
    only_kafka = cost_estimate(settings, units, {}, kafka_only)
    assert (only_kafka["bytes_from_archive"], only_kafka["bytes_from_broker"]) == (100_000, 300_000)


def test_human_units() -> None:
    assert human_bytes(999) == "999 B"
    assert human_bytes(1_234_567) == "1.2 MB"
    assert human_bytes(3_500_000_000_000) == "3.5 TB"
    assert human_seconds(59.94) == "59.9s"
    assert human_seconds(75.2) == "1m 15s"
    assert human_seconds(4000) == "1h 06m"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("core_hour", 0.05, "has no currency; write it like '0.05 USD' (per core-hour)"),
        ("gb_egress", "0.09", "is not a price"),
        ("gb_egress", "0.09 USD/core-hour", "priced per core-hour; this price is per GB"),
        ("gb_fast", "1 USD", "unknown price"),
    ],
)
def test_a_price_without_units_is_refused_in_one_line(field: str, value: object, says: str) -> None:
    with pytest.raises(PriceError) as caught:
        parse_price(field, value)
    assert says in str(caught.value) and f"cost.{field}" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_prices_in_settings(tmp_path: Path) -> None:
    (tmp_path / "rewind.yaml").write_text("cost: {core_hour: 0.05}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, cwd=tmp_path)
    assert "cost.core_hour" in str(caught.value) and "no currency" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1
    (tmp_path / "rewind.yaml").write_text("cost: {core_hour: 0.05 USD, gb_egress: 0.08 EUR/GB}\n")
    with pytest.raises(ConfigError) as mixed:
        load_settings(env={}, cwd=tmp_path).cost.prices()
    assert "prices in EUR and USD" in str(mixed.value)
    (tmp_path / "rewind.yaml").write_text("cost: {core_hour: 0.05 usd/core-hour}\n")
    assert load_settings(env={}, cwd=tmp_path).cost.prices() == {"core_hour": Price(0.05, "USD")}


@pytest.mark.parametrize(
    ("yaml", "says"),
    [
        ("cost: {core_hour: 0.05}\n", "cost.core_hour: 0.05 has no currency"),
        ("cost: {gb_egress: '0.09'}\n", "cost.gb_egress: '0.09' is not a price"),
    ],
)
def test_rewind_plan_refuses_a_price_without_units_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml: str, says: str
) -> None:
    """Refused before any broker is asked (none listens on the port given)."""
    from rewind.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    (tmp_path / "rewind.yaml").write_text(yaml)
    spec = jf.write_spec(tmp_path / "spec.yaml", jf.order_spec("priced", "t", "c.orders"))
    result = CliRunner().invoke(app, ["plan", str(spec)])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.output


def test_rewind_plan_shows_the_cost_in_raw_numbers_and_human_units(
    tmp_path: Path, bootstrap: str, topic_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real plan on tansu: bytes = the sample's average size x offsets, egress because the
    broker is marked remote, money from the configured prices; `local[3]` gives 3 cores."""
    from rewind.cli import app

    (tmp_path / "rewind.yaml").write_text(
        "kafka: {remote: true}\nspark: {master: 'local[3]'}\n"
        "cost: {core_hour: 0.10 USD, gb_egress: 0.09 USD}\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REWIND_BOOTSTRAP_SERVERS", bootstrap)
    settings = load_settings(cwd=tmp_path)
    create_topic(settings.kafka_config(), topic_name, 2)
    jf.produce_orders(settings.kafka_config(), topic_name, jf.order_events(600, 2))
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(jf.order_spec("costed", topic_name, "cost.orders")))
    runner = CliRunner()
    result = runner.invoke(app, ["plan", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    est = data["estimates"]
    cost = est["cost"]
    assert cost["records"] == 600 == data["offsets"]
    assert cost["bytes_from_broker"] == round(est["avg_record_bytes"] * 600)
    assert cost["egress_bytes"] == cost["bytes_from_broker"] and cost["bytes_from_archive"] == 0
    assert cost["cores"] == 3
    assert cost["core_seconds"] == round(600 / DEFAULT_RECORDS_PER_CORE_SECOND, 3)
    assert cost["money"]["egress"] == round(0.09 * cost["bytes_from_broker"] / 1e9, 4)
    assert cost["money"]["compute"] == round(0.10 * 600 / DEFAULT_RECORDS_PER_CORE_SECOND / 3600, 4)
    human = runner.invoke(app, ["plan", str(spec)])
    assert human.exit_code == 0, human.output
    assert "from the broker (remote: egress)" in human.stdout
    assert f"ETA: {human_seconds(cost['eta_seconds'])} = Spark start-up" in human.stdout
    assert "cost: " in human.stdout and " USD (compute " in human.stdout
