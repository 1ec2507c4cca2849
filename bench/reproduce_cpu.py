"""Benchmark: CPU per row of one re-produce unit in one process, stage by stage.

What a Spark task of ``bench/reproduce.py`` does for one unit, without Spark, the broker or the
transaction: the SQLite ``accounts`` table read (``SqlReader``), rows → Kafka-shaped batches
(``as_records``), ``process_batch`` with the pandas translate of ``bench/reproduce_translate.py``,
the encoding of keys, values and headers, the placement (murmur2) and the produce loop, into a
no-op ``produce`` (Rewind's own work) or, with ``--real``, into a librdkafka producer with no
broker (the call and its thread, which the bare loop pays too). CPU seconds
(``time.process_time``), so the load of other processes counts less than in wall time; the
whole unit runs once to warm up, then ``--repeat`` times, and the median per stage is printed.

Beside it, in the same run, librdkafka's own CPU per record: after each repeat of the unit, the
records that repeat produced (the same keys, values, partitions, timestamps and headers, kept
from a pass that is not timed) go through a bare loop into a real idempotent lz4 producer on a
broker (the embedded tansu, or ``REWIND_BENCH_BOOTSTRAP``): its ``produce`` calls, ``poll``
and ``flush``, and its threads' batching, compression and sending, as process CPU. That loop is
all a bare produce loop spends per record beyond building its records, so the last line, Rewind's
own µs per row beside librdkafka's and their ratio, reads off whether Rewind's own CPU per
record stays within librdkafka's (with ``--real`` the unit's ``produce`` stage already holds
librdkafka's calls, and the ratio is not printed).

To compare two versions of the code side by side, run it with each one's ``src`` first on
``PYTHONPATH``, alternating: ``PYTHONPATH=/old/checkout/src python bench/reproduce_cpu.py``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(HERE.parent / "src"))

from common import broker, create_topic, machine, stamp  # noqa: E402

STAGES = ("read", "as_records", "process_batch", "encode", "placement", "produce")


def unit(n: int, db: Path, real: bool, into: Any = None) -> dict[str, float]:
    """CPU seconds per stage of one unit holding every row of ``db``; ``into``, when given,
    is called instead of ``produce`` (it keeps the calls for :func:`librdkafka`)."""
    import pyarrow as pa
    import reproduce_translate

    from rewind.kafka.partitioner import partitions_for
    from rewind.sinks.kafka.records import RecordEncoder
    from rewind.tables.readers import Selection
    from rewind.tables.records import as_records
    from rewind.tables.sql import SqlReader
    from rewind.translate.lineage import LINEAGE_SCHEMA
    from rewind.translate.process import ProcessContext, process_batch
    from rewind.translate.rows_decoder import RowsDecoder

    reader = SqlReader("sqlite", f"sqlite:///{db}", "accounts", None, "id", "sqlite:accounts")
    user = pa.schema(
        [
            ("account_id", pa.int64()),
            ("name", pa.string()),
            ("balance", pa.float64()),
            ("status", pa.string()),
            ("region", pa.string()),
        ]
    )
    schema = pa.schema([*user, *LINEAGE_SCHEMA])
    ctx = ProcessContext("bench", "u-0", "account_state", "1", datetime.now(UTC), id_scheme="table")
    encoder = RecordEncoder(schema, ["account_id"])
    producer: Any = None
    if real:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": "127.0.0.1:1",  # nothing is sent: the calls and the queue only
                "enable.idempotence": True,
                "linger.ms": 20,
                "compression.type": "lz4",
                "queue.buffering.max.messages": 2 * n + 1000,
                "queue.buffering.max.kbytes": 2_000_000,
                "log_level": 0,
            }
        )
        produce = producer.produce
    elif into is not None:
        produce = into
    else:

        def produce(*args: Any, **kwargs: Any) -> None:
            return None

    def full(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the producer's queue is full: raise queue.buffering.max.messages")

    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.process_time
    rows_seen = 0
    batches = reader.read(Selection(where="TRUE"), None, None, 10_000)
    gc.disable()  # as in Rewind's produce loop
    try:
        while True:
            t0 = clock()
            rows = next(batches, None)
            t1 = clock()
            spent["read"] += t1 - t0
            if rows is None:
                break
            records = as_records(rows, "id", "sqlite:accounts", 0, rows_seen, ctx.extracted_at)
            rows_seen += len(rows)
            t2 = clock()
            result = process_batch(
                records,
                RowsDecoder(),
                reproduce_translate.account_state,
                ["account_id"],
                ctx,
                output_schema=user,
            )
            t3 = clock()
            spent["as_records"] += t2 - t1
            spent["process_batch"] += t3 - t2
            for batch in result.rows.select(schema.names).cast(schema).to_batches():
                t4 = clock()
                encoded = encoder.encode(batch)
                keys = [k if type(k) is bytes else bytes(k) for k in encoded.keys]
                t5 = clock()
                partitions = partitions_for(keys, 8, "murmur2")
                t6 = clock()
                encoder.produce(encoded, produce, full, "accounts", partitions)
                t7 = clock()
                spent["encode"] += t5 - t4
                spent["placement"] += t6 - t5
                spent["produce"] += t7 - t6
    finally:
        gc.enable()
        reader.close()
        if producer is not None:
            producer.purge()
    assert rows_seen == n, f"read {rows_seen} of {n} rows"
    return spent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--real", action="store_true", help="into librdkafka's produce (no broker)")
    args = parser.parse_args()

    rewind = importlib.import_module("rewind")  # before bench/reproduce.py puts this checkout's src first
    from reproduce import fill_sqlite

    db = Path(tempfile.mkdtemp(prefix="rewind-bench-cpu-")) / "accounts.db"
    fill_sqlite(db, args.rows)
    unit(args.rows, db, args.real)  # imports, the first connection, pandas' caches
    calls: list[tuple[Any, ...]] = []
    unit(args.rows, db, False, into=lambda *a: calls.append(a))  # the records, not timed
    runs, kafka = [], []
    with broker() as bootstrap:
        topic = f"bench-cpu-{time.time_ns()}"
        create_topic({"bootstrap.servers": bootstrap}, topic, 8)
        librdkafka(bootstrap, topic, calls[:1000])  # the connection and its first batches
        for _ in range(args.repeat):
            runs.append(unit(args.rows, db, args.real))
            kafka.append(librdkafka(bootstrap, topic, calls))
    per_row = {s: statistics.median(r[s] for r in runs) / args.rows * 1e6 for s in STAGES}
    total = statistics.median(sum(r.values()) for r in runs) / args.rows * 1e6
    load = os.getloadavg()[0]
    into = "librdkafka, no broker" if args.real else "no-op"
    print(f"# {stamp()}  {machine()}  {args.rows:,} rows, median of {args.repeat}, load {load:.1f}")
    print(f"# code: {Path(str(rewind.__file__)).parent}  produce: {into}")
    fastest = min(sum(r.values()) for r in runs) / args.rows * 1e6  # the least disturbed repeat
    print(
        "  ".join(f"{s}={v:.2f}" for s, v in per_row.items())
        + f"  total={total:.2f}  min={fastest:.2f} us/row"
    )
    per_record = statistics.median(kafka) / len(calls) * 1e6
    line = f"librdkafka={per_record:.2f} min={min(kafka) / len(calls) * 1e6:.2f} us/record"
    if not args.real:
        line = f"rewind={total:.2f}  {line}  rewind/librdkafka={total / per_record:.2f}"
    print(line + " (medians, same run)")


def librdkafka(bootstrap: str, topic: str, calls: list[tuple[Any, ...]]) -> float:
    """Process CPU seconds (librdkafka's threads included) of a bare loop that produces
    ``calls`` (as the unit's produce loop made them) to ``topic`` and flushes."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
            "log_level": 0,
        }
    )
    produce, poll = producer.produce, producer.poll
    gc.disable()
    t0 = time.process_time()
    try:
        for i, (_, value, key, partition, _cb, _od, ts, headers) in enumerate(calls):
            while True:
                try:
                    produce(topic, value, key, partition, None, None, ts, headers)
                    break
                except BufferError:
                    poll(0.01)
            if i % 10_000 == 0:
                poll(0)
        if producer.flush(120):
            raise RuntimeError("librdkafka loop: records left undelivered")
        return time.process_time() - t0
    finally:
        gc.enable()


if __name__ == "__main__":
    main()
