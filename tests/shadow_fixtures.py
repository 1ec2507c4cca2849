"""Shared parts of the shadow tests: a keyed order stream, its spec, and a clean recomputation.

Orders are keyed: every event of order ``k`` goes to partition ``k % 2`` (as a keyed
producer would put it), so the last event of an order is the one with the highest offset in
its partition, and a read model upserted on ``order_id`` must hold exactly that event.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer

ORDERS = 40


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
