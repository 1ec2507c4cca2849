"""A topic's live produce rate, measured from its log ends' growth while a producer writes at a
known rate; retention from the topic's config; the plan's "x real-time" beside its ETA, and
readiness' cost area yellow below the multiple and red when retention takes the window's oldest
records before the run can finish. Real brokers (each of ``broker``), no Spark.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from rewind.config import Settings
from rewind.core.cost import describe
from rewind.kafka.live_rate import LiveRateProbe, LogEndMeter, first_timestamps, retention_of
from tests import job_fixtures as jf
from tests.kafka_util import KEEP_FOREVER, create_topic, produce, writing

RATE = 200  # records per second the writer produces, over 2 partitions


def test_the_live_rate_is_the_rate_a_producer_writes_at(broker_conf: dict[str, Any], topic_name: str) -> None:
    tps = [(topic_name, 0), (topic_name, 1)]
    create_topic(broker_conf, topic_name, 2)
    with writing(broker_conf, topic_name, RATE):
        probe = LiveRateProbe(broker_conf, tps, interval_s=1.5)
        probe.start()
        rate = probe.finish()
        meter = LogEndMeter(broker_conf, tps, every_s=0.5)
        deadline, seen = time.monotonic() + 1.6, None
        while time.monotonic() < deadline:
            seen = meter.rate() or seen
            time.sleep(0.1)
    assert 1.45 <= rate.seconds <= 2.0, rate
    assert RATE * 0.8 <= rate.records_per_second <= RATE * 1.2, rate
    for tp in tps:
        assert RATE / 2 * 0.75 <= rate.per_partition[tp] <= RATE / 2 * 1.25, rate
    assert seen is not None and RATE * 0.7 <= seen <= RATE * 1.3, seen
    # the producer stopped: nothing is written live any more
    idle = LiveRateProbe(broker_conf, tps, interval_s=0.5)
    idle.start()
    assert idle.finish().records_per_second == 0.0


TX_RATE = 50  # transactions of one record each per second: the offsets grow twice as fast


def test_a_transactional_producers_rate_counts_its_records_not_its_markers(
    broker_conf: dict[str, Any], topic_name: str
) -> None:
    tps = [(topic_name, 0), (topic_name, 1)]
    create_topic(broker_conf, topic_name, 2)
    with writing(broker_conf, topic_name, TX_RATE, transactional=True) as sent:
        probe = LiveRateProbe(broker_conf, tps, interval_s=2.0)
        probe.start()
        rate = probe.finish()
        written = sent[0]
    assert probe.first is not None and probe.last is not None
    grew = sum(probe.last.highs[tp] - probe.first.highs[tp] for tp in tps)
    assert grew > 0, "the writer wrote nothing during the probe"
    # each commit left a marker beside its record: half the offsets hold records
    assert 0.4 <= rate.record_share <= 0.6, rate
    assert rate.records_per_second == pytest.approx(grew * rate.record_share / rate.seconds), rate
    assert TX_RATE * 0.6 <= rate.records_per_second <= TX_RATE * 1.3, (rate, written)
    # a producer without transactions: every offset is a record
    with writing(broker_conf, topic_name, TX_RATE):
        plain = LiveRateProbe(broker_conf, tps, interval_s=1.0)
        plain.start()
        assert plain.finish().record_share == 1.0


def test_retention_comes_from_the_topic_config_and_the_oldest_record_from_the_log(
    broker_conf: dict[str, Any], topic_name: str
) -> None:
    create_topic(broker_conf, topic_name, 1, {"retention.ms": "3600000", "retention.bytes": "50000000"})
    forever = f"{topic_name}-forever"
    create_topic(broker_conf, forever, 1, KEEP_FOREVER)
    kept = retention_of(broker_conf, [topic_name, forever])
    assert kept[topic_name].ms == 3_600_000 and kept[topic_name].bytes == 50_000_000
    assert kept[forever].ms == -1
    now = int(time.time() * 1000)
    produce(broker_conf, topic_name, [(0, b"k", b"v", now - 60_000 + i) for i in range(5)])
    found = first_timestamps(broker_conf, {(topic_name, 0): (2, 4)})
    record = found[(topic_name, 0)]
    assert record is not None and (record.offset, record.ts) == (2, now - 60_000 + 2)


def _plan(settings: Settings, spec: dict[str, Any]) -> Any:
    from rewind.job.planner import build_plan
    from rewind.ops.readiness import scorecard
    from rewind.spec import parse_spec

    parsed = parse_spec(spec)
    plan = build_plan(settings, parsed)
    cost = {s.area: s for s in scorecard(settings, parsed, plan)}["cost-boundary"]
    return plan, cost


def test_the_plan_shows_x_real_time_and_readiness_is_yellow_below_the_multiple(
    broker_settings: Settings, topic_name: str
) -> None:
    conf = broker_settings.kafka_config()
    create_topic(conf, topic_name, 2)
    jf.produce_orders(conf, topic_name, jf.order_events(400, 2))
    guard = 200  # records per second the run is held to: 4x the live 50 rec/s
    spec = jf.order_spec("live-x", topic_name, "live.x", guards={"max_records_per_second": guard})
    with writing(conf, topic_name, 50):
        plan, cost = _plan(broker_settings, spec)
    live = plan.estimates["cost"]["live"]
    assert 50 * 0.7 <= live["records_per_second"] <= 50 * 1.3, live
    assert live["expected_records_per_second"] == guard
    assert guard / 50 * 0.75 <= live["multiple"] <= guard / 50 * 1.3, live
    assert live["retention"] == {topic_name: {"ms": -1, "bytes": live["retention"][topic_name]["bytes"]}}
    assert "oldest_leaves_at_ms" not in live  # infinite retention: the window's records stay
    eta = next(line for line in describe(plan.estimates["cost"]) if line.startswith("ETA"))
    assert re.search(r"; [\d.]+x real-time \(live \d+ rec/s\) over \d+\.\ds$", eta), eta
    assert cost.status == "yellow" and "real-time (live" in cost.detail and "below 10.0x" in cost.detail, cost

    # nothing written live: no multiple, and it is not what makes the area yellow
    quiet, cost = _plan(broker_settings, spec)
    assert quiet.estimates["cost"]["live"]["records_per_second"] == 0.0
    assert quiet.estimates["cost"]["live"]["multiple"] is None
    assert "no live writes" in cost.detail


def test_readiness_is_red_when_retention_takes_the_oldest_records_before_the_run_can_finish(
    broker_settings: Settings, topic_name: str
) -> None:
    conf = broker_settings.kafka_config()
    hour = 3_600_000
    create_topic(conf, topic_name, 1, {"retention.ms": str(hour)})
    now = int(time.time() * 1000)
    # the oldest record leaves the log about 60 s from now; the guard holds the run to 100 s or more
    body = b'{"order_id": 1, "status": "paid", "amount": 1.0}'
    produce(conf, topic_name, [(0, b"k", body, now - hour + 60_000 + i) for i in range(1000)])
    spec = jf.order_spec("live-late", topic_name, "live.late", guards={"max_records_per_second": 10})
    plan, cost = _plan(broker_settings, spec)
    live = plan.estimates["cost"]["live"]
    assert live["oldest"] == {
        "partition": f"{topic_name}/0",
        "offset": 0,
        "timestamp_ms": now - hour + 60_000,
    }
    assert 50 <= (live["oldest_leaves_at_ms"] - now) / 1000 <= 60, live
    assert cost.status == "red", cost
    assert cost.detail.startswith("the run cannot finish before the window's oldest records leave the log")
    # the same window under a guard it can finish within: not red
    fast = jf.order_spec("live-in-time", topic_name, "live.late", guards={"max_records_per_second": 1000})
    assert _plan(broker_settings, fast)[1].status != "red"


def test_no_interval_measures_nothing(broker_settings: Settings, topic_name: str) -> None:
    conf = broker_settings.kafka_config()
    create_topic(conf, topic_name, 1)
    jf.produce_orders(conf, topic_name, jf.order_events(10, 1))
    settings = broker_settings.model_copy(
        update={"live": broker_settings.live.model_copy(update={"interval_s": 0.0})}
    )
    plan, _cost = _plan(settings, jf.order_spec("live-off", topic_name, "live.off"))
    assert "live" not in plan.estimates["cost"]
