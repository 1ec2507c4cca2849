"""Benchmark: rows/s into Iceberg staging through Rewind's path vs pyiceberg's own append.

Same run, same N rows (default 5,000,000; --rows): (a) Spark tasks write Parquet files into
the staging branch's data folder and the driver commits them in one ``IcebergSink.commit``
(what a backfill wave does); (b) the baseline: pyiceberg ``Table.append`` of the same rows as
one Arrow table, from one process. Prints rows/s and the ratio a/b.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, stamp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    n = parser.parse_args().rows

    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    from rewind.config import load_settings
    from rewind.sinks.iceberg import IcebergSink
    from rewind.spark import session

    tmp = Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    (tmp / "wh").mkdir()
    catalog = SqlCatalog("bench", uri=f"sqlite:///{tmp / 'c.db'}", warehouse=(tmp / "wh").as_uri())
    catalog.create_namespace("b")
    spark = session(load_settings(env={"REWIND_STATE_DIR": str(tmp / "state")}), app_name="bench-iceberg")
    df = spark.range(n).selectExpr(
        "id as order_id",
        "concat('c-', cast(id % 50000 as string)) as customer",
        "cast(id % 9973 as double) / 7 as amount",
        "timestamp_millis(1760000000000 + id) as last_event_at",
    )
    schema = pa.schema(
        [
            ("order_id", pa.int64()),
            ("customer", pa.string()),
            ("amount", pa.float64()),
            ("last_event_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    arrow = df.toArrow().cast(schema)  # the baseline's input, built once outside the timings

    target = catalog.create_table("b.rewind_path", schema=schema)
    target.append(arrow.slice(0, 1))  # an existing target: staging is a branch
    sink = IcebergSink(catalog, "b.rewind_path")
    staging = sink.prepare("bench", schema)
    folder = sink.data_folder(staging)

    def write(batches):
        import pyarrow as pa

        from rewind.core.parquet import write_parquet

        table = pa.Table.from_batches(list(batches))
        if table.num_rows:
            path = write_parquet(folder, table.cast(schema), "bench")
            yield pa.RecordBatch.from_pylist([{"path": path}])

    t0 = time.perf_counter()
    files = [r.path for r in df.mapInArrow(write, "path string").collect()]
    sink.commit(staging, "bench", ["all"], files)
    rewind_rate = n / (time.perf_counter() - t0)

    baseline = catalog.create_table("b.baseline", schema=schema)
    t0 = time.perf_counter()
    baseline.append(arrow)
    baseline_rate = n / (time.perf_counter() - t0)
    spark.stop()

    print(f"# sink_iceberg benchmark, {stamp()}, {machine()}, {n:,} rows")
    print(f"{'Spark tasks write + one IcebergSink.commit':44s} {rewind_rate:>12,.0f} rows/s")
    print(f"{'pyiceberg Table.append, one process':44s} {baseline_rate:>12,.0f} rows/s")
    print(f"{'ratio':44s} {rewind_rate / baseline_rate:12.2f}")
    print(json.dumps({"rewind": rewind_rate, "pyiceberg_append": baseline_rate}))


if __name__ == "__main__":
    main()
