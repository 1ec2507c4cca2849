"""The live side of the shadow story: new orders keep arriving, a service keeps ``order_totals``.

:class:`OrderProducer` writes new orders' events (the demo's generator, placed now) while the
migration runs; :class:`TotalsService` is the live read model: a consumer group that folds
each batch of events into its orders' rows in SQLite and commits after each batch. Both are
threads the story starts and stops; an error in either is raised by ``stop()`` as
:class:`DemoFailed`.
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
from rewind.kafka.clients import ready_messages

_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"  # naive UTC text, as Rewind's SQLite sink writes timestamps


BATCH = 500
FIRST_WAIT_S = 1.0
"""How long a resumed assignment may take to bring its first event: librdkafka's first fetch
after a resume came 0.1-1 s later (measured); a shorter wait could miss it on every turn."""
LOOK_EVERY_S = 0.5
"""How long the service leaves its assignment paused between two batches once caught up."""


def _next_batch(consumer: Any) -> list[Any]:
    """What has arrived (up to :data:`BATCH`), the assignment paused again afterwards.

    Paused, a consumer sends no fetch. Left assigned once caught up, it fetches in a loop on a
    broker that answers an empty fetch at once instead of waiting ``fetch.wait.max.ms``
    (noida-db, the tests' second broker: ~0.8 of a core between client and broker, measured,
    for as long as the service runs; the shadow story's test took 58.9 s of CPU with the
    service always assigned, 31.0-36.2 s paused between batches, its wall 39 s and 40-43 s). Where the
    broker waits, the pause costs only the latency of one look."""
    consumer.resume(consumer.assignment())
    try:
        return ready_messages(consumer, FIRST_WAIT_S, BATCH)
    finally:
        consumer.pause(consumer.assignment())


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
        # lazy: avoids confluent_kafka at import
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


class TotalsService(threading.Thread):
    """The live ``order_totals`` service: group ``group`` folds each batch of events into
    ``table`` of ``db`` (reads the rows of the batch's orders, folds the events in, upserts
    them, commits the offsets after the transaction).

    ``discount``: the service's new release, which also keeps v2's ``discount`` column.
    """

    def __init__(
        self, conf: dict[str, Any], topic: str, group: str, db: Path, table: str, *, discount: bool
    ) -> None:
        super().__init__(daemon=True, name="demo-totals-service")
        self.conf, self.topic, self.group, self.db, self.table = conf, topic, group, db, table
        self.discount = discount
        self.halt = threading.Event()
        self.error: BaseException | None = None
        self.applied = 0

    def _columns(self) -> list[str]:
        return [*domain.READ_MODEL_SCHEMA, *(["discount"] if self.discount else []), *_LINEAGE]

    def run(self) -> None:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import Consumer

        try:
            consumer = Consumer(
                {
                    **self.conf,
                    "group.id": self.group,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "client.id": "order-totals-service",
                }
            )
            consumer.subscribe([self.topic])
            conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
            cols = self._columns()
            names = ", ".join(f'"{c}"' for c in cols)
            sets = ", ".join(f'"{c}" = excluded."{c}"' for c in cols[1:])
            upsert = (
                f'INSERT INTO "{self.table}" ({names}) VALUES ({", ".join("?" for _ in cols)}) '
                f"ON CONFLICT (order_id) DO UPDATE SET {sets}"
            )
            try:
                while not self.halt.is_set():
                    batch = _next_batch(consumer)
                    msgs = [m for m in batch if m.error() is None]
                    if msgs:
                        conn.execute("BEGIN IMMEDIATE")
                        self._fold(conn, msgs, upsert)
                        conn.execute("COMMIT")
                        consumer.commit(asynchronous=False)
                        self.applied += len(msgs)
                    if len(batch) < BATCH:  # caught up: look again a moment later
                        self.halt.wait(LOOK_EVERY_S)
            finally:
                conn.close()
                consumer.close()  # leaves the group: it is inactive from here
        except BaseException as exc:  # raised by stop()
            self.error = exc

    def _fold(self, conn: sqlite3.Connection, msgs: list[Any], upsert: str) -> None:
        events = []
        for m in msgs:
            try:
                data = json.loads(m.value())
            except ValueError:
                continue
            if isinstance(data, dict) and domain.valid_event(data):
                events.append((m, data))
        ids = sorted({data["order_id"] for _, data in events})
        rows = self._read(conn, ids)
        lineage: dict[str, tuple[Any, ...]] = {}
        for m, data in events:
            rows[data["order_id"]] = domain.fold_event(rows.get(data["order_id"]), data, self.discount)
            at = sqlite_time(m.timestamp()[1])
            where = (m.topic(), m.partition(), m.offset())
            lineage[data["order_id"]] = ("{}/{}/{}".format(*where), *where, at)
        for order_id, row in rows.items():
            if order_id in lineage:
                conn.execute(upsert, (*_values(row, self.discount), *lineage[order_id]))

    def _read(self, conn: sqlite3.Connection, ids: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        cols = [*domain.READ_MODEL_SCHEMA, *(["discount"] if self.discount else [])]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            found = conn.execute(
                f'SELECT {", ".join(cols)} FROM "{self.table}" WHERE order_id IN ({marks})', chunk
            ).fetchall()
            for values in found:
                r = dict(zip(cols, values, strict=True))
                out[r["order_id"]] = {
                    "order_id": r["order_id"],
                    "customer_id": r["customer_id"],
                    "status": r["status"],
                    "cents": round(r["total"] * 100),
                    "item_count": r["item_count"],
                    "placed_at": _ms(r["placed_at"]),
                    "last_event_time": _ms(r["last_event_time"]),
                    "discount_cents": round((r.get("discount") or 0) * 100),
                }
        return out

    def stop(self) -> None:
        self.halt.set()
        self.join(60)
        if self.error is not None:
            raise DemoFailed(f"the demo's order_totals service failed: {self.error}")


_LINEAGE = [
    "_rewind_event_id",
    "_rewind_source_topic",
    "_rewind_source_partition",
    "_rewind_source_offset",
    "_rewind_source_timestamp",
]


def _values(row: dict[str, Any], discount: bool) -> tuple[Any, ...]:
    """A folded row in the table's columns (money back from cents, times as SQLite text)."""
    times = [None if row[c] is None else sqlite_time(row[c]) for c in ("placed_at", "last_event_time")]
    values = [row["order_id"], row["customer_id"], row["status"], row["cents"] / 100, row["item_count"]]
    values += times
    return (*values, *([row["discount_cents"] / 100] if discount else []))


def _ms(text: str | None) -> int | None:
    if text is None:
        return None
    return round(datetime.strptime(text, _SQLITE_TIME).replace(tzinfo=UTC).timestamp() * 1000)
