"""Benchmark: the run users wait for, a cold ``rewind run``, against the bare fetch; and Spark's
read through ``rewind-kafka`` against one and two bare consumer processes.

Same broker, same topic per size (default 1,000,000 and 5,000,000 JSON records of 200 B, 8
partitions):

  (a) the bare fetch: a confluent-kafka batch consume loop summing value lengths
      (read_uncommitted), in one process; and in two processes at once, each assigned half the
      partitions (the wall of the later one): best of ``--repeat`` each;
  (b) Spark's read: ``rewind-kafka`` read + count on a warm session, best of ``--repeat``;
      b / the faster of the two bare fetches (#37.2: >= 0.9);
  (c) a cold ``rewind run SPEC --json`` child process, as a user runs it (a new Python, a new
      JVM): JSON decode, the bench's pandas translate (bench/job_translate.py), Iceberg staging,
      into a new table; with Spark's class archive (``rewind.spark.class_archive``) and without
      (``REWIND_CLASS_ARCHIVE=off``). c / the bare one-process fetch (#37.1: >= 0.8 at 1M,
      >= 0.9 at 5M);
  (d) where a cold run's seconds go: the CLI's imports (``rewind --help``), a cold process
      that starts a Spark session and runs one tiny job (the JVM's start and its first job), the
      cold ``rewind plan SPEC --json`` (imports, session, plan), and the run's own ``seconds``
      (from its plan's end to its commit) against the child's wall.

  (e) with ``--against SRC`` (another checkout's ``src``, e.g. a ``git worktree`` of the commit
      before a change): cold runs of the same spec alternating between that code and this one,
      ``--repeat`` each, their walls and medians side by side (the change's own effect, paired
      against the machine's drift).

Usage: ``python bench/cold_run.py [--sizes 1,5] [--partitions 8] [--repeat 3] [--against SRC]``;
``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from common import bare_consume, bare_produce, broker, create_topic, machine, stamp  # noqa: E402

SCHEMA = {
    "order_id": "long",
    "customer": "string",
    "status": "string",
    "amount": "double",
    "currency": "string",
    "note": "string",
}
REWIND = str(Path(sys.executable).parent / "rewind")
SESSION_ONLY = (
    "from rewind.spark import session; s = session(); s.range(0, 1000).selectExpr('sum(id)').collect()"
)


def consume(bootstrap: str, topic: str, partitions: list[int], out: Any) -> None:
    """:func:`common.bare_consume` of ``partitions`` in a child process: records and seconds."""
    count, rate = bare_consume({"bootstrap.servers": bootstrap}, topic, partitions, "read_uncommitted")
    out.put((count, count / rate if rate else 0.0))


def bare_fetch(bootstrap: str, topic: str, partitions: int, processes: int) -> float:
    """Records/s of ``processes`` bare consumers started together, each on its share of the
    partitions: all records over the wall from the start to the last one's end."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    shares = [list(range(partitions))[i::processes] for i in range(processes)]
    procs = [ctx.Process(target=consume, args=(bootstrap, topic, share, out)) for share in shares]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    # the children's own clocks exclude their interpreter's start; the slowest one ends the read
    return sum(r[0] for r in results) / max(r[1] for r in results)


def spark_read(bootstrap: str, topic: str, n: int, repeat: int) -> float:
    from rewind.config import load_settings
    from rewind.spark import session

    spark = session(load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap}), app_name="bench")
    spark.range(1).count()  # the JVM and the Python workers warm
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = (
            spark.read.format("rewind-kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .load()
            .count()
        )
        assert count == n, f"spark read {count} of {n}"
        best = max(best, n / (time.perf_counter() - t0))
    return best


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({out.returncode}): {out.stderr[-2000:]}")
    return seconds, out.stdout


def spec(topic: str, table: str) -> dict[str, Any]:
    return {
        "name": table.replace(".", "-").replace("_", "-"),
        "source": {"kafka": {"topics": [topic]}},
        "decode": {"format": "json", "schema": SCHEMA},
        "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
        "key": ["order_id"],
        "sink": {"iceberg": {"table": table}},
    }


def paired(peer: Path, topic: str, n: int, repeat: int, env: dict[str, str], work: Path) -> dict[str, Any]:
    """(e): cold runs alternating between ``peer``'s code and this checkout's, a new table each."""
    import statistics

    import yaml

    walls: dict[str, list[float]] = {"peer": [], "this": []}
    for i in range(repeat):
        for label, src in (("peer", peer.resolve()), ("this", REPO / "src")):
            child = {**env, "PYTHONPATH": os.pathsep.join([str(src), env["PYTHONPATH"]])}
            path = work / f"paired-{label}-{i}.yaml"
            path.write_text(yaml.safe_dump(spec(topic, f"bench.paired_{uuid.uuid4().hex[:6]}")))
            wall, out = timed([REWIND, "run", str(path), "--json"], child, work)
            assert json.loads(out)["records_read"] == n
            walls[label].append(round(wall, 2))
    medians = {label: statistics.median(w) for label, w in walls.items()}
    return {
        **walls,
        "median_peer_s": medians["peer"],
        "median_this_s": medians["this"],
        "this_over_peer": round(medians["this"] / medians["peer"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,5", help="millions of records, comma separated")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--against", type=Path, help="another checkout's src: alternating cold runs (e)")
    args = parser.parse_args()
    import yaml

    print(f"# bench/cold_run.py  {stamp()}  {machine()}")
    results: list[dict[str, Any]] = []
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        for size in (float(s) for s in args.sizes.split(",")):
            n, parts = int(size * 1_000_000), args.partitions
            work = Path(tempfile.mkdtemp(prefix="rewind-bench-cold-"))
            try:
                topic = f"bench-cold-{uuid.uuid4().hex[:6]}"
                create_topic(conf, topic, parts)
                bare_produce(conf, topic, n, parts)
                one = max(bare_fetch(bootstrap, topic, parts, 1) for _ in range(args.repeat))
                two = max(bare_fetch(bootstrap, topic, parts, 2) for _ in range(args.repeat))
                read = spark_read(bootstrap, topic, n, args.repeat)
                env = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
                env.update(
                    REWIND_BOOTSTRAP_SERVERS=bootstrap,
                    REWIND_STATE_DIR=str(work / "state"),
                    PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                )
                row: dict[str, Any] = {
                    "records": n,
                    "bare_fetch_1": round(one),
                    "bare_fetch_2": round(two),
                    "spark_read": round(read),
                    "spark_read_ratio": round(read / max(one, two), 3),
                }
                for label, extra in (
                    ("with_archive", {}),
                    ("without_archive", {"REWIND_CLASS_ARCHIVE": "off"}),
                ):
                    path = work / f"{label}.yaml"
                    path.write_text(yaml.safe_dump(spec(topic, f"bench.cold_{uuid.uuid4().hex[:6]}")))
                    child = {**env, **extra}
                    imports, _ = timed([REWIND, "--help"], child, work)
                    session_s, _ = timed([sys.executable, "-c", SESSION_ONLY], child, work)
                    plan_s, _ = timed([REWIND, "plan", str(path), "--json"], child, work)
                    wall, out = timed([REWIND, "run", str(path), "--json"], child, work)
                    res = json.loads(out)
                    assert res["records_read"] == n, (res["records_read"], n)
                    row[label] = {
                        "wall_s": round(wall, 2),
                        "rate": round(n / wall),
                        "ratio": round(n / wall / one, 3),
                        "cli_imports_s": round(imports, 2),
                        "session_and_first_job_s": round(session_s, 2),
                        "cold_plan_s": round(plan_s, 2),
                        "run_s": round(float(res["seconds"]), 2),
                        "before_run_s": round(wall - float(res["seconds"]), 2),
                    }
                if args.against:
                    row["against"] = paired(args.against, topic, n, args.repeat, env, work)
                print(json.dumps(row, indent=2))
                results.append(row)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    for row in results:
        w = row["with_archive"]
        print(
            f"{row['records']:>10,}: cold run {w['wall_s']} s = {w['ratio']:.2f}x the bare fetch "
            f"({row['without_archive']['ratio']:.2f}x without the class archive); Spark read "
            f"{row['spark_read_ratio']:.2f}x the faster of 1 ({row['bare_fetch_1']:,}) and 2 "
            f"({row['bare_fetch_2']:,}) bare consumer processes"
        )
        if "against" in row:
            a = row["against"]
            print(
                f"{'':>12}this code {a['median_this_s']} s, the code --against "
                f"{a['median_peer_s']} s: {a['this_over_peer']}x"
            )
    if args.json:
        args.json.write_text(json.dumps({"at": stamp(), "machine": machine(), "sizes": results}, indent=2))


if __name__ == "__main__":
    main()
