"""A shadow migration of a folded Iceberg read model (order totals), killed -9 and cut over.

The live service folds each batch of events into v1 itself (reads its rows of the batch's
orders, adds the amounts and events, keeps the last status, upserts them: a read-modify-write
of its own table, from the group's committed offsets). The shadow rebuilds v2 from archive +
log with ``translate.fold``: killed -9 in its history (before the folded rows' commit) and in
its tail (after a micro-batch's commit, before Spark marked it done), each time started again.
Then v2 is verified against v1, cut (the cut line is where v2 ends: a fold absorbs no
overlap, so the group is moved exactly there), swapped in, rolled back and promoted again; the
live service resumes on the swapped table from the cut line while orders keep coming, and the
final table equals a clean recomputation of the fold over every event: no event counted twice
and none missed. Then v1 is decommissioned. Runs on noida-db; the data is small.
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
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.kafka_util import gather
from tests.shadow_fixtures import prepared, shadow_env
from tests.shadow_fold_fixtures import expected_totals, folded_spec
from tests.test_shadow_iceberg import BATCH_S, _lineage_defaults, _ts, wait_for

NAME = "fold-ice"
# micro-batches a second apart (the fixtures use 0.5 s): each is a Spark job and an Iceberg commit
SHADOW = {
    "lag_threshold": 100,
    "caught_up_for_s": 1,
    "settle_s": 10,
    "verify_passes": 1,
    "monitoring_s": 4,
    "trigger_s": 1.0,
}
V1 = "app.totals"


class FoldingLive(threading.Thread):
    """The live service: per batch, reads its table's rows of the batch's orders, folds the
    batch's events into them, upserts them, then commits the group's offsets."""

    def __init__(self, conf: dict[str, Any], topic: str, group: str, settings: Any) -> None:
        super().__init__(daemon=True)
        self.conf, self.topic, self.group, self.settings = conf, topic, group, settings
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.applied = 0

    def run(self) -> None:
        from pyiceberg.expressions import In

        try:
            consumer = Consumer({**self.conf, "group.id": self.group, "enable.auto.commit": False})
            parts = [TopicPartition(self.topic, p) for p in (0, 1)]
            found = consumer.committed(parts, timeout=10)
            consumer.assign([TopicPartition(self.topic, tp.partition, max(tp.offset, 0)) for tp in found])
            catalog = load_catalog(self.settings)
            try:
                while not self.halt.is_set():
                    msgs = gather(consumer, BATCH_S, self.halt)
                    if not msgs:
                        continue
                    table = catalog.load_table(V1)  # by name: the swap replaces it
                    orders = sorted({int(json.loads(m.value())["order_id"]) for m in msgs})
                    now = table.scan(row_filter=In("order_id", orders)).to_arrow().to_pylist()
                    rows = {r["order_id"]: r for r in now}
                    for m in msgs:
                        v, at = json.loads(m.value()), sf.row_of(m)["_rewind_source_timestamp"]
                        row = rows.setdefault(int(v["order_id"]), {"amount": 0.0, "events": 0})
                        row.update(
                            order_id=int(v["order_id"]),
                            status=v["status"],
                            amount=row["amount"] + float(v["amount"]),
                            events=row["events"] + 1,
                            _rewind_event_id=f"{m.topic()}/{m.partition()}/{m.offset()}",
                            _rewind_source_topic=m.topic(),
                            _rewind_source_partition=m.partition(),
                            _rewind_source_offset=m.offset(),
                            _rewind_source_timestamp=_ts(at),
                            **_lineage_defaults(),
                        )
                    arrow = table.schema().as_arrow()
                    batch = pa.Table.from_pylist(
                        [{f.name: r.get(f.name) for f in arrow} for r in rows.values()], schema=arrow
                    )
                    table.upsert(batch, join_cols=["order_id"])
                    ends = {m.partition(): m.offset() + 1 for m in msgs}
                    offsets = [TopicPartition(self.topic, p, o) for p, o in ends.items()]
                    consumer.commit(offsets=offsets, asynchronous=False)
                    self.applied += len(msgs)
            finally:
                consumer.close()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert self.error is None, self.error


def totals(settings: Any, table: str) -> dict[int, tuple[str, float, int, int, int]]:
    data = load_catalog(settings).load_table(table).scan().to_arrow().to_pylist()
    assert len(data) == len({r["order_id"] for r in data}), "an order twice"
    return {
        r["order_id"]: (
            r["status"],
            r["amount"],
            r["events"],
            r["_rewind_source_partition"],
            r["_rewind_source_offset"],
        )
        for r in data
    }


def names(settings: Any) -> list[str]:
    return sorted(".".join(t) for t in load_catalog(settings).list_tables("app"))


def test_a_folded_iceberg_shadow_killed_twice_cuts_over_with_no_event_twice(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    from rewind.job.planner import build_plan
    from rewind.job.publish import promote_run, rollback_run
    from rewind.shadow.cutline import cut_shadow
    from rewind.shadow.cutover import cutover_hard
    from rewind.shadow.start import start_shadow
    from rewind.shadow.status import shadow_status
    from rewind.shadow.verify import verify_shadow
    from rewind.spec import load_spec

    _, conf, topic, _, spec_path = prepared(noida_broker, spark, tmp_path, NAME, SHADOW)
    settings = load_settings(env=shadow_env(tmp_path, noida_broker.bootstrap), cwd=tmp_path)
    data = folded_spec(yaml.safe_load(spec_path.read_text()))
    sql_spec = load_spec(sf.write_spec(spec_path, data))
    schema = build_plan(settings, sql_spec).output_schema()
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("app")
    catalog.create_table(V1, schema=pa.schema([f.with_nullable(True) for f in schema]))
    data["sink"] = {"iceberg": {"table": V1}}
    spec = load_spec(sf.write_spec(spec_path, data))
    group = f"live-{topic}"
    env = shadow_env(tmp_path, noida_broker.bootstrap)

    live = FoldingLive(conf, topic, group, settings)
    live.start()
    producer = sf.LiveProducer(conf, topic, 600, rate=10)
    producer.start()
    try:
        killed = sf.run_child(env, spec_path, tmp_path / "never", tmp_path, fault="before-fold-commit")
        assert killed.returncode == -9, killed.stderr[-3000:]
        first = start_shadow(settings, spec, stop=lambda _: True, sample_s=0.5)  # the history resumed
        assert first["state"] == "tailing" and first["replayed"] == 0, first
        killed = sf.run_child(
            env, spec_path, tmp_path / "never", tmp_path, fault="shadow-after-batch-commit:2", limit=300
        )
        assert killed.returncode == -9, killed.stderr[-3000:]
        tail = sf.Tail(settings, spec)
        tail.start()
        try:
            wait_for("caught up", lambda: tail.failed() or shadow_status(settings, NAME)["caught_up"], 300)
        finally:
            last = producer.stop()
        wait_for("v1 at the log end", lambda: live.applied >= last or not live.is_alive())
        wait_for("v2 at the log end", lambda: tail.failed() or shadow_status(settings, NAME)["max_lag"] == 0)
        checked = verify_shadow(settings, NAME)
        assert checked["results"][0]["passed"] is True, json.dumps(checked["results"], default=str)[-3000:]
    finally:
        live.stop()
        if producer.is_alive():
            producer.stop()
    tail.stop()
    assert tail.result["replayed"] == 1, tail.result
    status = shadow_status(settings, NAME)
    expected = expected_totals(conf, topic)
    assert totals(settings, status["v2"]) == expected, "v2 is the fold of every event, once"

    cut = cut_shadow(settings, NAME)
    assert cut["holds"] is True
    assert all(p["cut"] == p["v2_end"] and p["v2_ranges"] == [[0, p["v2_end"]]] for p in cut["partitions"])
    done = cutover_hard(settings, NAME)
    assert done["state"] == "cutover" and V1 in names(settings)
    rollback_run(settings, status["run_id"])
    assert status["v2"] in names(settings)
    promote_run(settings, status["run_id"])
    assert totals(settings, V1) == expected

    # the service resumes on the swapped table from the cut line (v2's end) while orders come
    live = FoldingLive(conf, topic, group, settings)
    live.start()
    sf.produce_range(conf, topic, last, last + 60)
    try:
        wait_for("the live service at the log end", lambda: live.applied >= 60 or not live.is_alive())
        time.sleep(0.5)
    finally:
        live.stop()
    assert live.applied == 60, "resumed exactly at the cut line: nothing re-read, nothing skipped"
    assert totals(settings, V1) == expected_totals(conf, topic)
    gone = _after_monitoring_of(settings)
    assert gone["state"] == "decommissioned"


def _after_monitoring_of(settings: Any) -> dict[str, Any]:
    from rewind.errors import RewindError
    from rewind.shadow.lifecycle import decommission

    deadline = time.monotonic() + 15
    while True:
        try:
            return decommission(settings, NAME)
        except RewindError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
