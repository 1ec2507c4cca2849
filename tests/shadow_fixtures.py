"""Shared parts of the shadow tests: a keyed order stream, its spec, and a clean recomputation.

Orders are keyed: every event of order ``k`` goes to partition ``k % 2`` (as a keyed
producer would put it), so the last event of an order is the one with the highest offset in
its partition, and a read model upserted on ``order_id`` must hold exactly that event.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, Producer

from rewind.config import Settings, load_settings
from rewind.errors import RewindError
from rewind.history import archive_once
from tests import cli_in_process
from tests.job_fixtures import QUICK_SPARK_CONF
from tests.kafka_util import create_topic, gather

ROOT = Path(__file__).resolve().parent.parent
ORDERS = 400


def event(seq: int) -> tuple[int, bytes, bytes]:
    """The ``seq``-th event: order ``seq % ORDERS``, its amount is the sequence number."""
    order = seq % ORDERS
    value = {"order_id": order, "status": "paid" if seq % 3 else "open", "amount": float(seq)}
    return order % 2, str(order).encode(), json.dumps(value).encode()


def produce_range(conf: dict[str, Any], topic: str, first: int, last: int) -> None:
    producer = Producer({**conf, "linger.ms": 5})
    for seq in range(first, last):
        partition, key, value = event(seq)
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(30) == 0


class LiveProducer(threading.Thread):
    """Keeps writing events at ``rate`` per second until stopped; ``next_seq`` is the next one."""

    def __init__(self, conf: dict[str, Any], topic: str, first: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.conf, self.topic, self.next_seq, self.rate = conf, topic, first, rate
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = Producer({**self.conf, "linger.ms": 5})
            while not self.halt.is_set():
                partition, key, value = event(self.next_seq)
                producer.produce(self.topic, value, key, partition=partition)
                producer.poll(0)
                self.next_seq += 1
                time.sleep(1 / self.rate)
            assert producer.flush(30) == 0
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> int:
        self.halt.set()
        self.join(60)
        assert self.error is None, self.error
        return self.next_seq


def spec_data(
    name: str, topic: str, archive: str, declared: int, db: Path, table: str, group: str
) -> dict[str, Any]:
    return {
        "name": name,
        "source": {
            "history": {
                "topics": [topic],
                "archive": archive,
                "declared_log_start": {topic: {"0": declared, "1": declared}},
            }
        },
        "decode": "json",
        "translate": {"function": "tests.job_fixtures:order_amounts", "version": "1"},
        "key": ["order_id"],
        "sink": {"postgres": {"table": table, "url": f"sqlite:///{db}"}},
        "run": {"work_unit_records": 100},
        "shadow": {"live_group": group, "lag_threshold": 0, "caught_up_for_s": 1, "trigger_s": 0.5},
    }


def write_spec(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def expected_rows(conf: dict[str, Any], topic: str) -> dict[int, tuple[str, float, int, int]]:
    """A clean recomputation: read every event from Kafka, keep each order's last one."""
    consumer = Consumer(
        {
            **conf,
            "group.id": f"check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    from confluent_kafka import TopicPartition

    low_high = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in (0, 1)]
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    out: dict[int, tuple[str, float, int, int]] = {}
    seen = {0: 0, 1: 0}
    deadline = time.monotonic() + 60
    while any(seen[p] < low_high[p][1] for p in (0, 1)) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        v = json.loads(msg.value())
        out[int(v["order_id"])] = (v["status"], float(v["amount"]), msg.partition(), msg.offset())
        seen[msg.partition()] = msg.offset() + 1
    consumer.close()
    return out


def table_rows(db: Path, table: str) -> list[tuple[int, str, float, int, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            f'SELECT order_id, status, amount, _rewind_source_partition, _rewind_source_offset FROM "{table}"'
        ).fetchall()


def committed_units(db: Path, run_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [
            r[0] for r in conn.execute("SELECT unit_id FROM rewind_unit_commits WHERE run_id = ?", (run_id,))
        ]


def create_v1(settings: Any, spec: Any, db: Path, table: str) -> None:
    """v1 as the live service's read model: the job's output columns (lineage included), unique on the key."""
    from rewind.job.planner import build_plan
    from rewind.sinks.sql.types import sqlite_type

    schema = build_plan(settings, spec).output_schema()
    cols = ", ".join(f'"{f.name}" {sqlite_type(f.type)}' for f in schema)
    with sqlite3.connect(db) as conn:
        conn.execute(f'CREATE TABLE "{table}" ({cols})')
        conn.execute(f'CREATE UNIQUE INDEX "{table}_key" ON "{table}" (order_id)')


UPSERT = (
    'INSERT INTO "{table}" (order_id, status, amount, _rewind_event_id, _rewind_source_topic, '
    "_rewind_source_partition, _rewind_source_offset, _rewind_source_timestamp) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (order_id) DO UPDATE SET status = excluded.status, "
    "amount = excluded.amount, _rewind_event_id = excluded._rewind_event_id, "
    "_rewind_source_partition = excluded._rewind_source_partition, "
    "_rewind_source_offset = excluded._rewind_source_offset, "
    "_rewind_source_timestamp = excluded._rewind_source_timestamp"
)


def row_of(m: Any) -> dict[str, Any]:
    """What the live service writes for one event (the job's translate, and the source lineage)."""
    from datetime import UTC, datetime

    v = json.loads(m.value())
    at = datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return {
        "order_id": int(v["order_id"]),
        "status": v["status"],
        "amount": float(v["amount"]),
        "_rewind_event_id": f"{m.topic()}/{m.partition()}/{m.offset()}",
        "_rewind_source_topic": m.topic(),
        "_rewind_source_partition": m.partition(),
        "_rewind_source_offset": m.offset(),
        "_rewind_source_timestamp": at,
    }


class LiveConsumer(threading.Thread):
    """The live service: a consumer group that upserts each event's row into v1, then commits.

    The row is what the job's translate makes of the event (order_id, status, amount) with the
    source lineage the shadow's verification needs (its settle time reads the source time).
    """

    def __init__(
        self, conf: dict[str, Any], topic: str, group: str, db: Path, table: str, dual: Any = None
    ) -> None:
        super().__init__(daemon=True)
        self.conf, self.topic, self.group, self.db, self.table = conf, topic, group, db, table
        self.dual = dual  # a rewind.dualwrite.DualWriter: the service's writes go through it
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.applied = 0

    def run(self) -> None:
        from datetime import UTC, datetime

        try:
            consumer = Consumer(
                {
                    **self.conf,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "client.id": "orders-service",
                }
            )
            consumer.subscribe([self.topic])
            conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
            try:
                while not self.halt.is_set():
                    msgs = gather(consumer, 1.0, self.halt)
                    if not msgs:
                        continue
                    if self.dual is not None:
                        self.dual.upsert([row_of(m) for m in msgs])
                        consumer.commit(asynchronous=False)
                        self.applied += len(msgs)
                        continue
                    conn.execute("BEGIN IMMEDIATE")
                    for m in msgs:
                        v = json.loads(m.value())
                        at = datetime.fromtimestamp(m.timestamp()[1] / 1000, UTC).strftime(
                            "%Y-%m-%d %H:%M:%S.%f"
                        )
                        conn.execute(
                            UPSERT.format(table=self.table),
                            (
                                int(v["order_id"]),
                                v["status"],
                                float(v["amount"]),
                                f"{m.topic()}/{m.partition()}/{m.offset()}",
                                m.topic(),
                                m.partition(),
                                m.offset(),
                                at,
                            ),
                        )
                    conn.execute("COMMIT")
                    consumer.commit(asynchronous=False)
                    self.applied += len(msgs)
            finally:
                conn.close()
                consumer.close()  # leaves the group: it is inactive from here
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        assert self.error is None, self.error


class Tail(threading.Thread):
    """``rewind shadow start`` in this process (the shared Spark session, no JVM to start) until
    stopped: the history into v2 if it is not there yet, then the live tail."""

    def __init__(self, settings: Any, spec: Any) -> None:
        super().__init__(daemon=True)
        self.settings, self.spec = settings, spec
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.result: dict[str, Any] = {}

    def run(self) -> None:
        from rewind.shadow.start import start_shadow

        try:
            self.result = start_shadow(
                self.settings, self.spec, stop=lambda _: self.halt.is_set(), sample_s=0.5
            )
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def failed(self) -> bool:
        return not self.is_alive()

    def stop(self) -> None:
        self.halt.set()
        self.join(120)
        if self.error is not None:
            import traceback

            raise AssertionError("".join(traceback.format_exception(self.error))[-3000:])


def shadow_env(tmp_path: Path, bootstrap: str) -> dict[str, str]:
    return {
        "REWIND_STATE_DIR": str(tmp_path / "state"),
        "REWIND_BOOTSTRAP_SERVERS": bootstrap,
        "REWIND_SPARK_CONF": QUICK_SPARK_CONF,
    }


def run_child(
    env: dict[str, str], spec: Path, done: Path, cwd: Path, fault: str | None = None, limit: float = 150
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
    full.update(env)
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
    if fault:
        full["REWIND_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "tests.shadow_child", str(spec), str(done), str(limit)],
        env=full,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=400,
    )


def rewind(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``rewind ARGS`` with only ``env``'s settings, in this process (tests/cli_in_process.py):
    the shadows' commands that nothing kills (a status, a refused start)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
    full.update(env)
    return cli_in_process.rewind(list(args), cwd=cwd, env=full)


def prepared(
    noida_broker: Any, spark: Any, tmp_path: Path, name: str, shadow: dict[str, Any] | None = None
) -> tuple[Settings, dict[str, Any], str, Path, Path]:
    """A keyed topic with 300 events per partition, the first 150 of each archived (and
    declared gone from the log), and the spec of a shadow over it."""
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    settings = load_settings(env=env, cwd=tmp_path)
    conf = settings.kafka_config()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    produce_range(conf, topic, 0, 400)
    archive = f"lake.archive_{uuid.uuid4().hex[:6]}"
    archive_once(settings, [topic], archive, spark=spark)
    produce_range(conf, topic, 400, 600)
    db = tmp_path / "read_model.db"
    data = spec_data(name, topic, archive, 150, db, "orders", f"live-{topic}")
    data["shadow"].update(shadow or {})
    spec = write_spec(tmp_path / "shadow.yaml", data)
    return settings, conf, topic, db, spec


def refused(call: Any, *words: str) -> str:
    """``call`` raises a RewindError of one line naming every one of ``words``; its message."""
    with pytest.raises(RewindError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message
