"""Benchmark: archiving Kafka into Iceberg, and reading history back from the lake.

Same run, same broker, same topic (default 2,000,000 records of 200 bytes, 8 partitions):

  (a) raw fetch: a bare confluent-kafka batch consume loop (read_committed, as Rewind reads);
  (b) archive: one ``rewind archive`` pass, Kafka → Iceberg (plan, Spark tasks fetching and
      writing Parquet files, one commit with the high-water); b2 the same pass reading through
      the ``rewind-kafka`` reader and ``mapInArrow`` (``via="reader"``);
  (c) history from the archive alone (a declared log start at the end of the log, so the
      history plan takes every offset from the lake), with Spark:
        c1 count (reads the coordinate columns the range filter needs),
        c2 a JSON-decoding job (from_json on every value, then an aggregate),
        c3 a value scan (every key and value read, nothing decoded);
  (d) the same three Spark jobs over the same records read from Kafka (``rewind-kafka``);
  (e) pyarrow reading the archive's Parquet files directly (every column), and
      ``iter_history`` (pyiceberg + pyarrow, no Spark) over the same window.

Prints records/s and the ratios that matter: archive / raw fetch, lake / Kafka for the same
Spark job, Spark over the lake / pyarrow over the same files.
Usage: ``python bench/history.py [--records N] [--partitions P]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_consume, bare_produce, broker, create_topic, machine, stamp  # noqa: E402

ORDER_SCHEMA = "order_id long, customer string, status string, amount double, currency string, note string"


def best_of(runs: int, n: int, job: Callable[[], Any]) -> float:
    """Records/s of the fastest of ``runs`` runs of ``job`` (the first one warms Spark's workers)."""
    best = 0.0
    for _ in range(runs):
        t0 = time.perf_counter()
        job()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def json_job(df: Any) -> list[Any]:
    from pyspark.sql import functions as F

    events = df.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("e"))
    return events.groupBy("e.status").agg(F.count(F.lit(1)), F.sum("e.amount")).collect()


def value_scan(df: Any) -> list[Any]:
    """Every record's value and key read, nothing decoded: the cost of the source itself."""
    return df.selectExpr("sum(length(value))", "count(key)").collect()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2, help="runs of each read job; the best is kept")
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    import pyarrow.parquet as pq

    from rewind.catalog import load_catalog
    from rewind.config import load_settings
    from rewind.history.archive import archive_once
    from rewind.history.files import plan_files
    from rewind.history.iterate import iter_plan
    from rewind.history.plan import plan_history
    from rewind.history.read import read_history, read_kafka_ranges
    from rewind.spark import session

    state = Path(tempfile.mkdtemp(prefix="bench-history-"))
    rates: dict[str, float] = {}
    facts: dict[str, Any] = {}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-history"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        got, rates["a_raw_fetch"] = bare_consume(conf, topic, parts, "read_committed")
        assert got == n

        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-history")
        spark.range(1).count()

        t0 = time.perf_counter()
        result = archive_once(settings, [topic], "bench.history_archive", spark=spark)
        rates["b1_archive"] = n / (time.perf_counter() - t0)
        assert result.records == n, result.to_dict()
        facts["archive_files"] = result.files
        t0 = time.perf_counter()
        result = archive_once(settings, [topic], "bench.history_archive_reader", spark=spark, via="reader")
        rates["b2_archive_via_reader"] = n / (time.perf_counter() - t0)
        assert result.records == n, result.to_dict()

        # history from the lake alone: retention "removed" everything (declared log start = end)
        catalog = load_catalog(settings)
        ends = {(topic, p): n // parts + (1 if p < n % parts else 0) for p in range(parts)}
        plan = plan_history(
            settings, [topic], "bench.history_archive", declared_log_start=ends, catalog=catalog
        )
        assert plan.kafka_ranges() == [] and sum(r.size for r in plan.archive_ranges()) == n
        lake = read_history(spark, settings, plan, catalog=catalog)
        kafka = read_kafka_ranges(spark, settings, plan.archive_ranges())

        rates["c1_lake_spark_count"] = best_of(args.runs, n, lambda: assert_count(lake.count(), n))
        rates["d1_kafka_spark_count"] = best_of(args.runs, n, lambda: assert_count(kafka.count(), n))
        rates["c2_lake_spark_json"] = best_of(args.runs, n, lambda: json_job(lake))
        rates["d2_kafka_spark_json"] = best_of(args.runs, n, lambda: json_job(kafka))
        rates["c3_lake_spark_value_scan"] = best_of(args.runs, n, lambda: value_scan(lake))
        rates["d3_kafka_spark_value_scan"] = best_of(args.runs, n, lambda: value_scan(kafka))

        iceberg = catalog.load_table("bench.history_archive")
        files = plan_files(iceberg, plan.archive_ranges())
        facts["archive_bytes"] = sum(Path(f.path.removeprefix("file://")).stat().st_size for f in files)

        def read_parquet() -> None:
            rows = 0
            for f in files:
                with iceberg.io.new_input(f.path).open() as stream:
                    rows += pq.read_table(stream).num_rows
            assert_count(rows, n)

        rates["e1_pyarrow_parquet_direct"] = best_of(args.runs, n, read_parquet)
        rates["e2_iter_history_no_spark"] = best_of(
            1,
            n,
            lambda: assert_count(sum(t.num_rows for t in iter_plan(settings, plan, chunk_rows=100_000)), n),
        )
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)

    ratios = {
        "archive / raw fetch (b1/a)": rates["b1_archive"] / rates["a_raw_fetch"],
        "archive in tasks / via reader (b1/b2)": rates["b1_archive"] / rates["b2_archive_via_reader"],
        "lake / Kafka, Spark count (c1/d1)": rates["c1_lake_spark_count"] / rates["d1_kafka_spark_count"],
        "lake / Kafka, Spark JSON job (c2/d2)": rates["c2_lake_spark_json"] / rates["d2_kafka_spark_json"],
        "lake / Kafka, Spark value scan (c3/d3)": rates["c3_lake_spark_value_scan"]
        / rates["d3_kafka_spark_value_scan"],
        "lake Spark JSON job / raw fetch (c2/a)": rates["c2_lake_spark_json"] / rates["a_raw_fetch"],
        "lake Spark count / pyarrow direct (c1/e1)": rates["c1_lake_spark_count"]
        / rates["e1_pyarrow_parquet_direct"],
        "iter_history / pyarrow direct (e2/e1)": rates["e2_iter_history_no_spark"]
        / rates["e1_pyarrow_parquet_direct"],
    }
    print(f"# history benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    print(f"# archive: {facts['archive_files']} files, {facts['archive_bytes'] / 1e6:,.1f} MB (zstd)")
    for key, value in rates.items():
        print(f"{key:44s} {value:>14,.0f} rec/s")
    for key, value in ratios.items():
        print(f"{key:44s} {value:14.2f}")
    print(json.dumps({"rates": rates, "ratios": ratios, "facts": facts}))


def assert_count(got: int, n: int) -> None:
    if got != n:
        raise AssertionError(f"read {got:,} records, expected {n:,}")


if __name__ == "__main__":
    main()
