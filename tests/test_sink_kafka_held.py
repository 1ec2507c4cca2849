"""A backfill topic that lost committed records fails the run at its conclusion and is not promoted.

The loss is real and deterministic: DeleteRecords moves the log start past records a commit
wrote (what retention does too), on the brokers that support it; a broker that comes back
without acknowledged records (noida-db after SIGKILL) is the tail case, checked on the
bookkeeping the same way (:func:`rewind.sinks.kafka.held._problem`).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rewind.config import Settings
from rewind.job.publish import promote_run
from rewind.job.service import open_ledger, run_job
from rewind.sinks.kafka.bookkeeping import KafkaStaging, RunLog
from rewind.sinks.kafka.held import StagingLost, _problem
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.brokers import DELETE_RECORDS, TestBroker
from tests.kafka_util import create_topic

RECORDS = 600


def _delete_front(conf: dict[str, Any], topic: str, upto: int) -> None:
    """DeleteRecords: partition 0 of ``topic`` starts at ``upto`` from now on."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(conf))
    for fut in admin.delete_records([TopicPartition(topic, 0, upto)]).values():
        fut.result(timeout=15)


def _job(settings: Settings, name: str, transactional: bool) -> tuple[Any, str]:
    conf = settings.kafka_config()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    jf.produce_orders(conf, topic, jf.order_events(RECORDS, 2))
    target = f"{topic}.backfill"
    spec = jf.order_spec(name, topic, "unused", unit_records=RECORDS // 2)
    spec["sink"] = {"kafka": {"topic": target, "transactional": transactional}}
    return parse_spec(spec), target


def _one_line(exc: BaseException, topic: str) -> str:
    text = str(exc)
    assert "\n" not in text and text.startswith(f"topic {topic} no longer holds every record"), text
    return text


def test_a_run_whose_topic_lost_records_before_conclude_fails_in_one_line(
    broker: TestBroker, broker_settings: Settings, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.require(DELETE_RECORDS)
    spec, target = _job(broker_settings, f"held-{uuid.uuid4().hex[:6]}", transactional=False)
    check = KafkaTopicSink.check_held

    def lose_then_check(sink: KafkaTopicSink, staging: KafkaStaging, run_id: str) -> None:
        _delete_front(broker_settings.kafka_config(), target, 5)  # between the last commit and conclude
        check(sink, staging, run_id)

    monkeypatch.setattr(KafkaTopicSink, "check_held", lose_then_check)
    with pytest.raises(StagingLost) as raised:
        run_job(broker_settings, spec)
    text = _one_line(raised.value, target)
    assert "partition 0 starts at offset 5, past 0" in text
    with open_ledger(broker_settings) as ledger:
        [run] = [r for r in ledger.list_runs() if r.name == spec.name]
    assert (run.state, run.error) == ("failed", f"StagingLost: {text}")


def test_promote_refuses_a_topic_that_lost_committed_records(
    broker: TestBroker, broker_settings: Settings, spark: Any
) -> None:
    broker.require(DELETE_RECORDS)
    spec, target = _job(broker_settings, f"held-{uuid.uuid4().hex[:6]}", transactional=True)
    outcome = run_job(broker_settings, spec)
    assert outcome.state == "succeeded"
    _delete_front(broker_settings.kafka_config(), target, 3)
    with pytest.raises(StagingLost) as raised:
        promote_run(broker_settings, outcome.run_id, force=True, reason="test: not verified")
    _one_line(raised.value, target)
    with open_ledger(broker_settings) as ledger:
        assert ledger.get_run(outcome.run_id).state == "succeeded"  # nothing promoted


def _staging(start: dict[int, int]) -> KafkaStaging:
    return KafkaStaging("t", "t.backfill", "r-1", len(start), start, {"t": len(start)}, False, "", True)


def test_a_commit_that_began_below_the_end_of_the_one_before_means_the_broker_lost_records() -> None:
    first = {"rows": 100, "from_offsets": {"0": 0}, "to_offsets": {"0": 100}}
    again = {"rows": 100, "from_offsets": {"0": 60}, "to_offsets": {"0": 160}}  # 40 offsets handed out twice
    problem = _problem(_staging({0: 0}), RunLog(commits=[first, again]), {0: (0, 160)})
    assert problem is not None and "a commit began at offset 60, below the end 100" in problem
    later = {"rows": 100, "from_offsets": {"0": 101}, "to_offsets": {"0": 201}}
    assert _problem(_staging({0: 0}), RunLog(commits=[first, later]), {0: (0, 202)}) is None
    # the tail of the last commit is gone
    problem = _problem(_staging({0: 0}), RunLog(commits=[first, later]), {0: (0, 150)})
    assert problem is not None and "ends at offset 150, before 201" in problem
    # units committed from tasks: their rows per partition must fit
    unit = {"rows": 50, "from_offsets": {}, "partitions": {"1": 50}}
    problem = _problem(_staging({0: 0, 1: 10}), RunLog(commits=[unit]), {0: (0, 0), 1: (0, 40)})
    assert problem is not None and "partition 1 spans 30 offsets for 50 committed rows" in problem
