"""The messages of ``rewind compensate`` and the transactions that write them, one per unit.

A message per op of a changed key (see :mod:`rewind.job.compensate`): key = the key's text (a
JSON list for a composite key), value = JSON ``{"key", "op", "row"}`` (or ``old``/``new``: made a
batch at a time by :mod:`rewind.job.compensate_messages`), headers ``rewind-synthetic: true``,
``rewind-run-id``, ``rewind-op``.

A unit (the changes of the keys that hash to it, over every target partition) is written by the
Spark task that holds it, in order:

1. open a producer with the unit's transactional id (``rewind-compensate-<run>-<topic>-u-<digest
   of the unit>``, the same on every attempt): ``init_transactions`` fences an earlier attempt
   of the unit and aborts what it left open;
2. unless this is the unit's first attempt, read partition 0 (read committed) for the unit's
   marker: found means an earlier attempt committed it, nothing is produced;
3. begin; produce the unit's messages on their partitions (murmur2 of the key), key by key;
4. flush (failing on a refused record); produce the unit's marker on partition 0 (key
   ``rewind-compensate/<unit>``, headers ``rewind-marker: <run>`` and ``rewind-unit: <unit>``,
   its messages, changed keys and counts); flush;
5. commit: a read_committed consumer sees the unit's messages and its marker together or not at
   all.

The driver then writes the final marker (key ``rewind-compensate``, header ``rewind-marker``,
the counts) in a transaction of its own: the whole compensation is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.errors import RewindError
from rewind.kafka.clients import private_consumer, producer, ready_messages
from rewind.kafka.producer import TransactionalProducer

if TYPE_CHECKING:
    from confluent_kafka import Message

MARKER_KEY = b"rewind-compensate"
MARKER_HEADER = "rewind-marker"
UNIT_HEADER = "rewind-unit"
MARKER_PARTITION = 0
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "linger.ms": 20,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "delivery.report.only.error": True,
    "transaction.timeout.ms": 600_000,
}
"""Under the settings' own ``kafka.properties``: those of the Kafka sink's unit producers."""
_STALL_TIMEOUT_S = 120.0


class CompensationError(RewindError):
    """Writing or reading the compensation's messages and markers failed."""


def key_text(values: tuple[Any, ...]) -> bytes:
    """A message's key: the key column's text, or a JSON list for a composite key."""
    if len(values) == 1:
        return str(values[0]).encode()
    return json.dumps(list(values), default=str).encode()


def unit_marker_key(unit_id: str) -> bytes:
    return MARKER_KEY + b"/" + unit_id.encode()


def unit_transactional_id(run_id: str, topic: str, unit_id: str) -> str:
    return f"rewind-compensate-{run_id}-{topic}-u-{hashlib.sha256(unit_id.encode()).hexdigest()[:16]}"


def final_transactional_id(run_id: str, topic: str) -> str:
    return f"rewind-compensate-{run_id}-{topic}"


def op_headers(run_id: str, op: str) -> list[tuple[str, bytes]]:
    """The headers of a message of ``op``: ``rewind-synthetic``, ``rewind-run-id``, ``rewind-op``."""
    return [("rewind-synthetic", b"true"), ("rewind-run-id", run_id.encode()), ("rewind-op", op.encode())]


@dataclass
class Messages:
    """A slice of a unit's messages, ready for :meth:`UnitTransaction.produce`: aligned lists of
    values, keys, partitions and header lists (one shared list per op), in the order they are
    applied, and how many of each op they hold."""

    values: list[bytes]
    keys: list[bytes]
    partitions: list[int]
    headers: list[list[tuple[str, bytes]]]
    counts: dict[str, int]


@dataclass(frozen=True)
class Markers:
    """What partition 0 holds of one run: its final marker's body, and its committed units."""

    final: dict[str, Any] | None = None
    units: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_markers(
    conf: dict[str, Any], topic: str, run_id: str, stall_timeout_s: float = _STALL_TIMEOUT_S
) -> Markers:
    """The run's committed markers in partition 0, read committed to the partition's end.

    The end is the high watermark at the start; a read_committed reader stops short of it while
    a transaction is open, so it waits (up to ``stall_timeout_s``: an attempt killed with a
    transaction open is fenced by the next one, which aborts it) rather than answer early."""
    final: dict[str, Any] | None = None
    units: dict[str, dict[str, Any]] = {}
    run = run_id.encode()
    for msg in _read_partition(conf, topic, MARKER_PARTITION, stall_timeout_s):
        headers = dict(msg.headers() or [])
        if headers.get(MARKER_HEADER) != run:
            continue
        try:
            body = json.loads(msg.value() or b"{}")
        except ValueError:
            body = {}
        unit = headers.get(UNIT_HEADER)
        if unit is not None:
            units[unit.decode() if isinstance(unit, bytes) else unit] = body
        elif msg.key() == MARKER_KEY:
            final = body
    return Markers(final, units)


def _read_partition(
    conf: dict[str, Any], topic: str, partition: int, stall_timeout_s: float
) -> Iterator[Message]:
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, TopicPartition

    consumer = private_consumer(
        conf, "compensate-check", {"isolation.level": "read_committed", "fetch.wait.max.ms": 50}
    )
    try:
        tp = TopicPartition(topic, partition)
        low, listed = consumer.get_watermark_offsets(tp, timeout=15)
        consumer.assign([TopicPartition(topic, partition, low)])
        # the end: the high watermark of the first fetch response, not ListOffsets' alone (tansu
        # answers the last batch's base offset + 1: the markers after it were not read)
        end: int | None = None
        last = time.monotonic()
        while True:
            progressed = False
            for msg in ready_messages(consumer, 0.2, 1000):
                if end is None:
                    fetched = consumer.get_watermark_offsets(tp, cached=True)[1]
                    end = max(listed, fetched if fetched is not None else -1)
                    if end <= low:
                        return
                err = msg.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise CompensationError(f"reading {topic}/{partition} failed: {err.str()}")
                    if (msg.offset() or 0) >= end:  # the fetch's end (tansu's ListOffsets answers low)
                        return
                    continue
                progressed = True
                yield msg
                if (msg.offset() or 0) + 1 >= end:
                    return
            now = time.monotonic()
            if progressed:
                last = now
            elif now - last > stall_timeout_s:
                raise CompensationError(
                    f"{topic}/{partition} did not reach offset {end or listed} within "
                    f"{stall_timeout_s:.0f}s reading read_committed: an open transaction holds it "
                    "back; retry later"
                )
    finally:
        consumer.close()


def fence(conf: dict[str, Any], transactional_ids: list[str]) -> None:
    """``init_transactions`` for each id: a killed attempt's open transaction is aborted now, not
    after the broker's transaction timeout (it would hold partition 0's read committed back)."""
    for tid in transactional_ids:
        client = producer(conf, **{"transactional.id": tid})
        try:
            client.init_transactions(60.0)
        except Exception as exc:
            raise CompensationError(f"could not fence transactional id {tid}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                client.close()


@dataclass(frozen=True)
class UnitWriter:
    """Plain data pickled to the tasks: opens the transaction of one unit (steps 1-2)."""

    conf: dict[str, Any]
    topic: str
    run_id: str
    shape: str
    key: tuple[str, ...]

    def open(self, unit_id: str, first_attempt: bool) -> UnitTransaction:
        unit = UnitTransaction(self, unit_id)
        unit.start(first_attempt)
        return unit


@dataclass
class UnitTransaction:
    """One unit's transaction inside a task (steps 1-5 of the module docstring)."""

    writer: UnitWriter
    unit_id: str
    done: dict[str, Any] | None = None
    counts: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    _txn: Any = None

    def start(self, first_attempt: bool) -> None:
        w = self.writer
        self._txn = TransactionalProducer(
            {**PRODUCER_DEFAULTS, **w.conf},
            transactional_id=unit_transactional_id(w.run_id, w.topic, self.unit_id),
            error=CompensationError,
            topic=w.topic,
        )
        try:
            self._txn.open()  # 1.
            if not first_attempt:  # 2.
                self.done = read_markers(w.conf, w.topic, w.run_id).units.get(self.unit_id)
                if self.done is not None:
                    self.close()
                    return
            self._txn.begin()  # 3.
        except BaseException:
            self.abort()
            raise

    def produce(self, messages: Messages) -> None:
        """Step 3 for a slice of the unit's messages."""
        topic = self.writer.topic
        client = self._txn.client
        produce = client.produce
        for value, kb, p, headers in zip(
            messages.values, messages.keys, messages.partitions, messages.headers, strict=True
        ):
            try:
                produce(topic, value, kb, p, None, None, 0, headers)
            except BufferError:
                self._when_full(value, kb, p, headers)
        for op, n in messages.counts.items():
            self.counts[op] = self.counts.get(op, 0) + n
        self.messages += len(messages.values)
        client.poll(0)
        self._txn.raise_failures(what=f" for {topic}")

    def _when_full(self, value: bytes, kb: bytes, partition: int, headers: Any) -> None:
        """librdkafka's queue is full: serve deliveries until the message fits."""
        topic = self.writer.topic
        client = self._txn.client
        while True:
            client.poll(0.05)
            self._txn.raise_failures(what=f" for {topic}")
            try:
                client.produce(topic, value, kb, partition, headers=headers)
                return
            except BufferError:
                continue

    def commit(self, keys: int) -> None:
        """Steps 4-5; ``keys``: how many changed keys the unit's messages are of."""
        w = self.writer
        try:
            self._txn.flush()
            faults.point("compensate-before-marker")
            body = {
                "run_id": w.run_id,
                "unit": self.unit_id,
                "messages": self.messages,
                "keys": keys,
                "counts": self.counts,
            }
            self._txn.client.produce(
                w.topic,
                json.dumps(body, sort_keys=True).encode(),
                unit_marker_key(self.unit_id),
                MARKER_PARTITION,
                headers=[(MARKER_HEADER, w.run_id.encode()), (UNIT_HEADER, self.unit_id.encode())],
            )
            self._txn.flush()
            faults.point("compensate-before-end")
            self._txn.commit()
        except BaseException:
            self.abort()
            raise
        self.close()

    def abort(self) -> None:
        if self._txn is not None:
            with contextlib.suppress(Exception):
                self._txn.abort()
        self.close()

    def close(self) -> None:
        if self._txn is not None:
            with contextlib.suppress(Exception):
                self._txn.close()
            self._txn = None


def write_final_marker(conf: dict[str, Any], topic: str, run_id: str, body: dict[str, Any]) -> None:
    """The final marker, alone in a transaction of the run's own id (fencing a zombie of it)."""
    txn = TransactionalProducer(
        {**PRODUCER_DEFAULTS, **conf},
        transactional_id=final_transactional_id(run_id, topic),
        error=CompensationError,
        topic=topic,
    )
    try:
        client = txn.open()
        txn.begin()
        client.produce(
            topic,
            json.dumps(body, sort_keys=True).encode(),
            MARKER_KEY,
            MARKER_PARTITION,
            headers=[(MARKER_HEADER, run_id.encode())],
        )
        txn.flush()
        txn.commit()
    except BaseException:
        txn.abort()
        raise
    finally:
        txn.close()
