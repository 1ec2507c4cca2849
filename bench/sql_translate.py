"""Benchmark: a ``translate.sql`` job against the same job with a Python translate, and the
driver's peak memory of a SQL job as the topic grows.

Same run, same broker, same topic per size (default 1,000,000 JSON records of 200 bytes, 4
partitions, the bench's order events): each job is a cold ``rewind run SPEC --json`` child
process, as a user runs it (a new driver, a new Spark session), into a new Iceberg table.
Both translates do the same work: keep the records whose status is not ``cancelled`` and
write the amount in cents.

Printed per size: seconds and records/s of each job, the ratio SQL / Python (target >= 0.8),
and the peak RSS of the driver's Python process and of its JVM (sampled every 0.1 s from
/proc); across sizes, the ratio of the SQL driver's peak RSS (target: 10M within 1.3x of 1M;
the driver holds no records).

Usage: ``python bench/sql_translate.py [--sizes 1,10] [--partitions 4]`` (millions of records).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from common import bare_produce, broker, create_topic, machine, stamp  # noqa: E402

SCHEMA = {"order_id": "long", "status": "string", "amount": "double"}
QUERY = (
    "SELECT _rewind_row, order_id, status, CAST(ROUND(amount * 100) AS BIGINT) AS amount_cents "
    "FROM events WHERE status <> 'cancelled'"
)
OUTPUT = {"order_id": "long", "status": "string", "amount_cents": "long"}


def spec(topic: str, table: str, translate: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": table.replace(".", "-").replace("_", "-"),
        "source": {"kafka": {"topics": [topic]}},
        "decode": {"format": "json", "schema": SCHEMA},
        "translate": {**translate, "version": "1", "output_schema": OUTPUT},
        "key": ["order_id"],
        "sink": {"iceberg": {"table": table}},
    }


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def run_cli(spec_path: Path, env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """``rewind run SPEC --json`` in a child process; its wall time and the peak RSS of the
    driver (the Python process) and of its JVM (its java child)."""
    rewind = str(Path(sys.executable).parent / "rewind")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [rewind, "run", str(spec_path), "--json"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = {"driver_kb": 0, "jvm_kb": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak["driver_kb"] = max(peak["driver_kb"], rss_kb(proc.pid))
            jvm = sum(rss_kb(c) for c in children(proc.pid) if "java" in _cmd(c))
            peak["jvm_kb"] = max(peak["jvm_kb"], jvm)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"rewind run failed ({proc.returncode}): {err[-2000:]}")
    result = json.loads(out)
    return {"seconds": seconds, "result": result, **peak}


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1", help="millions of records, comma separated (e.g. 1,10)")
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    import yaml

    print(f"# bench/sql_translate.py  {stamp()}  {machine()}")
    peaks: dict[float, int] = {}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        for size in sizes:
            n = int(size * 1_000_000)
            work = Path(tempfile.mkdtemp(prefix="rewind-bench-sql-"))
            try:
                env = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
                env.update(
                    REWIND_BOOTSTRAP_SERVERS=bootstrap,
                    REWIND_STATE_DIR=str(work / "state"),
                    PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                )
                topic = f"bench-sql-{uuid.uuid4().hex[:6]}"
                create_topic(conf, topic, args.partitions)
                rate = bare_produce(conf, topic, n, args.partitions)
                print(
                    f"produced {n:,} records of 200 B into {args.partitions} partitions ({rate:,.0f} rec/s)"
                )
                runs: dict[str, dict[str, Any]] = {}
                for label, translate in (
                    ("python", {"function": "bench.job_translate:order_amount_kept"}),
                    ("sql", {"sql": QUERY}),
                ):
                    path = work / f"{label}.yaml"
                    path.write_text(
                        yaml.safe_dump(spec(topic, f"bench.sql_{label}_{uuid.uuid4().hex[:6]}", translate))
                    )
                    runs[label] = run_cli(path, env, work)
                    r = runs[label]
                    res = r["result"]
                    print(
                        f"  {label:6s} {r['seconds']:7.1f} s ({res['seconds']:.1f} s in the run)  "
                        f"{n / r['seconds']:9,.0f} rec/s  driver peak {r['driver_kb'] / 1024:5.0f} MiB  "
                        f"JVM peak {r['jvm_kb'] / 1024:5.0f} MiB  "
                        f"rows {res['rows_out']:,} filtered {res['filtered']:,}"
                    )
                py, sql = runs["python"], runs["sql"]
                fields = ("records_read", "emitted", "rows_out", "quarantined", "filtered")
                py_counts = [py["result"][f] for f in fields]
                sql_counts = [sql["result"][f] for f in fields]
                if py_counts != sql_counts:
                    print(f"  !! counts differ: python {py_counts} sql {sql_counts}")
                print(f"  sql / python rate: {py['seconds'] / sql['seconds']:.2f} (target >= 0.8)")
                peaks[size] = sql["driver_kb"] + sql["jvm_kb"]
                print(f"  sql driver + JVM peak: {peaks[size] / 1024:.0f} MiB")
            finally:
                shutil.rmtree(work, ignore_errors=True)
    if len(peaks) > 1:
        small, large = min(peaks), max(peaks)
        print(
            f"SQL job peak RSS (driver + JVM) {large:g}M / {small:g}M records: "
            f"{peaks[large] / peaks[small]:.2f} (target <= 1.3)"
        )


if __name__ == "__main__":
    main()
