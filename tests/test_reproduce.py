"""Re-produce (``source.table``) end to end, on each real broker, from real databases.

One run per way of selecting, each from another source of truth (ids from SQLite, a predicate
on PostgreSQL with a skipped partition, an ids file on Iceberg), into a live topic that already
holds records. What a consumer reads ``read_committed`` is checked exactly: the selected
entities once each, keyed by their id, on the partition librdkafka's Java-compatible
``murmur2_random`` partitioner picks for that key (produced here beside them), in key order
within a unit, with the synthetic headers; rejected rows are in the quarantine with their row
as JSON; the counts add up. Bad input (unknown table, bad predicate, ids of the wrong type, an
output that does not fit, an unreachable database, an empty or too large selection) is one
line and produces nothing. The plan warns about a stuck partition.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings
from rewind.errors import RewindError
from rewind.job.plan import PlanRefused
from rewind.job.runner import RunOutcome
from rewind.kafka.partitioner import partitions_for
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests import reproduce_fixtures as rf
from tests.brokers import TestBroker
from tests.kafka_util import create_topic

PARTITIONS = 6
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ACCOUNTS = rf.accounts(400)
BY_ID = {a.id: a for a in ACCOUNTS}
LIVE = 25  # records the live producer wrote before the re-produce
LIVE_MS = 1_760_000_000_000


@dataclass
class World:
    broker: TestBroker
    settings: Settings
    tmp: Path
    sqlite_url: str
    pg_url: str
    pg_table: str
    iceberg_table: str
    conf: dict[str, Any]

    def live_topic(self) -> str:
        """A topic as a live producer left it: LIVE records keyed by account id, by murmur2."""
        from confluent_kafka import Producer

        topic = f"accounts-{uuid.uuid4().hex[:8]}"
        create_topic(self.conf, topic, PARTITIONS)
        producer = Producer({**self.conf, "partitioner": "murmur2_random", "linger.ms": 5})
        for a in ACCOUNTS[:LIVE]:  # written a while ago (the topic keeps records forever)
            producer.produce(
                topic, json.dumps({"live": a.id}).encode(), str(a.id).encode(), timestamp=LIVE_MS
            )
        assert producer.flush(30) == 0
        return topic


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    broker: TestBroker,
    broker_settings: Settings,
    pg_url: str,
    spark: Any,
) -> World:
    tmp = tmp_path_factory.mktemp(f"reproduce-{broker.name}")
    sqlite_url = rf.sqlite_accounts(tmp / "accounts.db", ACCOUNTS)
    pg_table = f"accounts_{uuid.uuid4().hex[:6]}"  # the database is the module's, for both brokers
    rf.postgres_accounts(pg_url, ACCOUNTS, pg_table)
    iceberg_table = f"truth_{uuid.uuid4().hex[:6]}.accounts"
    rf.iceberg_accounts(broker_settings, iceberg_table, ACCOUNTS)
    conf = broker_settings.kafka_config()
    return World(broker, broker_settings, tmp, sqlite_url, pg_url, pg_table, iceberg_table, conf)


def _librdkafka_partitions(conf: dict[str, Any], keys: list[str]) -> dict[str, int]:
    """Where librdkafka's Java-compatible murmur2 partitioner puts each key (delivered for real)."""
    from confluent_kafka import Producer

    topic = f"placement-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, PARTITIONS)
    placed: dict[str, int] = {}

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        placed[msg.key().decode()] = msg.partition()

    producer = Producer({**conf, "partitioner": "murmur2_random", "linger.ms": 5})
    for key in keys:
        producer.produce(topic, b"x", key.encode(), on_delivery=report)
    assert producer.flush(30) == 0
    return placed


def _run(world: World, spec: dict[str, Any]) -> tuple[RunOutcome, list[rf.Produced], Any]:
    from rewind.job.service import plan_job, run_job

    parsed = parse_spec(spec)
    plan = plan_job(world.settings, parsed)
    assert plan.ok, plan.failed_gates()
    outcome = run_job(world.settings, parsed)
    assert outcome.state == "succeeded"
    topic = spec["sink"]["kafka"]["topic"]
    return outcome, rf.read_topic(world.conf, topic), plan


def _synthetic(records: list[rf.Produced], run_id: str) -> list[rf.Produced]:
    return [r for r in records if r.headers.get("rewind.run-id") == run_id]


def _check_records(
    world: World, outcome: RunOutcome, records: list[rf.Produced], label: str, expected: list[int]
) -> None:
    """Exactly the expected entities once each, on librdkafka's murmur2 partition, in key order
    per unit, with values and headers as the translate and lineage say."""
    ours = _synthetic(records, outcome.run_id)
    assert sorted(int(r.key) for r in ours) == sorted(expected)  # once each, nothing else
    keys = [r.key for r in ours]
    assert {r.key: r.partition for r in ours} == _librdkafka_partitions(world.conf, keys)
    assert [r.partition for r in ours] == partitions_for([k.encode() for k in keys], PARTITIONS)
    started = datetime.now(UTC).timestamp() - outcome.seconds - 60
    by_unit: dict[tuple[int, str], list[int]] = {}
    for r in ours:
        assert r.value == BY_ID[int(r.key)].message()
        h = r.headers
        assert h["rewind.synthetic"] == "true"
        assert h["rewind.version"] == "3" and h["rewind.transform"] == "account_state"
        assert h["rewind.run-id"] == outcome.run_id
        source, unit, position = h["rewind.source"].rsplit("/", 2)
        assert source == label and int(position) >= 0
        extracted = datetime.fromisoformat(h["rewind.extracted-at"].replace("Z", "+00:00"))
        assert started < extracted.timestamp() <= datetime.now(UTC).timestamp()
        assert r.timestamp == (extracted - EPOCH) // timedelta(milliseconds=1)  # CreateTime = extraction
        by_unit.setdefault((r.partition, unit), []).append(int(r.key))
    for keys_of_unit in by_unit.values():  # one unit's records of a partition come in key order
        assert keys_of_unit == sorted(keys_of_unit)


def _check_quarantine(world: World, outcome: RunOutcome, rejected: list[int], label: str) -> None:
    rows = jf.quarantine_rows(world.settings, outcome.quarantine_table, outcome.run_id)
    assert sorted(int(r["key"]) for r in rows) == sorted(rejected)
    for row in rows:
        assert row["stage"] == "translate-reject" and row["reason"] == "corrupt account"
        assert row["topic"] == label
        value = json.loads(row["value"])
        account = BY_ID[int(row["key"])]
        assert value["id"] == account.id and value["status"] == "corrupt" and value["name"] == account.name


def test_sqlite_by_ids_into_a_live_topic(world: World) -> None:
    topic = world.live_topic()
    wanted = [a.id for a in ACCOUNTS if a.id % 7 == 0] + [97, 194, 9999]  # two corrupt, one absent
    spec = rf.spec(
        "reproduce-ids",
        {
            "sqlite": {"url": world.sqlite_url, "table": "accounts"},
            "key": "id",
            "ids": wanted,
            "key_ranges": 3,
        },
        topic,
    )
    outcome, records, plan = _run(world, spec)
    present = [i for i in wanted if i in BY_ID]
    rejected = [i for i in present if BY_ID[i].rejected]
    good = [i for i in present if not BY_ID[i].rejected]
    _check_records(world, outcome, records, "sqlite:accounts", good)
    _check_quarantine(world, outcome, rejected, "sqlite:accounts")
    c = outcome.counts
    assert (c.records_read, c.emitted, c.quarantined, c.filtered) == (len(present), len(good), 2, 0)
    assert len([r for r in records if "rewind.run-id" not in r.headers]) == LIVE  # the live records stay
    facts = plan.read_plan["table"]
    placement = partitions_for([str(i).encode() for i in present], PARTITIONS)
    expected = {str(p): placement.count(p) for p in sorted(set(placement))}
    assert facts["selected"] == len(present) and facts["placement"] == expected
    assert [u.id for u in plan.units] == [
        f"sqlite:accounts/{i}/0-{n}" for i, n in enumerate(_thirds(len(present)))
    ]
    assert f"1 of the {len(wanted)} ids are not in the table (first: 9999)" in plan.notes


def _thirds(n: int) -> list[int]:
    step = -(-n // 3)
    return [min(step, n - i * step) for i in range(3)]


def test_postgres_by_predicate_skipping_a_partition(world: World) -> None:
    topic = world.live_topic()
    source = {"postgres": {"url": world.pg_url, "table": f"public.{world.pg_table}"}, "key": "id"}
    spec = rf.spec(
        "reproduce-where",
        {**source, "where": "status IN ('blocked', 'corrupt') AND region = 'eu'", "skip_partitions": [1]},
        topic,
    )
    outcome, records, plan = _run(world, spec)
    chosen = [a for a in ACCOUNTS if a.status in ("blocked", "corrupt") and a.region == "eu"]
    placed = dict(
        zip(
            [a.id for a in chosen],
            partitions_for([str(a.id).encode() for a in chosen], PARTITIONS),
            strict=True,
        )
    )
    skipped = [a.id for a in chosen if placed[a.id] == 1]
    kept = [a for a in chosen if placed[a.id] != 1]
    assert skipped and any(a.rejected for a in kept)  # the data exercises both paths
    _check_records(
        world, outcome, records, f"postgres:public.{world.pg_table}", [a.id for a in kept if not a.rejected]
    )
    _check_quarantine(world, outcome, [a.id for a in kept if a.rejected], f"postgres:public.{world.pg_table}")
    assert not [r for r in _synthetic(records, outcome.run_id) if r.partition == 1]
    c = outcome.counts
    assert (c.records_read, c.filtered, c.quarantined) == (
        len(chosen),
        len(skipped),
        sum(a.rejected for a in kept),
    )
    assert plan.read_plan["table"]["skipped"] == {"1": len(skipped)}
    assert (
        f"skip_partitions [1]: {len(skipped)} selected entities land there and are left out "
        "(counted as filtered)" in plan.notes
    )


def test_iceberg_by_ids_file(world: World) -> None:
    topic = world.live_topic()
    wanted = [a.id for a in ACCOUNTS if a.id % 11 == 3]
    ids_file = world.tmp / f"ids-{uuid.uuid4().hex[:6]}.txt"
    ids_file.write_text("# accounts to fix\n" + "\n".join(str(i) for i in wanted) + f"\n\n{wanted[0]}\n")
    source = {"iceberg": {"table": world.iceberg_table}, "key": "id", "ids_file": str(ids_file)}
    outcome, records, plan = _run(world, rf.spec("reproduce-file", source, topic))
    label = f"iceberg:{world.iceberg_table}"
    _check_records(world, outcome, records, label, [i for i in wanted if not BY_ID[i].rejected])
    _check_quarantine(world, outcome, [i for i in wanted if BY_ID[i].rejected], label)
    assert (
        plan.read_plan["table"]["ids_digest"]
        and "source.table.ids_file repeats 1 ids; each is re-produced once" in plan.notes
    )


# -- bad input: one line, nothing produced ----------------------------------------------------------


def _bad(world: World, source: dict[str, Any], **sections: Any) -> str:
    from rewind.job.service import run_job
    from rewind.sinks.kafka.topics import high_watermarks

    topic = world.live_topic()
    before = high_watermarks(world.conf, topic)
    with pytest.raises(RewindError) as err:
        run_job(world.settings, parse_spec(rf.spec("reproduce-bad", source, topic, **sections)))
    assert high_watermarks(world.conf, topic) == before  # nothing produced
    message = str(err.value)
    assert "\n" not in message
    assert isinstance(err.value, PlanRefused)
    return message


def test_bad_input_is_one_line_and_produces_nothing(world: World) -> None:
    sqlite = {"sqlite": {"url": world.sqlite_url, "table": "accounts"}, "key": "id"}
    pg = {"postgres": {"url": world.pg_url, "table": world.pg_table}, "key": "id"}
    message = _bad(world, {**sqlite, "sqlite": {"url": world.sqlite_url, "table": "acounts"}, "ids": [1]})
    assert message.endswith(
        f"source.table.sqlite.table: no table acounts in {world.sqlite_url}; check the name (schema.table)"
    )
    message = _bad(world, {**pg, "where": "status = = 'blocked'"})
    assert 'source.table.where: not a valid predicate for PostgreSQL: syntax error at or near "="' in message
    message = _bad(world, {**sqlite, "where": "no_such_column > 3"})
    assert "source.table.where: not a valid predicate for SQLite: no such column: no_such_column" in message
    message = _bad(world, {**sqlite, "ids": ["12", "x-1"]})
    assert message.endswith(
        "source.table.ids.0: '12' is not an integer, and the key column is integer; "
        "give ids of the key's type"
    )
    bad_file = world.tmp / "bad-ids.txt"
    bad_file.write_text("12\n13\nfourteen\n")
    message = _bad(world, {**pg, "ids_file": str(bad_file)})
    assert message.endswith(
        f"source.table.ids_file: {bad_file} line 3: 'fourteen' is not an integer, and the key column is "
        "integer; give ids of the key's type"
    )
    message = _bad(
        world,
        {**sqlite, "ids": [1, 2]},
        translate={
            "function": "tests.reproduce_fixtures:account_state",
            "version": "3",
            "output_schema": {
                "account_id": "long",
                "name": "long",
                "balance": "double",
                "status": "string",
                "region": "string",
            },
        },
    )
    assert (
        "refused by gate output-schema: the sample could not be processed" in message and "'name'" in message
    )
    message = _bad(
        world,
        {
            **pg,
            "postgres": {"url": "postgresql://postgres@127.0.0.1:1/nowhere", "table": "accounts"},
            "ids": [1],
        },
    )
    assert (
        "source.table.postgres.url: cannot connect to postgresql://postgres@127.0.0.1:1/nowhere:" in message
    )
    message = _bad(
        world,
        {**sqlite, "sqlite": {"url": f"sqlite:///{world.tmp}/missing.db", "table": "accounts"}, "ids": [1]},
    )
    assert message.endswith(f"source.table.sqlite.url: no SQLite file at {world.tmp}/missing.db")
    assert not Path(f"{world.tmp}/missing.db").exists()  # read-only: never a new empty database
    message = _bad(world, {**sqlite, "where": "status = 'unheard-of'"})
    assert message.endswith(
        "refused by gate selection: where status = 'unheard-of' selects no entity of sqlite:accounts; "
        "check the ids or the predicate"
    )
    message = _bad(world, {**sqlite, "where": "TRUE"}, guards={"max_records": 100})
    assert message.endswith(
        "refused by gate max-records: the selection holds 400 entities, more than guards.max_records=100; "
        "narrow the selection or raise the guard"
    )
    message = _bad(world, {**sqlite, "key": "nope", "ids": [1]})
    assert (
        "source.table.key: no column 'nope' in accounts (columns: id, name, balance_cents, status, region)"
        in message
    )


def test_the_plan_warns_about_a_stuck_partition(world: World) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from rewind.job.service import plan_job

    topic = world.live_topic()
    keys = [str(a.id).encode() for a in ACCOUNTS[:LIVE]]
    live = partitions_for(keys, PARTITIONS)
    stuck = max(set(live), key=live.count)
    group = f"projector-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({**world.conf, "group.id": group, "enable.auto.commit": False})
    try:  # the group consumed every partition but `stuck` (its records wait there)
        ends = {p: live.count(p) for p in range(PARTITIONS)}
        offsets = [TopicPartition(topic, p, 0 if p == stuck else ends[p]) for p in range(PARTITIONS)]
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()
    ids = [a.id for a in ACCOUNTS if not a.rejected][:120]
    placed = partitions_for([str(i).encode() for i in ids], PARTITIONS)
    source = {
        "sqlite": {"url": world.sqlite_url, "table": "accounts"},
        "key": "id",
        "ids": ids,
        "stuck_check_group": group,
        "stuck_after_s": 1,
    }
    plan = plan_job(world.settings, parse_spec(rf.spec("reproduce-stuck", source, topic)))
    assert plan.ok
    warning = [n for n in plan.notes if n.startswith("warning:")]
    assert len(warning) == 1
    assert warning[0].startswith(
        f"warning: {placed.count(stuck)} selected entities land on partition {stuck}, where group {group} "
        f"has {live.count(stuck)} unconsumed records, the oldest "
    )
    assert plan.read_plan["table"]["stuck"][str(stuck)]["lag"] == live.count(stuck)
    assert set(plan.read_plan["table"]["stuck"]) == {str(stuck)}
