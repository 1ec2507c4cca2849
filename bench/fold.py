"""Benchmark: the fold stage of read models, rows/s, against a plain Spark ``applyInPandas``.

Same run, same input: N partial rows (default 2,000,000) of M orders (default 300,000) in the
demo's ``order_totals`` columns plus Rewind's lineage, written once to Parquet (what the
units leave in staging), then folded with the demo's fold
(``rewind.demo.orders:fold_order_totals``) and written to Parquet by:

  (a) Rewind's fold stage (:func:`rewind.spark.fold_stage.run_fold`): repartition by key, one
      fold call per task over all its keys, the last row's lineage per key, Parquet files;
  (b) plain Spark: ``groupBy(order_id).applyInPandas(...)`` calling the same fold once per
      order, the group sorted by source time and offset and the last row's lineage attached
      the same way, then ``write.parquet``. One Python call per order costs milliseconds, so
      at 300,000 orders (b) would take hours here: it runs on the rows of the first
      ``--plain-keys`` orders (default 5,000) of the same input, a per-row rate that does not
      depend on the number of orders.

(b)'s orders are checked to come out of (a) identical (status, total, items, lineage), and
(a) to give one row per order. Prints rows in per second for each and a/b.
Usage: ``python bench/fold.py [--rows N] [--keys M] [--plain-keys K]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rewind.core.arrow import schema_to_b64

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, stamp  # noqa: E402

RUN = "r-bench"
FOLD = "rewind.demo.orders:fold_order_totals"
BASE_MS = 1_788_000_000_000


def partial_rows(spark, n: int, keys: int):  # type: ignore[no-untyped-def]
    """N partial rows of ``keys`` orders: placed, lines, paid/shipped, spread over 8 partitions."""
    step = f"cast(floor(id / {keys}) as long)"
    return spark.range(n).selectExpr(
        f"concat('o-', lpad(cast(id % {keys} as string), 7, '0')) as order_id",
        f"case when {step} = 0 then concat('c-', cast(id % 5000 as string)) end as customer_id",
        f"case when {step} = 0 then 'placed' when id % 7 = 3 then 'paid' "
        "when id % 7 = 5 then 'shipped' end as status",
        f"case when {step} = 0 then 0.0 else cast(id % 12000 as double) / 100 end as total",
        f"case when {step} = 0 then 0L else 1L + id % 3 end as item_count",
        f"case when {step} = 0 then timestamp_millis({BASE_MS} + id * 10) end as placed_at",
        f"timestamp_millis({BASE_MS} + id * 10) as last_event_time",
        "sha2(cast(id as string), 256) as _rewind_event_id",
        "'orders' as _rewind_source_topic",
        "cast(id % 8 as int) as _rewind_source_partition",
        "cast(floor(id / 8) as long) as _rewind_source_offset",
        f"timestamp_millis({BASE_MS} + id * 10) as _rewind_source_timestamp",
        f"timestamp_millis({BASE_MS}) as _rewind_extracted_at",
        "'order_deltas_v2' as _rewind_transform",
        "'2' as _rewind_transform_version",
        f"'{RUN}' as _rewind_run_id",
        "true as _rewind_synthetic",
    )


def output_schema():  # type: ignore[no-untyped-def]
    import pyarrow as pa

    from rewind.translate.lineage import LINEAGE_SCHEMA, TIMESTAMP

    user = [
        ("order_id", pa.string()),
        ("customer_id", pa.string()),
        ("status", pa.string()),
        ("total", pa.float64()),
        ("item_count", pa.int64()),
        ("placed_at", TIMESTAMP),
        ("last_event_time", TIMESTAMP),
    ]
    return pa.schema([pa.field(n, t) for n, t in user] + list(LINEAGE_SCHEMA))


def plain_fold(rows, out: str) -> None:  # type: ignore[no-untyped-def]
    """What one would write without Rewind: the fold once per order, then a Parquet write."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from rewind.core.columns import LINEAGE_COLUMNS

    order = [
        "_rewind_source_timestamp",
        "_rewind_source_topic",
        "_rewind_source_partition",
        "_rewind_source_offset",
    ]

    def one_order(group):  # type: ignore[no-untyped-def]
        from rewind.demo.orders import fold_order_totals

        group = group.sort_values(order, kind="stable", na_position="first")
        user = [c for c in group.columns if c not in LINEAGE_COLUMNS]
        folded = fold_order_totals(group[user].reset_index(drop=True))
        last = group.iloc[[-1]][["order_id", *LINEAGE_COLUMNS]]
        return folded.merge(last, on="order_id")

    schema = from_arrow_schema(output_schema())
    rows.groupBy("order_id").applyInPandas(one_order, schema).write.mode("overwrite").parquet(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--plain-keys", type=int, default=5_000)
    args = parser.parse_args()
    n, keys, plain_keys = args.rows, args.keys, min(args.plain_keys, args.keys)

    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from rewind.config import load_settings
    from rewind.spark import session
    from rewind.spark.fold_stage import FoldContext, run_fold
    from rewind.spark.session import default_parallelism

    tmp = Path(tempfile.mkdtemp(prefix="bench-fold-"))
    spark = session(load_settings(env={"REWIND_STATE_DIR": str(tmp / "state")}), app_name="bench-fold")
    staged = str(tmp / "staged")
    partial_rows(spark, n, keys).write.parquet(staged)  # the units' output, outside the timings
    rows = spark.read.parquet(staged)
    subset = str(tmp / "subset")  # (b)'s input, also written outside the timings
    rows.where(F.col("order_id") < f"o-{plain_keys:07d}").write.parquet(subset)
    first = spark.read.parquet(subset)
    n_plain = first.count()
    assert rows.count() == n

    rates: dict[str, float] = {}
    ctx = FoldContext(
        run_id=RUN,
        key=("order_id",),
        fold=FOLD,
        schema_b64=schema_to_b64(output_schema()),
        data_folder=(tmp / "folded").as_uri(),
    )
    t0 = time.perf_counter()
    files, counts = run_fold(rows, ctx, default_parallelism(spark))
    rates["rewind_fold_stage"] = n / (time.perf_counter() - t0)
    assert counts.to_dict() == {"rows_in": n, "rows_out": keys, "outside_window": 0}, counts

    plain = str(tmp / "plain")
    t0 = time.perf_counter()
    plain_fold(first, plain)
    rates["plain_spark_applyInPandas"] = n_plain / (time.perf_counter() - t0)

    compared = ["order_id", "status", "total", "item_count", "_rewind_event_id", "_rewind_source_offset"]
    ours = pq.read_table([f.removeprefix("file://") for f in files], columns=compared).to_pylist()
    ours = sorted((r for r in ours if r["order_id"] < f"o-{plain_keys:07d}"), key=lambda r: r["order_id"])
    theirs = sorted(pq.read_table(plain, columns=compared).to_pylist(), key=lambda r: r["order_id"])
    assert len(theirs) == plain_keys and ours == theirs

    parallelism = default_parallelism(spark)
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    spark.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    ratio = rates["rewind_fold_stage"] / rates["plain_spark_applyInPandas"]
    print(
        f"# fold benchmark, {stamp()}, {machine()}, {n:,} partial rows of {keys:,} keys "
        f"(fold tasks: {parallelism}); applyInPandas on the {n_plain:,} rows of the first {plain_keys:,} "
        f"keys (shuffle partitions: {shuffle})"
    )
    for key, value in rates.items():
        print(f"{key:42s} {value:>14,.0f} rows/s")
    print(f"{'a/b (fold stage / applyInPandas)':42s} {ratio:14.2f}")
    print(json.dumps({"rates": rates, "ratio": ratio, "rows": n, "keys": keys, "plain_rows": n_plain}))


if __name__ == "__main__":
    main()
