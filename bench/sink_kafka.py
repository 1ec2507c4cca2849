"""Benchmark: the Kafka topic sink's commit against a bare confluent-kafka produce loop.

Same run, same broker, same rows (default 2,000,000 output rows of an order, 8 partitions):

  (a) ``KafkaTopicSink.commit``: Parquet files (one per unit of 250k rows, as Spark tasks
      write them) read by the driver, encoded (JSON value, key, 7 lineage headers, source
      timestamp), produced with the commit producer (transactional with ``--transactional``),
      the marker written, the transaction committed; the first commit of a process also scans
      the topic for an interrupted commit (empty here);
  (b) a bare confluent-kafka idempotent produce loop of the very same records (key, value,
      headers, partition, timestamp), computed before the clock starts, chunk by chunk, with
      the garbage collector paused as in (a).

Prints rows/s of both and the ratio a/b. Usage: ``python bench/sink_kafka.py [--rows N]
[--transactional]``; ``REWIND_BENCH_BOOTSTRAP`` selects another broker than a fresh tansu.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from common import broker, create_topic, machine, stamp  # noqa: E402

UNIT_ROWS = 250_000
PARTITIONS = 8
BASE_MS = 1_760_000_000_000


def unit_table(src: str, partition: int, start: int, end: int, run_id: str) -> Any:
    """Output rows of source offsets [start, end) of one partition (vectorised, deterministic)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from rewind.translate.lineage import LINEAGE_SCHEMA

    offsets = np.arange(start, end, dtype=np.int64)
    n = len(offsets)
    order_id = offsets * PARTITIONS + partition
    statuses = pa.array(["placed", "paid", "shipped", "cancelled"])
    ids = pc.binary_join_element_wise(
        pa.array(np.full(n, f"{partition:04d}")), pc.cast(pa.array(offsets), pa.string()), "-"
    )
    extracted = pa.array(np.full(n, int(datetime(2026, 11, 1, tzinfo=UTC).timestamp() * 1e6), dtype=np.int64))
    columns = {
        "order_id": pa.array(order_id),
        "customer": pc.binary_join_element_wise(
            pa.array(np.full(n, "c")), pc.cast(pa.array(order_id % 50_000), pa.string()), "-"
        ),
        "status": statuses.take(pa.array(order_id % 4)),
        "amount": pa.array((order_id % 9973) / 7.0),
        "currency": pa.array(np.full(n, "EUR")),
        "_rewind_event_id": ids,
        "_rewind_source_topic": pa.array(np.full(n, src)),
        "_rewind_source_partition": pa.array(np.full(n, partition, dtype=np.int32)),
        "_rewind_source_offset": pa.array(offsets),
        "_rewind_source_timestamp": pa.array((BASE_MS + offsets) * 1000).cast(pa.timestamp("us", "UTC")),
        "_rewind_extracted_at": extracted.cast(pa.timestamp("us", "UTC")),
        "_rewind_transform": pa.array(np.full(n, "order_total")),
        "_rewind_transform_version": pa.array(np.full(n, "2")),
        "_rewind_run_id": pa.array(np.full(n, run_id)),
        "_rewind_synthetic": pa.array(np.ones(n, dtype=bool)),
    }
    user = [
        pa.field("order_id", pa.int64()),
        pa.field("customer", pa.string()),
        pa.field("status", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("currency", pa.string()),
    ]
    schema = pa.schema(user + list(LINEAGE_SCHEMA))
    return pa.table([columns[f.name].cast(f.type) for f in schema], schema=schema)


def bare_loop(conf: dict[str, Any], topic: str, files: list[str], schema: Any, key: list[str]) -> float:
    """The same records through a bare producer; only produce calls and the flush are timed."""
    import pyarrow.parquet as pq
    from confluent_kafka import Producer

    from rewind.sinks.kafka.records import RecordEncoder

    producer = Producer(
        {
            **conf,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "delivery.report.only.error": True,
        }
    )
    encoder = RecordEncoder(schema, key)
    timed = 0.0
    rows = 0
    for path in files:
        for batch in pq.ParquetFile(path.removeprefix("file://")).iter_batches(batch_size=250_000):
            enc = encoder.encode(batch)
            records = list(
                zip(
                    encoder.values(enc),
                    enc.keys,
                    enc.source_partitions,
                    enc.timestamps,
                    enc.headers,
                    strict=True,
                )
            )
            produce = producer.produce
            gc.disable()  # as in the sink's loop: a fair bare loop does not pay for the collector
            t0 = time.perf_counter()
            for i, (value, k, p, ts, headers) in enumerate(records):
                while True:
                    try:
                        produce(topic, value, k, p, timestamp=ts, headers=headers)
                        break
                    except BufferError:
                        producer.poll(0.01)
                if i % 20_000 == 0:
                    producer.poll(0)
            timed += time.perf_counter() - t0
            gc.enable()
            rows += len(records)
            del records
    t0 = time.perf_counter()
    if producer.flush(300):
        raise RuntimeError("bare produce: records left undelivered")
    timed += time.perf_counter() - t0
    return rows / timed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--transactional", action="store_true")
    args = parser.parse_args()

    from rewind.core.parquet import write_parquet
    from rewind.sinks.kafka.sink import KafkaTopicSink

    n = args.rows
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        src = f"bench-src-{uuid.uuid4().hex[:6]}"
        create_topic(conf, src, PARTITIONS)
        spool = Path(tempfile.mkdtemp(prefix="rewind-bench-sink-"))
        sink = KafkaTopicSink(
            conf, source_topics=[src], key=["order_id"], transactional=args.transactional, spool_dir=spool
        )
        run_id = f"r-bench-{uuid.uuid4().hex[:6]}"
        schema = unit_table(src, 0, 0, 1, run_id).schema
        staging = sink.prepare(run_id, schema)
        folder = sink.data_folder(staging)
        per_partition = -(-n // PARTITIONS)
        files: list[str] = []
        units: list[str] = []
        for p in range(PARTITIONS):
            top = min(per_partition, n - p * per_partition) if p * per_partition < n else 0
            for start in range(0, max(top, 0), UNIT_ROWS):
                end = min(start + UNIT_ROWS, top)
                files.append(write_parquet(folder, unit_table(src, p, start, end, run_id), f"u{p}-{start}"))
                units.append(f"{src}/{p}/{start}-{end}")
        kept = [f"{f}.copy" for f in files]
        for f, k in zip(files, kept, strict=True):  # commit deletes its files: keep a copy for (b)
            Path(k.removeprefix("file://")).write_bytes(Path(f.removeprefix("file://")).read_bytes())

        t0 = time.perf_counter()
        result = sink.commit(staging, run_id, units, files, extra={})
        sink_seconds = time.perf_counter() - t0
        sink_rate = result["rows"] / sink_seconds

        other = f"bench-bare-{uuid.uuid4().hex[:6]}"
        create_topic(conf, other, PARTITIONS)
        bare_rate = bare_loop(conf, other, kept, schema, ["order_id"])

    mode = "transactional" if args.transactional else "idempotent"
    print(f"# sink_kafka benchmark, {stamp()}, {machine()}, {n:,} rows, {PARTITIONS} partitions, {mode}")
    print(f"{'(a) KafkaTopicSink.commit':42s} {sink_rate:>14,.0f} rows/s  ({sink_seconds:.1f} s)")
    print(f"{'(b) bare confluent-kafka produce loop':42s} {bare_rate:>14,.0f} rows/s")
    print(f"{'a/b':42s} {sink_rate / bare_rate:14.2f}")
    print(
        json.dumps(
            {
                "rows": n,
                "mode": mode,
                "sink_rows_per_s": round(sink_rate),
                "bare_rows_per_s": round(bare_rate),
                "ratio": round(sink_rate / bare_rate, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
