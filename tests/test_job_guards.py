"""Guards and bad specs: refused before anything runs, and the read rate held over a long run.

A refused plan leaves no run in the ledger and no table in the catalog (each test has its
own state folder, so "nothing" is checkable). The rate test reads about 105,000 records at
3,000 records/s (35 s) with two concurrent Spark tasks sharing the cap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.errors import SpecError
from rewind.job.plan import PlanRefused
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce

RATE = 3000.0
RATE_PARTITIONS = 4
RATE_RECORDS = 105_000


def fresh_settings(tmp: Path, bootstrap: str) -> Settings:
    return load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )


@pytest.fixture
def orders_topic(tmp_path: Path, bootstrap: str, topic_name: str) -> tuple[Settings, str]:
    settings = fresh_settings(tmp_path, bootstrap)
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 2)
    jf.produce_orders(conf, topic_name, jf.order_events(500, 2))
    return settings, topic_name


def assert_nothing_ran(settings: Settings) -> None:
    """No run in the ledger, no table (staging, quarantine) in the catalog."""
    from rewind.catalog import load_catalog
    from rewind.job.service import list_runs

    assert list_runs(settings) == []
    catalog = load_catalog(settings)
    assert [t for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)] == []


def refused(settings: Settings, spec: Any) -> str:
    from rewind.job.service import run_job

    with pytest.raises(PlanRefused) as caught:
        run_job(settings, spec)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_max_records_stops_the_plan_before_anything_runs(orders_topic: tuple[Settings, str]) -> None:
    from rewind.job.service import plan_job

    settings, topic = orders_topic
    spec = parse_spec(jf.order_spec("guarded", topic, "guards.orders", guards={"max_records": 499}))
    plan = plan_job(settings, spec)
    assert not plan.ok
    assert [g.name for g in plan.failed_gates()] == ["max-records"]
    assert (
        "500 offsets" in plan.failed_gates()[0].detail and "max_records=499" in plan.failed_gates()[0].detail
    )
    message = refused(settings, spec)
    assert f"plan {plan.plan_id} refused by gate max-records" in message and "499" in message
    assert_nothing_ran(settings)
    # the bound is inclusive: a window of exactly max_records passes
    exact = parse_spec(jf.order_spec("guarded", topic, "guards.orders", guards={"max_records": 500}))
    assert plan_job(settings, exact).ok


def test_max_bytes_stops_the_plan_before_anything_runs(orders_topic: tuple[Settings, str]) -> None:
    from rewind.job.service import plan_job

    settings, topic = orders_topic
    small = parse_spec(jf.order_spec("guarded", topic, "guards.orders", guards={"max_bytes": "10KB"}))
    plan = plan_job(settings, small)
    assert [g.name for g in plan.failed_gates()] == ["max-bytes"]
    estimated = plan.estimates["estimated_bytes"]
    assert estimated > 10_000 and str(estimated) in plan.failed_gates()[0].detail
    assert "refused by gate max-bytes" in refused(settings, small)
    assert_nothing_ran(settings)
    roomy = parse_spec(jf.order_spec("guarded", topic, "guards.orders", guards={"max_bytes": "1GiB"}))
    assert plan_job(settings, roomy).ok


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("tests.no_such_module:order_lines", "module tests.no_such_module not found"),
        ("tests.job_fixtures:no_such_function", "has no attribute no_such_function"),
    ],
)
def test_a_translate_that_cannot_be_imported_fails_its_gate(
    orders_topic: tuple[Settings, str], function: str, says: str
) -> None:
    from rewind.job.service import plan_job

    settings, topic = orders_topic
    spec = parse_spec(jf.order_spec("broken", topic, "guards.orders", function=function))
    plan = plan_job(settings, spec)
    failed = {g.name: g.detail for g in plan.failed_gates()}
    assert "translate" in failed
    assert says in failed["translate"] and function in failed["translate"]
    message = refused(settings, spec)
    assert "refused by gate translate" in message and says in message
    assert_nothing_ran(settings)


def test_a_fold_that_cannot_be_imported_fails_the_translate_gate(orders_topic: tuple[Settings, str]) -> None:
    from rewind.job.service import plan_job

    settings, topic = orders_topic
    spec = jf.order_spec("broken-fold", topic, "guards.orders")
    spec["translate"]["fold"] = "tests.job_fixtures:no_such_fold"
    plan = plan_job(settings, parse_spec(spec))
    failed = {g.name: g.detail for g in plan.failed_gates()}
    assert "translate.fold tests.job_fixtures:no_such_fold" in failed["translate"]
    assert "has no attribute no_such_fold" in failed["translate"]
    assert_nothing_ran(settings)


def test_a_window_that_ends_before_it_starts_is_a_one_line_spec_error(topic_name: str) -> None:
    data = jf.order_spec("backwards", topic_name, "guards.orders")
    data["source"]["kafka"].update({"from": "2026-10-08T00:00:00Z", "to": "2026-10-01T00:00:00Z"})
    with pytest.raises(SpecError) as caught:
        parse_spec(data, "backwards.yaml")
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("backwards.yaml: source.kafka.to")
    assert "before from" in message


@pytest.mark.slow
def test_the_rate_guard_holds_over_a_long_run(
    tmp_path: Path, bootstrap: str, topic_name: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rewind.spark.waves as waves  # the runner calls waves.run_wave at each wave
    from rewind.job.service import plan_job, run_job

    settings = fresh_settings(tmp_path, bootstrap)
    conf = settings.kafka_config()
    create_topic(conf, topic_name, RATE_PARTITIONS)
    values = [json.dumps({"order_id": i, "amount": i / 4}).encode() for i in range(RATE_RECORDS)]
    records = [(i % RATE_PARTITIONS, None, v, None) for i, v in enumerate(values)]
    produce(conf, topic_name, records, **{"queue.buffering.max.messages": 2 * RATE_RECORDS})
    schema = {"order_id": "long", "amount": "double"}
    spec = parse_spec(
        {
            "name": "paced",
            "source": {"kafka": {"topics": [topic_name]}},
            "decode": {"format": "json", "schema": schema},
            "translate": {
                "function": "tests.job_fixtures:keep_orders",
                "version": "1",
                "output_schema": schema,
            },
            "sink": {"iceberg": {"table": "paced.orders"}},
            "guards": {"max_records_per_second": RATE},
            # 8 units: two Spark tasks of 4 partitions each share the cap
            "run": {"work_unit_records": RATE_RECORDS // RATE_PARTITIONS // 2 + 1},
        }
    )

    # the plan's sample is part of the job: one second of the guard, at its pace
    plan = plan_job(settings, spec)
    sample, seconds = plan.estimates["sample_records"], plan.estimates["sample_seconds"]
    # one second of the guard shared by the first unit of each of the 4 partitions (13,126
    # records each): 750 from each
    assert sample == RATE
    assert sample / seconds <= RATE * 1.10, plan.estimates

    spark_seconds: list[float] = []
    wave_ends: list[float] = []
    real_run_wave = waves.run_wave

    def timed(session: Any, ctx: Any, *rest: Any) -> Any:
        began = time.monotonic()
        try:
            return real_run_wave(session, ctx, *rest)
        finally:
            spark_seconds.append(time.monotonic() - began)
            wave_ends.append(time.time())

    monkeypatch.setattr(waves, "run_wave", timed)
    outcome = run_job(settings, spec)
    assert outcome.state == "succeeded" and outcome.counts.records_read == RATE_RECORDS
    assert len(spark_seconds) == outcome.waves == 1
    wall = sum(spark_seconds)
    rate = RATE_RECORDS / wall
    print(
        f"\nrate guard {RATE:.0f} rec/s: {RATE_RECORDS} records in {wall:.1f} s of Spark = {rate:.0f} rec/s"
    )
    assert wall >= 30
    assert 0.5 * RATE <= rate <= 1.10 * RATE
    # the read itself, from the first task's start (its rows' extraction time) to the wave's
    # end, without Spark's job start-up: the tighter test of the cap
    first_task = min(jf.staging_table(settings, outcome.staging).column("_rewind_extracted_at").to_pylist())
    reading = wave_ends[0] - first_task.timestamp()
    print(f"reading alone: {reading:.1f} s = {RATE_RECORDS / reading:.0f} rec/s")
    assert RATE_RECORDS / reading <= 1.10 * RATE
    assert outcome.counts.records_read / outcome.seconds <= 1.10 * RATE  # the whole run too
