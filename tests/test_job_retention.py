"""Offsets that leave Kafka between ``rewind plan`` and ``rewind run`` are reported as lost.

On a broker that really moves the log start (noida-db: DeleteRecords, and retention.ms
expiring records), a stored plan is run after part of its window left Kafka: the run fails
before its first wave writes anything, naming exactly the lost ranges and the new log start,
the ledger records them, and a fresh plan refuses the window as it is now. Tansu can move
neither, so these tests are skipped there with the capability named.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from rewind.config import Settings, load_settings
from rewind.job.plan import PlanRefused
from rewind.job.retention import OffsetsLostError
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.brokers import DELETE_RECORDS, RETENTION, TestBroker
from tests.kafka_util import create_topic

ORDERS = 300  # 150 per partition, units of 50


def planned(broker: TestBroker, tmp_path: Path, topic: str) -> tuple[Settings, str, dict[int, int]]:
    """A topic of orders on ``broker`` and a stored plan of a job over all of it."""
    from rewind.job.service import plan_job

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    conf = settings.kafka_config()
    create_topic(conf, topic, 2)
    coords = jf.produce_orders(conf, topic, jf.order_events(ORDERS, 2)).values()
    ends = {p: 1 + max(o for q, o in coords if q == p) for p in (0, 1)}
    spec = parse_spec(jf.order_spec("aging", topic, f"an.aging_{topic[-8:]}", unit_records=50))
    plan = plan_job(settings, spec)
    assert plan.ok and plan.offsets == sum(ends.values())
    return settings, plan.plan_id, ends


def log_start(conf: dict[str, Any], topic: str, partition: int) -> int:
    consumer = Consumer({**conf, "group.id": "t-watermarks"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0])
    finally:
        consumer.close()


def run_fails_with_lost(settings: Settings, plan_id: str) -> tuple[str, OffsetsLostError]:
    from rewind.job.service import list_runs, run_job

    with pytest.raises(OffsetsLostError) as caught:
        run_job(settings, plan_id)
    [run] = list_runs(settings)
    return str(run["run_id"]), caught.value


def assert_reported_and_nothing_written(
    settings: Settings, run_id: str, message: str
) -> list[dict[str, Any]]:
    """The run failed with ``message``, committed nothing, and its audit names the lost ranges."""
    from rewind.job.service import open_ledger, show_run

    shown = show_run(settings, run_id)
    assert shown["state"] == "failed" and shown["error"] == f"OffsetsLostError: {message}"
    ledger = open_ledger(settings)
    try:
        assert [u.unit_id for u in ledger.pending_units(run_id)]  # no unit was committed
        assert ledger.unit_counts(run_id).counts.records_read == 0
        [entry] = [e for e in ledger.audit_log(run_id) if e.action == "offsets-lost"]
    finally:
        ledger.close()
    return entry.details["ranges"]  # type: ignore[no-any-return]


def test_deleted_records_between_plan_and_run_are_reported_lost(
    broker: TestBroker, tmp_path: Path, topic_name: str
) -> None:
    broker.require(DELETE_RECORDS)
    settings, plan_id, ends = planned(broker, tmp_path, topic_name)
    conf = settings.kafka_config()
    admin = AdminClient(conf)  # kept: a collected client never resolves its futures
    for fut in admin.delete_records([TopicPartition(topic_name, 0, 70)]).values():
        assert fut.result(timeout=15).low_watermark == 70

    run_id, error = run_fails_with_lost(settings, plan_id)
    message = str(error)
    assert f"{topic_name}/0 [0, 70) (the log now starts at 70)" in message
    assert f"{topic_name}/1" not in message and "70 offsets of the plan left Kafka" in message
    ranges = assert_reported_and_nothing_written(settings, run_id, message)
    assert ranges == [
        {"topic": topic_name, "partition": 0, "start": 0, "end": 70, "log_start": 70}
    ]
    assert ends[0] > 70

    # the window as it is now: a new plan refuses it, naming the same offsets
    from rewind.job.service import run_job

    spec = parse_spec(jf.order_spec("aging", topic_name, f"an.aging_{topic_name[-8:]}", unit_records=50))
    with pytest.raises(PlanRefused, match=r"\[0, 70\)"):
        run_job(settings, spec)


def test_retention_expiring_the_window_between_plan_and_run_is_reported_lost(
    broker: TestBroker, tmp_path: Path, topic_name: str
) -> None:
    broker.require(RETENTION)
    settings, plan_id, ends = planned(broker, tmp_path, topic_name)
    conf = settings.kafka_config()
    admin = AdminClient(conf)
    shorter = ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource("topic", topic_name, incremental_configs=[shorter])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=15)
    deadline = time.monotonic() + 60
    while any(log_start(conf, topic_name, p) < ends[p] for p in ends):
        assert time.monotonic() < deadline, "retention did not expire the records in 60 s"
        time.sleep(0.2)

    run_id, error = run_fails_with_lost(settings, plan_id)
    message = str(error)
    for p, end in ends.items():
        assert f"{topic_name}/{p} [0, {end}) (the log now starts at {end})" in message
    ranges = assert_reported_and_nothing_written(settings, run_id, message)
    assert {(r["partition"], r["start"], r["end"]) for r in ranges} == {(p, 0, e) for p, e in ends.items()}
