"""Probe what a broker really does, feature by feature, on a scratch topic.

Each probe answers ``supported``, ``missing`` (the broker refuses or errors) or
``wrong-answer`` (the broker answers, but not what the Kafka protocol promises). Later
features read these answers to choose a fallback instead of trusting a broker blindly:
for example the offset planner checks every ListOffsets answer by reading records.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rewind.kafka import clients

Status = Literal["supported", "missing", "wrong-answer"]

_TIMEOUT = 10.0
_PARTITIONS = 8
JOIN_SESSION_TIMEOUT_MS = 6000
"""The join probe's session timeout: the smallest a Kafka broker accepts by default
(``group.min.session.timeout.ms``). Some brokers answer a join only after a share of it (the
embedded tansu after about half: 23 s at librdkafka's default of 45 s, 3 s at 6 s), so the
probe uses the least one, and the figure tells users what their own consumers' timeout costs."""


@dataclass
class Capability:
    name: str
    status: Status
    detail: str
    seconds: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)


class _Probe:
    """Holds the scratch topic and the clients shared by the probes of one doctor run."""

    def __init__(self, conf: dict[str, Any], join_timeout_s: float) -> None:
        self.conf = conf
        self.join_timeout_s = join_timeout_s
        self.topic = f"rewind-doctor-{uuid.uuid4().hex[:10]}"
        # a metadata look-up of the scratch topic must not create it (clients.topic_metadata)
        self.admin = clients.admin({**conf, "allow.auto.create.topics": False})

    def create_topic(self) -> None:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka.admin import NewTopic

        futures = self.admin.create_topics([NewTopic(self.topic, _PARTITIONS, 1)], operation_timeout=_TIMEOUT)
        for fut in futures.values():
            fut.result(timeout=_TIMEOUT)
        self._wait_for_metadata(self.topic)

    def _wait_for_metadata(self, topic: str) -> None:
        deadline = time.monotonic() + _TIMEOUT
        while time.monotonic() < deadline:
            md = self.admin.list_topics(topic=topic, timeout=_TIMEOUT)
            if topic in md.topics and md.topics[topic].error is None and md.topics[topic].partitions:
                return
            time.sleep(0.1)

    def delete_topic(self) -> None:
        futures = self.admin.delete_topics([self.topic], operation_timeout=_TIMEOUT)
        for fut in futures.values():
            fut.result(timeout=_TIMEOUT)

    def partition(self) -> int:
        """Each probe writes to its own partition so that probes cannot disturb each other.

        The partitions are made with the topic: CreatePartitions is not on every broker.
        """
        self._next = getattr(self, "_next", -1) + 1
        if self._next >= _PARTITIONS:
            raise RuntimeError("doctor ran out of scratch partitions")
        return self._next

    def produce(
        self,
        partition: int,
        values: list[bytes],
        timestamps: list[int] | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        producer = clients.producer(self.conf, **{"linger.ms": 50, **(overrides or {})})
        errors: list[str] = []
        for i, value in enumerate(values):
            producer.produce(
                self.topic,
                value=value,
                partition=partition,
                timestamp=timestamps[i] if timestamps else 0,
                on_delivery=lambda err, _m: errors.append(str(err)) if err else None,
            )
        left = producer.flush(_TIMEOUT)
        if left or errors:
            raise RuntimeError(f"produce failed: {errors[:1] or [f'{left} undelivered']}")

    def read_all(self, partition: int, overrides: dict[str, Any] | None = None) -> tuple[list[bytes], int]:
        """Every value of a partition and the high watermark from the fetch response."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaError, TopicPartition

        # a short fetch wait: the read ends at the partition's end, which an empty fetch tells,
        # and a broker may hold an empty fetch for fetch.wait.max.ms (tansu: the full 500 ms,
        # on every probe, which every run into a Kafka sink makes once)
        settings = {"fetch.wait.max.ms": 10, **(overrides or {})}
        consumer = clients.private_consumer(self.conf, "doctor", settings)
        try:
            consumer.assign([TopicPartition(self.topic, partition, 0)])
            values: list[bytes] = []
            deadline = time.monotonic() + _TIMEOUT
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    raise RuntimeError(err.str())
                values.append(msg.value() or b"")
            _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
            return values, high
        finally:
            consumer.close()

    # -- probes ----------------------------------------------------------------------------

    def idempotent_produce(self) -> Capability:
        p = self.partition()
        self.produce(p, [b"i%d" % i for i in range(10)], overrides={"enable.idempotence": True})
        values, _ = self.read_all(p)
        if len(values) == 10:
            return Capability("idempotent_produce", "supported", "10 records delivered once each")
        return Capability("idempotent_produce", "wrong-answer", f"10 produced, {len(values)} read")

    def transactions(self) -> tuple[Capability, Capability]:
        p = self.partition()
        producer = clients.producer(self.conf, **{"transactional.id": f"{self.topic}-tx"})
        producer.init_transactions(_TIMEOUT)
        producer.begin_transaction()
        for i in range(5):
            producer.produce(self.topic, value=b"aborted-%d" % i, partition=p)
        producer.flush(_TIMEOUT)
        producer.abort_transaction(_TIMEOUT)
        producer.begin_transaction()
        for i in range(5):
            producer.produce(self.topic, value=b"committed-%d" % i, partition=p)
        producer.commit_transaction(_TIMEOUT)
        txn = Capability("transactions", "supported", "init, abort and commit all answered")
        values, high = self.read_all(p, {"isolation.level": "read_committed"})
        aborted_seen = sum(v.startswith(b"aborted") for v in values)
        committed_seen = sum(v.startswith(b"committed") for v in values)
        facts = {"aborted_seen": aborted_seen, "committed_seen": committed_seen, "high": high}
        if aborted_seen == 0 and committed_seen == 5:
            rc = Capability("read_committed", "supported", "aborted records hidden", facts=facts)
        else:
            rc = Capability(
                "read_committed",
                "wrong-answer",
                f"read_committed returned {aborted_seen} of 5 aborted records",
                facts=facts,
            )
        return txn, rc

    def list_offsets_latest(self) -> Capability:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        p = self.partition()
        count = 100
        self.produce(p, [b"x" * 20] * count, overrides={"linger.ms": 200, "batch.num.messages": 1000})
        consumer = clients.private_consumer(self.conf, "doctor")
        try:
            _low, listed = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=_TIMEOUT)
        finally:
            consumer.close()
        _values, fetched = self.read_all(p)
        facts = {"produced": count, "list_offsets_latest": listed, "fetch_high_watermark": fetched}
        if listed == fetched == count:
            return Capability(
                "list_offsets_latest",
                "supported",
                f"ListOffsets latest = {listed} = records produced",
                facts=facts,
            )
        return Capability(
            "list_offsets_latest",
            "wrong-answer",
            f"ListOffsets latest = {listed}, fetch high watermark = {fetched}, "
            f"records produced = {count}; Rewind checks `latest` by fetching",
            facts=facts,
        )

    def list_offsets_by_time(self) -> Capability:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        p = self.partition()
        base = 1_700_000_000_000
        stamps = [base + i * 1000 for i in range(10)]
        self.produce(p, [b"t%d" % i for i in range(10)], timestamps=stamps)
        queries = {base - 1: 0, base + 4500: 5, base + 9000: 9}
        consumer = clients.private_consumer(self.conf, "doctor")
        try:
            wrong = []
            for ts, expected in queries.items():
                [answer] = consumer.offsets_for_times([TopicPartition(self.topic, p, ts)], timeout=_TIMEOUT)
                if answer.offset != expected:
                    wrong.append(f"t={ts - base:+d}ms: offset {answer.offset}, expected {expected}")
        finally:
            consumer.close()
        if not wrong:
            return Capability("list_offsets_by_time", "supported", "3 of 3 lookups correct")
        return Capability(
            "list_offsets_by_time",
            "wrong-answer",
            "; ".join(wrong) + "; Rewind falls back to a search over record timestamps",
            facts={"wrong": wrong},
        )

    def group_offsets(self) -> Capability:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        group = f"rewind-doctor-{uuid.uuid4().hex[:10]}"  # a scratch group, never a live one
        consumer = clients.private_consumer(self.conf, "doctor", {"group.id": group})
        try:
            consumer.commit(offsets=[TopicPartition(self.topic, 0, 3)], asynchronous=False)
            [got] = consumer.committed([TopicPartition(self.topic, 0)], timeout=_TIMEOUT)
        finally:
            consumer.close()
        if got.offset == 3:
            return Capability("group_offsets", "supported", "commit then fetch returned 3")
        return Capability("group_offsets", "wrong-answer", f"committed 3, fetched {got.offset}")

    def group_join(self) -> Capability:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import Consumer

        group = f"rewind-doctor-{uuid.uuid4().hex[:10]}"
        assigned: list[int] = []
        refused = ""
        consumer = Consumer(
            {
                **self.conf,
                "group.id": group,
                "enable.auto.commit": False,
                "session.timeout.ms": JOIN_SESSION_TIMEOUT_MS,
                "logger": clients.RDKAFKA_LOGGER,
            }
        )
        t0 = time.monotonic()
        try:
            consumer.subscribe([self.topic], on_assign=lambda _c, parts: assigned.append(len(parts)))
            while not assigned and time.monotonic() - t0 < self.join_timeout_s:
                msg = consumer.poll(0.2)
                error = msg.error() if msg is not None else None
                if error is not None:  # a broker may refuse the session timeout: say so
                    refused = str(error.str())
        finally:
            consumer.close()
        took = time.monotonic() - t0
        if not assigned:
            why = f": {refused}" if refused else ""
            return Capability(
                "group_join", "missing", f"no assignment within {self.join_timeout_s:.0f}s{why}", took
            )
        return Capability(
            "group_join",
            "supported",
            f"first assignment after {took:.1f}s (session.timeout.ms {JOIN_SESSION_TIMEOUT_MS})",
            took,
            facts={"latency_s": round(took, 2), "session_timeout_ms": JOIN_SESSION_TIMEOUT_MS},
        )

    def delete_records(self) -> Capability:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        p = self.partition()
        self.produce(p, [b"d"] * 5)
        try:
            futures = self.admin.delete_records(
                [TopicPartition(self.topic, p, 2)], operation_timeout=_TIMEOUT
            )
            for fut in futures.values():
                fut.result(timeout=_TIMEOUT)
        except Exception as exc:
            return Capability("delete_records", "missing", f"DeleteRecords failed: {_short(exc)}")
        consumer = clients.private_consumer(self.conf, "doctor")
        try:
            low, _high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=_TIMEOUT)
        finally:
            consumer.close()
        if low == 2:
            return Capability("delete_records", "supported", "low watermark moved to 2")
        return Capability("delete_records", "wrong-answer", f"low watermark is {low}, expected 2")


def _short(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str"):
        return str(args[0].str())
    return str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__


def probe_capabilities(conf: dict[str, Any], join_timeout_s: float = 45.0) -> list[Capability]:
    """Run every probe on a scratch topic that is deleted afterwards."""
    probe = _Probe(conf, join_timeout_s)
    probe.create_topic()
    results: list[Capability] = []

    def run(name: str, fn: Callable[[], Capability | tuple[Capability, ...]]) -> None:
        t0 = time.monotonic()
        try:
            out = fn()
        except Exception as exc:
            out = Capability(name, "missing", _short(exc))
        for cap in out if isinstance(out, tuple) else (out,):
            cap.seconds = cap.seconds or round(time.monotonic() - t0, 3)
            results.append(cap)

    try:
        run("idempotent_produce", probe.idempotent_produce)
        run("transactions", probe.transactions)
        run("list_offsets_latest", probe.list_offsets_latest)
        run("list_offsets_by_time", probe.list_offsets_by_time)
        run("group_offsets", probe.group_offsets)
        run("group_join", probe.group_join)
        run("delete_records", probe.delete_records)
    finally:
        probe.delete_topic()
    return results
