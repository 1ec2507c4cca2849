"""The broker restarts in the middle of a handover: both sides ride it out, and it ends as a
clean handover does.

A reconsume in handover mode on a private noida-db: the live group's service runs its
:class:`~rewind.reconsume.ExistingSide` while new records arrive, the
:class:`~rewind.reconsume.TemporarySide` re-reads (slowly), and the broker is stopped for
:data:`OUTAGE_S` seconds and started again while the temporary side is half way. Both sides
must keep going by themselves; every offset is handled exactly once, by exactly one side
(the temporary side below the handover, the live side from it); the live group's committed
offsets end at the log end, where a clean handover leaves them; ``finish`` deletes the
temporary group.

The broker is stopped with SIGTERM (a rolling restart): noida-db writes what it
acknowledged, as a Kafka broker does on a controlled shutdown. A broker that loses
acknowledged offset commits makes a group read again from its last durable commit, which no
consumer can tell from a clean restart (see docs/reconsume.md, "Crash semantics").
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from rewind.config import Settings
from rewind.kafka import groups as kg
from rewind.ledger import Ledger
from rewind.ledger.reconsumes import ReconsumeStore
from rewind.reconsume import ExistingSide, TemporarySide
from rewind.reconsume.service import finish_reconsume, plan_reconsume, start_reconsume
from tests.kafka_util import produce
from tests.reconsume_fixtures import Recorder, broker_settings_for, sqlite_url, topic_with_group
from tests.test_broker_restart import RestartableBroker, outage_lines, restarts_the_broker

OUTAGE_S = 5.0
PER_PARTITION = 300
OUTAGE_LINES = 6


class Running(threading.Thread):
    """A side's ``run`` in a thread; its error, if any, kept for the test."""

    def __init__(self, side: ExistingSide | TemporarySide, stop: threading.Event | None = None) -> None:
        super().__init__(daemon=True)
        self.side, self.stop = side, stop
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.side:
                self.side.run(self.stop)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@restarts_the_broker
def test_a_handover_survives_a_broker_restart(
    noida: RestartableBroker,
    settings: Settings,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = broker_settings_for(settings, noida.address, sqlite_url(tmp_path))
    conf = s.kafka_config()
    topic, group, rid = topic_with_group(conf, 2, per_partition=PER_PARTITION, live_at=PER_PARTITION)
    plan_reconsume(s, rid, group=group, topics=[topic], from_earliest=True, idle_handover_s=1.0)
    start_reconsume(s, rid)
    existing, temporary = Recorder(), Recorder(delay_s=0.01)  # the re-read takes ~6 s
    stop = threading.Event()
    live = Running(ExistingSide(conf, existing, reconsume=rid, ledger=s.ledger, timeout_s=0.2), stop)
    temp = Running(
        TemporarySide(conf, temporary, reconsume=rid, ledger=s.ledger, batch_size=50, timeout_s=0.2)
    )
    live.start()
    produce(conf, topic, [(p, b"k", b"live", None) for _ in range(10) for p in (0, 1)])
    temp.start()
    try:
        deadline = time.monotonic() + 60
        while len(temporary.seen) < PER_PARTITION // 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        noida.proc.stop()  # SIGTERM: a controlled shutdown, nothing acknowledged is lost
        time.sleep(OUTAGE_S)
        noida.start()
        produce(conf, topic, [(p, b"k", b"live", None) for _ in range(10) for p in (0, 1)])
        temp.join(120)
        assert not temp.is_alive(), "the temporary side never handed every partition over"
        produce(conf, topic, [(p, b"k", b"after", None) for _ in range(10) for p in (0, 1)])
        tps = [(topic, 0), (topic, 1)]
        high = {p: b.high for (_t, p), b in kg.log_bounds(conf, tps).items()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            at = kg.committed_offsets(conf, group, tps)
            if all(at[(topic, p)] == high[p] for p in (0, 1)) or live.error:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        live.join(30)
    assert temp.error is None and live.error is None, (temp.error, live.error)
    assert kg.committed_offsets(conf, group, tps) == {(topic, p): high[p] for p in (0, 1)}
    with Ledger.open(s.ledger) as ledger:
        rows = {r.partition: r for r in ReconsumeStore(ledger.engine).rows(rid)}
    for p in (0, 1):
        h = rows[p].handover_offset
        assert h is not None and temporary.of(p) == list(range(h)), p
        assert sorted(existing.of(p)) == list(range(h, high[p])), p
        assert len(existing.of(p)) == len(set(existing.of(p))), p
    done = finish_reconsume(s, rid)
    assert done["state"] == "finished" and kg.committed_offsets(conf, f"rewind-reconsume-{rid}") == {}
    logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    noisy = outage_lines(capfd.readouterr().err) + logged
    assert len(noisy) <= OUTAGE_LINES, f"{len(noisy)} lines about the outage: {noisy[:10]}"
    assert any("unreachable, retrying" in line for line in noisy), noisy  # the sides saw it


class _FlakyCommits:
    """A consumer whose commits fail as librdkafka's do while the broker is away."""

    def __init__(self, failures: int, code: int) -> None:
        self.failures, self.code, self.calls = failures, code, 0

    def commit(self, **_kwargs: object) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))


def test_a_commit_is_tried_again_while_the_broker_is_away_then_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError

    from rewind.reconsume import ReconsumeError

    monkeypatch.setattr(time, "sleep", lambda _s: None)
    side = ExistingSide({}, print, reconsume="rc-flaky", ledger="sqlite://", commit_timeout_s=60)
    side.consumer = _FlakyCommits(3, KafkaError._WAIT_COORD)  # type: ignore[assignment]
    side._commit()
    assert side.consumer.calls == 4  # type: ignore[attr-defined]

    side.commit_timeout_s = 0  # beyond the budget: one line, saying what happens to the batch
    side.consumer = _FlakyCommits(10, KafkaError._WAIT_COORD)  # type: ignore[assignment]
    with pytest.raises(ReconsumeError) as failed:
        side._commit()
    assert "\n" not in str(failed.value) and "handles that batch again" in str(failed.value)

    side.commit_timeout_s = 60  # a rebalance's error is not the broker being away: not retried
    side.consumer = _FlakyCommits(10, KafkaError.ILLEGAL_GENERATION)  # type: ignore[assignment]
    with pytest.raises(ReconsumeError):
        side._commit()
    assert side.consumer.calls == 1  # type: ignore[attr-defined]
