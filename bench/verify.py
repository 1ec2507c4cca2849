"""Benchmark: ``rewind verify``'s comparison against plain Spark counts, on Iceberg tables.

Same session, same tables: N rows per side (default 10,000,000), written once with Spark
into an Iceberg SQL catalog in a temporary folder:

  (a) Spark ``count(*)`` of both sides (the floor: no column is read);
  (b) verify with no differences (staging vs an identical copy);
  (c) verify with 0.1% of the rows differing (a changed total on every 1000th order).

Also shown for context: (s) one Spark pass hashing every compared column of both sides
(``sum(xxhash64(...))``), the least any comparison that reads the data can cost; and (j)
the plain way, a full outer join of both sides on the key comparing every column (skip it
with ``--no-join``).

The verification is the issue's example: key ``order_id``; ``total`` within 0.01,
``status`` exact, ``updated_at`` to the second; buckets per day of ``updated_at`` and by
``status``. Targets (#18): b/s within 1.5, c/j within 0.5. Each figure is the best of ``--repeat``
runs, after ``--warmup`` untimed runs of every figure (Spark's generated code and the JIT warm up
over the first runs of a query: a verify's first level took 1.44, 0.99, 0.90, 0.79 s in four
runs in a row), so that each figure and its peer are measured alike, in steady state.

Usage: ``python bench/verify.py [--rows N] [--repeat 2] [--diff-every 1000]``.
"""

from __future__ import annotations

import argparse
import json
import os
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

from common import machine, stamp  # noqa: E402

VERIFY = {
    "reference": {"iceberg": "bench.reference"},
    "key": ["order_id"],
    "compare": {"total": {"abs": 0.01}, "status": "exact", "updated_at": {"timestamp_precision": "s"}},
    "buckets": {"time_column": "updated_at", "granularity": "day", "category": "status"},
}


def orders(spark: Any, rows: int) -> Any:
    """Orders 3 s apart (about 28,800 a day), a total, one of four statuses, a note."""
    from pyspark.sql import functions as F

    statuses = F.array(*[F.lit(s) for s in ("placed", "paid", "shipped", "cancelled")])
    return spark.range(rows).select(
        F.col("id").alias("order_id"),
        (F.col("id") % 9973 / 7).alias("total"),
        F.element_at(statuses, (F.col("id") % 4 + 1).cast("int")).alias("status"),
        (F.lit(1_790_812_800) + F.col("id") * 3).cast("timestamp").alias("updated_at"),
        F.concat(F.lit("customer-"), (F.col("id") % 50_000).cast("string")).alias("customer"),
    )


CPU: dict[str, float] = {}
"""Per figure: CPU seconds the Spark JVM spent in the fastest run (see :func:`jvm_cpu`)."""


def jvm_cpu(spark: Any) -> float:
    """CPU seconds used so far by the Spark JVM (driver and local executors: one process).

    On a machine shared with other work, wall time swings with the load while CPU time
    barely does: the CPU figures say how much work each way takes.
    """
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def best(repeat: int, fn: Callable[[], Any], name: str = "", spark: Any = None) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs and its result (its JVM CPU seconds in ``CPU[name]``)."""
    runs = []
    for _ in range(repeat):
        cpu = jvm_cpu(spark) if spark is not None else 0.0
        began = time.perf_counter()
        result = fn()
        runs.append((time.perf_counter() - began, result, jvm_cpu(spark) - cpu if spark is not None else 0.0))
    wall, result, cpu = min(runs, key=lambda run: run[0])
    CPU[name] = cpu
    return wall, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows per side")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure; the best is kept")
    parser.add_argument("--diff-every", type=int, default=1000, help="(c): one row in this many differs")
    parser.add_argument("--keep", type=Path, help="keep the tables in this folder (and reuse them)")
    parser.add_argument("--no-join", action="store_true", help="skip (j), the plain full outer join")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of every figure first")
    args = parser.parse_args()

    from pyiceberg.catalog.sql import SqlCatalog
    from pyspark.sql import functions as F

    from rewind.config import load_settings
    from rewind.sinks.iceberg import read_iceberg
    from rewind.spark import session
    from rewind.spec import Verify
    from rewind.verify.service import verify_frames
    from rewind.verify.tables import dataframe_to_iceberg

    folder = args.keep or Path(tempfile.mkdtemp(prefix="rewind-bench-verify-"))
    folder.mkdir(parents=True, exist_ok=True)
    settings = load_settings(env={"REWIND_STATE_DIR": str(folder / "state")}, cwd=folder)
    spark = session(settings, app_name="rewind-bench-verify")
    (folder / "warehouse").mkdir(exist_ok=True)
    catalog = SqlCatalog(
        "bench", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=(folder / "warehouse").as_uri()
    )
    names = {"staging": "bench.staging", "same": "bench.same", "diff": "bench.diff"}
    try:
        began = time.perf_counter()
        if not all(catalog.table_exists(n) for n in names.values()):
            for name in names.values():
                if catalog.table_exists(name):
                    catalog.drop_table(name)
            base = orders(spark, args.rows)
            dataframe_to_iceberg(spark, base, catalog, names["staging"])
            dataframe_to_iceberg(spark, orders(spark, args.rows), catalog, names["same"])
            changed = (F.col("order_id") % args.diff_every) == 7
            diff = base.withColumn("total", F.when(changed, F.col("total") + 1).otherwise(F.col("total")))
            dataframe_to_iceberg(spark, diff, catalog, names["diff"])
        setup = time.perf_counter() - began

        def side(name: str) -> Any:
            return read_iceberg(spark, catalog.load_table(names[name]), "main")

        def counts() -> tuple[int, int]:
            return side("staging").count(), side("same").count()

        def scan() -> int:
            cols = ["order_id", "total", "status", "updated_at"]
            total = 0
            for name in ("staging", "same"):
                row = side(name).select(F.sum(F.xxhash64(*cols).bitwiseAND(0xFFFF)).alias("s")).collect()[0]
                total += int(row["s"] or 0)
            return total

        def join() -> int:
            s, r = side("staging").alias("s"), side("diff").alias("r")
            same = F.lit(True)
            for c in ("total", "status", "updated_at"):
                same = same & F.col(f"s.{c}").eqNullSafe(F.col(f"r.{c}"))
            return s.join(r, F.col("s.order_id") == F.col("r.order_id"), "full_outer").where(~same).count()

        verify = Verify.model_validate(VERIFY)

        def check(reference: str) -> dict[str, Any]:
            return verify_frames(spark, side("staging"), side(reference), verify)

        figures: list[Callable[[], Any]] = [counts, scan, lambda: check("same"), lambda: check("diff")]
        for _ in range(args.warmup):  # JIT, generated code, file listing, catalog
            for figure in figures + ([] if args.no_join else [join]):
                figure()
        a, (n_s, n_r) = best(args.repeat, counts, "a", spark)
        s, _ = best(args.repeat, scan, "s", spark)
        b, same = best(args.repeat, lambda: check("same"), "b", spark)
        c, diff_report = best(args.repeat, lambda: check("diff"), "c", spark)
        expected = len(range(7, args.rows, args.diff_every))
        j, joined = best(args.repeat, join, "j", spark) if not args.no_join else (float("nan"), expected)
        assert joined == expected, (joined, expected)
        assert same["passed"], same["failed"]
        assert diff_report["state"]["changed"] == expected, (diff_report["state"]["changed"], expected)

        print(f"verify benchmark, {stamp()}, {machine()}")
        print(
            f"rows per side {args.rows:,} (staging {n_s:,}, reference {n_r:,}); "
            f"tables written in {setup:.1f}s"
        )
        print(f"(a) count(*) of both sides          {a:8.2f} s")
        print(f"(s) hash every compared column      {s:8.2f} s   s/a = {s / a:5.2f}")
        print(
            f"(b) verify, no difference           {b:8.2f} s   b/a = {b / a:5.2f}   b/s = {b / s:5.2f}"
            "   (target b/s <= 1.5)"
        )
        print(
            f"(c) verify, {expected:,} rows differ{'':<{max(0, 10 - len(f'{expected:,}'))}}"
            f"{c:8.2f} s   c/a = {c / a:5.2f}   c/s = {c / s:5.2f}"
        )
        print(
            f"(j) plain full outer join            {j:8.2f} s   j/a = {j / a:5.2f}   "
            f"c/j = {c / j:5.2f}   (target c/j <= 0.5)"
        )
        cpu = {k: max(v, 0.01) for k, v in CPU.items()}
        print(
            f"JVM CPU seconds (less swayed by other load): a {cpu['a']:.2f}, s {cpu['s']:.2f}, "
            f"b {cpu['b']:.2f} (b/s {cpu['b'] / cpu['s']:.2f}), c {cpu['c']:.2f}"
            + (f", j {cpu['j']:.2f} (c/j {cpu['c'] / cpu['j']:.2f})" if "j" in cpu else "")
        )
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"    bisection (b): {same['bisection']}")
        print(f"    bisection (c): {diff_report['bisection']}")
        print(f"    steps (b): {same['seconds']}")
        print(f"    steps (c): {diff_report['seconds']}")
        print(
            json.dumps(
                {
                    "rows": args.rows,
                    "a_count_s": round(a, 3),
                    "s_scan_s": round(s, 3),
                    "b_verify_same_s": round(b, 3),
                    "c_verify_diff_s": round(c, 3),
                    "b_over_a": round(b / a, 2),
                    "c_over_a": round(c / a, 2),
                    "b_over_s": round(b / s, 2),
                    "c_over_s": round(c / s, 2),
                    "c_over_j": round(c / j, 2),
                    "j_join_s": round(j, 3),
                    "cpu_s": {k: round(v, 3) for k, v in CPU.items()},
                    "load": [round(x, 1) for x in os.getloadavg()],
                }
            )
        )
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
