"""Benchmark: ``rewind compensate`` of N differing keys against a bare confluent-kafka produce loop.

Same run, same broker, same messages (default 1,000,000 keys, ``--keys 5000000`` for the
larger target; 8 partitions):

  setup (a child process, so the driver's figures hold none of it): an Iceberg production
      table (``main``) and a staging table of N rows each, every key's ``qty`` different, and
      a verified run naming them in the ledger;
  (a) ``compensate_run`` (retract-and-correct: 2N messages), the Spark session started before
      the clock: the diff in Spark, the units' transactions from the tasks, the final marker.
      The driver's RSS is sampled every 20 ms: its peak during (a) against its RSS just before;
  (b) a bare idempotent confluent-kafka produce loop (linger 20 ms, lz4) of the very data
      messages (a) wrote, read back into memory first (key, value, partition, headers); only the
      produce calls and the flush are timed.

  (c) with ``--warm``: the same compensation again, to a second topic, in the same (now warm)
      Spark session: what the first job's cold JVM (JIT, code generation, the Python workers'
      imports) costs (a).

``--connect``: (a) and (c) on a Spark Connect server started before the clock (a resident
Spark, as where data teams run it): (a) is then the server's first compensation, (c) the next.

Prints messages/s of each, the ratio a/b (and c/b), the driver's RSS, the load average and
where (a)'s seconds went (the result's ``seconds``: driver steps, and the tasks' steps summed
over units); ``--json PATH`` writes them.
Usage: ``python bench/compensate.py [--keys N] [--unit-messages M] [--warm] [--connect]``;
``REWIND_BENCH_BOOTSTRAP`` selects another broker than a fresh tansu.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "src"))

from common import broker, create_topic, machine, stamp  # noqa: E402

PARTITIONS = 8
RUN_ID = "bench-compensate"


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def setup(state: str, bootstrap: str, keys: int) -> None:
    """Production and staging tables, and a verified run naming them (in a child process)."""
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.config import load_settings
    from rewind.ledger import Ledger
    from tests.job_fixtures import record_finished_run

    settings = load_settings(env={"REWIND_STATE_DIR": state, "REWIND_BOOTSTRAP_SERVERS": bootstrap})
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("bench")
    for name, bump in (("bench.model", 0), ("bench.model_fixed", 1)):
        step = 1_000_000
        table = None
        for lo in range(0, keys, step):
            ids = list(range(lo, min(keys, lo + step)))
            rows = pa.table(
                {
                    "sku": pa.array([f"sku-{i:09d}" for i in ids]),
                    "qty": pa.array([i % 1000 + bump for i in ids], pa.int64()),
                    "note": pa.array(["x" * 40] * len(ids)),
                }
            )
            if table is None:
                table = catalog.create_table(name, rows.schema)
            table.append(rows)
    spec = {
        "name": "bench-compensate",
        "source": {
            "kafka": {"topics": ["unused"], "from": "2026-09-21T00:00:00Z", "to": "2026-09-22T00:00:00Z"}
        },
        "decode": {"format": "json", "schema": {"sku": "string", "qty": "long", "note": "string"}},
        "translate": {
            "function": "tests.test_compensate:right",
            "version": "1",
            "output_schema": {"sku": "string", "qty": "long", "note": "string"},
        },
        "key": ["sku"],
        "sink": {"iceberg": {"table": "bench.model"}},
    }

    class Staging:
        def to_dict(self) -> dict[str, Any]:
            return {"table": "bench.model_fixed", "branch": None}

    record_finished_run(settings, spec, "bench.model", RUN_ID, Staging())
    with Ledger.open(settings.ledger) as ledger:
        ledger.audit(RUN_ID, "verify", {"passed": True})


def read_back(conf: dict[str, Any], topic: str) -> list[tuple[Any, ...]]:
    """(value, key, partition, headers) of every data message (markers left out) of ``topic``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        left = set(range(PARTITIONS))
        while left:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition())
                    continue
                headers = msg.headers() or []
                if not any(h[0] == "rewind-marker" for h in headers):
                    out.append((msg.value(), msg.key(), msg.partition(), headers))
    finally:
        consumer.close()
    return out


def bare_loop(conf: dict[str, Any], topic: str, records: list[tuple[Any, ...]]) -> float:
    from confluent_kafka import Producer

    producer = Producer(
        {
            **conf,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    started = time.perf_counter()
    for value, key, partition, headers in records:
        while True:
            try:
                producer.produce(topic, value, key, partition, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--unit-messages", type=int, default=None)
    parser.add_argument("--warm", action="store_true", help="(c): again, on the warm session")
    parser.add_argument("--connect", action="store_true", help="on a Spark Connect server")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        remote = None
        if args.connect:
            from tests.spark_connect import spark_connect_server

            folder = Path(tempfile.mkdtemp(prefix="rewind-bench-connect-"))
            remote = stack.enter_context(spark_connect_server(folder))
        measure(args, remote)


def measure(args: argparse.Namespace, remote: str | None) -> None:
    """Set-up, (a), (c) and (b) on a fresh broker, with Spark ``remote`` when given."""
    from rewind.config import load_settings
    from rewind.job.compensate import UNIT_MESSAGES, compensate_run
    from rewind.spark import session

    with broker() as bootstrap:
        state = tempfile.mkdtemp(prefix="rewind-bench-compensate-")
        child = multiprocessing.get_context("spawn").Process(target=setup, args=(state, bootstrap, args.keys))
        child.start()
        child.join()
        assert child.exitcode == 0, "setup failed"
        env = {"REWIND_STATE_DIR": state, "REWIND_BOOTSTRAP_SERVERS": bootstrap}
        settings = load_settings(env={**env, **({"REWIND_SPARK_REMOTE": remote} if remote else {})})
        conf = settings.kafka_config()
        topic, bare = f"model-{uuid.uuid4().hex[:6]}", f"bare-{uuid.uuid4().hex[:6]}"
        create_topic(conf, topic, PARTITIONS)
        create_topic(conf, bare, PARTITIONS)
        session(settings)
        before = rss_mb()
        peak = [before]
        running = [True]

        def sample() -> None:
            while running[0]:
                peak[0] = max(peak[0], rss_mb())
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        out = compensate_run(settings, RUN_ID, topic, unit_messages=args.unit_messages or UNIT_MESSAGES)
        seconds_a = time.perf_counter() - started
        running[0] = False
        sampler.join()
        warm: dict[str, Any] = {}
        if args.warm:
            again = f"model-{uuid.uuid4().hex[:6]}"
            create_topic(conf, again, PARTITIONS)
            started = time.perf_counter()
            out_c = compensate_run(settings, RUN_ID, again, unit_messages=args.unit_messages or UNIT_MESSAGES)
            warm = {"s": time.perf_counter() - started, "seconds": out_c.get("seconds", {})}
            assert out_c["messages"] == out["messages"], (out_c["messages"], out["messages"])
        if remote:  # before the server stops: a client left open retries at exit for minutes
            session(settings).stop()
        records = read_back(conf, topic)
        assert len(records) == out["messages"], (len(records), out["messages"])
        seconds_b = bare_loop(conf, bare, records)

    rate_a, rate_b = out["messages"] / seconds_a, len(records) / seconds_b
    result = {
        "at": stamp(),
        "machine": machine(),
        "keys": args.keys,
        "spark": remote or "local",
        "messages": out["messages"],
        "units": out["units"],
        "compensate_s": round(seconds_a, 2),
        "compensate_msgs_per_s": round(rate_a),
        "bare_s": round(seconds_b, 2),
        "bare_msgs_per_s": round(rate_b),
        "ratio": round(rate_a / rate_b, 3),
        **(
            {
                "warm_compensate_s": round(warm["s"], 2),
                "warm_ratio": round(out["messages"] / warm["s"] / rate_b, 3),
                "warm_seconds": warm["seconds"],
            }
            if warm
            else {}
        ),
        "driver_rss_before_mb": round(before),
        "driver_rss_peak_mb": round(peak[0]),
        "driver_rss_ratio": round(peak[0] / before, 3),
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "seconds": out.get("seconds", {}),
    }
    for k, v in result.items():
        print(f"{k:>24}: {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
