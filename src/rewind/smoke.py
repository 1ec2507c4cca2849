"""``rewind demo`` (for now): an end-to-end smoke of the embedded stack.

Until the full repair story lands, the demo proves every part of the stack works together:
it starts the stack, produces a known set of JSON events, plans a window, reads it with the
``rewind-kafka`` Spark source, decodes it, writes it back to a second topic with the
``rewind-kafka`` writer, reads that back, and fails loudly if any count is not exact.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rewind.config import Settings
from rewind.errors import RewindError


class SmokeFailed(RewindError):
    """A step of the smoke run did not give the expected result."""


@dataclass
class SmokeReport:
    steps: list[dict[str, Any]] = field(default_factory=list)

    def step(self, name: str, started: float, **facts: Any) -> None:
        self.steps.append({"step": name, "seconds": round(time.monotonic() - started, 2), **facts})


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeFailed(message)


def run_smoke(settings: Settings, records: int = 60_000, partitions: int = 6, seed: int = 7) -> SmokeReport:
    from confluent_kafka import Producer
    from confluent_kafka.admin import NewTopic

    from rewind.embedded.stack import Stack
    from rewind.kafka import clients
    from rewind.kafka.offsets import parse_spark_options, resolve

    report = SmokeReport()
    t0 = time.monotonic()
    parts = Stack(settings).up()
    report.step("stack up", t0, parts={p.name: p.state for p in parts})

    conf = settings.kafka_config()
    run = uuid.uuid4().hex[:6]
    source, copy = f"smoke-orders-{run}", f"smoke-orders-copy-{run}"
    t0 = time.monotonic()
    admin = clients.admin(conf)
    for fut in admin.create_topics([NewTopic(t, partitions, 1) for t in (source, copy)]).values():
        fut.result(timeout=15)
    rng = random.Random(seed)
    producer = Producer({**conf, "enable.idempotence": True, "linger.ms": 20})
    statuses = ["placed", "paid", "shipped", "cancelled"]
    expected_by_status: dict[str, int] = {}
    for i in range(records):
        status = rng.choice(statuses)
        expected_by_status[status] = expected_by_status.get(status, 0) + 1
        value = json.dumps({"order_id": i % 5000, "status": status, "amount": round(rng.uniform(1, 500), 2)})
        while True:
            try:
                producer.produce(source, key=str(i % 5000).encode(), value=value.encode())
                break
            except BufferError:
                producer.poll(0.05)
    _expect(producer.flush(30) == 0, "the producer could not deliver every record")
    report.step("produce", t0, topic=source, records=records)

    t0 = time.monotonic()
    plan = resolve(conf, parse_spark_options({"subscribe": source}))
    _expect(plan.total_offsets == records, f"plan covers {plan.total_offsets} offsets, produced {records}")
    report.step("plan", t0, partitions=len(plan.partitions), offsets=plan.total_offsets,
                notes=list(plan.notes)[:3])

    t0 = time.monotonic()
    from pyspark.sql import functions as F

    from rewind.spark import session

    spark = session(settings, app_name="rewind-demo")
    report.step("spark session", t0)

    t0 = time.monotonic()
    df = (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("plan", plan.to_json())
        .load()
    )
    decoded = df.select(
        F.from_json(F.col("value").cast("string"), "order_id INT, status STRING, amount DOUBLE").alias("e")
    ).select("e.*")
    by_status = {r["status"]: r["count"] for r in decoded.groupBy("status").count().collect()}
    _expect(by_status == expected_by_status, f"decoded counts {by_status} != produced {expected_by_status}")
    report.step("read + decode", t0, records=sum(by_status.values()),
                records_per_s=round(records / (time.monotonic() - t0)))

    t0 = time.monotonic()
    (
        df.select("key", "value")
        .write.format("rewind-kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("topic", copy)
        .mode("append")
        .save()
    )
    copied = (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("subscribe", copy)
        .load()
        .count()
    )
    _expect(copied == records, f"copy topic holds {copied} records, expected {records}")
    report.step("write + read back", t0, topic=copy, records=copied)

    for fut in admin.delete_topics([source, copy]).values():
        fut.result(timeout=15)
    return report
