"""The broker dies mid-wave and comes back: the run finishes by itself, its output exact.

A private noida-db on a fixed port with its data on disk: the source is produced, the broker
is stopped with SIGTERM and started again (noida-db can lose what it acknowledged in the last
second when killed, so the source is made durable first), then a real ``rewind run`` child
process starts; while its rate-limited wave reads, the broker is SIGKILLed, stays down
:data:`OUTAGE_S` seconds and is restarted on the same port and data folder. The run must end
``succeeded`` with exactly the output of a clean run, and print at most a few lines about the
outage (librdkafka's own connection errors are routed through logging, rate-limited). The tasks'
line that they retry goes where Spark's output goes: the CLI's ``<state_dir>/spark.log``.

A broker named by ``REWIND_TEST_BOOTSTRAP`` cannot be killed and restarted by the test: these
tests are skipped there, and run on the noida-db they start themselves.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rewind.cli.app import SPARK_LOG_FILE
from rewind.config import Settings, load_settings
from rewind.embedded.broker import port_open, wait_gone
from rewind.job.service import open_ledger
from rewind.spark.ratelimit import default_state_dir
from tests import job_fixtures as jf
from tests.brokers import NOIDA, NoidaProcess, broker_names
from tests.conftest import EXTERNAL_BOOTSTRAP, restart_port
from tests.kafka_util import create_topic
from tests.reproduce_fixtures import read_topic
from tests.test_cli_errors import REWIND

RECORDS = 1600
UNITS = 4  # one wave
RATE = 100.0  # records/s: the wave reads for ~16 s; the broker dies within ~0.1 s of its start
OUTAGE_S = 8.0
OUTAGE_LINES = 6
"""At most this many lines of the child's stderr may be about the outage (librdkafka printed
~145 a second of it before its logs were routed and rate-limited)."""


restarts_the_broker = pytest.mark.skipif(
    bool(EXTERNAL_BOOTSTRAP) or NOIDA not in broker_names(),
    reason="the test kills and restarts the broker itself: it cannot restart an external broker "
    "(REWIND_TEST_BOOTSTRAP), so it runs only on the noida-db it starts",
)


SHUTDOWN_S = 60.0
"""How long a stopped broker may take to go and free its port. Under SIGTERM noida-db first
writes what it acknowledged: on a 2-core machine loaded by the other test workers a restart
found its port still taken once stop's 10 s (SIGTERM, then SIGKILL) were over."""


class RestartableBroker:
    """noida-db on one port and data folder across SIGTERM/SIGKILL and restarts."""

    def __init__(self, run_dir: Path) -> None:
        self.proc = NoidaProcess("127.0.0.1", restart_port(), run_dir)

    @property
    def address(self) -> str:
        return self.proc.address

    def start(self) -> None:
        """Start on the broker's port once the one stopped before has let go of it."""
        deadline = time.monotonic() + SHUTDOWN_S
        while port_open(self.proc.host, self.proc.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proc.start(timeout_s=60)

    def restart_clean(self) -> None:
        """SIGTERM (noida-db writes everything it acknowledged), then start again."""
        self.proc.stop(timeout_s=SHUTDOWN_S)
        self.start()

    def kill(self) -> None:
        pid = self.proc.pid()
        assert pid is not None, "the broker is not running"
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, SHUTDOWN_S)
        self.proc.pid_file.unlink(missing_ok=True)

    def stop(self) -> None:
        self.proc.stop()


def _settings(tmp_path: Path, broker: RestartableBroker) -> Settings:
    return load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.address, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )


def _run(settings: Settings, name: str) -> Any:
    with open_ledger(settings) as ledger:
        runs = [r for r in ledger.list_runs() if r.name == name]
    return runs[0] if runs else None


def _reading(run_id: str) -> bool:
    """The wave's tasks are reading: the run's read-pacing state has reads reserved past now."""
    try:
        raw = (default_state_dir() / f"read-{run_id}.pace").read_bytes()
    except FileNotFoundError:
        return False
    return len(raw) == 16 and struct.unpack("<dd", raw)[0] > time.monotonic()


def _wait_mid_wave(child: subprocess.Popen[str], settings: Settings, name: str) -> str:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and child.poll() is None:
        run = _run(settings, name)
        if run is not None and _reading(run.id):
            with open_ledger(settings) as ledger:
                states = Counter(u.state for u in ledger.units(run.id))
            assert "done" not in states, states
            return str(run.id)
        time.sleep(0.1)
    child.kill()
    raise AssertionError(f"the wave was never seen reading: {child.communicate()[1][-3000:]}")


def outage_lines(stderr: str) -> list[str]:
    """Lines of a child's stderr about the broker being away."""
    words = ("Connection refused", "unreachable", "FAIL|rdkafka", "Disconnected", "brokers are down")
    return [line for line in stderr.splitlines() if any(w in line for w in words)]


def tasks_retried(settings: Settings, stderr: str) -> bool:
    """The tasks said they retry an unreachable broker: on the child's stderr or, where the CLI
    sends Spark's output (its tasks' included), in ``<state_dir>/spark.log``."""
    spark_log = settings.state_path / SPARK_LOG_FILE
    told = stderr + (spark_log.read_text(errors="replace") if spark_log.exists() else "")
    return any("unreachable, retrying" in line for line in outage_lines(told))


def _run_through_outage(
    tmp_path: Path, noida: RestartableBroker, spec: dict[str, Any]
) -> tuple[Settings, Any, str]:
    """``rewind run`` of ``spec`` in a child; the broker killed mid-wave and restarted.

    The run ends ``succeeded`` by itself, unless the broker came back without a unit the run
    had committed (noida-db loses what it acknowledged in its last second): then the run fails
    in one line naming the lost units, and ``rewind resume`` writes them again."""
    settings = _settings(tmp_path, noida)
    path = jf.write_spec(tmp_path / "spec.yaml", spec)
    env = jf.child_env(settings)
    child = subprocess.Popen(
        [REWIND, "run", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = _wait_mid_wave(child, settings, spec["name"])
        noida.kill()
        time.sleep(OUTAGE_S)
        noida.start()
        _out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    (tmp_path / "child.stderr").write_text(err)
    noisy = outage_lines(err)
    assert len(noisy) <= OUTAGE_LINES, f"{len(noisy)} lines about the outage: {noisy[:10]}"
    assert tasks_retried(settings, err), err[-3000:]
    run = _run(settings, spec["name"])
    if run.state == "failed" and "finished unit(s) are gone from" in (run.error or ""):
        last = err.strip().splitlines()[-1]
        assert child.returncode == 1 and last.endswith(f"`rewind resume {run_id}` writes them again"), last
        resumed = subprocess.run(
            [REWIND, "resume", run_id], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        run = _run(settings, spec["name"])
    else:
        assert child.returncode == 0, err[-3000:]
    assert (run.id, run.state) == (run_id, "succeeded"), (run.state, run.error, err[-3000:])
    return settings, run, err


Source = tuple[str, list[jf.Order], dict[int, tuple[int, int]]]


def _source(tmp_path: Path, noida: RestartableBroker) -> Source:
    """The source topic, produced and made durable (SIGTERM and restart)."""
    settings = _settings(tmp_path, noida)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    orders = jf.order_events(RECORDS, 2)
    coords = jf.produce_orders(settings.kafka_config(), topic, orders)
    noida.restart_clean()
    return topic, orders, coords


def _spec(name: str, topic: str, table: str, **sections: Any) -> dict[str, Any]:
    return jf.order_spec(
        name,
        topic,
        table,
        unit_records=RECORDS // UNITS,
        guards={"max_records_per_second": RATE},
        run={"work_unit_records": RECORDS // UNITS},
        **sections,
    )


@restarts_the_broker
def test_iceberg_run_survives_a_broker_restart_mid_wave(noida: RestartableBroker, tmp_path: Path) -> None:
    topic, orders, coords = _source(tmp_path, noida)
    spec = _spec("restart-iceberg", topic, "restart.staging")
    settings, run, _err = _run_through_outage(tmp_path, noida, spec)

    rows = jf.staging_table(settings, run.staging).to_pylist()
    expected = jf.expected_rows(topic, orders, coords, "order_lines", "1")
    assert len(rows) == len(expected)
    columns = [k for k in expected[0] if k in rows[0]]
    got = sorted(({k: r[k] for k in columns} for r in rows), key=lambda r: r["_rewind_event_id"])
    assert got == [{k: r[k] for k in got[0]} for r in expected]


@restarts_the_broker
def test_transactional_kafka_run_survives_a_broker_restart_mid_wave(
    noida: RestartableBroker, tmp_path: Path
) -> None:
    topic, orders, coords = _source(tmp_path, noida)
    target = f"{topic}.backfill"
    spec = _spec("restart-kafka", topic, "unused", sink={"kafka": {"topic": target, "transactional": True}})
    del spec["sink"]["iceberg"]
    settings, _run_row, _err = _run_through_outage(tmp_path, noida, spec)

    produced = read_topic(settings.kafka_config(), target)
    expected = jf.expected_rows(topic, orders, coords, "order_lines", "1")
    ids = [p.headers["rewind.event-id"] for p in produced]
    assert len(ids) == len(set(ids)), "a record was written twice"
    assert sorted(ids) == [r["_rewind_event_id"] for r in expected]


@restarts_the_broker
def test_reproduce_survives_a_broker_restart_mid_wave(noida: RestartableBroker, tmp_path: Path) -> None:
    from tests import reproduce_fixtures as rf

    settings = _settings(tmp_path, noida)
    rows = rf.accounts(RECORDS)
    url = rf.sqlite_accounts(tmp_path / "accounts.db", rows)
    topic = f"accounts-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 3)
    noida.restart_clean()  # the topic survives the kill
    source = {"sqlite": {"url": url, "table": "accounts"}, "key": "id", "where": "TRUE", "key_ranges": UNITS}
    spec = rf.spec("restart-reproduce", source, topic, guards={"max_records_per_second": RATE})
    _same, run, _err = _run_through_outage(tmp_path, noida, spec)

    conf = settings.kafka_config()
    produced = [p for p in rf.read_topic(conf, topic) if p.headers.get("rewind.run-id") == run.id]
    good = [a for a in rows if not a.rejected]
    if len(produced) != len(good):  # say whether the records are missing or held back
        uncommitted = [
            p
            for p in rf.read_topic(conf, topic, "read_uncommitted")
            if p.headers.get("rewind.run-id") == run.id
        ]
        pytest.fail(
            f"read_committed saw {len(produced)} of the run's {len(good)} records, read_uncommitted "
            f"{len(uncommitted)}; (low, stable, high) offsets per partition: {rf.stable_offsets(conf, topic)}"
        )
    assert sorted(int(p.key) for p in produced) == [a.id for a in good]  # each once
    assert {int(p.key): p.value for p in produced} == {a.id: a.message() for a in good}


@restarts_the_broker
def test_a_transaction_that_lost_its_broker_sends_nothing_more_and_holds_no_partition_back(
    noida: RestartableBroker, tmp_path: Path
) -> None:
    """What a unit's writer relies on (rewind.sinks.kafka.unit_writer): a flush that waits for a
    broker killed while the transaction is open stops once the client has lost it, and the
    abort purges what waits. Sent to the restarted broker, which came back without the
    transaction, those records would belong to no transaction it knows: no marker would ever
    end them, and read_committed readers would see nothing past them. The unit written again
    by a producer of the same transactional id is then all such a reader sees."""
    from rewind.kafka.producer import TransactionalProducer
    from tests import reproduce_fixtures as rf

    conf = _settings(tmp_path, noida).kafka_config()
    topic = f"lost-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)

    def unit_producer() -> TransactionalProducer:
        return TransactionalProducer(conf, transactional_id=f"t-{topic}", topic=topic, call_timeout_s=5)

    txn = unit_producer()
    client = txn.open()
    try:
        txn.begin()
        client.produce(topic, b'"before"')
        txn.flush()
        assert not txn.broker_lost
        time.sleep(1.5)  # past the last second, which noida-db may lose when killed
        noida.kill()
        client.produce(topic, b'"queued"')
        txn.flush(timeout_s=60, until_broker_lost=True)
        assert txn.broker_lost and not txn.failures, "the flush waits for the broker, not for its loss"
        txn.abort()  # the abort itself fails after 5 s: the broker is down
        assert [err.name() for err, _topic, _p in txn.failures] == ["_PURGE_QUEUE"], txn.failures
        noida.start()
        client.poll(3.0)  # connected again: a record left queued would go out now
    finally:
        if not port_open(noida.proc.host, noida.proc.port):  # the test failed while it was down:
            noida.start()  # librdkafka's destroy of this producer would wait for the broker
        txn.close()
    again = unit_producer()
    client = again.open()  # fences the transaction the broker lost
    try:
        again.begin()
        client.produce(topic, b'"again"')
        again.flush()
        assert not again.broker_lost
        again.commit()
    finally:
        again.close()
    assert [p.value for p in rf.read_topic(conf, topic)] == ["again"]
    [(_low, stable, high)] = rf.stable_offsets(conf, topic).values()
    assert stable == high, f"an open transaction holds the partition back at {stable} (end {high})"


class _Err:
    def __init__(self, name: str, fatal: bool = False) -> None:
        self._name, self._fatal = name, fatal

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return f"{self._name} happened"

    def fatal(self) -> bool:
        return self._fatal


def test_outage_reports_are_rate_limited_and_the_clients_own_callback_still_runs() -> None:
    import logging

    from rewind.kafka.clients import OUTAGE_LOG, OutageReporter

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    keep = Keep()
    OUTAGE_LOG.addHandler(keep)
    try:
        seen: list[str] = []
        reporter = OutageReporter(every_s=60.0)
        callback = reporter.callback("b:9092", lambda err: seen.append(err.name()))
        for _ in range(500):
            callback(_Err("_TRANSPORT"))
        callback(_Err("_FENCED", fatal=True))
        assert keep.lines == ["Kafka broker b:9092 unreachable, retrying: _TRANSPORT happened"]
        assert seen == ["_TRANSPORT"] * 500 + ["_FENCED"]
        reporter.last -= 61  # the next one, a minute later, says how many were held back
        callback(_Err("_ALL_BROKERS_DOWN"))
        assert len(keep.lines) == 2 and keep.lines[1].endswith("(499 similar in the last 60s)")
    finally:
        OUTAGE_LOG.removeHandler(keep)
