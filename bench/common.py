"""Shared pieces of the benchmarks: a broker to run against, a topic filler, a timer."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

VALUE_TEMPLATE = (
    '{{"order_id": {i}, "customer": "c-{c:06d}", "status": "{s}", "amount": {a:.2f}, '
    '"currency": "EUR", "note": "{pad}"}}'
)
STATUSES = ("placed", "paid", "shipped", "cancelled")


def value_of(i: int, size: int = 200) -> bytes:
    """A JSON order event of exactly ``size`` bytes, deterministic in ``i``."""
    fields = {"i": i, "c": i % 50_000, "s": STATUSES[i % 4], "a": (i % 9973) / 7}
    body = VALUE_TEMPLATE.format(pad="", **fields)
    return VALUE_TEMPLATE.format(pad="x" * max(0, size - len(body)), **fields).encode()


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()} {os.cpu_count()} cores {cpu} Python {platform.python_version()}"


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


@contextmanager
def broker() -> Iterator[str]:
    """REWIND_BENCH_BOOTSTRAP, or a fresh embedded broker on a free port for this run."""
    external = os.environ.get("REWIND_BENCH_BOOTSTRAP")
    if external:
        yield external
        return
    from rewind.embedded.broker import BrokerProcess

    state = Path(tempfile.mkdtemp(prefix="rewind-bench-"))
    proc = BrokerProcess("127.0.0.1", _free_port(), state / "broker.pid", state / "broker.log")
    proc.start(timeout_s=30)
    try:
        yield proc.address
    finally:
        proc.stop()


@contextmanager
def noida() -> Iterator[str]:
    """REWIND_BENCH_BOOTSTRAP, or a fresh noida-db Kafka service on a free port (transactions
    whose aborted records read_committed hides, which tansu lacks)."""
    external = os.environ.get("REWIND_BENCH_BOOTSTRAP")
    if external:
        yield external
        return
    from tests.brokers import NoidaProcess

    state = Path(tempfile.mkdtemp(prefix="rewind-bench-noida-"))
    proc = NoidaProcess("127.0.0.1", _free_port(), state)
    proc.start(timeout_s=60)
    try:
        yield proc.address
    finally:
        proc.stop()
        shutil.rmtree(state, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - t0


def create_topic(conf: dict[str, Any], topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(conf)
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        fut.result(timeout=30)


def bare_produce(conf: dict[str, Any], topic: str, records: int, partitions: int, size: int = 200) -> float:
    """Produce ``records`` deterministic events from one process; returns records/s."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **conf,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    values = [value_of(i, size) for i in range(min(records, 100_000))]
    t0 = time.perf_counter()
    produce = producer.produce
    for i in range(records):
        while True:
            try:
                key = b"%d" % (i % 50_000)
                produce(topic, key=key, value=values[i % len(values)], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("bare produce: records left undelivered")
    return records / (time.perf_counter() - t0)


def bare_consume(
    conf: dict[str, Any], topic: str, partitions: int | list[int], isolation: str
) -> tuple[int, float]:
    """A bare confluent-kafka batch consume loop that only sums value lengths, over the first
    ``partitions`` partitions (or those listed); records and records/s."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"bench-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.max.bytes": 4 << 20,
            "max.partition.fetch.bytes": 1 << 20,
        }
    )
    chosen = list(range(partitions)) if isinstance(partitions, int) else partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in chosen])
    count = total = eof = 0
    t0 = time.perf_counter()
    while eof < len(chosen):
        for msg in consumer.consume(10_000, 1.0):
            if msg.error():
                eof += 1
                continue
            count += 1
            total += len(msg.value())
    rate = count / (time.perf_counter() - t0)
    consumer.close()
    return count, rate


def run_tansu_perf_consume(bootstrap: str, topic: str) -> str:
    """The broker's own consume benchmark, when it has one (tansu 0.6's panics: not implemented)."""
    try:
        from rewind.embedded.broker import tansu_binary

        out = subprocess.run(
            [tansu_binary(), "perf", "--broker", f"tcp://{bootstrap}", topic, "consume"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except Exception as exc:
        return f"unavailable ({exc.__class__.__name__})"
    if out.returncode != 0:
        reason = "not implemented" if "not yet implemented" in out.stderr else f"exit {out.returncode}"
        return f"unavailable ({reason})"
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "no output"
