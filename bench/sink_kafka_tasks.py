"""Benchmark: a Kafka-source job into a transactional Kafka topic, produced by the driver or by the tasks.

Same run, same broker (noida-db: its read_committed hides aborted records, so the tasks may
produce), same topic (default 600,000 records of 200 bytes, 4 partitions, units of 150,000):

  (a) ``rewind run`` with ``REWIND_KAFKA_LOAD=driver``: Spark tasks write Parquet, the driver
      reads every file and produces every row in one transaction per wave;
  (b) ``rewind run`` as it is: each task produces its units, one transaction per unit.

The two are interleaved (a, b, a, b, ...) into topics of their own; prints records/s of each
repeat, the medians, b/a, and the load average before and after. Usage:
``python bench/sink_kafka_tasks.py [--records N] [--partitions P] [--repeats R]``;
``REWIND_BENCH_BOOTSTRAP`` selects another broker (it must support transactions).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "src"))

from common import bare_produce, create_topic, machine, noida, stamp  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--unit", type=int, default=150_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.sinks.kafka.bookkeeping import BOOKKEEPING_TOPIC, read_run_log
    from rewind.spark import session
    from rewind.spec import parse_spec

    state = Path(tempfile.mkdtemp(prefix="bench-kafka-tasks-"))
    rates: dict[str, list[float]] = {"driver": [], "tasks": []}
    load_before = os.getloadavg()
    with noida() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-orders"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-kafka-tasks")
        spark.range(1).count()
        for repeat in range(args.repeats):
            for mode in ("driver", "tasks"):
                os.environ["REWIND_KAFKA_LOAD"] = mode
                spec = parse_spec(
                    {
                        "name": f"bench-{mode}-{repeat}",
                        "source": {"kafka": {"topics": [topic]}},
                        "decode": "json",
                        "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
                        "key": ["order_id"],
                        "sink": {"kafka": {"topic": f"bench-out-{mode}-{repeat}", "transactional": True}},
                        "run": {"work_unit_records": args.unit},
                    }
                )
                t0 = time.perf_counter()
                outcome = run_job(settings, spec)
                seconds = time.perf_counter() - t0
                assert outcome.counts.rows_out == n, outcome.to_dict()
                markers = read_run_log(conf, BOOKKEEPING_TOPIC, outcome.run_id).commits
                per_unit = all(len(m["units"]) == 1 for m in markers) and len(markers) == outcome.units
                assert per_unit == (mode == "tasks"), f"{mode}: {len(markers)} commit markers"  # who produced
                rates[mode].append(n / seconds)
                print(f"{mode:7s} repeat {repeat}: {n / seconds:>10,.0f} rec/s ({seconds:.1f} s)", flush=True)
        os.environ.pop("REWIND_KAFKA_LOAD", None)
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)
    load_after = os.getloadavg()

    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    print(f"# sink_kafka_tasks benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    print(f"load average before {load_before[0]:.1f} / after {load_after[0]:.1f}")
    for mode, value in medians.items():
        print(f"{mode:7s} median {value:>10,.0f} rec/s over {len(rates[mode])} runs")
    print(f"b/a (tasks / driver) {medians['tasks'] / medians['driver']:.2f}")
    print(json.dumps({"rates": rates, "medians": medians, "load": [load_before, load_after]}))


if __name__ == "__main__":
    main()
