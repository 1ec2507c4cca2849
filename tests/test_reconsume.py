"""Reconsume on real brokers: plan, start, both sides, status and finish (noida-db, and the
broker of REWIND_TEST_BOOTSTRAP when set; see tests/reconsume_fixtures.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from rewind.config import Settings
from rewind.groups.exceptions import ResetInputError, TimeBeforeLogStart, TopicNotConsumed
from rewind.kafka import clients
from rewind.kafka import groups as kg
from rewind.kafka.exceptions import GroupNotFound
from rewind.ledger import Ledger, NotFound
from rewind.ledger.reconsumes import ReconsumeStateError, ReconsumeStore
from rewind.reconsume import (
    ExistingSide,
    ReconsumeInputError,
    ReconsumeNotStarted,
    TemporaryGroupTaken,
    TemporarySide,
    TemporarySideRunning,
)
from rewind.reconsume.service import finish_reconsume, plan_reconsume, start_reconsume, status
from tests.brokers import DELETE_RECORDS, TestBroker
from tests.kafka_util import create_topic, produce
from tests.reconsume_fixtures import (
    GROUP_BROKERS,
    Recorder,
    broker_settings_for,
    group_broker,
    new_names,
    sqlite_url,
    topic_with_group,
)


@pytest.fixture(scope="module", params=GROUP_BROKERS)
def gbroker(request: pytest.FixtureRequest) -> TestBroker:
    return group_broker(request)  # type: ignore[no-any-return]


@pytest.fixture
def rsettings(settings: Settings, gbroker: TestBroker, tmp_path: Path) -> Settings:
    return broker_settings_for(settings, gbroker.bootstrap, sqlite_url(tmp_path))


BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: record i of each partition is BASE + i s


def conf_of(s: Settings) -> dict[str, Any]:
    return s.kafka_config()


def test_parallel_the_temporary_side_stops_where_the_existing_side_is(rsettings: Settings) -> None:
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=50, live_at=50)
    plan = plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True, mode="parallel",
                          idle_handover_s=1.0)
    assert plan.start_offsets == {(topic, 0): 0, (topic, 1): 0} and plan.reread == 100
    start_reconsume(rsettings, rid)

    # the service's new code runs: it handles 20 new records per partition and records where it is
    produce(conf, topic, [(p, b"k", b"new", None) for _ in range(20) for p in (0, 1)])
    existing = Recorder()
    with ExistingSide(conf, existing, reconsume=rid, ledger=rsettings.ledger, timeout_s=0.5) as side:
        deadline = time.monotonic() + 60
        while len(existing.seen) < 40 and time.monotonic() < deadline:
            side.poll_once()
    assert sorted(existing.of(0)) == list(range(50, 70)) and sorted(existing.of(1)) == list(range(50, 70))

    temporary = Recorder()
    with TemporarySide(conf, temporary, reconsume=rid, ledger=rsettings.ledger, timeout_s=0.5) as side:
        side.run(max_batches=200)
        assert side.done and side.handed_over == {(topic, 0): 70, (topic, 1): 70}
    # it re-read up to and including the existing side's recorded offset 69, and no further
    assert temporary.of(0) == list(range(70)) and temporary.of(1) == list(range(70))
    done = finish_reconsume(rsettings, rid)
    assert done["state"] == "finished" and done["temporary_records"] == 140
    assert kg.committed_offsets(conf, f"rewind-reconsume-{rid}", [(topic, 0)])[(topic, 0)] is None


def test_a_side_refuses_a_reconsume_that_is_not_started(rsettings: Settings) -> None:
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=1, per_partition=5, live_at=5)
    plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True)
    side = ExistingSide(conf, Recorder(), reconsume=rid, ledger=rsettings.ledger)
    with pytest.raises(ReconsumeNotStarted, match=f"rewind reconsume start {rid}"):
        side.poll_once()
    assert side.consumer is None  # nothing was built


class Worker(threading.Thread):
    """One side, stopped cleanly (closed after a batch) and restarted at random."""

    def __init__(self, make: Any, rng: random.Random, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.make, self.rng, self.stop = make, rng, stop
        self.restarts = 0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set() and not self.done.is_set():
                side = self.make(self.rng.randint(3, 60))
                try:
                    for _ in range(self.rng.randint(1, 12)):
                        if self.stop.is_set():
                            break
                        side.poll_once()
                        if side.done:
                            self.done.set()
                            break
                finally:
                    side.close()
                self.restarts += 1
                time.sleep(self.rng.random() * 0.2)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


@pytest.mark.parametrize("ledger_kind", ["sqlite", "postgresql"])
def test_handover_every_message_once_by_one_side_through_random_restarts(
    rsettings: Settings, request: pytest.FixtureRequest, ledger_kind: str
) -> None:
    """Both sides stop and restart at random while records arrive; partition 2 never gets a
    new record (it is handed over by the idle rule). Every offset from the start offsets to
    the end is handled exactly once, by exactly one side: the temporary side below the
    handover, the existing side from it."""
    if ledger_kind == "postgresql":
        rsettings = rsettings.model_copy(update={"ledger_url": request.getfixturevalue("pg_url")})
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=3, per_partition=400, live_at=400)
    starts = {0: 50, 1: 0, 2: 320}
    offsets = json.dumps({topic: {str(p): o for p, o in starts.items()}})
    plan_reconsume(rsettings, rid, group=group, topics=[topic], from_offsets=offsets, mode="handover",
                   idle_handover_s=1.0)
    start_reconsume(rsettings, rid)
    rng = random.Random(f"{ledger_kind}-1313")
    existing, temporary = Recorder(), Recorder(delay_s=0.002)  # a re-read slower than the live side
    stop_existing, stop_temp = threading.Event(), threading.Event()
    url = rsettings.ledger

    def make_existing(batch: int) -> ExistingSide:
        return ExistingSide(conf, existing, reconsume=rid, ledger=url, batch_size=batch, timeout_s=0.2)

    def make_temporary(batch: int) -> TemporarySide:
        return TemporarySide(conf, temporary, reconsume=rid, ledger=url, batch_size=batch, timeout_s=0.2)

    ex = Worker(make_existing, random.Random(rng.random()), stop_existing)
    tm = Worker(make_temporary, random.Random(rng.random()), stop_temp)
    ex.start()
    tm.start()
    try:
        producer = Producer({**conf, "linger.ms": 1})
        for _ in range(60):  # records keep arriving on partitions 0 and 1 while both sides run
            for _ in range(rng.randint(1, 12)):
                producer.produce(topic, b"live", b"k", partition=0)
                producer.produce(topic, b"live", b"k", partition=1)
            producer.flush(10)
            time.sleep(rng.random() * 0.1)
        assert producer.flush(30) == 0
        assert tm.done.wait(120), "the temporary side never handed every partition over"
        high = {p: b.high for (_t, p), b in kg.log_bounds(conf, [(topic, p) for p in starts]).items()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            at = kg.committed_offsets(conf, group, [(topic, p) for p in starts])
            if all(at[(topic, p)] == high[p] for p in starts):
                break
            time.sleep(0.2)
    finally:
        stop_existing.set()
        stop_temp.set()
        ex.join(30)
        tm.join(30)
    assert ex.error is None and tm.error is None, (ex.error, tm.error)
    assert ex.restarts >= 3 and tm.restarts >= 3

    rows = {r.partition: r for r in ReconsumeStore(Ledger.open(url).engine).rows(rid)}
    for p, s in starts.items():
        t_seen, e_seen = temporary.of(p), [o for o in existing.of(p) if o >= s]
        assert len(t_seen) == len(set(t_seen)), f"partition {p}: the temporary side handled an offset twice"
        assert len(e_seen) == len(set(e_seen)), f"partition {p}: the existing side handled an offset twice"
        assert not set(t_seen) & set(e_seen), f"partition {p}: both sides handled {set(t_seen) & set(e_seen)}"
        assert set(t_seen) | set(e_seen) == set(range(s, high[p])), f"partition {p}: offsets missing"
        h = rows[p].handover_offset
        assert h is not None and sorted(t_seen) == list(range(s, h))
    # 0 and 1 were handed over because the temporary side caught up with the existing side's
    # record, 2 by the idle rule (no record ever came for the existing side to skip)
    assert rows[0].existing_last_offset is not None and rows[1].existing_last_offset is not None
    assert rows[2].existing_last_offset is None and rows[2].handover_offset == 400
    assert len(existing.of(2)) == 0 and len(temporary.of(2)) == 80
    assert finish_reconsume(rsettings, rid)["state"] == "finished"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_bad_input_gets_one_line_and_changes_nothing(rsettings: Settings) -> None:
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=40, live_at=40, base_ms=BASE_MS)
    other, _g, _r = new_names()
    create_topic(conf, other, 1)
    two = json.dumps({topic: {"0": 3, "1": 4}})
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"group": "no-such-group-r"}, GroupNotFound, "consumer group 'no-such-group-r' does not exist"),
        ({"topics": [other]}, TopicNotConsumed, f"does not consume topic '{other}'"),
        ({"topics": ["no-such-topic-r"]}, ResetInputError, "'no-such-topic-r' does not exist"),
        ({"from_earliest": False}, ReconsumeInputError, "exactly one of --from-datetime"),
        ({"from_offsets": two}, ReconsumeInputError, "--from-offsets and --from-earliest given"),
        ({"from_earliest": False, "from_offsets": '{"x": 1'}, ReconsumeInputError, "is not JSON"),
        ({"from_earliest": False, "from_offsets": json.dumps({topic: {"0": 3}})}, ReconsumeInputError,
         f"no offset for {topic}/1"),
        ({"from_earliest": False, "from_offsets": json.dumps({topic: {"0": -3}})}, ReconsumeInputError,
         "must be a whole number >= 0"),
        ({"from_earliest": False, "from_datetime": "2025-01-01T00:00:00"}, ResetInputError, "no time zone"),
        ({"from_earliest": False, "from_datetime": "soon"}, ResetInputError, "--from-datetime 'soon' is not"),
        ({"mode": "both"}, ReconsumeInputError, "--mode 'both': expected parallel or handover"),
        ({"reconsume_id": "bad id/1"}, ReconsumeInputError, "reconsume id 'bad id/1'"),
        ({"idle_handover_s": 0}, ReconsumeInputError, "--idle-handover 0"),
        ({"topics": []}, ReconsumeInputError, "--topic T"),
    ]
    for change, error, needle in cases:
        kwargs: dict[str, Any] = {"group": group, "topics": [topic], "from_earliest": True, **change}
        with pytest.raises(error) as caught:
            plan_reconsume(rsettings, kwargs.pop("reconsume_id", rid), **kwargs)
        assert needle in one_line(caught.value), (change, str(caught.value))

    # a temporary group name that is taken
    kg.alter_offsets(conf, f"rewind-reconsume-{rid}", {(topic, 0): 1})
    with pytest.raises(TemporaryGroupTaken, match=f"rewind-reconsume-{rid}' of reconsume {rid} already has"):
        plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True)
    kg.delete_group(conf, f"rewind-reconsume-{rid}")

    # nothing changed: no reconsume recorded, the live group where it was, no temporary group
    with Ledger.open(rsettings.ledger) as led, pytest.raises(NotFound):
        ReconsumeStore(led.engine).get(rid)
    assert kg.committed_offsets(conf, group, [topic]) == {(topic, 0): 40, (topic, 1): 40}
    assert kg.committed_offsets(conf, f"rewind-reconsume-{rid}") == {}
    for command in (start_reconsume, status, finish_reconsume):
        with pytest.raises(NotFound, match=f"no reconsume '{rid}' in the ledger"):
            command(rsettings, rid)


def test_a_time_before_the_log_start_says_how_many_records_are_gone(
    gbroker: TestBroker, rsettings: Settings
) -> None:
    gbroker.require(DELETE_RECORDS)
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=1, per_partition=50, live_at=45, base_ms=BASE_MS)
    admin = clients.admin(conf)
    for fut in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        assert fut.result(timeout=15).low_watermark == 20
    before = "2025-01-01T00:00:00Z"  # before every record
    with pytest.raises(TimeBeforeLogStart) as gone:
        plan_reconsume(rsettings, rid, group=group, topics=[topic], from_datetime=before)
    line = one_line(gone.value)
    assert line.startswith(f"--from-datetime {before} is before the log start of {topic}/0 (offset 20)")
    assert "up to 20 records" in line and "--allow-gaps" in line
    with pytest.raises(TimeBeforeLogStart, match=r"up to 15 records"):
        plan_reconsume(rsettings, rid, group=group, from_offsets=json.dumps({topic: {"0": 5}}))
    with Ledger.open(rsettings.ledger) as led, pytest.raises(NotFound):
        ReconsumeStore(led.engine).get(rid)

    plan = plan_reconsume(rsettings, rid, group=group, topics=[topic], from_datetime=before, allow_gaps=True)
    assert plan.start_offsets == {(topic, 0): 20} and plan.partitions[0].missing == 20
    assert plan.reread == 30 and any("20 records are no longer in Kafka" in n for n in plan.notes)
    # a time inside the log: the checked lookup's offset (record i is stamped BASE + i s)
    at = plan_reconsume(rsettings, rid, group=group, topics=[topic], from_datetime=BASE_MS + 33_000)
    assert at.start_offsets == {(topic, 0): 33} and at.reread == 17


def test_finish_refuses_until_every_partition_is_handed_over(rsettings: Settings) -> None:
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=10, live_at=10)
    plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True, idle_handover_s=0.5)
    with pytest.raises(ReconsumeStateError, match="is planned, not started"):
        finish_reconsume(rsettings, rid)
    started = start_reconsume(rsettings, rid)
    assert started["state"] == "started" and started["records"] == 20
    assert start_reconsume(rsettings, rid)["state"] == "started"  # a re-run changes nothing
    with pytest.raises(ReconsumeStateError, match="already started"):
        plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True)
    temp = f"rewind-reconsume-{rid}"
    assert kg.committed_offsets(conf, temp, [topic]) == {(topic, 0): 0, (topic, 1): 0}

    seen = Recorder()
    side = TemporarySide(conf, seen, reconsume=rid, ledger=rsettings.ledger, timeout_s=0.3)
    side.poll_once()
    with pytest.raises(TemporarySideRunning, match="one temporary side per reconsume"):  # fenced
        TemporarySide(conf, Recorder(), reconsume=rid, ledger=rsettings.ledger).poll_once()
    running = status(rsettings, rid)
    assert running["temporary_side"] is not None and running["state"] == "started"
    with pytest.raises(ReconsumeStateError) as pending:
        finish_reconsume(rsettings, rid)
    assert "not handed over yet" in one_line(pending.value) and f"{topic}/" in str(pending.value)
    side.run(max_batches=100)
    assert side.done and side.handed_over == {(topic, 0): 10, (topic, 1): 10}
    side.close()
    s = status(rsettings, rid)
    assert [(p["owner"], p["temp_position"], p["handover"], p["left"]) for p in s["partitions"]] == [
        ("existing", 10, 10, 0), ("existing", 10, 10, 0)]
    assert s["handed_over"] == 2 and s["temporary_side"] is None and s["done"] == 20
    done = finish_reconsume(rsettings, rid)
    assert done["state"] == "finished" and done["temporary_records"] == 20
    assert kg.committed_offsets(conf, temp) == {}
    assert finish_reconsume(rsettings, rid)["finished_at"] == done["finished_at"]  # idempotent


def test_cli_plan_start_status_finish(rsettings: Settings, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rewind.cli import app

    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=30, live_at=25)
    env = {
        "REWIND_BOOTSTRAP_SERVERS": rsettings.bootstrap_servers,
        "REWIND_LEDGER_URL": rsettings.ledger,
        "REWIND_STATE_DIR": str(tmp_path),
        "COLUMNS": "200",
    }
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(app, ["reconsume", *args], env=env)
        assert result.exit_code == 0, result.output
        return result.stdout

    shown = ok("plan", rid, "--group", group, "--topic", topic, "--from-offsets",
               json.dumps({topic: {"0": 5, "1": 10}}), "--idle-handover", "0.5", "--rate", "10")
    header = next(line for line in shown.splitlines() if "TOPIC" in line)
    assert header.replace("┃", " ").split()[:4] == ["TOPIC", "PARTITION", "LIVE-OFFSET", "START"]
    assert "re-reads 45 records" in shown and "ETA 4s at 10 records/s" in shown and "nothing changed" in shown
    planned = json.loads(ok("plan", rid, "--group", group, "--topic", topic, "--from-earliest",
                            "--idle-handover", "0.5", "--json"))
    assert planned["reread"] == 60 and planned["temp_group"] == f"rewind-reconsume-{rid}"
    assert [(p["start"], p["live"], p["high"]) for p in planned["partitions"]] == [(0, 25, 30), (0, 25, 30)]

    started = json.loads(ok("start", rid, "--json"))
    assert started["state"] == "started" and started["records"] == 60
    before = json.loads(ok("status", rid, "--json"))
    assert [(p["owner"], p["left"]) for p in before["partitions"]] == [("temporary", 30), ("temporary", 30)]
    refused = runner.invoke(app, ["reconsume", "finish", rid], env=env)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.exit_code == 1 and len(lines) == 1 and "2 partition(s) not handed over yet" in lines[0]

    with TemporarySide(conf, Recorder(), reconsume=rid, ledger=rsettings.ledger, timeout_s=0.2) as side:
        side.run(max_batches=100)
        assert side.done
    table = ok("status", rid)
    assert "2 of 2 partitions handed over, 60 records re-read, 0 left" in table
    finished = json.loads(ok("finish", rid, "--json"))
    assert finished["state"] == "finished" and finished["temporary_records"] == 60
    unknown = runner.invoke(app, ["reconsume", "status", "no-such-rc", "--json"], env=env)
    assert unknown.exit_code == 1 and json.loads(unknown.stdout) == {
        "error": "no reconsume 'no-such-rc' in the ledger; `rewind reconsume plan` records one"}


def test_a_side_killed_with_sigkill_rehandles_at_most_its_uncommitted_batch(
    rsettings: Settings, tmp_path: Path
) -> None:
    """SIGKILL lands in the middle of a batch: after a restart that side handles the batch's
    messages again (at most one batch per kill), the other side never handles them."""
    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=300, live_at=300)
    starts = {0: 0, 1: 100}
    plan_reconsume(rsettings, rid, group=group, topics=[topic], mode="handover", idle_handover_s=1.0,
                   from_offsets=json.dumps({topic: {str(p): o for p, o in starts.items()}}))
    start_reconsume(rsettings, rid)
    batch = 20
    out = {"temporary": tmp_path / "temporary.log", "existing": tmp_path / "existing.log"}
    root = Path(__file__).resolve().parent.parent
    incarnation = {"temporary": 0, "existing": 0}

    def spawn(side: str) -> subprocess.Popen[bytes]:
        incarnation[side] += 1
        args = [sys.executable, "-m", "tests.reconsume_child", side, rsettings.bootstrap_servers,
                rsettings.ledger, rid, str(out[side]), str(batch), "0.004", str(incarnation[side])]
        return subprocess.Popen(args, cwd=root, stderr=subprocess.DEVNULL)

    def lines(side: str) -> list[tuple[int, int, int]]:
        text = out[side].read_text() if out[side].exists() else ""
        return [tuple(map(int, line.split())) for line in text.splitlines()]  # type: ignore[misc]

    def wait_for(side: str, more: int, timeout: float = 60) -> None:
        want = len(lines(side)) + more
        deadline = time.monotonic() + timeout
        while len(lines(side)) < want and time.monotonic() < deadline:
            time.sleep(0.02)

    stop_producing = threading.Event()

    def keep_producing() -> None:
        producer = Producer({**conf, "linger.ms": 1})
        while not stop_producing.is_set():
            for _ in range(5):
                producer.produce(topic, b"live", b"k", partition=0)
                producer.produce(topic, b"live", b"k", partition=1)
            producer.flush(10)
            time.sleep(0.1)
        assert producer.flush(30) == 0

    feeder = threading.Thread(target=keep_producing)
    feeder.start()
    killed = {"temporary": set(), "existing": set()}  # type: dict[str, set[int]]
    existing = spawn("existing")
    try:
        for _ in range(3):  # kill the temporary side three times while it re-reads
            temporary = spawn("temporary")
            wait_for("temporary", 45)
            temporary.kill()
            temporary.wait()
            killed["temporary"].add(incarnation["temporary"])
        temporary = spawn("temporary")
        assert temporary.wait(120) == 0  # it finishes: every partition handed over
        for _ in range(2):  # kill the existing side while it handles live records
            wait_for("existing", 15)
            existing.kill()
            existing.wait()
            killed["existing"].add(incarnation["existing"])
            existing = spawn("existing")
        wait_for("existing", 15)
        stop_producing.set()
        feeder.join()
        high = {p: b.high for (_t, p), b in kg.log_bounds(conf, [(topic, p) for p in starts]).items()}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            at = kg.committed_offsets(conf, group, [(topic, p) for p in starts])
            if all(at[(topic, p)] == high[p] for p in starts):
                break
            time.sleep(0.2)
    finally:
        stop_producing.set()
        feeder.join()
        existing.terminate()
        existing.wait(30)
    rows = {r.partition: r for r in ReconsumeStore(Ledger.open(rsettings.ledger).engine).rows(rid)}
    handled: dict[str, dict[tuple[int, int], list[int]]] = {}
    for side in ("temporary", "existing"):
        handled[side] = {}
        for tag, p, o in lines(side):
            handled[side].setdefault((p, o), []).append(tag)
    both = set(handled["temporary"]) & set(handled["existing"])
    assert not both, f"handled by both sides: {sorted(both)[:5]}"
    for p, s in starts.items():
        h = rows[p].handover_offset
        assert h is not None
        assert {o for q, o in handled["temporary"] if q == p} == set(range(s, h))
        assert {o for q, o in handled["existing"] if q == p} == set(range(h, high[p]))
    for side in ("temporary", "existing"):
        again: dict[int, int] = {}
        for tags in handled[side].values():
            for tag in tags[:-1]:  # every handling but the last was by a process later killed
                assert tag in killed[side], f"{side} incarnation {tag} was not killed, yet re-handled"
                again[tag] = again.get(tag, 0) + 1
        assert all(n <= batch for n in again.values()), again
    # the kills did land mid-batch: some messages were handled twice, by the same side
    assert sum(len(t) - 1 for t in handled["temporary"].values()) > 0


def test_the_ledger_is_written_once_per_batch_not_per_message(rsettings: Settings) -> None:
    """Counted at the database: the existing side's skip claims are one UPDATE per partition
    and batch; the temporary side's informative records come at most once per interval."""
    from sqlalchemy import event

    conf = conf_of(rsettings)
    topic, group, rid = topic_with_group(conf, partitions=1, per_partition=200, live_at=0)
    plan_reconsume(rsettings, rid, group=group, topics=[topic], from_earliest=True, idle_handover_s=60)
    start_reconsume(rsettings, rid)
    with Ledger.open(rsettings.ledger) as ledger:
        updates: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE"):
                updates.append(statement)

        event.listen(ledger.engine, "before_cursor_execute", count)
        existing = ExistingSide(conf, Recorder(), reconsume=rid, ledger=ledger, batch_size=50, timeout_s=0.3)
        with existing:
            batches = 0
            deadline = time.monotonic() + 30
            while existing.skipped < 200 and time.monotonic() < deadline:
                batches += bool(existing.poll_once())
        assert existing.skipped == 200 and existing.handled == 0
        assert len(updates) == batches and 4 <= batches < 200  # one claim per batch with messages

        updates.clear()
        temporary = TemporarySide(conf, Recorder(), reconsume=rid, ledger=ledger, batch_size=20,
                                  timeout_s=0.3, record_interval_s=3600)
        with temporary:
            while not temporary.done:
                temporary.poll_once()
            # ten batches and more: progress once at the start, then the one handover try that
            # could hold (past the existing side's 199), which records the progress with it
            assert temporary.batches >= 10 and temporary.handed_over == {(topic, 0): 200}
            assert len(updates) == 2 and "handover_offset" in updates[1]
            assert "existing_last_offset <" in updates[1]
        assert len(updates) == 2  # nothing left to record on close
    row = ReconsumeStore(Ledger.open(rsettings.ledger).engine).rows(rid)[0]
    assert (row.temp_last_offset, row.existing_last_offset, row.handover_offset) == (199, 199, 200)
