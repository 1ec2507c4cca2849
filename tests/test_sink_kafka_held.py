"""A backfill topic that lost committed records fails the run at its conclusion and is not promoted.

The loss is real and deterministic: DeleteRecords moves the log start past records a commit
wrote (what retention does too), on the brokers that support it; a broker that comes back
without acknowledged records (noida-db after SIGKILL) is the tail case, checked on the
bookkeeping the same way (:func:`rewind.sinks.kafka.held._problem`).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings
from rewind.job.publish import promote_run
from rewind.job.service import open_ledger, run_job
from rewind.sinks.kafka.bookkeeping import KafkaStaging, RunLog
from rewind.sinks.kafka.held import StagingLost, _problem, check_held
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.brokers import DELETE_RECORDS, TestBroker
from tests.kafka_util import create_topic

RECORDS = 600


def _delete_front(conf: dict[str, Any], topic: str, upto: int, partition: int = 0) -> None:
    """DeleteRecords: ``partition`` of ``topic`` starts at ``upto`` from now on (-1: its end)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(conf))
    for fut in admin.delete_records([TopicPartition(topic, partition, upto)]).values():
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

    def lose_then_check(sink: KafkaTopicSink, staging: KafkaStaging, run_id: str, done: Any) -> None:
        _delete_front(broker_settings.kafka_config(), target, 5)  # between the last commit and conclude
        check(sink, staging, run_id, done)

    monkeypatch.setattr(KafkaTopicSink, "check_held", lose_then_check)
    with pytest.raises(StagingLost) as raised:
        run_job(broker_settings, spec)
    text = _one_line(raised.value, target)
    assert "partition 0 starts at offset 5, past 0" in text
    with open_ledger(broker_settings) as ledger:
        [run] = [r for r in ledger.list_runs() if r.name == spec.name]
    assert (run.state, run.error) == ("failed", f"StagingLost: {text}")


def test_units_whose_commit_markers_are_gone_fail_the_run_and_are_reopened(tmp_path: Path) -> None:
    """A broker that came back without a unit's transaction lost its marker with it: the check
    names the units in one line, and the job reopens them in the ledger for `rewind resume`
    (counts cleared, audited). DeleteRecords cannot empty the compacted bookkeeping topic (a
    policy violation), so the check is given the run log it would read after such a loss."""
    from rewind.core.counts import RecordCounts
    from rewind.core.ranges import OffsetRange
    from rewind.job.held import check_staging_held
    from rewind.ledger import Ledger
    from rewind.ledger.models import UnitResult

    ids = ["t/0/0-100", "t/0/100-200"]
    kept = {"kind": "commit", "units": [ids[0]], "rows": 90, "partitions": {"0": 90}}
    staging = _staging({0: 0})

    class LosingSink:
        def check_held(self, staging: KafkaStaging, run_id: str, done: set[str]) -> None:
            check_held({}, staging, RunLog(commits=[kept]), done)  # raises before any I/O

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    jf.record_finished_run(type("S", (), {"ledger": url})(), {"name": "held-units"}, "t", "r-1", staging)
    counts = RecordCounts(records_read=100, emitted=90, rows_out=90, filtered=10)
    with Ledger.open(url) as ledger:
        ledger.add_units("r-1", [OffsetRange("t", 0, 0, 100), OffsetRange("t", 0, 100, 200)])
        ledger.complete_units("r-1", [UnitResult.of(u, counts) for u in ids])
        with pytest.raises(StagingLost) as raised:
            check_staging_held(ledger, LosingSink(), staging, "r-1")  # type: ignore[arg-type]
        text = str(raised.value)
        assert "\n" not in text and raised.value.units == [ids[1]]
        assert text.startswith(
            "run r-1: the commits of 1 finished unit(s) are gone from rewind.commits (first: t/0/100-200)"
        )
        assert text.endswith("`rewind resume r-1` writes them again")
        states = {u.unit_id: (u.state, u.records_read) for u in ledger.units("r-1")}
        assert states == {ids[0]: ("done", 100), ids[1]: ("failed", 0)}
        assert ledger.unit_counts("r-1").counts.records_read == 100
        assert [a.action for a in ledger.audit_log("r-1")].count("units-lost") == 1
        assert [u.unit_id for u in ledger.pending_units("r-1")] == [ids[1]]  # what a resume does again


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
