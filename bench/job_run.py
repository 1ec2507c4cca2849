"""Benchmark: a backfill job end to end (Kafka → JSON decode → translate → Iceberg staging).

Same run, same broker, same topic (default 5,000,000 records of 200 bytes, 8 partitions):

  (a) raw fetch rate: a bare confluent-kafka batch consume loop (best of read_committed and
      read_uncommitted, as the job reads read_committed);
  (b) ``rewind run``: plan + run with lineage, quarantine, unit commits and the ledger;
  (c) the same decode + translate + Parquet write as one plain Spark job without Rewind's
      lineage, quarantine, conservation checks and unit commits (``mapInArrow``).

Prints records/s, b/a, and the overhead of lineage and quarantine as b/c.
Usage: ``python bench/job_run.py [--records N]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_consume, bare_produce, broker, create_topic, machine, stamp  # noqa: E402


def plain_job(spark, bootstrap: str, topic: str, out: str) -> None:
    """Decode + translate + write Parquet with nothing of Rewind's bookkeeping."""
    import pyarrow as pa

    def process(batches):
        import pandas as pd

        from bench.job_translate import order_amount

        for batch in batches:
            values = batch.column("value").to_pylist()
            events = pd.DataFrame.from_records([json.loads(v) for v in values])
            events["_rewind_row"] = range(len(events))
            rows = order_amount(events).drop(columns=["_rewind_row"])
            yield pa.RecordBatch.from_pandas(rows, preserve_index=False)

    (
        spark.read.format("rewind-kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
        .mapInArrow(process, "order_id long, status string, amount_cents long")
        .write.mode("overwrite")
        .parquet(out)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.spark import session
    from rewind.spec import parse_spec

    state = Path(tempfile.mkdtemp(prefix="bench-job-"))
    rates: dict[str, float] = {}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-orders"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        got, ru = bare_consume(conf, topic, parts, "read_uncommitted")
        got2, rc = bare_consume(conf, topic, parts, "read_committed")
        assert got == got2 == n
        rates["raw_fetch_read_uncommitted"], rates["raw_fetch_read_committed"] = ru, rc
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-job")
        spark.range(1).count()

        out = tempfile.mkdtemp(prefix="bench-plain-")
        t0 = time.perf_counter()
        plain_job(spark, bootstrap, topic, out)
        rates["plain_spark_job"] = n / (time.perf_counter() - t0)
        shutil.rmtree(out, ignore_errors=True)

        spec = parse_spec(
            {
                "name": "bench",
                "source": {"kafka": {"topics": [topic]}},
                "decode": "json",
                "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
                "key": ["order_id"],
                "sink": {"iceberg": {"table": "bench.order_amounts"}},
                "run": {"work_unit_records": 250_000},
            }
        )
        t0 = time.perf_counter()
        outcome = run_job(settings, spec)
        rates["rewind_run"] = n / (time.perf_counter() - t0)
        assert outcome.counts.records_read == n, outcome.to_dict()
        assert outcome.counts.rows_out == n
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)

    raw = max(rates["raw_fetch_read_uncommitted"], rates["raw_fetch_read_committed"])
    ratios = {
        "b/a (run / best raw fetch)": rates["rewind_run"] / raw,
        "b/a (run / read_committed raw fetch)": rates["rewind_run"] / rates["raw_fetch_read_committed"],
        "b/c (lineage+quarantine+commits overhead)": rates["rewind_run"] / rates["plain_spark_job"],
    }
    print(f"# job_run benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    for key, value in rates.items():
        print(f"{key:42s} {value:>14,.0f} rec/s")
    for key, value in ratios.items():
        print(f"{key:42s} {value:14.2f}")
    print(json.dumps({"rates": rates, "ratios": ratios}))


if __name__ == "__main__":
    main()
