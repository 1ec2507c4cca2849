"""Resetting consumer groups' offsets (`rewind groups`), on real brokers (tansu and noida-db).

A group gets committed offsets the fast way, by committing them with a consumer that never
subscribes; the one test that needs a live member subscribes for real and runs where a
subscription is quick and the broker lists members (noida-db; tansu takes ~20 s and lists
none). Offsets expected after a time reset are computed from the timestamps the test
produced, never copied from the code under test.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from rewind.config import Settings
from rewind.groups import (
    ResetInputError,
    ResetPlan,
    TimeAfterNewestRecord,
    TimeBeforeLogStart,
    TopicNotConsumed,
    describe,
    execute_reset,
    from_csv,
    list_resets,
    plan_reset,
    target_offset,
    to_csv,
    undo_reset,
)
from rewind.kafka import clients
from rewind.kafka import groups as kg
from rewind.kafka.exceptions import GroupActive, GroupError, GroupNotFound, OffsetsNotApplied
from rewind.ledger import Ledger
from rewind.ledger import group_resets as ledger_resets
from rewind.ledger.group_resets import ResetAlreadyUndone
from tests.brokers import DELETE_RECORDS, GROUP_MEMBERS, OFFSET_DELETE, TIME_INDEX, TestBroker
from tests.kafka_util import create_topic, produce

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
N = 60  # records per partition


def stamp(partition: int, i: int) -> int:
    """Record i of a partition: one second apart, partition 1 a tenth of a second later."""
    return BASE + i * 1000 + partition * 100


@dataclass(frozen=True)
class World:
    topic: str
    other: str  # a topic no group of these tests consumes
    stamps: dict[int, list[int]]


@pytest.fixture(scope="module")
def world(broker_conf: dict[str, Any]) -> World:
    topic, other = f"g-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    create_topic(broker_conf, topic, 2)
    create_topic(broker_conf, other, 1)
    stamps = {p: [stamp(p, i) for i in range(N)] for p in (0, 1)}
    produce(broker_conf, topic, [(p, None, b"v", ts) for p in (0, 1) for ts in stamps[p]])
    produce(broker_conf, other, [(0, None, b"v", BASE)])
    return World(topic, other, stamps)


def new_group() -> str:
    return f"grp-{uuid.uuid4().hex[:10]}"


def commit(conf: dict[str, Any], group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Give ``group`` committed offsets without joining it (no subscribe: fast on every broker)."""
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(conf: dict[str, Any], group: str, topic: str) -> dict[int, int | None]:
    got = kg.committed_offsets(conf, group, [topic])
    return {p: o for (_t, p), o in got.items()}


def rows(plan: ResetPlan) -> list[tuple[int, int | None, int, int | None, int | None]]:
    return [(p.partition, p.current, p.new, p.reread, p.skipped) for p in plan.partitions]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.strip() == text
    return text


# -- plans: exact counts, clamping, nothing changed ----------------------------------------------


def test_dry_run_counts_are_exact_and_change_nothing(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})

    back = plan_reset(broker_settings, group, topics=[t], shift_by=-5)
    assert rows(back) == [(0, 30, 25, 5, 0), (1, 10, 5, 5, 0)]
    assert (back.reread, back.skipped, back.group_state) == (10, 0, "Empty")

    one = plan_reset(broker_settings, group, topics=[f"{t}:1"], to_offset=40)
    assert rows(one) == [(1, 10, 40, 0, 30)]

    ahead = plan_reset(broker_settings, group, topics=[t], shift_by=100)  # clamped to the end
    assert rows(ahead) == [(0, 30, N, 0, N - 30), (1, 10, N, 0, N - 10)]
    assert [p.requested for p in ahead.partitions] == [130, 110]
    assert all(f"after the end of the log ({N})" in p.notes[0] for p in ahead.partitions)

    below = plan_reset(broker_settings, group, topics=[t], shift_by=-25)  # partition 1 below 0
    assert rows(below) == [(0, 30, 5, 25, 0), (1, 10, 0, 10, 0)]
    assert below.partitions[1].notes and "before the log start (0)" in below.partitions[1].notes[0]

    assert [p.new for p in plan_reset(broker_settings, group, topics=[t], to_earliest=True).partitions] == [
        0,
        0,
    ]
    assert [
        p.new for p in plan_reset(broker_settings, group, all_topics=True, to_latest=True).partitions
    ] == [N, N]
    assert committed(broker_conf, group, t) == {0: 30, 1: 10}
    assert ResetPlan.from_dict(json.loads(json.dumps(back.to_dict()))) == back


# -- execute, read back, ledger, undo -----------------------------------------------------------


def test_execute_reads_back_and_undo_restores(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})

    outcome = execute_reset(broker_settings, plan_reset(broker_settings, group, topics=[t], to_offset=12))
    assert committed(broker_conf, group, t) == {0: 12, 1: 12}
    record = outcome.record
    assert record.state == "applied" and record.mode == "to-offset" and record.args["offset"] == 12
    assert record.before == {(t, 0): 30, (t, 1): 10} and record.after == {(t, 0): 12, (t, 1): 12}
    assert "@" in record.who
    assert [r.reset_id for r in list_resets(broker_settings, group)] == [record.reset_id]

    undone = undo_reset(broker_settings, record.reset_id)
    assert committed(broker_conf, group, t) == {0: 30, 1: 10}
    assert undone.record.state == "undone" and undone.restored == {(t, 0): 30, (t, 1): 10}
    with pytest.raises(ResetAlreadyUndone) as again:
        undo_reset(broker_settings, record.reset_id)
    assert record.reset_id in one_line(again.value)


def test_execute_refuses_a_plan_whose_offsets_moved(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    from rewind.groups import OffsetsMoved

    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})
    plan = plan_reset(broker_settings, group, topics=[t], to_earliest=True)
    commit(broker_conf, group, {(t, 0): 33})  # a consumer moved on after the dry run
    with pytest.raises(OffsetsMoved) as moved:
        execute_reset(broker_settings, plan)
    assert f"{t}/0 planned from 30, now 33" in one_line(moved.value)
    assert committed(broker_conf, group, t) == {0: 33, 1: 10}
    assert list_resets(broker_settings, group) == []


def test_undo_removes_an_offset_the_group_did_not_have(
    broker: TestBroker, world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    """Partition 1 had no offset before the reset. Where the broker has OffsetDelete (noida-db)
    undo removes it; where it has not (tansu) undo keeps it and says why."""
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30})
    plan = plan_reset(broker_settings, group, topics=[t], to_offset=5)
    assert rows(plan) == [(0, 30, 5, 25, 0), (1, None, 5, None, None)]
    reset = execute_reset(broker_settings, plan).record
    assert committed(broker_conf, group, t) == {0: 5, 1: 5}

    undone = undo_reset(broker_settings, reset.reset_id)
    if broker.has(OFFSET_DELETE):
        assert committed(broker_conf, group, t) == {0: 30, 1: None}
        assert undone.removed == ((t, 1),) and undone.kept == {}
    else:
        assert committed(broker_conf, group, t) == {0: 30, 1: 5}
        assert undone.kept == {(t, 1): 5}
        assert any("does not support it" in n for n in undone.notes)


def test_a_refused_commit_is_named_never_silent(world: World, broker_conf: dict[str, Any]) -> None:
    """Both brokers refuse an offset for a topic that does not exist; the read-back names it."""
    group = new_group()
    commit(broker_conf, group, {(world.topic, 0): 3})
    with pytest.raises(OffsetsNotApplied) as refused:
        kg.alter_offsets(broker_conf, group, {(world.topic, 0): 4, ("no-such-topic-x", 0): 1})
    line = one_line(refused.value)
    assert "no-such-topic-x/0 wanted 1, committed none" in line and "nknown topic" in line
    assert refused.value.failures.keys() == {("no-such-topic-x", 0)}


# -- Kafka's CSV ---------------------------------------------------------------------------------


def test_export_and_from_file_round_trip_in_kafkas_format(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})
    plan = plan_reset(broker_settings, group, topics=[t], shift_by=-3)
    text = to_csv(plan.offsets)
    assert text == f"{t},0,27\n{t},1,7\n"  # kafka-consumer-groups --export, one group: no header

    path = tmp_path / "plan.csv"
    path.write_text(text)
    again = plan_reset(broker_settings, group, from_file=path)
    assert again.mode == "from-file" and again.offsets == plan.offsets
    assert to_csv(again.offsets) == text

    # several groups, as Kafka exports them: group,topic,partition,offset; only ours is taken
    many = tmp_path / "many.csv"
    many.write_text(f"other-group,{t},0,1\n{group},{t},0,4\n{group},{t},1,70\n")
    theirs = plan_reset(broker_settings, group, from_file=many)
    assert rows(theirs) == [(0, 30, 4, 26, 0), (1, 10, N, 0, N - 10)]  # 70 clamped to the end
    with pytest.raises(ResetInputError, match="has no lines for group 'nobody'"):
        plan_reset(broker_settings, "nobody", from_file=many)


@given(
    st.dictionaries(
        st.tuples(st.from_regex(r"[a-zA-Z0-9._-]{1,20}", fullmatch=True), st.integers(0, 50)),
        st.integers(0, 2**62),
        min_size=1,
        max_size=20,
    )
)
def test_csv_round_trip_property(offsets: dict[tuple[str, int], int]) -> None:
    assert from_csv(to_csv(offsets), "g") == offsets


# -- time resets through the checked lookup ----------------------------------------------------


def test_datetime_reset_uses_the_checked_time_lookup(
    broker: TestBroker, world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    """noida-db's time index answers right; tansu's answers 0 and the check searches. Either way
    the offset is the first record whose timestamp is >= the time."""
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 40, (t, 1): 40})
    when = BASE + 16_050  # between records: partition 0 -> 17, partition 1 -> 16
    expected = {p: min(i for i, ts in enumerate(world.stamps[p]) if ts >= when) for p in (0, 1)}
    assert expected[0] != expected[1]

    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when // 1000)) + f".{when % 1000:03d}Z"
    plan = plan_reset(broker_settings, group, topics=[t], to_datetime=iso)
    assert rows(plan) == [(p, 40, expected[p], 40 - expected[p], 0) for p in (0, 1)]
    method = "list-offsets" if broker.has(TIME_INDEX) else "search"
    assert [p.method for p in plan.partitions] == [method, method]
    assert any("time index answered wrongly" in n for n in plan.notes) == (method == "search")

    exact = plan_reset(broker_settings, group, topics=[t], to_datetime=stamp(1, 25))  # a record's own time
    assert [p.new for p in exact.partitions] == [26, 25]
    # after the newest record of partition 0 only (an idle partition): it lands on its end
    idle = plan_reset(broker_settings, group, topics=[t], to_datetime=stamp(0, N - 1) + 50)
    assert [p.new for p in idle.partitions] == [N, N - 1]

    execute_reset(broker_settings, plan)
    assert committed(broker_conf, group, t) == expected


def test_a_time_after_every_record_is_refused_naming_the_newest_record(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    """A time after the newest record of every partition (a wrong year, a wrong zone) would
    land the group on the log end: refused in one line naming the newest record's time and the
    records it would skip, pointing at --to-latest; nothing changes. The same for a reconsume."""
    from typer.testing import CliRunner

    from rewind.cli import app
    from rewind.reconsume.service import plan_reconsume

    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 40, (t, 1): 45})
    later = stamp(1, N - 1) + 1
    newest = "2026-01-01T00:00:59.100Z"  # stamp(1, N - 1), the newest record of the topic
    with pytest.raises(TimeAfterNewestRecord) as refused:
        plan_reset(broker_settings, group, topics=[t], to_datetime=later)
    line = one_line(refused.value)
    assert f"is after the newest record of 2 partitions ({newest}, {t}/1 offset {N - 1})" in line
    assert "skip 35 records" in line and "--to-latest" in line
    year_later = "2027-01-01T00:00:00Z"
    with pytest.raises(TimeAfterNewestRecord, match=f"--to-datetime {year_later} is after"):
        plan_reset(broker_settings, group, topics=[t], to_datetime=year_later)

    env = {
        "REWIND_BOOTSTRAP_SERVERS": broker_settings.bootstrap_servers,
        "REWIND_STATE_DIR": str(broker_settings.state_path),
        "COLUMNS": "300",
    }
    cli = CliRunner().invoke(
        app, ["groups", "reset", group, "--topic", t, "--to-datetime", year_later, "--execute"], env=env
    )
    assert cli.exit_code == 1
    lines = [x for x in cli.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --to-datetime {year_later} is after"), cli.stderr
    assert newest in lines[0] and "skip 35 records" in lines[0] and "--to-latest" in lines[0]
    assert committed(broker_conf, group, t) == {0: 40, 1: 45}
    assert list_resets(broker_settings, group) == []
    latest = plan_reset(broker_settings, group, topics=[t], to_latest=True)  # the way to mean it
    assert [p.new for p in latest.partitions] == [N, N] and latest.skipped == 35

    with pytest.raises(TimeAfterNewestRecord) as reconsume:
        plan_reconsume(
            broker_settings, f"rc-{uuid.uuid4().hex[:6]}", group=group, topics=[t], from_datetime=year_later
        )
    line = one_line(reconsume.value)
    assert line.startswith(f"--from-datetime {year_later} is after the newest record") and newest in line


def test_a_time_before_the_log_start_is_refused_with_the_records_gone(
    broker: TestBroker, broker_settings: Settings, broker_conf: dict[str, Any], topic_name: str
) -> None:
    broker.require(DELETE_RECORDS)
    create_topic(broker_conf, topic_name, 1)
    produce(broker_conf, topic_name, [(0, None, b"v", stamp(0, i)) for i in range(50)])
    admin = clients.admin(broker_conf)  # kept alive until its futures resolve
    for fut in admin.delete_records([TopicPartition(topic_name, 0, 20)]).values():
        assert fut.result(timeout=15).low_watermark == 20
    group = new_group()
    commit(broker_conf, group, {(topic_name, 0): 30})

    with pytest.raises(TimeBeforeLogStart) as gone:
        plan_reset(broker_settings, group, topics=[topic_name], to_datetime=BASE - 60_000)
    line = one_line(gone.value)
    assert f"log start of {topic_name}/0 (offset 20)" in line
    assert "up to 20 records" in line and "[0, 20)" in line and "--allow-gaps" in line

    allowed = plan_reset(
        broker_settings, group, topics=[topic_name], to_datetime=BASE - 60_000, allow_gaps=True
    )
    assert rows(allowed) == [(0, 30, 20, 10, 0)] and allowed.partitions[0].missing == 20
    assert any("up to 20 records" in n for n in allowed.notes)
    assert committed(broker_conf, group, topic_name) == {0: 30}


# -- bad input: one line each, nothing changed --------------------------------------------------


def test_bad_input_gets_one_line_and_changes_nothing(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30})
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"topics": [t], "to_earliest": True, "group": "no-such-group-xyz"}, GroupNotFound, "does not exist"),
        ({"topics": [world.other], "to_earliest": True}, TopicNotConsumed, f"the topics it consumes: {t}"),
        (
            {"topics": ["no-such-topic-y"], "to_earliest": True},
            ResetInputError,
            "'no-such-topic-y' does not exist",
        ),
        ({"topics": [f"{t}:7"], "to_earliest": True}, ResetInputError, f"{t}/7 does not exist"),
        ({"topics": [t]}, ResetInputError, "none was given"),
        (
            {"topics": [t], "to_earliest": True, "to_offset": 3},
            ResetInputError,
            "--to-offset and --to-earliest",
        ),
        ({"to_earliest": True}, ResetInputError, "--all-topics"),
        ({"topics": [t], "to_datetime": "2026-01-01T00:00:00"}, ResetInputError, "has no time zone"),
        ({"topics": [t], "to_datetime": "yesterday"}, ResetInputError, "is not a time"),
        ({"topics": [t], "shift_by": -1}, ResetInputError, f"cannot shift {t}/1"),
    ]
    for kwargs, error, needle in cases:
        name = kwargs.pop("group", group)
        with pytest.raises(error) as caught:
            plan_reset(broker_settings, name, **kwargs)
        assert needle in one_line(caught.value), (kwargs, str(caught.value))
    with pytest.raises(GroupError) as empty:
        describe(broker_settings, " ")
    assert "group id is empty" in one_line(empty.value)
    assert committed(broker_conf, group, t) == {0: 30, 1: None}
    assert list_resets(broker_settings, group) == []


def test_an_active_group_is_refused_naming_its_members(
    broker: TestBroker, world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    broker.require(GROUP_MEMBERS)
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})
    member = Consumer(
        {**broker_conf, "group.id": group, "client.id": "orders-projector", "enable.auto.commit": False}
    )
    try:
        member.subscribe([t])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.1)
        assert member.assignment(), "no assignment within 30 s"

        seen = describe(broker_settings, group)
        assert seen.state.state == "Stable" and [m.label for m in seen.state.members] == [
            "orders-projector@127.0.0.1"
        ]
        assert {p["member"] for p in seen.partitions} == {"orders-projector@127.0.0.1"}
        plan = plan_reset(broker_settings, group, topics=[t], to_earliest=True)  # a dry run is allowed
        with pytest.raises(GroupActive) as active:
            execute_reset(broker_settings, plan)
        line = one_line(active.value)
        assert "state Stable" in line and "1 active member: orders-projector@127.0.0.1" in line
        assert committed(broker_conf, group, t) == {0: 30, 1: 10}
        assert list_resets(broker_settings, group) == []
    finally:
        member.close()
    outcome = execute_reset(broker_settings, plan)  # the member left: the group is Empty now
    assert outcome.record.state == "applied" and committed(broker_conf, group, t) == {0: 0, 1: 0}


def test_describe_shows_offsets_lag_and_state(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any]
) -> None:
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})
    seen = describe(broker_settings, group)
    assert seen.state.state == "Empty" and seen.state.members == ()
    assert [(p["partition"], p["committed"], p["log_end"], p["lag"]) for p in seen.partitions] == [
        (0, 30, N, N - 30),
        (1, 10, N, N - 10),
    ]
    assert seen.lag == 2 * N - 40


# -- the command line -----------------------------------------------------------------------------


def test_cli_dry_run_export_execute_undo(
    world: World, broker_settings: Settings, broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from rewind.cli import app

    env = {
        "REWIND_BOOTSTRAP_SERVERS": broker_settings.bootstrap_servers,
        "REWIND_STATE_DIR": str(broker_settings.state_path),
        "COLUMNS": "200",
    }
    group, t = new_group(), world.topic
    commit(broker_conf, group, {(t, 0): 30, (t, 1): 10})
    runner = CliRunner()

    dry = runner.invoke(app, ["groups", "reset", group, "--topic", t, "--shift-by", "-5"], env=env)
    assert dry.exit_code == 0, dry.output
    header = next(line for line in dry.stdout.splitlines() if "GROUP" in line)
    assert header.replace("┃", " ").split()[:4] == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    assert "re-reads 5" in dry.stdout and "dry run" in dry.stdout

    exported = runner.invoke(
        app, ["groups", "reset", group, "--topic", t, "--shift-by", "-5", "--export", "-"], env=env
    )
    assert exported.exit_code == 0 and exported.stdout == f"{t},0,25\n{t},1,5\n"
    plan_file = tmp_path / "plan.csv"
    plan_file.write_text(exported.stdout)
    both = runner.invoke(
        app, ["groups", "reset", group, "--topic", t, "--to-latest", "--export", "-", "--execute"], env=env
    )
    assert both.exit_code == 1 and "give --export a file" in both.stderr

    done = runner.invoke(
        app, ["groups", "reset", group, "--from-file", str(plan_file), "--execute", "--json"], env=env
    )
    assert done.exit_code == 0, done.output
    applied = json.loads(done.stdout)
    assert applied["state"] == "applied" and applied["reread"] == 10
    assert committed(broker_conf, group, t) == {0: 25, 1: 5}

    described = json.loads(runner.invoke(app, ["groups", "describe", group, "--json"], env=env).stdout)
    assert described["lag"] == (N - 25) + (N - 5)
    listed = json.loads(runner.invoke(app, ["groups", "resets", group, "--json"], env=env).stdout)
    assert [r["reset_id"] for r in listed["resets"]] == [applied["reset_id"]]

    undone = runner.invoke(app, ["groups", "undo", applied["reset_id"], "--json"], env=env)
    assert undone.exit_code == 0 and json.loads(undone.stdout)["state"] == "undone"
    assert committed(broker_conf, group, t) == {0: 30, 1: 10}

    missing = runner.invoke(app, ["groups", "reset", "no-such-group-q", "--topic", t, "--to-latest"], env=env)
    assert missing.exit_code == 1
    lines = [line for line in missing.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: consumer group 'no-such-group-q' does not exist")


# -- the ledger on PostgreSQL ----------------------------------------------------------------------


def test_reset_records_on_postgresql(pg_url: str) -> None:
    with Ledger.open(pg_url) as ledger:
        made = ledger_resets.record_reset(
            ledger,
            group="g",
            mode="shift-by",
            args={"shift": -3},
            before={("t", 0): 5, ("t", 1): None},
            after={("t", 0): 2, ("t", 1): 0},
        )
        assert made.state == "applying"
        assert ledger_resets.finish_reset(ledger, made.reset_id, "applied").state == "applied"
        done = ledger_resets.mark_undone(ledger, made.reset_id, notes=["restored"])
        assert (done.state, done.notes, done.before) == (
            "undone",
            ("restored",),
            {("t", 0): 5, ("t", 1): None},
        )
        with pytest.raises(ResetAlreadyUndone):
            ledger_resets.mark_undone(ledger, made.reset_id)
        assert [r.reset_id for r in ledger_resets.list_resets(ledger, "g")] == [made.reset_id]


# -- the pure part: shifting and clamping ----------------------------------------------------------


@given(
    low=st.integers(0, 10**12),
    span=st.integers(0, 10**6),
    current=st.none() | st.integers(0, 10**12 + 10**6),
    shift=st.integers(-(10**7), 10**7),
    offset=st.integers(0, 10**12 + 2 * 10**6),
)
def test_shift_and_offsets_land_inside_the_log(
    low: int, span: int, current: int | None, shift: int, offset: int
) -> None:
    high = low + span
    for mode, value in (("shift-by", shift), ("to-offset", offset)):
        if mode == "shift-by" and current is None:
            with pytest.raises(ResetInputError):
                target_offset("shift-by", value, current, low, high)
            continue
        requested, new, note = target_offset(mode, value, current, low, high)  # type: ignore[arg-type]
        assert requested == (current + shift if mode == "shift-by" else offset)  # type: ignore[operator]
        assert low <= new <= high
        assert (new == requested) == (note is None) == (low <= requested <= high)
        if requested > high:
            assert new == high
        if requested < low:
            assert new == low and f"{low - requested:,} records" in note  # type: ignore[operator]
    assert target_offset("to-earliest", None, current, low, high)[1:] == (low, None)
    assert target_offset("to-latest", None, current, low, high)[1:] == (high, None)
