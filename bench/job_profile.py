"""Profile: where a JSON backfill job's wall time and CPU go, beside the bare fetch.

Same run, same broker, same topic (default 1,000,000 records of 200 B, 8 partitions): the bare
confluent-kafka consume loop (:func:`common.bare_consume`), then ``--repeat`` runs of the job
(``decode.schema``, the pandas translate, Iceberg staging, 250,000 records per unit) after one
small warm-up run. Per run it prints the wall seconds of plan, Spark waves and commits (the
runner's ``timings``), the tasks' own stage seconds (read, decode, translate, write; summed over
tasks), and the CPU seconds each process group spent meanwhile, read from ``/proc``: this
driver, Spark's JVM, the Python workers (the JVM's descendants, reaped ones included) and the
broker. CPU seconds are what other load on the machine sways least.

Usage: ``python bench/job_profile.py [--records N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_consume, bare_produce, broker, create_topic, machine, stamp  # noqa: E402
from decode import json_job  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, command name, CPU seconds of the process and its reaped children)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[1] is ppid; utime, stime, cutime, cstime are fields 14-17 of stat (11-14 here)
    return int(fields[1]), name, sum(int(x) for x in fields[11:15]) / TICK


def cpu_groups() -> dict[str, float]:
    """CPU seconds by group: driver (this process), jvm, python workers, broker, other children."""
    me = os.getpid()
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            procs[int(entry)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _n, _c) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0, "broker": 0.0}
    # own CPU only for the driver (its reaped children are the JVM's start scripts)
    out["driver"] = sum(os.times()[:2])

    def walk(pid: int, group: str) -> None:
        for child in children.get(pid, []):
            _pp, name, cpu = procs[child]
            kind = group
            if group == "":
                kind = "jvm" if name == "java" else "broker" if "tansu" in name else ""
            elif group == "jvm":
                kind = "python workers"
            if kind:
                out[kind] += cpu
            walk(child, kind)

    walk(me, "")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--modes", default="reader,tasks",
        help="REWIND_WAVE_READ values to alternate (reader: rewind-kafka + mapInArrow; tasks: read in tasks)",
    )
    parser.add_argument("--profile-driver", action="store_true", help="cProfile the driver in the last run")
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.spark import session

    state = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    import rewind

    print(f"# job profile, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    print(f"# rewind from {Path(rewind.__file__).parent}")
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-orders"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-profile")
        spark.range(1).count()
        warmup = json_job(topic, "bench.warmup", {p: 5_000 for p in range(parts)}, work_unit_records=250_000)
        run_job(settings, warmup)
        results = []
        modes = args.modes.split(",")
        runs = [(r, m) for r in range(args.repeat) for m in (modes if r % 2 == 0 else modes[::-1])]
        for i, (_r, mode) in enumerate(runs):
            os.environ["REWIND_WAVE_READ"] = mode
            load = os.getloadavg()[0]
            c0, t0 = cpu_groups(), time.perf_counter()
            got, fetch = bare_consume(conf, topic, parts, "read_committed")
            c1 = cpu_groups()
            fetch_cpu = {k: c1[k] - c0[k] for k in c0}
            assert got == n
            spec = json_job(topic, f"bench.profile_{i}", work_unit_records=250_000)
            c0, t0 = cpu_groups(), time.perf_counter()
            timings: list[dict[str, Any]] = []
            profiler = None
            if args.profile_driver and i == len(runs) - 1:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            outcome = run_job(settings, spec, timings=timings)
            if profiler is not None:
                import pstats

                profiler.disable()
                pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
            wall = time.perf_counter() - t0
            c1 = cpu_groups()
            assert outcome.counts.records_read == n == outcome.counts.rows_out, outcome.to_dict()
            spark_s = sum(w["spark_s"] for w in timings)
            commit_s = sum(w["commit_s"] for w in timings)
            stages: dict[str, float] = {}
            for w in timings:
                for k, v in w["stages"].items():
                    stages[k] = stages.get(k, 0.0) + v
            cpu = {k: c1[k] - c0[k] for k in c0}
            row = {
                "mode": mode,
                "load": load,
                "fetch_rec_s": fetch,
                "fetch_cpu": fetch_cpu,
                "run_rec_s": n / wall,
                "ratio": n / wall / fetch,
                "wall": wall,
                "waves": len(timings),
                "spark_s": spark_s,
                "commit_s": commit_s,
                "other_s": wall - spark_s - commit_s,
                "task_stages": stages,
                "cpu": cpu,
            }
            results.append(row)
            print(
                f"run {i} ({mode}): load {load:.1f}; fetch {fetch:,.0f} rec/s; run {n / wall:,.0f} rec/s "
                f"({row['ratio']:.2f}x); wall {wall:.2f} s = spark {spark_s:.2f} + commits {commit_s:.2f} "
                f"+ plan/rest {row['other_s']:.2f} ({len(timings)} waves)"
            )
            print("   task stages s: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
            print("   run CPU s:     " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
            print("   fetch CPU s:   " + ", ".join(f"{k} {v:.2f}" for k, v in fetch_cpu.items()))
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
