"""Benchmark: the cost curve — seconds per million records as a job grows, planning time as
the partitions grow.

Same run, same broker, same Spark session:

1. Records. One topic (``--partitions``, 200 B JSON events) filled once with the largest size;
   then the same job (``decode.schema``, the pandas translate, Iceberg staging) over the first
   1M, 5M (and, with ``--sizes 1,5,20``, 20M) records of it (``to`` = offsets per partition),
   each into a fresh table. Printed: wall seconds, seconds per million and that figure's
   ratio to the smallest size's (target: linear within 15%, i.e. ratios in 0.85..1.15), and,
   with three sizes or more, the least-squares line fixed seconds + seconds per million with
   each size's distance from it (a run's fixed part makes seconds per million fall with size
   on a line that is straight). A warm-up run first, not counted, so the smallest size does
   not carry the JVM's start.
2. Planning. Topics of 1, 100 and 1,000 partitions, 10 records each; ``plan_job`` timed
   (median of 3) and printed per partition; the ratio of 1,000 to 100 partitions, against
   the 10 a linear plan would give (target: planning O(partitions)).

Usage: ``python bench/scale.py [--sizes 1,5] [--partitions 8] [--plan-partitions 1,100,1000]``;
``make bench-scale`` runs 1M and 5M, ``make bench-scale SIZES=1,5,20`` adds 20M.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_produce, broker, create_topic, machine, stamp  # noqa: E402
from decode import json_job  # noqa: E402

MILLION = 1_000_000


def records_curve(settings: Any, bootstrap: str, sizes: list[int], parts: int) -> list[dict[str, float]]:
    from rewind.job.service import run_job

    conf = {"bootstrap.servers": bootstrap}
    topic = "bench-scale"
    create_topic(conf, topic, parts)
    t0 = time.perf_counter()
    produce_rate = bare_produce(conf, topic, max(sizes), parts)
    took = time.perf_counter() - t0
    print(f"filled {topic}: {max(sizes):,} records in {took:.0f} s ({produce_rate:,.0f}/s)")
    run_job(settings, json_job(topic, "bench.scale_warmup", {p: 10_000 for p in range(parts)}))
    rows: list[dict[str, float]] = []
    for size in sizes:
        # bare_produce spreads record i to partition i % parts: the first `size` records end
        # at these offsets
        to = {p: size // parts + (1 if p < size % parts else 0) for p in range(parts)}
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        outcome = run_job(settings, json_job(topic, f"bench.scale_{size}", to))
        wall = time.perf_counter() - t0
        assert outcome.counts.records_read == size == outcome.counts.rows_out, outcome.to_dict()
        rows.append({"records": size, "wall_s": wall, "s_per_million": wall / (size / MILLION), "load": load})
        print(f"{size:>12,} records {wall:8.1f} s  {wall / (size / MILLION):6.2f} s/M  load {load:.1f}")
    return rows


def planning_curve(settings: Any, bootstrap: str, counts: list[int]) -> list[dict[str, float]]:
    from rewind.job.service import plan_job

    conf = {"bootstrap.servers": bootstrap}
    rows: list[dict[str, float]] = []
    for n in counts:
        topic = f"bench-plan-{n}"
        create_topic(conf, topic, n)
        bare_produce(conf, topic, 10 * n, n)
        spec = json_job(topic, f"bench.plan_{n}")
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            plan = plan_job(settings, spec)
            times.append(time.perf_counter() - t0)
        assert sum(u.end - u.start for u in plan.units) == 10 * n, "the plan must cover every record"
        median = statistics.median(times)
        rows.append({"partitions": n, "plan_s": median, "ms_per_partition": 1000 * median / n})
        print(f"{n:>6} partitions: plan {median:6.2f} s ({1000 * median / n:.1f} ms per partition)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,5", help="millions of records, comma-separated")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--plan-partitions", default="1,100,1000")
    args = parser.parse_args()
    sizes = sorted(int(float(s) * MILLION) for s in args.sizes.split(","))
    plan_counts = sorted(int(s) for s in args.plan_partitions.split(","))

    from rewind.config import load_settings
    from rewind.spark import session

    state = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    with broker() as bootstrap:
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-scale")
        planning = planning_curve(settings, bootstrap, plan_counts)
        records = records_curve(settings, bootstrap, sizes, args.partitions)
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)

    base = records[0]["s_per_million"]
    print(f"# scale benchmark, {stamp()}, {machine()}, {args.partitions} partitions, 200 B JSON")
    print("| records | wall s | s per million | ratio to the smallest | load |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in records:
        ratio = r["s_per_million"] / base
        cells = [f"{r['records']:,.0f}", f"{r['wall_s']:.1f}", f"{r['s_per_million']:.2f}", f"{ratio:.2f}"]
        print(f"| {' | '.join(cells)} | {r['load']:.1f} |")
    worst = max(abs(r["s_per_million"] / base - 1) for r in records)
    print(f"seconds per million within {100 * worst:.0f}% of the smallest size's (target 15%)")
    if len(records) >= 3:
        # the same curve as a fixed part plus a cost per record (least squares): a run's fixed
        # seconds (lease, staging, plan checks, commit) make seconds per million fall with size
        # while the cost per record stays constant
        xs = [r["records"] / MILLION for r in records]
        ys = [r["wall_s"] for r in records]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        fixed = my - slope * mx
        off = max(abs(fixed + slope * x - y) / y for x, y in zip(xs, ys, strict=True))
        print(f"fit: {fixed:.2f} s + {slope:.2f} s per million; every size within {100 * off:.1f}% of it")
    print("| partitions | plan s | ms per partition |")
    print("| ---: | ---: | ---: |")
    for p in planning:
        print(f"| {p['partitions']:,.0f} | {p['plan_s']:.2f} | {p['ms_per_partition']:.1f} |")
    by_n = {p["partitions"]: p["plan_s"] for p in planning}
    if 100 in by_n and 1000 in by_n:
        print(f"plan(1000) / plan(100) = {by_n[1000] / by_n[100]:.1f} (10 = linear in partitions)")
    print(json.dumps({"records": records, "planning": planning}))


if __name__ == "__main__":
    main()
