"""Benchmark: Kafka reads and writes through Spark's ``rewind-kafka`` against bare clients.

One run, one broker, one topic of N records (default 5,000,000) of 200 bytes over 8
partitions:

  (a) raw fetch: the best of the broker's own consume benchmark and a bare confluent-kafka
      batch consume loop that only sums value lengths (read_uncommitted and read_committed);
  (b) Spark ``rewind-kafka`` read + count;
  (c) Spark read, decode JSON values, write Parquet;
  (d) Spark ``rewind-kafka`` write of the same records vs a bare confluent-kafka produce loop.

Prints records/s and the ratios b/a, c/a, d/(bare produce). Usage:
``python bench/kafka_read.py [--records N]``; ``REWIND_BENCH_BOOTSTRAP`` picks another broker.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bare_consume, bare_produce, broker, create_topic, machine, run_tansu_perf_consume, stamp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from pyspark.sql import functions as F

    from rewind.config import load_settings
    from rewind.spark import session

    results: dict[str, float] = {}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic, copy = "bench-orders", "bench-orders-copy"
        create_topic(conf, topic, parts)
        create_topic(conf, copy, parts)
        results["bare_produce"] = bare_produce(conf, topic, n, parts)
        tansu_perf = run_tansu_perf_consume(bootstrap, topic)
        got, results["bare_fetch_read_uncommitted"] = bare_consume(conf, topic, parts, "read_uncommitted")
        assert got == n, f"bare consume read {got} of {n}"
        got, results["bare_fetch_read_committed"] = bare_consume(conf, topic, parts, "read_committed")
        assert got == n

        spark = session(load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap}), app_name="bench")
        spark.range(1).count()  # warm the JVM and the Python workers

        def reader(isolation: str):
            return (spark.read.format("rewind-kafka").option("kafka.bootstrap.servers", bootstrap)
                    .option("subscribe", topic).option("kafka.isolation.level", isolation).load())

        for isolation in ("read_uncommitted", "read_committed"):
            t0 = time.perf_counter()
            count = reader(isolation).count()
            assert count == n, f"spark read {count} of {n}"
            results[f"spark_read_count_{isolation}"] = n / (time.perf_counter() - t0)

        out = Path(tempfile.mkdtemp(prefix="bench-parquet-"))
        schema = "order_id LONG, customer STRING, status STRING, amount DOUBLE, currency STRING, note STRING"
        t0 = time.perf_counter()
        (reader("read_uncommitted").select(F.from_json(F.col("value").cast("string"), schema).alias("e"),
                                            "partition", "offset")
         .select("e.*", "partition", "offset").write.mode("overwrite").parquet(str(out)))
        results["spark_read_decode_parquet"] = n / (time.perf_counter() - t0)
        assert spark.read.parquet(str(out)).count() == n
        shutil.rmtree(out, ignore_errors=True)

        source = reader("read_uncommitted").select("key", "value").cache()
        assert source.count() == n  # the write is measured on its own, not the read
        t0 = time.perf_counter()
        source.write.format("rewind-kafka").option("kafka.bootstrap.servers", bootstrap).option(
            "topic", copy).mode("append").save()
        results["spark_write"] = n / (time.perf_counter() - t0)
        source.unpersist()
        got, _ = bare_consume(conf, copy, parts, "read_uncommitted")
        assert got == n, f"copy holds {got} of {n}"
        spark.stop()

    r = results
    raw = max(r["bare_fetch_read_uncommitted"], r["bare_fetch_read_committed"])
    ratios = {
        "b/a (read_uncommitted)": r["spark_read_count_read_uncommitted"] / r["bare_fetch_read_uncommitted"],
        "b/a (read_committed)": r["spark_read_count_read_committed"] / r["bare_fetch_read_committed"],
        "c/a (best raw)": r["spark_read_decode_parquet"] / raw,
        "d/bare_produce": r["spark_write"] / r["bare_produce"],
    }
    print(f"# kafka_read benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    print(f"{'tansu perf consume':34s} {tansu_perf}")
    for key, value in results.items():
        print(f"{key:34s} {value:>14,.0f} rec/s")
    for key, value in ratios.items():
        print(f"{key:34s} {value:14.2f}")
    print(json.dumps({"results": results, "ratios": ratios, "tansu_perf_consume": tansu_perf}))


if __name__ == "__main__":
    main()
