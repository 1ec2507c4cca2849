"""The live side of the shadow story: new orders keep arriving, a service keeps ``order_status``.

:class:`OrderProducer` writes new orders' events (the demo's generator, placed now) while the
migration runs; :class:`StatusService` is the live projection: a consumer group that upserts
each event's row into SQLite and commits after each batch. Both are threads the story starts
and stops; an error in either is raised by ``stop()`` as :class:`DemoFailed`.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rewind.demo import orders as domain
from rewind.demo.errors import DemoFailed

_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"  # naive UTC text, as Rewind's SQLite sink writes timestamps


def sqlite_time(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime(_SQLITE_TIME)


class OrderProducer(threading.Thread):
    """New orders at ``orders_per_s``, each order's events back to back, keyed by order id."""

    def __init__(
        self, conf: dict[str, Any], topic: str, partitions: int, orders_per_s: float, seed: int
    ) -> None:
        super().__init__(daemon=True, name="demo-orders")
        self.conf, self.topic, self.partitions = conf, topic, partitions
        self.rate, self.rng = orders_per_s, random.Random(seed)
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.produced: list[dict[str, Any]] = []  # in produce order: an order's events in order

    def run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({**self.conf, "linger.ms": 5, "enable.idempotence": True})
            n = 9_000_000
            while not self.halt.is_set():
                now = int(time.time() * 1000)
                for i, event in enumerate(domain._order_events(self.rng, n, now, 500)):
                    event["at"] = now + i  # the order's events in order, all "now"
                    key = event["order_id"].encode()
                    part = domain.partition_of(key, self.partitions)
                    producer.produce(self.topic, json.dumps(event).encode(), key, partition=part)
                    self.produced.append(event)
                producer.poll(0)
                n += 1
                time.sleep(1 / self.rate)
            if producer.flush(30):
                raise DemoFailed("the demo's order producer could not deliver every event in 30 s")
        except BaseException as exc:  # raised by stop()
            self.error = exc

    def stop(self) -> list[dict[str, Any]]:
        self.halt.set()
        self.join(60)
        if self.error is not None:
            raise DemoFailed(f"the demo's order producer failed: {self.error}")
        return self.produced


class StatusService(threading.Thread):
    """The live ``order_status`` projection: group ``group`` upserts into ``table`` of ``db``.

    ``with_stage``: the service's new release, which also writes v2's ``stage`` column.
    """

    def __init__(
        self, conf: dict[str, Any], topic: str, group: str, db: Path, table: str, *, with_stage: bool
    ) -> None:
        super().__init__(daemon=True, name="demo-status-service")
        self.conf, self.topic, self.group, self.db, self.table = conf, topic, group, db, table
        self.with_stage = with_stage
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.applied = 0

    def _upsert(self) -> str:
        cols = ["order_id", "status", "last_event_time", *(["stage"] if self.with_stage else [])]
        cols += [
            "_rewind_event_id",
            "_rewind_source_topic",
            "_rewind_source_partition",
            "_rewind_source_offset",
            "_rewind_source_timestamp",
        ]
        names = ", ".join(f'"{c}"' for c in cols)
        sets = ", ".join(f'"{c}" = excluded."{c}"' for c in cols[1:])
        marks = ", ".join("?" for _ in cols)
        return (
            f'INSERT INTO "{self.table}" ({names}) VALUES ({marks}) '
            f"ON CONFLICT (order_id) DO UPDATE SET {sets}"
        )

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            consumer = Consumer(
                {
                    **self.conf,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "client.id": "order-status-service",
                }
            )
            consumer.subscribe([self.topic])
            conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
            sql = self._upsert()
            try:
                while not self.halt.is_set():
                    msgs = [m for m in consumer.consume(500, 0.2) if m.error() is None]
                    if not msgs:
                        continue
                    conn.execute("BEGIN IMMEDIATE")
                    for m in msgs:
                        row = self._row(m)
                        if row is not None:
                            conn.execute(sql, row)
                    conn.execute("COMMIT")
                    consumer.commit(asynchronous=False)
                    self.applied += len(msgs)
            finally:
                conn.close()
                consumer.close()  # leaves the group: it is inactive from here
        except BaseException as exc:  # raised by stop()
            self.error = exc

    def _row(self, m: Any) -> tuple[Any, ...] | None:
        try:
            data = json.loads(m.value())
        except ValueError:
            return None
        row = domain.status_row(data) if isinstance(data, dict) else None
        if row is None:
            return None
        values: list[Any] = [row["order_id"], row["status"], sqlite_time(row["at"])]
        if self.with_stage:
            values.append(row["stage"])
        at = m.timestamp()[1]
        values += [f"{m.topic()}/{m.partition()}/{m.offset()}", m.topic(), m.partition(), m.offset()]
        values.append(sqlite_time(at))
        return tuple(values)

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        if self.error is not None:
            raise DemoFailed(f"the demo's order_status service failed: {self.error}")
