"""A Kafka-source run whose Spark tasks produce its units to the Kafka sink, killed and resumed.

800 order events on 2 partitions in 8 units of 100, 3 units a wave (3 waves; wave 2 holds units
of both partitions, so two tasks produce at once, and wave 1 three units of one partition, one
after the other in one task). A child ``rewind run`` (Spark retrying a task once) has:

* a task SIGKILLed in wave 1 after a unit's records and marker were flushed, before its
  transaction committed: Spark retries the task, whose transactional id fences the open one;
* the driver SIGKILLed after wave 2's tasks committed their units, before the quarantine commit
  and the ledger: the resume (in this process) finds the units in the log, commits their
  quarantine files and runs wave 3.

Then a ``read_committed`` reader sees every output row exactly once, in source order per
partition, with the values, timestamps and lineage headers the driver's commit writes
(test_sink_kafka's end-to-end job checks the same on a broker where the driver produces); the
quarantine holds each rejected row once; the counts add up. Needs a broker whose read_committed
hides aborted records (noida-db): elsewhere the driver produces, and test_sink_kafka covers it.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rewind.config import load_settings
from tests import job_fixtures as jf
from tests import reproduce_fixtures as rf
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic, produce

BASE_MS = 1_760_000_000_000
N = 800


def _spec(src: str, target: str) -> dict[str, Any]:
    return {
        "name": f"tasks-{target}",
        "source": {"kafka": {"topics": [src]}},
        "decode": {"format": "json", "schema": {"order_id": "long", "status": "string", "amount": "double"}},
        "translate": {
            "function": "tests.job_fixtures:order_amounts",
            "version": "1",
            "output_schema": {"order_id": "long", "status": "string", "amount": "double"},
        },
        "key": ["order_id"],
        "sink": {"kafka": {"topic": target, "transactional": True}},
        "run": {"work_unit_records": 100},
    }


def _source(tmp_path: Path, broker: TestBroker) -> tuple[Any, dict[str, Any], str]:
    """Settings on ``broker`` with a state dir under ``tmp_path``, and a new 2-partition topic."""
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    conf = settings.kafka_config()
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 2)
    return settings, conf, src


def _staged(tmp_path: Path, broker: TestBroker) -> tuple[dict[str, Any], str, Any, Any]:
    """A new 2-partition source topic on ``broker`` and a transactional Kafka sink's staging
    for a new run: (conf, source topic, sink, staging)."""
    from tests.test_sink_kafka import SCHEMA, new_sink

    conf = broker.conf()
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 2)
    sink = new_sink(conf, src, tmp_path, transactional=True)
    return conf, src, sink, sink.prepare(f"r-{uuid.uuid4().hex[:8]}", SCHEMA)


def test_task_produced_units_survive_a_killed_task_and_a_killed_driver(
    tmp_path: Path, broker: TestBroker, spark: Any
) -> None:
    broker.require(READ_COMMITTED)
    from rewind.job.service import resume_job
    from rewind.ledger import Ledger
    from rewind.sinks.kafka.bookkeeping import BOOKKEEPING_TOPIC, read_run_log
    from rewind.sinks.kafka.records import HEADER_NAMES
    from rewind.spec import parse_spec
    from rewind.translate.factory import transform_name
    from rewind.translate.lineage import event_id

    settings, conf, src = _source(tmp_path, broker)
    events = []
    for i in range(N):
        status = "test" if i % 10 == 0 else "paid"
        amount = -1.0 if i % 25 == 1 else i * 0.5
        value = json.dumps({"order_id": i, "status": status, "amount": amount}).encode()
        events.append((i % 2, str(i).encode(), value, BASE_MS + i))
    produce(conf, src, events)
    target = f"{src}-tasks"
    path = jf.write_spec(tmp_path / "spec.yaml", _spec(src, target))

    env = jf.child_env(
        settings,
        REWIND_FAULT="reproduce-before-end,after-wave-tasks:2",
        REWIND_FAULT_ONCE=str(tmp_path / "fired"),
        REWIND_SPARK_MASTER="local[2,2]",  # Spark retries a failed task once
    )
    killed = jf.run_driver(tmp_path, env, "run", str(path), units_per_wave=3)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (tmp_path / "fired.reproduce-before-end").exists()  # the task was killed (and retried)
    with Ledger.open(settings.ledger) as ledger:
        (run,) = ledger.list_runs(5)
        assert ledger.unit_counts(run.id).done == 3  # wave 1 only: the driver died before wave 2's ledger
    outcome = resume_job(settings, run.id, units_per_wave=3)
    assert outcome.state == "succeeded"

    kept = [i for i in range(N) if i % 10 != 0 and i % 25 != 1]
    records = [r for r in rf.read_topic(conf, target) if r.headers.get("rewind.run-id") == run.id]
    assert sorted(int(r.key) for r in records) == kept  # each exactly once
    for p in (0, 1):  # a record keeps its source partition, in source order
        mine = [int(r.key) for r in records if r.partition == p]
        assert mine == [i for i in kept if i % 2 == p]
    everything = rf.read_topic(conf, target, isolation="read_uncommitted")
    assert len(everything) > len(records)  # the killed task's records reached the log, hidden
    markers = read_run_log(conf, BOOKKEEPING_TOPIC, run.id).commits
    with Ledger.open(settings.ledger) as ledger:
        unit_ids = sorted(u.unit_id for u in ledger.units(run.id))
    assert sorted(u for m in markers for u in m["units"]) == unit_ids
    assert all(len(m["units"]) == 1 and "quarantine_files" in m["extra"] for m in markers)  # by tasks
    quarantined = jf.quarantine_rows(settings, "rewind.rewind_quarantine", run.id)
    assert sorted(int(q["key"]) for q in quarantined) == [i for i in range(N) if i % 25 == 1 and i % 10 != 0]
    assert (outcome.counts.records_read, outcome.counts.emitted) == (N, len(kept))
    assert (
        outcome.counts.records_read
        == outcome.counts.emitted + outcome.counts.quarantined + outcome.counts.filtered
    )

    # lineage as the driver writes it: headers in their order, ids from the source coordinates
    transform = transform_name(parse_spec(_spec(src, target)).translate)
    for r in records:
        i = int(r.key)
        assert list(r.headers) == list(HEADER_NAMES)
        assert r.headers["rewind.source"] == f"{src}/{i % 2}/{i // 2}"
        assert r.headers["rewind.event-id"] == event_id(src, i % 2, i // 2, transform, "1", 0)
        assert (r.timestamp, r.value) == (BASE_MS + i, {"order_id": i, "status": "paid", "amount": i * 0.5})


def test_a_task_loader_produces_its_unit_once_and_pays_the_drivers_budget(
    tmp_path: Path, broker: TestBroker
) -> None:
    """Outside Spark: one unit's transaction, its records on their source partitions in offset
    order, each chunk asked of a real budget server; a second attempt finds the marker."""
    broker.require(READ_COMMITTED)
    from rewind.core.parquet import write_parquet
    from rewind.sinks.kafka.task_load import task_loader
    from rewind.spark.pace_server import PaceServer
    from rewind.spark.ratelimit import RateLimit
    from tests.test_sink_kafka import output_rows, unit

    conf, src, sink, staging = _staged(tmp_path, broker)
    run_id = staging.run_id
    assert staging.read_committed == "supported"
    server = PaceServer(RateLimit(2_000.0))  # chunks of 100 rows: a 250-row unit asks 3 times
    try:
        loader = task_loader(sink, staging, frozenset(), 2_000.0, server.address)
        assert loader is not None
        path = write_parquet(sink.data_folder(staging), output_rows(src, 1, 0, 250, run_id), "u1")
        counts = {"records_read": 250, "emitted": 250, "rows_out": 250}
        recorded, loaded = loader.load(unit(src, 1, 0, 250), [path], ["q.parquet"], counts)
        assert loaded and recorded["rows_out"] == 250 and recorded["quarantine_files"] == ["q.parquet"]
        assert (server.clients, server.grants) == (1, 3)
        again, loaded = loader.load(unit(src, 1, 0, 250), [], [], {"records_read": 1})
    finally:
        server.close()
    assert not loaded and again["rows_out"] == 250 and again["quarantine_files"] == ["q.parquet"]
    records = rf.read_topic(conf, staging.topic)
    assert [(r.partition, int(r.key)) for r in records] == [(1, 1_000_000 + o) for o in range(250)]


def test_a_unit_whose_commit_fails_is_written_again_and_lands_once(
    tmp_path: Path, broker: TestBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit's transaction that fails at its commit (here another attempt of the unit fences it
    after its last flush; a broker restarted during the commit answers INVALID_TXN_STATE) is
    written again in the same task, after a look for its marker, and lands once."""
    broker.require(READ_COMMITTED)
    from rewind.kafka.unit_redo import redo_interrupted
    from rewind.sinks.kafka.unit_writer import CommittedUnit, UnitWriter
    from tests.test_sink_kafka import output_rows, unit

    conf, src, sink, staging = _staged(tmp_path, broker)
    writer = UnitWriter(conf=dict(sink.conf), staging=staging.to_dict(), key=("order_id",))
    unit_id, rows = unit(src, 0, 0, 120), output_rows(src, 0, 0, 120, staging.run_id)
    paused = tmp_path / "paused"
    # the first attempt holds still between its last flush and its commit (an idle sleep)
    monkeypatch.setenv("REWIND_FAULT_PAUSE", "reproduce-before-end:8")
    monkeypatch.setenv("REWIND_FAULT_PAUSED", str(paused))
    attempts: list[bool] = []

    def write(first_attempt: bool) -> Any:
        attempts.append(first_attempt)
        session = writer.open(unit_id, first_attempt)
        if session.done is not None:
            return session.done
        session.produce(rows)
        return session.commit({"records_read": 120, "rows_out": 120}, [])

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(redo_interrupted, write, True)
        deadline = time.monotonic() + 60
        while not Path(f"{paused}.reproduce-before-end").exists():
            assert time.monotonic() < deadline and not first.done(), "the unit never reached its commit"
            time.sleep(0.05)
        monkeypatch.delenv("REWIND_FAULT_PAUSE")
        writer.open(unit_id, False).abort()  # another attempt fences the paused transaction
        result = first.result(timeout=120)

    assert attempts == [True, False]  # the commit failed, and the redo looked for the marker
    assert not isinstance(result, CommittedUnit) and result["rows"] == 120
    records = rf.read_topic(conf, staging.topic)
    assert sorted(int(r.key) for r in records) == list(range(120))  # each once
    assert writer.open(unit_id, False).done == CommittedUnit(
        unit_id, {"records_read": 120, "rows_out": 120}, [], 120
    )


def test_a_sql_translate_into_the_kafka_sink_keeps_each_partitions_order(
    tmp_path: Path, broker: TestBroker, spark: Any
) -> None:
    """A row-by-row query runs in the task that read its records; with the Kafka sink that task
    holds a whole source partition's units and produces them in offset order."""
    broker.require(READ_COMMITTED)
    from rewind.job.service import run_job
    from rewind.sinks.kafka.bookkeeping import BOOKKEEPING_TOPIC, read_run_log
    from rewind.spec import parse_spec

    settings, conf, src = _source(tmp_path, broker)
    n = 400
    produce(
        conf,
        src,
        [
            (
                i % 2,
                str(i).encode(),
                json.dumps({"order_id": i, "status": "paid", "amount": i - 100.0}).encode(),
                BASE_MS + i,
            )
            for i in range(n)
        ],
    )
    spec = _spec(src, f"{src}-sql")
    spec["translate"] = {
        "sql": "SELECT _rewind_row, order_id, status, amount FROM events WHERE amount > 0",
        "version": "1",
        "output_schema": spec["translate"]["output_schema"],
    }
    outcome = run_job(settings, parse_spec(spec), units_per_wave=4)
    assert outcome.state == "succeeded"
    records = [
        r for r in rf.read_topic(conf, f"{src}-sql") if r.headers.get("rewind.run-id") == outcome.run_id
    ]
    for p in (0, 1):
        assert [int(r.key) for r in records if r.partition == p] == [i for i in range(101, n) if i % 2 == p]
    assert (outcome.counts.records_read, outcome.counts.emitted, outcome.counts.filtered) == (n, n - 101, 101)
    markers = read_run_log(conf, BOOKKEEPING_TOPIC, outcome.run_id).commits
    assert markers and all(
        len(m["units"]) == 1 and "quarantine_files" in m["extra"] for m in markers
    )  # by tasks
