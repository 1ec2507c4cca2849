"""Benchmark: the fixed overhead of a small job (100,000 records) on a warm session.

Same run, same broker: a 100,000-record topic (200 B JSON, 4 partitions); a Spark session
started and warmed by one first run (not counted); then ``--repeat`` runs of the same JSON job
(``decode.schema``, the pandas translate, Iceberg staging sink), each into a fresh table. Per
run: plan (``plan_job``), the Spark waves and the commits (the runner's timings), and the
whole ``run_job`` wall. The fixed overhead is the wall minus the records' own work, measured
as ``process_batch`` over the same records in this process. Target: ≤ 5 s.

Usage: ``python bench/small_job.py [--records N] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
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
from decode import SCHEMA, stage_times  # noqa: E402


def spec_for(topic: str, table: str) -> Any:
    from rewind.spec import parse_spec

    return parse_spec(
        {
            "name": table.replace(".", "-"),
            "source": {"kafka": {"topics": [topic]}},
            "decode": {"format": "json", "schema": SCHEMA},
            "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
            "key": ["order_id"],
            "sink": {"iceberg": {"table": table}},
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from rewind.config import load_settings
    from rewind.job.service import plan_job, run_job
    from rewind.spark import session

    per_record_s = stage_times()["process_batch, bulk decode (schema)"] / 1_000_000
    state = Path(tempfile.mkdtemp(prefix="bench-small-"))
    runs: list[dict[str, float]] = []
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-small"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-small")
        run_job(settings, spec_for(topic, "bench.warmup"))  # JIT, Python workers, catalog
        for i in range(args.repeat):
            spec = spec_for(topic, f"bench.small_{i}")
            t0 = time.perf_counter()
            plan_job(settings, spec)
            plan_s = time.perf_counter() - t0
            timings: list[dict[str, Any]] = []
            t0 = time.perf_counter()
            outcome = run_job(settings, spec, timings=timings)
            wall = time.perf_counter() - t0
            assert outcome.counts.records_read == n == outcome.counts.rows_out, outcome.to_dict()
            runs.append(
                {
                    "wall_s": wall,
                    "plan_s": plan_s,
                    "spark_s": sum(t["spark_s"] for t in timings),
                    "commit_s": sum(t["commit_s"] for t in timings),
                    "records_work_s": n * per_record_s,
                    "fixed_s": wall - n * per_record_s,
                }
            )
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"# small job benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    for key, value in median.items():
        print(f"{key:24s} {value:8.2f} s (median of {len(runs)})")
    print(json.dumps({"median": median, "runs": runs}))


if __name__ == "__main__":
    main()
