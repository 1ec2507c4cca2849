"""Benchmark: a shadow's live tail against a live producer at a fixed rate.

The shadow's whole life on the embedded broker: a keyed topic (4 partitions) with a small
history, archived; ``start_shadow`` runs the history into v2 (SQLite, the embedded SQL sink),
then, while the tail is stopped, a backlog is produced at full speed. Then a producer writes
at a fixed rate (default 200 records/s) and the tail starts again from its checkpoint:

* **sustained rate** — records the tail committed to v2 until it first caught up
  (every partition's lag ≤ ``--threshold``), over the seconds that took, the query's start
  included. It must be ≥ 5 times the producer's rate: a tail that only matches the producer never
  catches up after a pause;
* **end-to-end lag** — after catching up, for ``--steady`` seconds: the lag in records at
  each sample (every 1 s) and the same in seconds at the producer's rate; the maximum and
  the median are printed.

``--sink iceberg`` makes v1 and v2 Iceberg tables (v2 upserted on the key by one Iceberg
commit per micro-batch); ``--sink both`` measures SQLite then Iceberg in the same run, on the
same broker, and prints the Iceberg tail's rate over the SQLite tail's.

Usage: ``python bench/shadow_tail.py [--rate R] [--backlog B] [--steady S] [--threshold T]
[--sink sqlite|iceberg|both]``. Prints one JSON line per sink with the figures
(``bench/RESULTS.md`` records a run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from common import broker, machine, stamp  # noqa: E402

PARTITIONS = 4
ORDERS = 2000


def event(seq: int) -> tuple[int, bytes, bytes]:
    order = seq % ORDERS
    value = {"order_id": order, "status": "paid", "amount": float(seq)}
    return order % PARTITIONS, str(order).encode(), json.dumps(value).encode()


def produce(conf: dict[str, Any], topic: str, first: int, last: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({**conf, "linger.ms": 5})
    for seq in range(first, last):
        partition, key, value = event(seq)
        producer.produce(topic, value, key, partition=partition)
        if seq % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


class Paced(threading.Thread):
    """Produces at ``rate`` records/s from ``first`` until stopped."""

    def __init__(self, conf: dict[str, Any], topic: str, first: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.conf, self.topic, self.seq, self.rate = conf, topic, first, rate
        self.halt = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.conf, "linger.ms": 5})
        started = time.monotonic()
        sent = 0
        while not self.halt.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while sent < due:
                partition, key, value = event(self.seq)
                producer.produce(self.topic, value, key, partition=partition)
                self.seq += 1
                sent += 1
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--history", type=int, default=4_000)
    parser.add_argument("--steady", type=float, default=30.0)
    parser.add_argument("--threshold", type=int, default=100)
    parser.add_argument("--sink", choices=["sqlite", "iceberg", "both"], default="sqlite")
    args = parser.parse_args()

    with broker() as bootstrap:
        sinks = ["sqlite", "iceberg"] if args.sink == "both" else [args.sink]
        results = []
        for sink in sinks:
            results.append(measure(args, bootstrap, sink))
            print(json.dumps(results[-1]), flush=True)
    if len(results) == 2:
        print(
            json.dumps(
                {"iceberg_over_sqlite": round(results[1]["sustained_rate"] / results[0]["sustained_rate"], 2)}
            )
        )


def measure(args: Any, bootstrap: str, sink_kind: str) -> dict[str, Any]:
    from rewind.catalog import load_catalog
    from rewind.config import load_settings
    from rewind.history import archive_once
    from rewind.job.planner import build_plan
    from rewind.shadow.start import TailProgress, start_shadow
    from rewind.spark import session
    from rewind.spec import parse_spec
    from tests.kafka_util import create_topic

    work = Path(tempfile.mkdtemp(prefix="rewind-bench-shadow-"))
    settings = load_settings(
        env={"REWIND_STATE_DIR": str(work / "state"), "REWIND_BOOTSTRAP_SERVERS": bootstrap}, cwd=work
    )
    conf = settings.kafka_config()
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(conf, topic, PARTITIONS)
    produce(conf, topic, 0, args.history)
    spark = session(settings)
    archive_once(settings, [topic], "lake.bench_archive", spark=spark)
    data: dict[str, Any] = {
        "name": f"bench-shadow-{sink_kind}",
        "source": {"history": {"topics": [topic], "archive": "lake.bench_archive"}},
        "decode": "json",
        "translate": {"function": "tests.job_fixtures:order_amounts", "version": "1"},
        "key": ["order_id"],
        "sink": {"postgres": {"table": "orders", "url": f"sqlite:///{work / 'app.db'}"}},
        "shadow": {"live_group": "bench-live", "lag_threshold": args.threshold, "trigger_s": 0.5},
    }
    if sink_kind == "iceberg":  # v1: an Iceberg table of the job's output schema
        schema = build_plan(settings, parse_spec(data)).output_schema()
        catalog = load_catalog(settings)
        catalog.create_namespace_if_not_exists("app")
        catalog.create_table("app.orders", schema=schema)
        data["sink"] = {"iceberg": {"table": "app.orders"}}
    spec = parse_spec(data)
    # 1. history into v2, the tail started and stopped at once
    start_shadow(settings, spec, stop=lambda p: True, sample_s=1.0)
    # 2. a backlog while the tail is stopped, then the producer at a fixed rate
    produce(conf, topic, args.history, args.history + args.backlog)
    paced = Paced(conf, topic, args.history + args.backlog, args.rate)
    paced.start()
    caught: dict[str, float] = {}
    lags: list[int] = []

    def stop(p: TailProgress) -> bool:
        if "seconds" not in caught:
            if p.max_lag <= args.threshold:
                caught.update(seconds=p.seconds, records=p.records)
            return False
        lags.append(p.max_lag)
        return p.seconds - caught["seconds"] >= args.steady

    result = start_shadow(settings, spec, stop=stop, sample_s=1.0)
    paced.halt.set()
    paced.join(60)
    rate = caught["records"] / caught["seconds"]
    lag_records = max(lags) if lags else None
    return {
        "sink": sink_kind,
        "when": stamp(),
        "machine": machine(),
        "producer_rate": args.rate,
        "backlog": args.backlog,
        "caught_up_after_s": round(caught["seconds"], 1),
        "records_to_catch_up": int(caught["records"]),
        "sustained_rate": round(rate),
        "ratio": round(rate / args.rate, 1),
        "steady_samples": len(lags),
        "max_lag_records": lag_records,
        "median_lag_records": statistics.median(lags) if lags else None,
        "max_lag_s": round(lag_records / args.rate, 2) if lag_records is not None else None,
        "median_lag_s": round(statistics.median(lags) / args.rate, 2) if lags else None,
        "tail_batches": result["batches"],
        "load_avg": os.getloadavg()[0],
    }


if __name__ == "__main__":
    main()
