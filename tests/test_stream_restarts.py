"""Rewind's streaming queries restart themselves after a failure, from their checkpoint, with
bounded backoff, and give up in one line after too many restarts in a window
(:mod:`rewind.spark.stream_restarts`).

The failures are real errors raised inside a running micro-batch (``REWIND_FAULT_RAISE``, the
foreachBatch body runs in this process on ``local[*]``); what the restarted query commits is
checked offset by offset against what was produced: every record exactly once.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rewind import faults
from rewind.config import Settings, load_settings
from rewind.history.exceptions import HistoryError
from rewind.spark.stream_restarts import RestartPolicy, Restarts, StreamGaveUp
from tests.kafka_util import create_topic
from tests.test_archive import archived_rows, assert_exactly, produce


@pytest.fixture
def quick(tmp_path: Path, bootstrap: str) -> Settings:
    """Settings whose streams restart after 0.2 s, at most twice a minute."""
    return load_settings(
        path=_write(
            tmp_path / "rewind.yaml",
            "streams: {restart_backoff_s: 0.2, max_restarts: 2, restart_window_s: 60}\n",
        ),
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> Any:
    def arm(value: str) -> None:
        monkeypatch.setattr(faults, "_seen", {})
        monkeypatch.setenv("REWIND_FAULT_RAISE", value)

    return arm


def test_backoff_doubles_to_its_cap_and_the_window_bounds_the_restarts() -> None:
    policy = RestartPolicy(backoff_s=1, max_backoff_s=5, max_restarts=4, window_s=100)
    restarts = Restarts("stream", policy)
    assert [restarts.after_failure(f"boom {i}", now=float(i)) for i in range(4)] == [1, 2, 4, 5]
    with pytest.raises(StreamGaveUp) as gave_up:
        restarts.after_failure(RuntimeError("broker down\nstack..."), now=10.0)
    assert str(gave_up.value) == (
        "stream stopped: it failed again after 4 restarts within 100 s (broker down); fix the cause and "
        "start it again"
    )
    # restarts older than the window no longer count: the stream may restart again, from the start
    assert restarts.after_failure("later", now=200.0) == 1


def test_a_continuous_archive_restarts_after_a_failed_batch_and_archives_everything_once(
    quick: Settings, spark: Any, fault: Any
) -> None:
    from rewind.history.archive import start_continuous

    conf = quick.kafka_config()
    topic = f"arch-restart-{uuid.uuid4().hex[:8]}"
    table = f"lake.restart_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    produce(conf, topic, 2, 0, 20)
    fault("archive-batch:1")  # the first micro-batch after the catch-up pass fails once
    runner = start_continuous(spark, quick, [topic], table, trigger_seconds=0.5)
    try:
        produce(conf, topic, 2, 20, 30)
        assert runner.wait_for({(topic, 0): 25, (topic, 1): 25}, 90), runner.error()
        produce(conf, topic, 2, 50, 10)
        assert runner.wait_for({(topic, 0): 30, (topic, 1): 30}, 90), runner.error()
        assert runner.restarts == 1 and runner.error() is None
    finally:
        runner.stop()
    assert_exactly(archived_rows(quick, table), topic, {0: 30, 1: 30})


def test_a_continuous_archive_that_keeps_failing_gives_up_in_one_line(
    quick: Settings, spark: Any, fault: Any
) -> None:
    from rewind.history.archive import start_continuous

    conf = quick.kafka_config()
    topic = f"arch-giveup-{uuid.uuid4().hex[:8]}"
    table = f"lake.giveup_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 1)
    produce(conf, topic, 1, 0, 10)
    fault("archive-batch:*")
    runner = start_continuous(spark, quick, [topic], table, trigger_seconds=0.3)
    try:
        produce(conf, topic, 1, 10, 10)
        with pytest.raises(HistoryError) as stopped:
            runner.await_termination(120)
    finally:
        runner.stop()
    line = str(stopped.value)
    assert "\n" not in line and runner.restarts == 2
    assert line.startswith(f"continuous archive of {table} stopped: it failed again")
    assert "after 2 restarts within 60 s" in line and "InjectedFault: injected fault at archive-batch" in line
    assert_exactly(archived_rows(quick, table), topic, {0: 10})  # the catch-up pass, nothing twice


def test_a_shadow_tail_restarts_after_a_failed_batch_and_v2_holds_each_order_once(
    noida_broker: Any, spark: Any, tmp_path: Path, fault: Any
) -> None:
    """The tail's query fails on a micro-batch; it starts again from its checkpoint, v2 ends
    equal to a clean recomputation, and ``rewind shadow status`` shows the restart."""
    import json

    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowStore
    from rewind.shadow.start import start_shadow
    from rewind.spec import load_spec
    from tests import shadow_fixtures as sf

    _write(
        tmp_path / "rewind.yaml", "streams: {restart_backoff_s: 0.2, max_restarts: 3, restart_window_s: 60}\n"
    )
    settings, conf, topic, db, spec = sf.prepared(noida_broker, spark, tmp_path, "shadow-restart")
    # the history run, then one sample of the tail: no fault yet
    started = start_shadow(settings, load_spec(spec), stop=lambda _: True, sample_s=0.5)
    assert started["state"] == "tailing", started
    sf.produce_range(conf, topic, 600, 700)
    fault("shadow-tail-batch:1")  # the tail's first batch with records fails once
    result = start_shadow(settings, load_spec(spec), stop=lambda p: p.caught_up, sample_s=0.5)
    assert result["restarts"] == 1 and result["caught_up"] is True, result

    ledger = Ledger.open(settings.ledger)
    try:
        record = ShadowStore(ledger.engine).get("shadow-restart")
        staging = ledger.get_run(record.run_id).staging
    finally:
        ledger.close()
    rows = sf.table_rows(db, staging["table"])
    assert len(rows) == len({r[0] for r in rows}), "no order twice"
    assert {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == sf.expected_rows(conf, topic)

    shown = sf.rewind(
        sf.shadow_env(tmp_path, noida_broker.bootstrap),
        tmp_path,
        "shadow",
        "status",
        "shadow-restart",
        "--json",
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    status = json.loads(shown.stdout)
    assert status["restarts"] == 1
    assert status["last_restart"]["cause"] == "InjectedFault: injected fault at shadow-tail-batch (pass 1)"


def test_a_tail_stopped_while_writing_its_first_offsets_starts_again(
    bootstrap: str, spark: Any, tmp_path: Path
) -> None:
    """A tail stopped or killed between writing its first batch's offsets to a temporary file
    and renaming it leaves that file in ``offsets/``; Spark then refuses the checkpoint as a new
    one that is not empty. The next start removes the file and reads from ``start``."""
    import time

    from rewind.core.units import WorkUnit
    from rewind.spark.shadow_tail import TailBatch, start_tail
    from tests.kafka_util import produce as produce_records

    topic = f"cut-short-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": bootstrap}
    create_topic(conf, topic, 1)
    produce_records(conf, topic, [(0, None, b"{}", None)] * 10)
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    left = checkpoint / "offsets" / f".0.{uuid.uuid4()}.tmp"
    left.touch()

    batches: list[TailBatch] = []
    query = start_tail(
        spark,
        kafka_conf=conf,
        topics=[topic],
        start={topic: {"0": 3}},
        checkpoint=str(checkpoint),
        trigger_s=0.1,
        max_offsets_per_trigger=None,
        on_batch=lambda _df, batch: batches.append(batch),
        name=f"cut-short-{uuid.uuid4().hex[:6]}",
    )
    try:
        deadline = time.monotonic() + 60
        while not batches and query.exception() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    assert batches, "the tail ran no batch in 60 s"
    assert batches[0].batch_id == 0 and batches[0].units == (WorkUnit(topic, 0, 3, 10),)
    assert not left.exists()
