"""Benchmark: a backfill job into PostgreSQL, the driver's COPY against the tasks' COPY.

Same run, same broker, same topic (default 400,000 JSON records of 200 B, 4 partitions; the
order ids repeat every 100,000 records, so units upsert keys other units hold), same server:

  (a) driver path (``REWIND_SQL_LOAD=driver``): the tasks write Parquet, the driver reads every
      file and ``COPY``-s its rows into staging, one transaction per wave;
  (b) task path (the default): each task ``COPY``-s each of its units into staging in one
      transaction with the unit's bookkeeping; the driver only records metadata.

The two alternate (a b, b a, a b...) on one warm Spark session, each run into a fresh table.
Per run: the job's wall time, the seconds of its Spark jobs (reading, translating, and in (b)
loading) and of the driver's commits. Prints the medians and b/a of the wall time, with the
load average before and after. Usage: ``python bench/job_postgres.py [--records N] [--repeat 3]``;
``REWIND_BENCH_PG`` names the server (default ``postgresql://postgres@127.0.0.1:5432``).
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
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_produce, broker, create_topic, machine, stamp  # noqa: E402
from decode import SCHEMA  # noqa: E402


def spec_for(topic: str, url: str, table: str, unit_records: int) -> Any:
    from rewind.spec import parse_spec

    return parse_spec(
        {
            "name": table.replace("_", "-"),
            "source": {"kafka": {"topics": [topic]}},
            "decode": {"format": "json", "schema": SCHEMA},
            "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
            "key": ["order_id"],
            "sink": {"postgres": {"url": url, "table": f"public.{table}"}},
            "run": {"work_unit_records": unit_records},
        }
    )


def staged_rows(url: str, staging: dict[str, Any]) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {staging['table']}").fetchone()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--unit-records", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    import psycopg

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.spark import session

    server = os.environ.get("REWIND_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
    database = f"bench_job_pg_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    url = f"{server}/{database}"
    state = Path(tempfile.mkdtemp(prefix="bench-job-pg-"))
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {"driver": [], "task": []}
    try:
        with broker() as bootstrap:
            conf = {"bootstrap.servers": bootstrap}
            topic = "bench-job-pg"
            create_topic(conf, topic, parts)
            bare_produce(conf, topic, n, parts)
            settings = load_settings(
                env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)}
            )
            spark = session(settings, app_name="bench-job-pg")
            run_job(settings, spec_for(topic, url, "warmup", args.unit_records))  # JIT, workers, catalog
            for i in range(args.repeat):
                order = ("driver", "task") if i % 2 == 0 else ("task", "driver")
                for mode in order:
                    os.environ["REWIND_SQL_LOAD"] = mode
                    timings: list[dict[str, Any]] = []
                    t0 = time.perf_counter()
                    outcome = run_job(
                        settings, spec_for(topic, url, f"{mode}_{i}", args.unit_records), timings=timings
                    )
                    wall = time.perf_counter() - t0
                    assert outcome.counts.records_read == n == outcome.counts.rows_out, outcome.to_dict()
                    assert staged_rows(url, outcome.staging) == min(n, 100_000)  # one row per order id
                    runs[mode].append(
                        {
                            "wall_s": wall,
                            "spark_s": sum(t["spark_s"] for t in timings),
                            "commit_s": sum(t["commit_s"] for t in timings),
                        }
                    )
                    print(mode, i, {k: round(v, 2) for k, v in runs[mode][-1].items()}, flush=True)
            spark.stop()
    finally:
        os.environ.pop("REWIND_SQL_LOAD", None)
        shutil.rmtree(state, ignore_errors=True)
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    load_after = os.getloadavg()
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    print(f"# job into PostgreSQL: driver COPY vs task COPY, {stamp()}, {machine()}")
    print(
        f"# {n:,} records x 200 B, {parts} partitions, units of {args.unit_records:,}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    for mode in ("driver", "task"):
        m = median[mode]
        print(
            f"{mode:7s} wall {m['wall_s']:7.2f} s  spark {m['spark_s']:7.2f} s  driver commits "
            f"{m['commit_s']:6.2f} s  {n / m['wall_s']:9,.0f} rec/s  (median of {len(runs[mode])})"
        )
    print(f"task/driver wall: {median['task']['wall_s'] / median['driver']['wall_s']:.2f}")
    print(json.dumps({"median": median, "runs": runs, "load": [load_before, load_after]}))


if __name__ == "__main__":
    main()
