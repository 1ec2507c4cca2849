"""Benchmark: the Iceberg merge's decisions in the driver vs in Spark, by contested-set size.

For each size C (``--sizes``, contested rows: the run's and live's together), a run of C/2 rows
in 8 files whose every key live also holds (C/2 live rows in 4 files, older, so every run row
is applied and every live row replaced), merged with ``rewind.job.merge_iceberg.merge_iceberg``
twice on identical branches: the driver deciding (threshold above C) and Spark deciding
(threshold 0, ``local[*]``, the session warmed first). Both paths read the same key columns and
rewrite the same files; what differs is step 4 (reading the contested rows and deciding).

Prints per size the medians of ``--repeat`` merges of each side (taken in turn), the ratio
spark/driver, the driver's peak Arrow memory deciding in the driver and deciding in Spark (each
in a fresh process that only merges: ``pyarrow``'s pool peak, what the keys, the contested rows
and the files read whole cost), and the smallest size at which Spark was faster (the crossing
point), if any.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, stamp
from merge_policy import RUN, rows

RUN_FILES, LIVE_FILES = 8, 4
BASE = 1_790_000_000_000_000


def staged(catalog: Any, name: str, n: int) -> tuple[Any, Any]:
    """A target whose live rows hold every key of the run's n rows (older), the run committed."""
    from rewind.core.parquet import write_parquet
    from rewind.sinks.iceberg import IcebergSink

    data = rows(n, RUN, BASE, 0.0)
    live = rows(n, "live", BASE - 10**9, 0.0).cast(data.schema)  # type: ignore[attr-defined]
    table = catalog.create_table(name, schema=data.schema)  # type: ignore[attr-defined]
    step = -(-n // LIVE_FILES)
    for i in range(0, n, step):
        table.append(live.slice(i, step))
    sink = IcebergSink(catalog, name)
    staging = sink.prepare(RUN, data.schema)  # type: ignore[attr-defined]
    step = -(-n // RUN_FILES)
    folder = sink.data_folder(staging)
    files = [write_parquet(folder, data.slice(i, step), "unit") for i in range(0, n, step)]  # type: ignore[attr-defined]
    sink.commit(staging, RUN, ["u"], files)
    return sink, staging


def merge_once(catalog: Any, name: str, n: int, spark: Any, threshold: int) -> tuple[float, dict[str, int]]:
    from rewind.core.merge import MergePolicy
    from rewind.job.merge_iceberg import merge_iceberg

    sink, staging = staged(catalog, name, n)
    began = time.perf_counter()
    result = merge_iceberg(
        sink,
        staging,
        RUN,
        ["order_id"],
        MergePolicy(),
        spark=(lambda: spark) if spark else None,
        spark_rows=threshold,
    )
    took = time.perf_counter() - began
    catalog.purge_table(name)
    return took, result.counts


def new_catalog() -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    tmp = Path(tempfile.mkdtemp(prefix="bench-merge-spark-"))
    (tmp / "wh").mkdir()
    catalog = SqlCatalog("bench", uri=f"sqlite:///{tmp / 'c.db'}", warehouse=(tmp / "wh").as_uri())
    catalog.create_namespace("b")
    return catalog


MEMORY_CHILD = """
import json, sys
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from rewind.core.merge import MergePolicy
from rewind.job.merge_iceberg import merge_iceberg
from rewind.sinks.iceberg import IcebergSink, IcebergStaging

uri, warehouse, name, staging, run, in_spark = sys.argv[1:7]
spark = None
if in_spark == "1":
    sys.path[:0] = sys.argv[7:9]
    import merge_spark
    spark = merge_spark.spark_session()
catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
sink = IcebergSink(catalog, name)
merge_iceberg(sink, IcebergStaging.from_dict(json.loads(staging)), run, ["order_id"], MergePolicy(),
              spark=(lambda: spark) if spark else None, spark_rows=0 if spark else 10**12)
print(json.dumps(pa.default_memory_pool().max_memory()))
"""


def driver_memory(catalog: Any, contested: int, in_spark: bool) -> int:
    """Peak bytes of pyarrow's pool in a fresh driver process that only merges (deciding in the
    driver, or in Spark) a branch staged by this one."""
    name = f"b.mem{contested}_{int(in_spark)}"
    _, staging = staged(catalog, name, contested // 2)
    here = Path(__file__).resolve()
    props = catalog.properties
    args = [props["uri"], props["warehouse"], name, json.dumps(staging.to_dict()), RUN, str(int(in_spark))]
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, *args, str(here.parent), str(here.parents[1])],
        capture_output=True,
        text=True,
        check=True,
    )
    catalog.purge_table(name)
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def spark_session() -> Any:
    from rewind.config import load_settings
    from rewind.spark import session

    state = Path(tempfile.mkdtemp(prefix="bench-merge-spark-state-"))
    return session(load_settings(env={"REWIND_STATE_DIR": str(state)}), app_name="bench-merge-spark")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="20000,100000,300000,1000000,2000000", help="contested rows")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    spark = spark_session()
    catalog = new_catalog()
    merge_once(catalog, "b.warm", 1000, spark, 0)  # the JVM and the Python workers warm
    table = []
    crossing = None
    for contested in sizes:
        n = contested // 2
        driver, in_spark = [], []
        for r in range(args.repeat):
            took, counts_d = merge_once(catalog, f"b.d{contested}_{r}", n, spark, 10**12)
            driver.append(took)
            took, counts_s = merge_once(catalog, f"b.s{contested}_{r}", n, spark, 0)
            in_spark.append(took)
            assert counts_d == counts_s, (counts_d, counts_s)
        d, s = statistics.median(driver), statistics.median(in_spark)
        row = {
            "contested_rows": contested,
            "driver_s": round(d, 2),
            "spark_s": round(s, 2),
            "spark_over_driver": round(s / d, 2),
            "driver_peak_arrow_mb_deciding_in_driver": round(
                driver_memory(catalog, contested, False) / 2**20, 1
            ),
            "driver_peak_arrow_mb_deciding_in_spark": round(
                driver_memory(catalog, contested, True) / 2**20, 1
            ),
            "load_average": [round(x, 1) for x in os.getloadavg()],
        }
        print(json.dumps(row), flush=True)
        table.append(row)
        if crossing is None and s < d:
            crossing = contested
    report = {"when": stamp(), "machine": machine(), "sizes": table, "spark_faster_from": crossing}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
