"""Event reconstruction (``source.table.reconstruct``) end to end: a legacy SQLite table of states
into a Kafka topic on a real broker, through Spark.

A history table whose rows were extracted in another order than the business's (inserted late,
ties on the business time) becomes, per policy, its events in business order, on the partition
librdkafka's Java-compatible murmur2 picks for the policy id, each labelled synthetic with its
source system, extraction time, business effective time, transition and version; a state the
transition rejects is in the quarantine with the entity and both states; the counts add up; the
events replayed with the fold give every policy's latest state. Monthly snapshots likewise. Bad
input (a business time that is not a time, a null entity key, a transition that returns events
without a type, snapshots without a snapshot time) is one line at plan time and produces nothing.
"""

from __future__ import annotations

import random
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import Settings
from rewind.job.plan import PlanRefused
from rewind.kafka.partitioner import partitions_for
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests import reconstruct_fixtures as rx
from tests import reproduce_fixtures as rf
from tests.kafka_util import create_topic

PARTITIONS = 6


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


def _topic(settings: Settings) -> str:
    topic = f"policies-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, PARTITIONS)
    return topic


def _history_source(url: str, **more: Any) -> dict[str, Any]:
    return {
        "sqlite": {"url": url, "table": "policy_history"},
        "key": "policy_id",
        "where": "TRUE",
        "reconstruct": {
            "time": "effective_from",
            "tie": ["change_seq"],
            "fold": "tests.reconstruct_fixtures:policy_state",
        },
        **more,
    }


def _run(settings: Settings, spec: dict[str, Any]) -> tuple[Any, Any, list[rf.Produced]]:
    from rewind.job.service import plan_job, run_job

    parsed = parse_spec(spec)
    plan = plan_job(settings, parsed)
    assert plan.ok, plan.failed_gates()
    outcome = run_job(settings, parsed)
    assert outcome.state == "succeeded"
    records = rf.read_topic(settings.kafka_config(), spec["sink"]["kafka"]["topic"])
    return plan, outcome, [r for r in records if r.headers.get("rewind.run-id") == outcome.run_id]


def test_a_history_table_becomes_events_in_business_order(
    settings: Settings, spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(11)
    history = rx.random_history(rng, 300, 7)
    at = next(i for i, s in enumerate(history) if s.change_seq > 0)  # a state the transition rejects
    bad = history[at]
    history[at] = rx.State(
        bad.policy_id, bad.status, -1.0, bad.effective_from, bad.change_seq, bad.changed_at
    )
    extraction = sorted(range(len(history)), key=lambda i: history[i].changed_at)  # recorded order
    url = rx.sqlite_history(tmp_path / "legacy.db", history, extraction)
    topic = _topic(settings)
    spec = rx.spec(
        "reconstruct-history",
        _history_source(url, key_ranges=3),
        topic,
        lineage={"source_system": "legacy-policies"},
    )
    plan, outcome, records = _run(settings, spec)

    facts = plan.read_plan["table"]
    assert (facts["states"], facts["entities"]) == (len(history), 300)
    assert set(facts["sample"]["events"]) <= {
        "PolicyBound",
        "PremiumChanged",
        "PolicyCancelled",
        "PolicyStatusChanged",
    }
    c = outcome.counts  # states in = consumed + quarantined + filtered
    assert (c.records_read, c.emitted, c.quarantined, c.filtered) == (len(history), len(history) - 1, 1, 0)
    assert c.rows_out == len(records)

    # the partition of every event is the live producer's for its policy id
    keys = sorted({r.key for r in records})
    assert {r.key: r.partition for r in records} == _librdkafka_partitions(settings.kafka_config(), keys)
    assert [r.partition for r in records] == partitions_for([r.key.encode() for r in records], PARTITIONS)
    # per policy, in partition order: its events in business order, what the transition makes of
    # its history sorted by (effective_from, change_seq)
    expected = _expected_events(history)
    got: dict[str, list[tuple[str, str]]] = {}
    for r in records:  # read_topic returns them in partition and offset order
        got.setdefault(r.key, []).append((r.value["type"], r.headers["rewind.effective-time"][:10]))
    assert got == expected
    started = datetime.now(UTC).timestamp() - outcome.seconds - 60
    for r in records:
        h = r.headers
        assert h["rewind.synthetic"] == "true" and h["rewind.source-system"] == "legacy-policies"
        assert (h["rewind.transform"], h["rewind.version"]) == ("policy_events", "1")
        assert h["rewind.source"].startswith("sqlite:policy_history/")
        extracted = datetime.fromisoformat(h["rewind.extracted-at"].replace("Z", "+00:00"))
        assert started < extracted.timestamp() <= datetime.now(UTC).timestamp()
        assert h["rewind.effective-time"][:10] == r.value["effective_at"][:10]

    q = jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
    assert len(q) == 1 and q[0]["reason"] == "negative premium" and int(q[0]["key"]) == bad.policy_id
    value = rx.json.loads(q[0]["value"])
    assert value["entity"] == bad.policy_id and value["current"]["premium"] == -1.0
    assert value["previous"]["change_seq"] == bad.change_seq - 1

    # the outcome: the events replayed with the fold give each policy's latest state
    folded = rx.policy_state(pd.DataFrame([{"policy_id": int(r.key), **r.value} for r in records]))
    latest = rx.latest([s for s in history if s.policy_id != bad.policy_id])
    got_state = {
        int(p): (s, float(m)) for p, s, m in folded[["policy_id", "status", "premium"]].values.tolist()
    }
    assert {p: v for p, v in got_state.items() if p != bad.policy_id} == latest

    # rewind verify: the same outcome check from the topic and the source, reported per event type
    from rewind.verify.service import verify_run

    report = verify_run(settings, outcome.run_id)
    assert report["mode"] == "outcome" and report["passed"], report
    assert (report["entities"], report["matched"], report["skipped_quarantined"]) == (299, 299, 1)
    assert report["events"] == len(records)
    assert sum(t["events"] for t in report["by_type"].values()) == len(records)
    assert report["by_type"]["PolicyBound"]["entities"] == 300
    assert all(t["mismatched"] == 0 for t in report["by_type"].values())


def _expected_events(history: list[rx.State]) -> dict[str, list[tuple[str, str]]]:
    """What the transition makes of each policy's history, in one batch (a rejected state's
    events left out)."""
    from rewind.translate.process import ProcessContext
    from rewind.translate.states import StateOrder
    from rewind.translate.transition import ReconstructContext, reconstruct_batch
    from tests.test_reconstruct_states import _table

    ctx = ReconstructContext(
        ProcessContext("x", "x", "policy_events", "1", datetime.now(UTC)), "x", 0, "x", "policy_id"
    )
    order = StateOrder("policy_id", "effective_from", ("change_seq",))
    rows = reconstruct_batch(_table(history), rx.policy_events, order, ctx, 0).rows.to_pandas()
    out: dict[str, list[tuple[str, str]]] = {}
    for p, t, e in rows[["policy_id", "type", "_rewind_effective_time"]].values.tolist():
        out.setdefault(str(p), []).append((t, e.strftime("%Y-%m-%d")))
    return out


def test_monthly_snapshots_become_events(settings: Settings, spark: Any, tmp_path: Path) -> None:
    months = ["2024-01-31", "2024-02-29T00:00:00Z", "2024-03-31T02:00:00+02:00", "2024-04-30"]
    rng = random.Random(5)
    snapshots: dict[str, list[tuple[int, str, float]]] = {}
    alive = {p: ("active", float(rng.randrange(100, 900))) for p in range(1, 121)}
    for i, month in enumerate(months):
        rows = []
        for p, (status, premium) in list(alive.items()):
            if i and rng.random() < 0.2:
                premium = float(rng.randrange(100, 900))
            if i and rng.random() < 0.1:
                del alive[p]  # cancelled: gone from this snapshot on
                continue
            alive[p] = (status, premium)
            rows.append((p, status, premium))
        snapshots[month] = rows
    # the partitions of the snapshot table were extracted newest first
    url = rx.sqlite_snapshots(tmp_path / "snapshots.db", dict(reversed(list(snapshots.items()))))
    topic = _topic(settings)
    source = {
        "sqlite": {"url": url, "table": "policy_snapshots"},
        "key": "policy_id",
        "where": "TRUE",
        "reconstruct": {"mode": "snapshots", "time": "snapshot_at"},
    }
    plan, outcome, records = _run(settings, rx.spec("reconstruct-snapshots", source, topic))
    assert len(plan.read_plan["table"]["snapshots"]) == 4
    per: dict[int, list[str]] = {}
    for r in records:
        per.setdefault(int(r.key), []).append(r.value["type"])
    for p in range(1, 121):
        kinds = per[p]
        assert kinds[0] == "PolicyBound" and kinds.count("PolicyBound") == 1
        assert (kinds[-1] == "PolicyCancelled") == (p not in alive)
    folded = rx.policy_state(pd.DataFrame([{"policy_id": int(r.key), **r.value} for r in records]))
    last = {p: s for p, s, _ in ((p, s, m) for p, s, m in folded.values.tolist()) if s != "cancelled"}
    assert set(last) == set(alive)
    assert {int(p): float(m) for p, s, m in folded.values.tolist() if s != "cancelled"} == {
        p: v[1] for p, v in alive.items()
    }
    c = outcome.counts
    assert c.records_read == sum(len(v) for v in snapshots.values()) and c.quarantined == 0
    assert c.filtered > 0 and c.balanced


def untyped_events(pairs: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"_rewind_row": pairs["_rewind_row"], "policy_id": pairs["policy_id"], "kind": "x"})


def test_bad_input_is_one_line_at_plan_time_and_produces_nothing(
    settings: Settings, spark: Any, tmp_path: Path
) -> None:
    from rewind.job.service import run_job

    history = rx.random_history(random.Random(2), 20, 3)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    topic = _topic(settings)

    def refused(spec: dict[str, Any], gate: str, words: str) -> None:
        with pytest.raises(PlanRefused) as err:
            run_job(settings, parse_spec(spec))
        line = str(err.value)
        assert "\n" not in line and f"gate {gate}" in line and words in line, line

    not_a_time = _history_source(url)
    not_a_time["reconstruct"] = {"time": "change_seq"}
    refused(rx.spec("bad-time", not_a_time, topic), "transition", "'change_seq' is int64, not a time")

    with sqlite3.connect(tmp_path / "legacy.db") as db:
        db.execute("INSERT INTO policy_history (policy_id, status, premium) VALUES (NULL, 'active', 1)")
    refused(rx.spec("null-key", _history_source(url), topic), "entity-key", "'policy_id' is null in 1 rows")
    with sqlite3.connect(tmp_path / "legacy.db") as db:
        db.execute("DELETE FROM policy_history WHERE policy_id IS NULL")

    untyped = rx.spec("untyped", _history_source(url), topic)
    untyped["translate"]["transition"] = "tests.test_reconstruct:untyped_events"
    refused(untyped, "transition", "no 'type' column")

    snaps = rx.sqlite_snapshots(
        tmp_path / "snaps.db", {"2024-01-31": [(1, "active", 1.0)], None: [(2, "active", 2.0)]}
    )  # type: ignore[dict-item]
    source = {
        "sqlite": {"url": snaps, "table": "policy_snapshots"},
        "key": "policy_id",
        "where": "TRUE",
        "reconstruct": {"mode": "snapshots", "time": "snapshot_at"},
    }
    refused(rx.spec("no-snapshot-time", source, topic), "snapshots", "snapshot(s) without a snapshot time")
    assert rf.read_topic(settings.kafka_config(), topic) == []  # nothing produced


def test_a_re_produce_carries_the_lineage_section(settings: Settings, spark: Any, tmp_path: Path) -> None:
    """``lineage:`` with a table source (no reconstruction): the source system and the effective
    time on every record, as headers."""
    history = rx.random_history(random.Random(4), 40, 1)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    topic = _topic(settings)
    source = {
        "sqlite": {"url": url, "table": "policy_history"},
        "key": "policy_id",
        "where": "change_seq = 0",
    }
    spec = {
        **rx.spec("reproduce-lineage", source, topic),
        "translate": {"function": "tests.reconstruct_fixtures:policy_row", "version": "1"},
        "lineage": {"source_system": "legacy-policies", "effective_time_column": "effective_from"},
    }
    _plan, outcome, records = _run(settings, spec)
    assert len(records) == 40 == outcome.counts.emitted
    first = {s.policy_id: s.effective_from for s in history if s.change_seq == 0}
    for r in records:
        assert r.headers["rewind.source-system"] == "legacy-policies"
        when = datetime.fromisoformat(r.headers["rewind.effective-time"].replace("Z", "+00:00"))
        assert when == first[int(r.key)]


def test_the_outcome_check_names_the_event_type_that_is_wrong(
    settings: Settings, spark: Any, tmp_path: Path
) -> None:
    """A transition whose PremiumChanged events are off by one: the verification fails, and its
    per-type report shows the mismatches among the entities with a PremiumChanged, while the
    policies that never changed premium match."""
    from rewind.verify.service import verify_run

    history = rx.random_history(random.Random(8), 60, 5)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    spec = rx.spec("reconstruct-bug", _history_source(url), _topic(settings))
    spec["translate"]["transition"] = "tests.reconstruct_fixtures:policy_events_premium_bug"
    _plan, outcome, records = _run(settings, spec)
    report = verify_run(settings, outcome.run_id)
    assert not report["passed"] and report["failed"] == ["outcome"]
    changed = {r.key for r in records if r.value["type"] == "PremiumChanged"}
    assert changed and report["by_type"]["PremiumChanged"]["entities"] == len(changed)
    assert report["by_type"]["PremiumChanged"]["matched"] == 0
    assert report["mismatched"] == len(changed) and report["matched"] == 60 - len(changed)
    bound = report["by_type"]["PolicyBound"]
    assert (bound["matched"], bound["mismatched"]) == (60 - len(changed), len(changed))
    example = report["examples"][0]
    assert example["replayed"]["premium"] == example["source"]["premium"] + 1


def test_an_iceberg_history_with_timestamps(settings: Settings, spark: Any) -> None:
    """The history in an Iceberg table (business time a timestamp column): the same events, and
    the reader's null-key count and distinct values the plan asks for."""
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.tables.plan import reader_of
    from rewind.tables.readers import Selection

    history = rx.random_history(random.Random(9), 50, 4)
    data = pa.table(
        {
            "policy_id": pa.array([s.policy_id for s in history], pa.int64()),
            "status": [s.status for s in history],
            "premium": [s.premium for s in history],
            "effective_from": pa.array([s.effective_from for s in history], pa.timestamp("us", "UTC")),
            "change_seq": pa.array([s.change_seq for s in history], pa.int64()),
        }
    )
    table = f"legacy_{uuid.uuid4().hex[:6]}.policy_history"
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
    catalog.create_table(table, schema=data.schema).append(data.take(list(reversed(range(data.num_rows)))))
    source = {**_history_source("unused"), "iceberg": {"table": table}}
    del source["sqlite"]
    spec = rx.spec("reconstruct-iceberg", source, _topic(settings))
    reader = reader_of(settings, parse_spec(spec))
    assert reader.null_keys(Selection(where="TRUE")) == 0
    assert sorted(reader.distinct(Selection(where="TRUE"), "change_seq")) == sorted(
        {s.change_seq for s in history}
    )
    _plan, outcome, records = _run(settings, spec)
    got: dict[str, list[tuple[str, str]]] = {}
    for r in records:
        got.setdefault(r.key, []).append((r.value["type"], r.headers["rewind.effective-time"][:10]))
    assert got == _expected_events(history)
    assert outcome.counts.records_read == len(history) == outcome.counts.emitted


def test_the_plan_warns_about_states_ordered_only_by_reading(settings: Settings, tmp_path: Path) -> None:
    from rewind.job.service import plan_job

    history = rx.random_history(random.Random(3), 40, 6)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    source = _history_source(url)
    source["reconstruct"] = {"time": "effective_from"}  # no tie column: same-day changes tie
    plan = plan_job(settings, parse_spec(rx.spec("ties", source, _topic(settings))))
    assert plan.ok
    assert any("tie with another state of their entity on effective_from" in n for n in plan.notes)
    with_tie = plan_job(settings, parse_spec(rx.spec("no-ties", _history_source(url), _topic(settings))))
    assert not any("tie with another state" in n for n in with_tie.notes)
