"""Benchmark: a re-produce (``source.table``) against a bare confluent-kafka produce loop.

Same run, same broker, same records (default 200,000 accounts in a SQLite file, 8 partitions):

  (a) ``run_job`` of a spec re-producing every row (``where: TRUE``) to a topic: Spark tasks
      read their key ranges, decode and translate the rows (a pandas function), attach lineage,
      and produce each unit in one Kafka transaction with its marker; the ledger, the
      quarantine and the conservation checks as in any run. Timed from the run's start to its
      end (plan, and the Spark session's first start, before the clock);
  (b) a bare confluent-kafka idempotent produce loop (the sink's producer settings: linger 20
      ms, lz4) of the very records (a) produced: read back from (a)'s topic into memory first
      (key, value, partition, timestamp, headers), only the produce calls and the flush timed.
      A bare *transactional* loop (one transaction) is measured too, for reference;
  (c) a bare re-produce script, what one writes by hand: one process reads the same rows with
      the database's driver, builds the same message (orjson), key and a few static headers,
      and produces with librdkafka's Java-compatible ``murmur2_random`` partitioner; timed from
      the query to the flush.

(a) and (b) run side by side ``--repeat`` times (default 3) and the medians are reported, after
``--warmup`` repeats (default 1) reported apart: a session's first Spark job with Python starts
its Python workers and their imports (pandas, pyarrow, SQLAlchemy, the translate), 3-4 s that a
long-lived service pays once and a ``rewind run`` from the shell pays every time, and the JIT
and the broker's new topics settle over the first repeats (at 200,000 rows on 2026-11-26 a
warm-up's ratio was 0.12-0.20, the next repeats' 0.42-0.88). As in ``bench/verify.py``, each
figure and its peer are thus measured alike, in steady state, and the cold figure is printed
beside them.

Prints rows/s of each and the ratio a/b; ``--json PATH`` writes them. Usage:
``python bench/reproduce.py [--rows N] [--ranges R] [--postgres URL] [--repeat 3] [--warmup 1]``;
``REWIND_BENCH_BOOTSTRAP`` selects another broker than a fresh tansu.
"""

from __future__ import annotations

import argparse
import gc
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

PARTITIONS = 8
SCHEMA = "id BIGINT PRIMARY KEY, name TEXT, balance_cents BIGINT, status TEXT, region TEXT, note TEXT"


def rows_of(n: int) -> list[tuple[Any, ...]]:
    statuses = ("active", "blocked", "closed")
    return [
        (i, f"account {i}", (i * 7919) % 1_000_000, statuses[i % 3], "eu" if i % 2 else "us", "x" * 40)
        for i in range(1, n + 1)
    ]


def fill_sqlite(path: Path, n: int) -> str:
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE accounts ({SCHEMA})")
        db.executemany("INSERT INTO accounts VALUES (?, ?, ?, ?, ?, ?)", rows_of(n))
    return f"sqlite:///{path}"


def fill_postgres(url: str, n: int) -> str:
    import psycopg

    with psycopg.connect(url) as db:
        db.execute("DROP TABLE IF EXISTS bench_accounts")
        db.execute(f"CREATE TABLE bench_accounts ({SCHEMA})")
        with db.cursor().copy("COPY bench_accounts FROM STDIN") as copy:
            for row in rows_of(n):
                copy.write_row(row)
    return url


def read_back(conf: dict[str, Any], topic: str) -> list[tuple[Any, ...]]:
    """(value, key, partition, timestamp, headers) of every record of ``topic``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    out = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        left = set(range(PARTITIONS))
        while left:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition())
                    continue
                out.append((msg.value(), msg.key(), msg.partition(), msg.timestamp()[1], msg.headers()))
    finally:
        consumer.close()
    return out


class _WaveClock:
    """A console that times the run's stages (each from its start to the next one's) and its
    waves (from the first wave's start to the conclude stage)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0
        self.marks: list[tuple[str, float]] = []

    def stage(self, name: str, description: str) -> None:
        now = time.perf_counter()
        self.marks.append((name, now))
        if name == "run-wave" and not self.started:
            self.started = now
        elif name == "conclude":
            self.seconds = now - self.started

    def stages(self, ended: float) -> dict[str, float]:
        """Seconds per stage name (summed over repeats of a name), the last one up to ``ended``."""
        out: dict[str, float] = {}
        for (name, at), (_, nxt) in zip(self.marks, [*self.marks[1:], ("", ended)], strict=True):
            out[name] = round(out.get(name, 0.0) + nxt - at, 3)
        return out

    def run_started(self, progress: Any) -> None: ...

    def wave_progress(self, progress: Any) -> None: ...

    def run_progress(self, progress: Any) -> None: ...

    def archive_committed(self, result: Any) -> None: ...


def bare_loop(conf: dict[str, Any], topic: str, records: list[tuple[Any, ...]], transactional: bool) -> float:
    from confluent_kafka import Producer

    settings = {
        **conf,
        "enable.idempotence": True,
        "linger.ms": 20,
        "compression.type": "lz4",
        "queue.buffering.max.messages": 500_000,
        "delivery.report.only.error": True,
    }
    if transactional:
        settings["transactional.id"] = f"bench-bare-{uuid.uuid4().hex[:6]}"
    producer = Producer(settings)
    if transactional:
        producer.init_transactions(60)
    produce = producer.produce
    gc.disable()  # as in Rewind's produce loop
    t0 = time.perf_counter()
    if transactional:
        producer.begin_transaction()
    for i, (value, key, partition, ts, headers) in enumerate(records):
        while True:
            try:
                produce(topic, value, key, partition, timestamp=ts, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 20_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("bare produce: records left undelivered")
    if transactional:
        producer.commit_transaction(60)
    seconds = time.perf_counter() - t0
    gc.enable()
    return len(records) / seconds


def bare_script(conf: dict[str, Any], topic: str, source: dict[str, Any]) -> float:
    import orjson
    from confluent_kafka import Producer

    producer = Producer(
        {
            **conf,
            "enable.idempotence": True,
            "linger.ms": 20,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 500_000,
            "delivery.report.only.error": True,
            "partitioner": "murmur2_random",
        }
    )
    headers = [("rewind.synthetic", "true"), ("rewind.source", "accounts"), ("rewind.version", "1")]
    produce, dumps = producer.produce, orjson.dumps
    gc.disable()
    t0 = time.perf_counter()
    if "sqlite" in source:
        db: Any = sqlite3.connect(source["sqlite"]["url"].removeprefix("sqlite:///"))
        cursor = db.execute("SELECT * FROM accounts ORDER BY id")
    else:
        import psycopg

        db = psycopg.connect(source["postgres"]["url"])
        cursor = db.cursor(name="bench").execute("SELECT * FROM bench_accounts ORDER BY id")
    n = 0
    while True:
        rows = cursor.fetchmany(10_000)
        if not rows:
            break
        for ident, name, cents, status, region, _note in rows:
            value = dumps(
                {
                    "account_id": ident,
                    "name": name,
                    "balance": cents / 100,
                    "status": status,
                    "region": region,
                }
            )
            while True:
                try:
                    produce(topic, value, str(ident).encode(), headers=headers)
                    break
                except BufferError:
                    producer.poll(0.01)
        n += len(rows)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("bare script: records left undelivered")
    seconds = time.perf_counter() - t0
    gc.enable()
    db.close()
    return n / seconds


def _median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--ranges", type=int, help="key ranges (work units); default: the plan's")
    parser.add_argument("--postgres", help="read from this PostgreSQL database instead of SQLite")
    parser.add_argument("--repeat", type=int, default=3, help="(a) and (b) side by side, this many times")
    parser.add_argument(
        "--warmup", type=int, default=1, help="(a) and (b) side by side this many times first, reported apart"
    )
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    from rewind.config import load_settings
    from rewind.job.service import plan_job, run_job
    from rewind.spark import session
    from rewind.spec import parse_spec

    n = args.rows
    tmp = Path(tempfile.mkdtemp(prefix="rewind-bench-reproduce-"))
    reps: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []  # the warm-up repeats
    with broker() as bootstrap:
        settings = load_settings(
            env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
        )
        conf = settings.kafka_config()
        if args.postgres:
            source = {"postgres": {"url": fill_postgres(args.postgres, n), "table": "bench_accounts"}}
        else:
            source = {"sqlite": {"url": fill_sqlite(tmp / "accounts.db", n), "table": "accounts"}}
        ranges = {"key_ranges": args.ranges} if args.ranges else {}
        session(settings)  # the Spark session's first start is not part of a run's rate
        for rep in range(args.warmup + args.repeat):
            topic = f"bench-accounts-{uuid.uuid4().hex[:6]}"
            create_topic(conf, topic, PARTITIONS)
            spec = parse_spec(
                {
                    "name": f"bench-reproduce-{rep}",
                    "source": {"table": {**source, "key": "id", "where": "TRUE", **ranges}},
                    "decode": "rows",
                    "translate": {"function": "bench.reproduce_translate:account_state", "version": "1"},
                    "key": ["account_id"],
                    "sink": {"kafka": {"topic": topic}},
                }
            )
            t0 = time.perf_counter()
            plan = plan_job(settings, spec)
            plan_seconds = time.perf_counter() - t0
            assert plan.ok, plan.failed_gates()
            waves = _WaveClock()
            t0 = time.perf_counter()
            outcome = run_job(settings, plan.plan_id, console=waves)  # `rewind run PLAN_ID`
            ended = time.perf_counter()
            run_seconds = ended - t0
            assert outcome.state == "succeeded" and outcome.counts.emitted == n, outcome.to_dict()
            records = read_back(conf, topic)
            assert len(records) == n, f"read back {len(records)} of {n} records"
            other = f"bench-bare-{uuid.uuid4().hex[:6]}"
            create_topic(conf, other, PARTITIONS)
            bare_rate = bare_loop(conf, other, records, transactional=False)
            del records
            (cold if rep < args.warmup else reps).append(
                {
                    "units": len(plan.units),
                    "plan_seconds": round(plan_seconds, 3),
                    "run_seconds": round(run_seconds, 3),
                    "reproduce_rows_per_s": n / run_seconds,
                    "wave_rows_per_s": n / waves.seconds,
                    "bare_rows_per_s": bare_rate,
                    "ratio": n / run_seconds / bare_rate,
                    "stages": waves.stages(ended),
                }
            )
            kind = "warm-up" if rep < args.warmup else "repeat"
            print(f"{kind} {rep + 1}: " + json.dumps((cold if rep < args.warmup else reps)[-1], default=str))
        other_txn = f"bench-bare-txn-{uuid.uuid4().hex[:6]}"
        create_topic(conf, other_txn, PARTITIONS)
        bare_txn_rate = bare_loop(conf, other_txn, read_back(conf, topic), transactional=True)
        scripted = f"bench-script-{uuid.uuid4().hex[:6]}"
        create_topic(conf, scripted, PARTITIONS)
        script_rate = bare_script(conf, scripted, source)

    rewind_rate = _median([r["reproduce_rows_per_s"] for r in reps])
    bare_rate = _median([r["bare_rows_per_s"] for r in reps])
    wave_rate = _median([r["wave_rows_per_s"] for r in reps])
    ratio = _median([r["ratio"] for r in reps])
    units = reps[0]["units"]
    shape = f"{n:,} rows, {PARTITIONS} partitions, {units} key ranges, median of {len(reps)}"
    print(f"# {stamp()}  {machine()}  {shape}")
    label = "(a) re-produce (rewind run of the stored plan)"
    print(f"{label:50s} {rewind_rate:>12,.0f} rows/s  ({_median([r['run_seconds'] for r in reps]):.1f} s)")
    print(f"{'    its plan (before the clock)':50s} {_median([r['plan_seconds'] for r in reps]):>12.1f} s")
    print(f"{'(b) bare confluent-kafka produce loop':50s} {bare_rate:>12,.0f} rows/s")
    print(f"{'    bare loop in one transaction (once)':50s} {bare_txn_rate:>12,.0f} rows/s")
    print(f"{'(c) bare re-produce script (once)':50s} {script_rate:>12,.0f} rows/s")
    print(f"{'a/b (median of the per-repeat ratios)':50s} {ratio:12.2f}   (target >= 0.7)")
    print(f"{'    per repeat':50s} " + ", ".join(f"{r['ratio']:.2f}" for r in reps))
    if cold:
        print(
            f"{'    warm-up (the first: Spark starts its Python workers)':50s} "
            + ", ".join(f"{r['ratio']:.2f}" for r in cold)
        )
    print(f"{'a/c':50s} {rewind_rate / script_rate:12.2f}")
    print(f"{'wave only (Spark tasks read, translate, produce)':50s} {wave_rate:>12,.0f} rows/s")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "at": stamp(),
                    "machine": machine(),
                    "rows": n,
                    "ranges": units,
                    "repeats": reps,
                    "warmup": cold,
                    "reproduce_rows_per_s": round(rewind_rate),
                    "bare_rows_per_s": round(bare_rate),
                    "bare_transactional_rows_per_s": round(bare_txn_rate),
                    "bare_script_rows_per_s": round(script_rate),
                    "wave_rows_per_s": round(wave_rate),
                    "ratio": round(ratio, 3),
                    "ratio_to_script": round(rewind_rate / script_rate, 3),
                },
                indent=2,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
