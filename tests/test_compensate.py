"""``rewind compensate RUN --topic T``: a consumer applying the corrections reaches the verified state.

A v1 projection (a translate that doubles odd SKUs' quantities and drops ``s1``) is promoted to
production; a fixed run (v2: right quantities, drops ``s0``) replaces it on its staging branch
(Iceberg) or staging table (SQLite, the embedded SQL sink) and is verified; these runs are made
once for the module. On each real broker, compensation writes, for every differing key, a
retraction and a correction (or one correction) keyed by the SKU, on murmur2's partition,
with the synthetic headers and the run id, in one transaction with its marker; a consumer that
starts from production's v1 rows and applies them ends with exactly the staging's rows. A
second compensate writes nothing; an unverified run is refused in one line.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import load_settings
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.brokers import READ_COMMITTED, TestBroker
from tests.kafka_util import create_topic

SKUS = 12
BASE_MS = 1_790_000_000_000  # 2026-09-21T14:13:20Z
OUT_PARTITIONS = 3


def wrong(events: pd.DataFrame) -> pd.DataFrame:
    odd = events["sku"].str[1:].astype(int) % 2 == 1
    rows = events.assign(qty=events["qty"].where(~odd, events["qty"] * 2))
    return rows[rows["sku"] != "s1"][["_rewind_row", "sku", "qty"]]


def right(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["sku"] != "s0"][["_rewind_row", "sku", "qty"]]


def spec(topic: str, function: str, version: str, sink: dict[str, Any]) -> Any:
    return parse_spec(
        {
            "name": "stock",
            "source": {
                "kafka": {"topics": [topic], "from": "2026-09-21T00:00:00Z", "to": "2026-09-22T00:00:00Z"}
            },
            "decode": {"format": "json", "schema": {"sku": "string", "qty": "long"}},
            "translate": {
                "function": f"tests.test_compensate:{function}",
                "version": version,
                "output_schema": {"sku": "string", "qty": "long"},
            },
            "key": ["sku"],
            "sink": sink,
            "verify": {
                "assertions": [
                    {"name": "no negative", "sql": "SELECT count(*) FROM staging WHERE qty < 0", "expect": 0}
                ]
            },
        }
    )


def read_topic(conf: dict[str, Any], topic: str, partitions: int = OUT_PARTITIONS) -> list[Any]:
    """Every committed record of ``topic``, each partition read to its end.

    The end is the consumer's end-of-partition event, not a quiet poll: a partition may be
    empty, and a read_committed reader never receives its last offset (the commit marker), so
    waiting for either costs a poll timeout per partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"t-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    out = []
    left = set(range(partitions))
    deadline = time.monotonic() + 60
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in left])
        while left:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(left)} never reached the end"
            for msg in consumer.consume(100, timeout=1.0):
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                else:
                    raise AssertionError(f"reading {topic}: {err}")
    finally:
        consumer.close()
    return out


def user_rows(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {r["sku"]: r["qty"] for r in rows}


@dataclass
class Case:
    state: Path
    run_id: str
    production: dict[str, int]
    verified: dict[str, int]

    def settings(self, bootstrap: str) -> Any:
        """The case's settings against the broker at ``bootstrap``."""
        return load_settings(
            env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(self.state)},
            cwd=self.state.parent,
        )

    @property
    def expected(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        return self.production, self.verified, self.differing

    @property
    def differing(self) -> list[str]:
        both = self.production.keys() | self.verified.keys()
        return sorted(k for k in both if self.production.get(k) != self.verified.get(k))


def make_case(tmp: Path, bootstrap: str, kind: str, pg_url: str | None = None) -> Case:
    """v1 promoted to production and v2 staged, refused while unverified, then verified (the
    runs read the session's broker; compensation, the part that talks to Kafka
    transactionally, runs on each broker)."""
    from confluent_kafka import Producer

    from rewind.catalog import load_catalog
    from rewind.job.compensate import CompensateRefused, compensate_run
    from rewind.job.components import make_sink
    from rewind.job.publish import promote_run
    from rewind.job.service import run_job
    from rewind.sinks.sql.publish import read_sides
    from rewind.verify.service import verify_run

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    conf = settings.kafka_config()
    source = f"stock-{uuid.uuid4().hex[:8]}"
    create_topic(conf, source, 1)
    producer = Producer(conf)
    for i in range(SKUS):
        value = json.dumps({"sku": f"s{i}", "qty": 10 + i}).encode()
        producer.produce(source, key=f"s{i}", value=value, timestamp=BASE_MS + i * 1000)
    assert producer.flush(10) == 0
    table = f"comp.stock_{source[-8:]}"
    sinks: dict[str, tuple[dict[str, Any], ...]] = {
        "iceberg": ({"iceberg": {"table": table}}, {"iceberg": {"table": table, "mode": "replace-window"}}),
        "sqlite": ({"postgres": {"table": "stock", "url": f"sqlite:///{tmp / 'model.db'}"}},) * 2,
        "postgres": ({"postgres": {"table": "stock", "url": pg_url}},) * 2,
    }
    first, second = sinks[kind]
    v1 = run_job(settings, spec(source, "wrong", "1", first))
    promote_run(settings, v1.run_id, force=True, reason="test: production's v1")
    v2_spec = spec(source, "right", "2", second)
    v2 = run_job(settings, v2_spec)
    if kind == "iceberg":
        rows = load_catalog(settings).load_table(table).scan().to_arrow().to_pylist()
        staged = jf.staging_table(settings, v2.staging).to_pylist()
    else:
        sink = make_sink(settings, v2_spec)
        before, after = read_sides(sink, sink.staging_from_dict(v2.staging))  # type: ignore[arg-type]
        sink.close()
        rows, staged = (before.to_pylist() if before is not None else []), after.to_pylist()
    case = Case(tmp / "state", v2.run_id, user_rows(rows), user_rows(staged))
    assert case.production != case.verified and "s0" in case.production and "s1" in case.verified

    with pytest.raises(CompensateRefused) as refused:  # bad input: one line, nothing written
        compensate_run(settings, v2.run_id, "anything")
    assert str(refused.value) == (
        f"run {v2.run_id} is not verified (it was never verified); "
        f"run `rewind verify {v2.run_id}` until it passes"
    )
    assert verify_run(settings, v2.run_id)["passed"]
    return case


def last_planned(settings: Any, run_id: str, topic: str) -> dict[str, Any]:
    """The run's last ``compensate-planned`` audit entry for ``topic``."""
    from rewind.job.compensate import PLANNED
    from rewind.ledger import Ledger

    with Ledger.open(settings.ledger) as ledger:
        return next(
            dict(e.details)
            for e in reversed(ledger.audit_log(run_id))
            if e.action == PLANNED and e.details.get("topic") == topic
        )


# one module-scoped case per sink, made once for both brokers (each its own fixture, so that
# neither test's setup carries both cases' runs)
@pytest.fixture(scope="module")
def iceberg_case(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> Case:
    return make_case(tmp_path_factory.mktemp("compensate-iceberg"), bootstrap, "iceberg")


@pytest.fixture(scope="module")
def sqlite_case(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> Case:
    return make_case(tmp_path_factory.mktemp("compensate-sqlite"), bootstrap, "sqlite")


@pytest.fixture(scope="module")
def postgres_case(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, pg_url: str) -> Case:
    return make_case(tmp_path_factory.mktemp("compensate-postgres"), bootstrap, "postgres", pg_url)


@pytest.mark.parametrize("kind", ["iceberg", "sqlite"])
def test_applying_the_compensation_to_v1_reaches_the_verified_state(
    broker: TestBroker, kind: str, request: pytest.FixtureRequest
) -> None:
    case: Case = request.getfixturevalue(f"{kind}_case")
    settings = case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    # both shapes on Iceberg; on SQLite the shape code is the same, one shape shows its rows
    for shape in ("retract-and-correct", "correction") if kind == "iceberg" else ("retract-and-correct",):
        out = f"stock-model-{uuid.uuid4().hex[:8]}"
        create_topic(conf, out, OUT_PARTITIONS)
        check_shape(settings, conf, case.run_id, out, shape, case.production, case.verified, case.differing)


def check_shape(
    settings: Any,
    conf: dict[str, Any],
    run_id: str,
    out: str,
    shape: Any,
    production: dict[str, int],
    verified: dict[str, int],
    differing: list[str],
) -> None:
    from rewind.job.compensate import compensate_run

    plan = compensate_run(settings, run_id, out, shape, dry_run=True)
    if shape == "correction":
        assert plan["counts"] == {"correction": len(differing)}
    else:
        assert plan["counts"] == retract_and_correct(production, verified, differing)
    assert read_topic(conf, out) == []  # a dry run writes nothing

    done = compensate_run(settings, run_id, out, shape)
    assert not done["already_done"] and done["counts"] == plan["counts"]
    msgs = read_topic(conf, out)
    assert applied(msgs, run_id, production, plan["messages"], done["units"]) == verified

    again = compensate_run(settings, run_id, out, shape)
    assert again["already_done"] and len(read_topic(conf, out)) == len(msgs)


def retract_and_correct(
    production: dict[str, int], verified: dict[str, int], differing: list[str]
) -> dict[str, int]:
    """The counts a retract-and-correct compensation writes: a retraction per differing key in
    production, a correction per differing key verified."""
    return {
        "retract": sum(1 for k in differing if k in production),
        "correct": sum(1 for k in differing if k in verified),
    }


def applied(
    msgs: list[Any], run_id: str, production: dict[str, int], messages: int, units: int
) -> dict[str, int]:
    """Production's rows with a compensation's messages applied, in each partition's order,
    after checking each message (keys, partitions, headers) and the markers (one per unit and
    the final one, on partition 0)."""
    from rewind.kafka.partitioner import partition_of

    data = [m for m in msgs if not any(h[0] == "rewind-marker" for h in m.headers() or [])]
    markers = [m for m in msgs if m not in data]
    assert len(data) == messages and all(m.partition() == 0 for m in markers)
    assert [m.key() for m in markers].count(b"rewind-compensate") == 1  # the final marker
    assert len(markers) == units + 1  # and one per unit, each in its unit's transaction
    state = dict(production)
    for m in sorted(data, key=lambda m: (m.partition(), m.offset())):
        headers = dict(m.headers())
        assert headers["rewind-synthetic"] == b"true" and headers["rewind-run-id"] == run_id.encode()
        assert m.partition() == partition_of(m.key(), OUT_PARTITIONS)
        body = json.loads(m.value())
        assert m.key() == body["key"]["sku"].encode() and headers["rewind-op"] == body["op"].encode()
        sku = body["key"]["sku"]
        if body["op"] == "retract":
            assert state.pop(sku) == body["row"]["qty"]
        elif body["op"] == "correct":
            state[sku] = body["row"]["qty"]
        else:
            assert (body["old"] or {}).get("qty") == state.get(sku)
            if body["new"] is None:
                del state[sku]
            else:
                state[sku] = body["new"]["qty"]
    return state


def test_a_missing_topic_is_refused_in_one_line_and_not_created(
    broker: TestBroker, iceberg_case: Case
) -> None:
    """Both embedded brokers create a topic a metadata request names when the client allows it
    (librdkafka's admin and producer clients do by default): the check must not."""
    from rewind.job.compensate import CompensateRefused, compensate_run
    from rewind.kafka.clients import cluster_metadata

    settings = iceberg_case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    missing = f"no-such-model-{uuid.uuid4().hex[:8]}"
    for dry_run in (True, False):
        with pytest.raises(CompensateRefused) as refused:
            compensate_run(settings, iceberg_case.run_id, missing, dry_run=dry_run)
        assert str(refused.value) == (
            f"--topic {missing}: no such topic on the broker; create it as the live producer's"
        )
    time.sleep(0.5)  # a creation, had there been one, is visible by now on either broker
    assert missing not in cluster_metadata(conf).topics

    small = f"stock-model-{uuid.uuid4().hex[:8]}"  # fewer partitions than the live producer's
    create_topic(conf, small, 2)
    with pytest.raises(CompensateRefused) as refused:
        compensate_run(settings, iceberg_case.run_id, small, partitions=OUT_PARTITIONS)
    assert str(refused.value) == (
        f"--topic {small} has 2 partition(s), fewer than the {OUT_PARTITIONS} the live producer places "
        "keys by (--partitions): add partitions to the topic or name the right count"
    )
    assert read_topic(conf, small, 2) == []


CHILD = """
import json, sys
from rewind.config import load_settings
from rewind.job.compensate import compensate_run
out = compensate_run(load_settings(), sys.argv[1], sys.argv[2], unit_messages=1)
print(json.dumps(out))
"""


def test_a_killed_compensate_run_again_writes_every_message_once(
    broker: TestBroker, iceberg_case: Case, tmp_path: Path, spark: Any
) -> None:
    """One unit per bucket (``unit_messages=1``): a task killed in its second unit after the
    unit's records and marker were flushed, not committed (the compensate fails); then the
    driver killed after every unit committed, before the final marker; then run to the end. A
    read_committed consumer sees every message once and reaches the verified rows; a fourth
    compensate writes nothing. Needs read_committed to hide the aborted attempt (noida-db).

    Only the driver's kill needs a child process; the task's kill and the last run are this
    process's, on the tests' session."""
    import subprocess
    import sys

    from rewind.job.compensate import compensate_run
    from rewind.spark.compensate_stage import CompensateStageError

    broker.require(READ_COMMITTED)
    settings = iceberg_case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    out = f"stock-model-{uuid.uuid4().hex[:8]}"
    create_topic(conf, out, OUT_PARTITIONS)
    once = str(tmp_path / "once")

    with (
        jf.in_tasks(spark, REWIND_FAULT="compensate-before-end:2", REWIND_FAULT_ONCE=once),
        pytest.raises(CompensateStageError, match="a Spark task of the compensation failed"),
    ):
        compensate_run(settings, iceberg_case.run_id, out, unit_messages=1)
    driver_killed = subprocess.run(
        [sys.executable, "-c", CHILD, iceberg_case.run_id, out],
        cwd=tmp_path,
        env=jf.child_env(settings, REWIND_FAULT_ONCE=once, REWIND_FAULT="compensate-before-final-marker"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert driver_killed.returncode == -9, driver_killed.stderr[-3000:]
    done = compensate_run(settings, iceberg_case.run_id, out, unit_messages=1)
    assert not done["already_done"] and done["units_done_before"] == done["units"] > 2

    msgs = read_topic(conf, out)
    data = [m for m in msgs if not any(h[0] == "rewind-marker" for h in m.headers() or [])]
    ops = sorted((m.key(), dict(m.headers())["rewind-op"]) for m in data)
    assert len(data) == done["messages"] and len(set(ops)) == len(ops)  # every message once
    state = dict(iceberg_case.production)
    for m in sorted(data, key=lambda m: (m.partition(), m.offset())):
        body = json.loads(m.value())
        if body["op"] == "retract":
            assert state.pop(body["key"]["sku"]) == body["row"]["qty"]
        else:
            state[body["key"]["sku"]] = body["row"]["qty"]
    assert state == iceberg_case.verified
    assert len(msgs) == len(data) + done["units"] + 1  # a marker per unit, and the final one

    again = compensate_run(settings, iceberg_case.run_id, out)
    assert again["already_done"] and len(read_topic(conf, out)) == len(msgs)


@contextlib.contextmanager
def sides_through_the_driver(spark: Any, sink: Any, staging: Any) -> Iterator[tuple[Any, Any]]:
    """What compensate did before the tasks read the SQL sides: both tables read in one
    transaction through the driver (``read_sides``), then handed to Spark."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from rewind.sinks.sql.publish import read_sides

    before, after = read_sides(sink, staging)
    if after.num_rows:
        new = spark.createDataFrame(after)
    else:
        new = spark.createDataFrame([], from_arrow_schema(after.schema))
    old = spark.createDataFrame(before) if before is not None and before.num_rows else None
    yield (old if old is not None else spark.createDataFrame([], new.schema)), new


def test_a_postgres_compensate_read_in_tasks_writes_what_the_driver_read_wrote(
    broker: TestBroker, postgres_case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL read model: the sides read by the tasks (slices under the driver's exported
    snapshot) give, message for message, what the sides read through the driver gave, in both
    shapes; and a consumer applying them reaches the verified rows."""
    from rewind.job.compensate import compensate_run
    from rewind.sinks.sql import sides

    case = postgres_case
    settings = case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    monkeypatch.setattr(sides, "SLICE_PAGES", 1)  # a slice per page: more than one task per side

    def messages(topic: str) -> list[tuple[Any, ...]]:
        return sorted(
            (m.partition(), m.key(), m.value(), tuple(m.headers() or []))
            for m in read_topic(conf, topic)
            if not any(h[0] == "rewind-marker" for h in m.headers() or [])
        )

    for shape in ("retract-and-correct", "correction"):
        in_tasks, through_driver = (f"stock-model-{uuid.uuid4().hex[:8]}" for _ in range(2))
        create_topic(conf, in_tasks, OUT_PARTITIONS)
        create_topic(conf, through_driver, OUT_PARTITIONS)
        done = compensate_run(settings, case.run_id, in_tasks, shape)
        with monkeypatch.context() as patch:
            patch.setattr(sides, "open_sides", sides_through_the_driver)
            before = compensate_run(settings, case.run_id, through_driver, shape)
        assert done["counts"] == before["counts"] and done["units"] == before["units"]
        got = messages(in_tasks)
        assert got == messages(through_driver) and len(got) == done["messages"] > 0
    out = f"stock-model-{uuid.uuid4().hex[:8]}"
    create_topic(conf, out, OUT_PARTITIONS)
    check_shape(settings, conf, case.run_id, out, "retract-and-correct", *case.expected)


def test_an_interrupted_compensate_is_finished_only_over_the_same_sides() -> None:
    """The planned units of an interrupted compensate are taken again only when its sides are
    the same (snapshots or row counts) and its units were cut by hash; otherwise one line."""
    from rewind.job.compensate import CompensateRefused, _planned_units

    sides = {"production": 11, "staging": 12}
    planned = {"units": 7, "sides": sides}
    assert _planned_units(planned, "r1", "t", dict(sides)) == 7
    with pytest.raises(CompensateRefused) as refused:
        _planned_units(planned, "r1", "t", {"production": 11, "staging": 13})
    assert str(refused.value).startswith(
        "run r1: production or staging changed since the interrupted compensate to t"
    )
    with pytest.raises(CompensateRefused) as refused:
        _planned_units({"units": [{"id": "p0-b0-4"}], "sides": sides}, "r1", "t", sides)
    assert "planned by an earlier Rewind" in str(refused.value)


def test_a_compensate_killed_after_its_final_marker_is_done_when_run_again(
    broker: TestBroker, iceberg_case: Case
) -> None:
    """Killed after the final marker and before the ledger's ``compensated`` entry: the ledger
    still shows the compensate planned, the topic shows it done. Run again, it writes nothing
    and reports what the final marker says."""
    from rewind.job.compensate import PLANNED, compensate_run
    from rewind.ledger import Ledger

    settings = iceberg_case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    out = f"stock-model-{uuid.uuid4().hex[:8]}"
    create_topic(conf, out, OUT_PARTITIONS)
    done = compensate_run(settings, iceberg_case.run_id, out)
    planned = last_planned(settings, iceberg_case.run_id, out)
    with Ledger.open(settings.ledger) as ledger:  # as if the process died before "compensated"
        ledger.audit(iceberg_case.run_id, PLANNED, planned)
    again = compensate_run(settings, iceberg_case.run_id, out)
    assert again["already_done"] and len(read_topic(conf, out)) == done["messages"] + done["units"] + 1
    assert (again["keys"], again["messages"], again["counts"]) == (
        done["keys"],
        done["messages"],
        done["counts"],
    )


def test_a_compensate_planned_with_the_key_hash_cut_is_finished_with_it(
    broker: TestBroker, iceberg_case: Case, spark: Any
) -> None:
    """An interrupted compensate planned before units were cut as the join cuts them (its
    ``compensate-planned`` entry names no cut) is finished with the units it planned: each
    unit's keys are those of ``pmod(hash(key), units)``, not the join's; a new compensate cuts
    by the join. Both write every differing key once."""
    from pyspark.sql import functions as F

    from rewind.job.compensate import PLANNED, compensate_run
    from rewind.kafka.compensation import read_markers
    from rewind.ledger import Ledger
    from rewind.spark.compensate_stage import unit_id

    settings = iceberg_case.settings(broker.bootstrap)
    conf = settings.kafka_config()
    keys = spark.createDataFrame([(k,) for k in iceberg_case.differing], "sku string")

    def keys_per_unit(units: int, by: Any) -> dict[str, int]:
        got = keys.groupBy(F.pmod(by, F.lit(units)).alias("u")).count().collect()
        return {unit_id(r["u"], units): r["count"] for r in got}

    topics = {cut: f"stock-model-{uuid.uuid4().hex[:8]}" for cut in ("join", "key-hash")}
    for topic in topics.values():
        create_topic(conf, topic, OUT_PARTITIONS)
    joined = compensate_run(settings, iceberg_case.run_id, topics["join"], unit_messages=4)
    planned = last_planned(settings, iceberg_case.run_id, topics["join"])
    assert planned["cut"] == "join" and planned["units"] > 2
    earlier = {k: v for k, v in planned.items() if k != "cut"} | {"topic": topics["key-hash"]}
    with Ledger.open(settings.ledger) as ledger:  # as an earlier Rewind planned it
        ledger.audit(iceberg_case.run_id, PLANNED, earlier)
    hashed = compensate_run(settings, iceberg_case.run_id, topics["key-hash"])
    units = int(planned["units"])
    join_hash = F.hash(F.coalesce(F.col("sku"), F.lit("")), F.col("sku").isNull())
    expected = {"join": keys_per_unit(units, join_hash), "key-hash": keys_per_unit(units, F.hash("sku"))}
    assert expected["join"] != expected["key-hash"]  # the two cuts differ on these keys
    for cut, topic in topics.items():
        markers = read_markers(conf, topic, iceberg_case.run_id)
        assert {u: int(body["keys"]) for u, body in markers.units.items()} == expected[cut]
    for done in (joined, hashed):
        assert done["keys"] == len(iceberg_case.differing) and not done["already_done"]
