"""Benchmark: an event reconstruction (``source.table.reconstruct``) against a bare produce loop.

Same run, same broker, same events (default 1,000,000 states of 100,000 policies in a SQLite
history table, inserted in a random order, 8 partitions):

  (a) ``run_job`` of a spec reconstructing every policy's events: Spark tasks read their key
      ranges, sort each policy's states by business time and change sequence, pair them, call the
      transition (``bench/reconstruct_transition.py``, vectorised pandas) once per batch, attach
      lineage and produce each unit in one Kafka transaction with its marker; the ledger, the
      quarantine and the conservation checks as in any run. Timed from the run's start to its end
      (the plan, and the Spark session's first start, before the clock);
  (b) a bare confluent-kafka idempotent produce loop (the sink's producer settings) of the very
      events (a) produced, read back from (a)'s topic into memory first; only the produce calls
      and the flush timed.

(a) and (b) run side by side ``--repeat`` times after ``--warmup`` repeats reported apart (as in
``bench/reproduce.py``: a session's first Spark job starts its Python workers). Prints rows/s of
each and the ratio a/b (target >= 0.5); ``--json PATH`` writes them. Usage:
``python bench/reconstruct.py [--states N] [--entities E] [--repeat 2] [--warmup 1]``;
``REWIND_BENCH_BOOTSTRAP`` selects another broker than a fresh tansu.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "src"))

from common import broker, create_topic, machine, stamp  # noqa: E402
from reproduce import PARTITIONS, _median, _WaveClock, bare_loop, read_back  # noqa: E402


def fill_history(path: Path, states: int, entities: int, seed: int = 7) -> str:
    """``states`` rows of ``entities`` policies (``states // entities`` each), in a random order:
    a bound state, then alternately a premium change and a status change (one thing at a time), a
    day apart, a tie on the business day every fourth change (ordered by ``change_seq``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    per = states // entities
    n = per * entities
    policy = np.repeat(np.arange(1, entities + 1, dtype=np.int64), per)
    seq = np.tile(np.arange(per, dtype=np.int64), entities)
    start = rng.integers(0, 300, entities).repeat(per)
    day = start + seq - seq // 4  # every fourth change on the day of the one before
    premium = (100 + policy % 900 + (seq + 1) // 2 * 10).astype(float)  # moves at odd changes
    statuses = np.array(["active", "lapsed", "suspended", "cancelled"], dtype=object)
    status = statuses[(seq // 2) % 4]  # moves at even changes
    dates = np.datetime64("2024-01-01") + day.astype("timedelta64[D]")
    order = rng.permutation(n)
    rows = list(
        zip(
            policy[order].tolist(),
            status[order].tolist(),
            premium[order].tolist(),
            np.datetime_as_string(dates[order]).tolist(),
            seq[order].tolist(),
            strict=True,
        )
    )
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE policy_history (policy_id BIGINT NOT NULL, status TEXT, premium REAL, "
            "effective_from TEXT, change_seq INTEGER)"
        )
        db.executemany("INSERT INTO policy_history VALUES (?, ?, ?, ?, ?)", rows)
        db.execute("CREATE INDEX policy_history_key ON policy_history (policy_id)")
    return f"sqlite:///{path}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--states", type=int, default=1_000_000)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--ranges", type=int, help="key ranges (work units); default: the plan's")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    from rewind.config import load_settings
    from rewind.job.service import plan_job, run_job
    from rewind.spark import session
    from rewind.spec import parse_spec

    tmp = Path(tempfile.mkdtemp(prefix="rewind-bench-reconstruct-"))
    reps: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    url = fill_history(tmp / "legacy.db", args.states, args.entities)
    n = args.states // args.entities * args.entities
    print(f"history of {n:,} states written in {time.perf_counter() - t0:.1f} s")
    with broker() as bootstrap:
        settings = load_settings(
            env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
        )
        conf = settings.kafka_config()
        ranges = {"key_ranges": args.ranges} if args.ranges else {}
        session(settings)
        for rep in range(args.warmup + args.repeat):
            topic = f"bench-policies-{uuid.uuid4().hex[:6]}"
            create_topic(conf, topic, PARTITIONS)
            spec = parse_spec(
                {
                    "name": f"bench-reconstruct-{rep}",
                    "source": {
                        "table": {
                            "sqlite": {"url": url, "table": "policy_history"},
                            "key": "policy_id",
                            "where": "TRUE",
                            "reconstruct": {"time": "effective_from", "tie": ["change_seq"]},
                            **ranges,
                        }
                    },
                    "decode": "rows",
                    "translate": {"transition": "bench.reconstruct_transition:policy_events", "version": "1"},
                    "key": ["policy_id"],
                    "sink": {"kafka": {"topic": topic}},
                    "guards": {"max_records": 10 * n},
                }
            )
            t0 = time.perf_counter()
            plan = plan_job(settings, spec)
            plan_seconds = time.perf_counter() - t0
            assert plan.ok, plan.failed_gates()
            waves = _WaveClock()
            t0 = time.perf_counter()
            outcome = run_job(settings, plan.plan_id, console=waves)
            ended = time.perf_counter()
            run_seconds = ended - t0
            assert outcome.state == "succeeded" and outcome.counts.records_read == n, outcome.to_dict()
            events = outcome.counts.rows_out
            records = read_back(conf, topic)
            assert len(records) == events, f"read back {len(records)} of {events} events"
            other = f"bench-bare-{uuid.uuid4().hex[:6]}"
            create_topic(conf, other, PARTITIONS)
            bare_rate = bare_loop(conf, other, records, transactional=False)
            del records
            (cold if rep < args.warmup else reps).append(
                {
                    "units": len(plan.units),
                    "states": n,
                    "events": events,
                    "plan_seconds": round(plan_seconds, 3),
                    "run_seconds": round(run_seconds, 3),
                    "events_per_s": events / run_seconds,
                    "states_per_s": n / run_seconds,
                    "wave_events_per_s": events / waves.seconds,
                    "bare_events_per_s": bare_rate,
                    "ratio": events / run_seconds / bare_rate,
                    "stages": waves.stages(ended),
                }
            )
            kind = "warm-up" if rep < args.warmup else "repeat"
            print(f"{kind} {rep + 1}: " + json.dumps((cold if rep < args.warmup else reps)[-1], default=str))

    rate = _median([r["events_per_s"] for r in reps])
    bare = _median([r["bare_events_per_s"] for r in reps])
    ratio = _median([r["ratio"] for r in reps])
    shape = (
        f"{n:,} states of {args.entities:,} entities → {reps[0]['events']:,} events, "
        f"{PARTITIONS} partitions, {reps[0]['units']} key ranges, median of {len(reps)}"
    )
    print(f"# {stamp()}  {machine()}  {shape}")
    print(f"{'(a) reconstruction (rewind run of the stored plan)':52s} {rate:>12,.0f} events/s")
    print(f"{'    its plan (before the clock)':52s} {_median([r['plan_seconds'] for r in reps]):>12.1f} s")
    print(f"{'(b) bare confluent-kafka produce loop, same events':52s} {bare:>12,.0f} events/s")
    print(f"{'a/b (median of the per-repeat ratios)':52s} {ratio:12.2f}   (target >= 0.5)")
    print(f"{'    per repeat':52s} " + ", ".join(f"{r['ratio']:.2f}" for r in reps))
    if cold:
        print(f"{'    warm-up':52s} " + ", ".join(f"{r['ratio']:.2f}" for r in cold))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "at": stamp(),
                    "machine": machine(),
                    "repeats": reps,
                    "warmup": cold,
                    "ratio": round(ratio, 3),
                },
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
