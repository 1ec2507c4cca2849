"""Small helpers for tests that put known records into a real broker."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

# The tests' records carry fixed 2025 timestamps: a broker that applies retention (noida-db,
# Apache Kafka) would expire them at once under the default 7 days. Tests about retention
# pass their own configs.
KEEP_FOREVER = {"retention.ms": "-1"}


def create_topic(
    conf: dict[str, Any], topic: str, partitions: int, configs: dict[str, str] | None = None
) -> None:
    admin = AdminClient(dict(conf))
    new = NewTopic(topic, partitions, 1, config=dict(KEEP_FOREVER if configs is None else configs))
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=5)
        if topic in md.topics and len(md.topics[topic].partitions) == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {topic} not visible in metadata")


def produce(
    conf: dict[str, Any],
    topic: str,
    records: list[tuple[int, bytes | None, bytes | None, int | None]],
    **overrides: Any,
) -> None:
    """Produce (partition, key, value, timestamp_ms) records; fail on any delivery error."""
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True, **overrides})
    errors: list[str] = []
    for partition, key, value, ts in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            timestamp=ts or 0,
            on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors


def committed(conf: dict[str, Any], group: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        got = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
        return {(tp.topic, tp.partition): tp.offset for tp in got}
    finally:
        consumer.close()


@contextlib.contextmanager
def writing(
    conf: dict[str, Any], topic: str, rate: float, partitions: int = 2, transactional: bool = False
) -> Iterator[list[int]]:
    """A producer writing ``rate`` records per second (round-robin over ``partitions``) in a
    background thread while the block runs; yields the count of records produced so far.
    ``transactional``: each record in a transaction of its own (each commit leaves a marker,
    an offset that holds no record)."""
    extra = {"transactional.id": f"writer-{uuid.uuid4().hex[:8]}"} if transactional else {}
    producer = Producer({**conf, "linger.ms": 0 if transactional else 5, **extra})
    if transactional:
        producer.init_transactions(30)
    stop, sent = threading.Event(), [0]

    def run() -> None:
        began = time.monotonic()
        while not stop.is_set():
            value = f'{{"order_id": {sent[0]}, "status": "paid", "amount": 1.0}}'.encode()
            if transactional:
                producer.begin_transaction()
            producer.produce(topic, value=value, key=b"k", partition=sent[0] % partitions)
            if transactional:
                producer.commit_transaction(30)
            sent[0] += 1
            producer.poll(0)
            stop.wait(max(0.0, began + sent[0] / rate - time.monotonic()))
        assert producer.flush(10) == 0

    thread = threading.Thread(target=run, name="known-rate-writer", daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # writing before the first look
        yield sent
    finally:
        stop.set()
        thread.join(timeout=15)


def gather(consumer: Consumer, every_s: float, halt: threading.Event) -> list[Any]:
    """What arrived since the last call, gathered once every ``every_s`` (sooner when ``halt``
    is set): a live service's poll loop that leaves its assignment paused between batches.

    noida-db answers a fetch at once when there is nothing to read (it ignores
    ``fetch.wait.max.ms``), so an assigned consumer that has caught up fetches in a loop:
    1.3 cores between the broker and the client, measured on a 2-core machine, for as long as
    a test's live service runs. Paused, it sends no fetch; resumed, its first fetch brings the
    batch."""
    halt.wait(every_s)
    consumer.resume(consumer.assignment())
    msgs: list[Any] = []
    while True:
        got = consumer.consume(500, 0.3)
        msgs += [m for m in got if m.error() is None]
        if len(got) < 500:
            break
    consumer.pause(consumer.assignment())
    return msgs
