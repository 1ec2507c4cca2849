"""A shadow migration of an Iceberg read model, on real parts, while orders keep arriving.

A producer writes keyed order events while the shadow is rebuilt and catches up; the live
service (a consumer in a thread, committing the live group's offsets; it assigns its
partitions, so it needs no group join) upserts each batch into v1, an Iceberg table, with
pyiceberg's upsert. The shadow rebuilds v2 from archive + log as a new Iceberg table upserted on
the key and is killed -9 in its tail (after a micro-batch's commit, before Spark marked it
done); started again (in this process, on the shared Spark session) it skips the replayed
batch and follows the topic until caught up,
is verified against v1 (the producer paused: the settle time under live writes is tested on
SQLite), cut, and swapped in by one transaction of the SQL catalog. Refused on the way, in one
line with nothing changed: dual-write (Iceberg is cut over hard), a swap after v1 moved past
the cut line, a decommission inside the monitoring period. The swap is rolled back and
promoted again; the live service resumes from the cut line on the swapped table (the overlap
re-applied idempotently), and the final table equals a clean recomputation of all events: no
order missing or doubled. Then v1 is decommissioned. Runs on noida-db, as the other shadow
tests do; the data is small.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from confluent_kafka import Consumer, TopicPartition

from rewind.catalog import load_catalog
from rewind.config import load_settings
from rewind.errors import RewindError
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.kafka_util import gather
from tests.shadow_fixtures import prepared, refused, shadow_env

NAME = "shadow-ice"
SHADOW = {
    "lag_threshold": 100,
    "caught_up_for_s": 1,
    "settle_s": 10,
    "verify_passes": 1,
    "rewind_by": 5,
    "monitoring_s": 4,
}
V1 = "app.orders"


BATCH_S = 3.0
"""How long the live services gather a batch (:func:`tests.kafka_util.gather`): each batch is
an Iceberg upsert and commit (a scan, a copy-on-write rewrite, a new snapshot); at 10 events a
second a batch of three seconds is a third of the commits of a one-second one."""


class IcebergLive(threading.Thread):
    """The live service: reads both partitions from the group's committed offsets (or 0), upserts
    each batch's last event per order into the Iceberg table named, commits the offsets."""

    def __init__(self, conf: dict[str, Any], topic: str, group: str, settings: Any, table: str) -> None:
        super().__init__(daemon=True)
        self.conf, self.topic, self.group, self.settings, self.table = conf, topic, group, settings, table
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.applied = 0

    def run(self) -> None:
        try:
            consumer = Consumer({**self.conf, "group.id": self.group, "enable.auto.commit": False})
            parts = [TopicPartition(self.topic, p) for p in (0, 1)]
            found = consumer.committed(parts, timeout=10)
            consumer.assign([TopicPartition(self.topic, tp.partition, max(tp.offset, 0)) for tp in found])
            catalog = load_catalog(self.settings)
            table = catalog.load_table(self.table)
            try:
                while not self.halt.is_set():
                    msgs = gather(consumer, BATCH_S, self.halt)
                    if not msgs:
                        continue
                    last = {int(json.loads(m.value())["order_id"]): m for m in msgs}
                    rows = [sf.row_of(m) for m in last.values()]
                    for row in rows:
                        row["_rewind_source_timestamp"] = _ts(row["_rewind_source_timestamp"])
                        row.update(_lineage_defaults())  # v2 (after the swap) requires them
                    arrow = table.schema().as_arrow()
                    batch = pa.Table.from_pylist(
                        [{f.name: r.get(f.name) for f in arrow} for r in rows], schema=arrow
                    )
                    table = catalog.load_table(self.table)  # by name: the swap replaces it
                    table.upsert(batch, join_cols=["order_id"])
                    ends = {}
                    for m in msgs:
                        ends[m.partition()] = m.offset() + 1
                    consumer.commit(
                        offsets=[TopicPartition(self.topic, p, o) for p, o in ends.items()],
                        asynchronous=False,
                    )
                    self.applied += len(msgs)
            finally:
                consumer.close()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert self.error is None, self.error


def _caught_up(settings: Any) -> bool:
    from rewind.shadow.status import shadow_status

    try:
        return bool(shadow_status(settings, NAME)["caught_up"])
    except RewindError:  # the shadow's history run has not started yet
        return False


def _lineage_defaults() -> dict[str, Any]:
    from datetime import UTC, datetime

    return {
        "_rewind_extracted_at": datetime.now(UTC),
        "_rewind_transform": "orders-service",
        "_rewind_transform_version": "1",
        "_rewind_run_id": "live",
        "_rewind_synthetic": False,
    }


def _ts(text: str) -> Any:
    from datetime import UTC, datetime

    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)


def wait_for(what: str, check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def rows_of(settings: Any, table: str) -> list[tuple[int, str, float, int, int]]:
    data = load_catalog(settings).load_table(table).scan().to_arrow().to_pylist()
    return [
        (r["order_id"], r["status"], r["amount"], r["_rewind_source_partition"], r["_rewind_source_offset"])
        for r in data
    ]


def names(settings: Any) -> list[str]:
    return sorted(".".join(t) for t in load_catalog(settings).list_tables("app"))


def test_iceberg_shadow_rebuilds_verifies_and_swaps_in_v2(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    from rewind.job.planner import build_plan
    from rewind.job.publish import promote_run, rollback_run
    from rewind.shadow.cutline import cut_shadow
    from rewind.shadow.cutover import cutover_hard
    from rewind.shadow.lifecycle import cutover_dual_write, decommission
    from rewind.shadow.start import start_shadow
    from rewind.shadow.status import shadow_status
    from rewind.shadow.verify import verify_shadow
    from rewind.spec import load_spec

    _, conf, topic, _, spec_path = prepared(noida_broker, spark, tmp_path, NAME, SHADOW)
    settings = load_settings(env=shadow_env(tmp_path, noida_broker.bootstrap), cwd=tmp_path)
    schema = build_plan(settings, load_spec(spec_path)).output_schema()  # the SQL spec: v1 does not exist yet
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("app")
    # v1 is the live service's table: the job's columns, lineage ones nullable (the service fills
    # only the source's); v2 is created by the shadow with the job's own schema
    catalog.create_table(V1, schema=pa.schema([f.with_nullable(True) for f in schema]))
    data = yaml.safe_load(spec_path.read_text())
    data["sink"] = {"iceberg": {"table": V1}}
    spec = load_spec(sf.write_spec(spec_path, data))
    group = f"live-{topic}"

    live = IcebergLive(conf, topic, group, settings, V1)
    live.start()
    producer = sf.LiveProducer(conf, topic, 600, rate=10)
    producer.start()
    # the history into v2 here, on the warm shared Spark session (the child's cold JVM took
    # longer over it), and one lag sample of the tail
    first = start_shadow(settings, spec, stop=lambda _: True, sample_s=0.5)
    assert first["state"] == "tailing" and first["replayed"] == 0, first
    # the tail continued in a child, killed -9 after a micro-batch's Iceberg commit, before Spark
    # marked the batch done: the restarted tail gets the batch again from Spark and finds its
    # units in v2's snapshots
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    killed = sf.run_child(  # the limit counts from the tail's start, the child's JVM start included
        env, spec_path, tmp_path / "never", tmp_path, fault="shadow-after-batch-commit:2", limit=300
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    tail = sf.Tail(settings, spec)
    tail.start()
    try:
        wait_for("caught up", lambda: tail.failed() or _caught_up(settings), timeout=300)
        wait_for("v1 holds the first 600 events", lambda: live.applied >= 600 or not live.is_alive())
    finally:
        # the producer pauses, the live service and the tail drain: the verification compares
        # two still tables (in one process on 2 cores, either side may lag past a settle time)
        last = producer.stop()
        wait_for("v1 at the log end", lambda: live.applied >= last or not live.is_alive())
        wait_for("v2 at the log end", lambda: tail.failed() or shadow_status(settings, NAME)["max_lag"] == 0)
    try:
        checked = verify_shadow(settings, NAME)
        assert checked["results"][0]["passed"] is True, json.dumps(checked["results"], default=str)[-3000:]
        assert checked["go"] is True and checked["results"][0]["rows"]["staging"] > 0
        refused(lambda: cutover_dual_write(settings, NAME), "dual-write is for SQL", "nothing was changed")
    finally:
        live.stop()
        tail.stop()
    assert tail.result["replayed"] == 1, tail.result
    status = shadow_status(settings, NAME)
    v2 = status["v2"]
    rows = rows_of(settings, v2)
    assert len(rows) == len({r[0] for r in rows}) == sf.ORDERS, "v2 holds every order once"

    cut = cut_shadow(settings, NAME)
    assert cut["holds"] is True and cut["v1_base"]["table"] == V1
    assert all(p["overlap"] == 5 and p["v2_ranges"] == [[0, p["v2_end"]]] for p in cut["partitions"])
    reread = sum(p["overlap"] for p in cut["partitions"])

    # v1 moves after the cut line: the swap is refused, both names stay; v1 put back, it goes through
    before = names(settings)
    v1 = catalog.load_table(V1)
    base = v1.metadata_location
    v1.append(v1.scan(limit=1).to_arrow())
    refused(lambda: cutover_hard(settings, NAME), "v1 moved after the cut line", "nothing was swapped")
    assert names(settings) == before and catalog.load_table(v2).metadata_location
    _point(catalog, "orders", base)

    done = cutover_hard(settings, NAME)
    assert done["state"] == "cutover" and done["swap"]["after"]["table"] == V1
    prev = f"{V1}__rewind_prev_{status['run_id'].replace('-', '_')}"
    assert v2 not in names(settings) and prev in names(settings)
    assert sorted(rows_of(settings, V1)) == sorted(rows)

    # rollback swaps v1 back (v2 keeps its rows under its own name); promoting again swaps v2 in
    rollback_run(settings, status["run_id"])
    assert v2 in names(settings) and prev not in names(settings)
    assert sorted(rows_of(settings, v2)) == sorted(rows)
    promote_run(settings, status["run_id"])
    assert v2 not in names(settings) and prev in names(settings)
    refused(lambda: decommission(settings, NAME), "monitored until", "nothing was dropped")

    # the live service resumes from the cut line on the swapped table while orders keep coming
    live = IcebergLive(conf, topic, group, settings, V1)
    live.start()
    sf.produce_range(conf, topic, last, last + 60)
    expected = sf.expected_rows(conf, topic)
    try:
        wait_for(
            "the live service at the log end", lambda: live.applied >= reread + 60 or not live.is_alive()
        )
    finally:
        live.stop()
    final = rows_of(settings, V1)
    assert len(final) == len({r[0] for r in final}) == sf.ORDERS
    assert {r[0]: (r[1], r[2], r[3], r[4]) for r in final} == expected
    assert live.applied == reread + 60, "the live service resumed at the cut line (5 before its offsets)"

    gone = _after_monitoring(settings)
    assert gone["state"] == "decommissioned" and gone["dropped"]["dropped"] == [prev]
    assert prev not in names(settings) and V1 in names(settings)


def _after_monitoring(settings: Any) -> dict[str, Any]:
    """``decommission`` once the monitoring period is over (refused until then)."""
    from rewind.shadow.lifecycle import decommission

    deadline = time.monotonic() + 15
    while True:
        try:
            return decommission(settings, NAME)
        except RewindError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _point(catalog: Any, table: str, location: str) -> None:
    """Put v1's catalog entry back at ``location`` (an operator's undo of the stray write)."""
    from pyiceberg.catalog.sql import IcebergTables
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session, session.begin():
        session.execute(
            update(IcebergTables)
            .where(IcebergTables.table_namespace == "app", IcebergTables.table_name == table)
            .values(metadata_location=location)
        )
