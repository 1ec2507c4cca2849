"""Benchmark: a shadow's tail into a folded v2 (``translate.fold``), as v2 grows.

Two parts, each at v2 sizes of 100k, 1M and 5M keys (``--sizes``):

* **per-batch commit** (the sink alone, no Spark, no broker): v2 is filled with ``N`` folded
  rows (one commit of the history's folded rows), then ``--batches`` folded commits of
  ``--per-batch`` partial rows each (200 = one second of a 200 rec/s producer) are timed, as the
  tail's :meth:`commit_folded` runs them: v2's rows of the batch's keys read, folded with the
  partial rows, written over them, the units recorded, one commit. The keys of a batch are
  ``--keys recent``: a third new orders above every key so far, two thirds updates of the 2,000
  most recent (a fulfilment stream: new orders and their follow-up events), or ``spread``: any
  key of v2, uniformly (the worst case for a layout by key range). Sinks: ``iceberg`` (a SQL
  catalog on SQLite, a local warehouse) and ``sqlite`` (the embedded SQL sink). The target: the
  median at 5M within 1.3x of the median at 100k.
* **tail** (``--tail``; real Spark, the embedded broker, an Iceberg v2): the shadow of a folded
  job is started (a small history), v2 is then grown to ``N`` keys by one sink commit (the
  live orders are keys 0..1,999, v2's lowest range: recent orders), a backlog of ``--backlog``
  events is produced while the tail is stopped, then a producer writes ``--rate`` events/s and
  the tail starts again: its sustained rate until caught up (target: >= 5x the producer) and
  the lag over ``--steady`` seconds after that (target: median under 2 s).

Usage: ``python bench/shadow_fold.py [--sizes 100000,1000000,5000000] [--sink iceberg|sqlite|both]
[--keys recent|spread] [--tail]``. One JSON line per measurement (``bench/RESULTS.md`` records a run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from common import machine, stamp  # noqa: E402

RUN = "r-bench"


def schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("order_id", pa.int64(), nullable=False),
            pa.field("status", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("events", pa.int64()),
            pa.field("_rewind_event_id", pa.string(), nullable=False),
            pa.field("_rewind_source_topic", pa.string(), nullable=False),
            pa.field("_rewind_source_partition", pa.int32(), nullable=False),
            pa.field("_rewind_source_offset", pa.int64(), nullable=False),
            pa.field("_rewind_source_timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("_rewind_extracted_at", pa.timestamp("us", tz="UTC")),
            pa.field("_rewind_transform", pa.string()),
            pa.field("_rewind_transform_version", pa.string()),
            pa.field("_rewind_run_id", pa.string(), nullable=False),
            pa.field("_rewind_synthetic", pa.bool_()),
        ]
    )


def rows(orders: Any, first_offset: int) -> Any:
    """One row per order id of ``orders`` (a numpy array), at consecutive offsets, vectorised."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(orders)
    offsets = np.arange(first_offset, first_offset + n, dtype=np.int64)
    micros = pa.array(1_790_000_000_000_000 + offsets * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    text = pc.cast(pa.array(offsets), pa.string())
    return pa.table(
        {
            "order_id": pa.array(orders, pa.int64()),
            "status": pa.array(np.where(offsets % 3 == 0, "paid", "placed")),
            "amount": pa.array((offsets % 9973).astype(np.float64)),
            "events": pa.array(np.ones(n, dtype=np.int64)),
            "_rewind_event_id": pc.binary_join_element_wise("orders/0/", text, ""),
            "_rewind_source_topic": pa.array(["orders"] * n),
            "_rewind_source_partition": pa.array(np.zeros(n, dtype=np.int32)),
            "_rewind_source_offset": pa.array(offsets),
            "_rewind_source_timestamp": micros,
            "_rewind_extracted_at": micros,
            "_rewind_transform": pa.array(["bench"] * n),
            "_rewind_transform_version": pa.array(["1"] * n),
            "_rewind_run_id": pa.array([RUN] * n),
            "_rewind_synthetic": pa.array(np.ones(n, dtype=bool)),
        }
    ).cast(schema())


def fold_totals(frame: Any) -> Any:
    """The fold under test (as :mod:`tests.shadow_fold_fixtures`): sums and the last status."""
    by = frame.groupby("order_id", sort=False)
    out = by.agg(status=("status", "last"), amount=("amount", "sum"), events=("events", "sum"))
    out["events"] = out["events"].astype("int64")
    return out.reset_index()


def row_fold() -> Any:
    from rewind.spark.fold_stage import fold_arrow

    target = schema()

    def fold(table: Any) -> Any:
        return fold_arrow(table, ["order_id"], fold_totals, target)

    return fold


def make_sink(kind: str, work: Path) -> tuple[Any, Any]:
    if kind == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        from rewind.sinks.iceberg.shadow import IcebergShadowSink

        (work / "warehouse").mkdir()
        uri, warehouse = f"sqlite:///{work / 'catalog.db'}", (work / "warehouse").as_uri()
        catalog = SqlCatalog("bench", uri=uri, warehouse=warehouse)
        catalog.create_namespace_if_not_exists("app")
        catalog.create_table("app.totals", schema=schema())
        sink: Any = IcebergShadowSink(catalog, "app.totals", ["order_id"])
    else:
        from rewind.sinks.sql.sink import SqlSink

        url = f"sqlite:///{work / 'app.db'}"
        sink = SqlSink(url, "totals", key=["order_id"], spool_dir=work / "spool", copy_target=False)
        sink.check(schema())
    return sink, sink.prepare(RUN, schema(), new_run=True)


def batch_keys(rng: Any, how: str, size: int, top: int, n: int) -> Any:
    import numpy as np

    if how == "spread":
        return rng.integers(0, top, n)
    new = np.arange(top, top + n // 3)
    recent = rng.integers(max(0, top - 2000), top, n - len(new))
    return np.concatenate([new, recent])


def commits(args: Any, kind: str, size: int) -> dict[str, Any]:
    import numpy as np

    from rewind.core.parquet import write_parquet

    work = Path(tempfile.mkdtemp(prefix="rewind-bench-fold-"))
    sink, staging = make_sink(kind, work)
    fold = row_fold()
    t0 = time.monotonic()
    history = write_parquet(sink.data_folder(staging), rows(np.arange(size), 0), "history")
    sink.commit_folded(staging, RUN, ["history"], [history], fold)
    fill_s = time.monotonic() - t0
    rng = np.random.default_rng(7)
    top, offset, times = size, size, []
    for _ in range(args.batches):
        keys = batch_keys(rng, args.keys, size, top, args.per_batch)
        top = max(top, int(keys.max()) + 1)
        path = write_parquet(sink.data_folder(staging), rows(keys, offset), "batch")
        offset += len(keys)
        started = time.monotonic()
        sink.commit_folded(staging, RUN, [f"orders/0/{offset - len(keys)}-{offset}"], [path], fold)
        times.append(time.monotonic() - started)
    files = None
    if kind == "iceberg":
        files = len(list(sink.catalog.load_table(staging.table).scan().plan_files()))
    warm = times[2:] or times
    return {
        "part": "commit",
        "sink": kind,
        "keys": args.keys,
        "v2_keys": size,
        "per_batch": args.per_batch,
        "batches": len(times),
        "fill_s": round(fill_s, 1),
        "median_ms": round(statistics.median(warm) * 1000, 1),
        "p90_ms": round(sorted(warm)[int(0.9 * (len(warm) - 1))] * 1000, 1),
        "rows_per_s": round(args.per_batch / statistics.median(warm)),
        "v2_files": files,
        "when": stamp(),
        "machine": machine(),
        "load_avg": os.getloadavg()[0],
    }


def tail(args: Any, bootstrap: str, size: int) -> dict[str, Any]:
    """Part two: the real tail against a paced producer, v2 grown to ``size`` keys."""
    import numpy as np
    import pyarrow as pa
    from shadow_tail import PARTITIONS, Paced, produce

    from rewind.catalog import load_catalog
    from rewind.config import load_settings
    from rewind.core.parquet import write_parquet
    from rewind.history import archive_once
    from rewind.job.planner import build_plan
    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowStore
    from rewind.shadow.start import TailProgress, start_shadow
    from rewind.shadow.tail import row_fold as spec_fold
    from rewind.sinks.iceberg.shadow import IcebergShadowSink
    from rewind.spark import session
    from rewind.spec import parse_spec
    from tests.kafka_util import create_topic

    work = Path(tempfile.mkdtemp(prefix="rewind-bench-fold-tail-"))
    settings = load_settings(
        env={"REWIND_STATE_DIR": str(work / "state"), "REWIND_BOOTSTRAP_SERVERS": bootstrap}, cwd=work
    )
    conf = settings.kafka_config()
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(conf, topic, PARTITIONS)
    produce(conf, topic, 0, 4000)
    archive_once(settings, [topic], "lake.bench_archive", spark=session(settings))
    data: dict[str, Any] = {
        "name": "bench-fold",
        "source": {"history": {"topics": [topic], "archive": "lake.bench_archive"}},
        "decode": "json",
        "translate": {
            "function": "tests.shadow_fold_fixtures:order_partials",
            "fold": "tests.shadow_fold_fixtures:fold_totals",
            "version": "1",
            "output_schema": {"order_id": "long", "status": "string", "amount": "double", "events": "long"},
        },
        "key": ["order_id"],
        "sink": {"postgres": {"table": "totals", "url": f"sqlite:///{work / 'app.db'}"}},
        "shadow": {"live_group": "bench-live", "lag_threshold": args.threshold, "trigger_s": 0.5},
    }
    out_schema = build_plan(settings, parse_spec(data)).output_schema()
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("app")
    catalog.create_table("app.totals", schema=out_schema)
    data["sink"] = {"iceberg": {"table": "app.totals"}}
    spec = parse_spec(data)
    start_shadow(settings, spec, stop=lambda p: True, sample_s=1.0)
    # v2 grown to `size` keys (above the live orders 0..1,999) by one folded commit
    ledger = Ledger.open(settings.ledger)
    try:
        run_id = ShadowStore(ledger.engine).get("bench-fold").run_id
        run = ledger.get_run(run_id)
        from rewind.job.service import load_plan

        plan = load_plan(ledger, run.plan_id)
    finally:
        ledger.close()
    sink = IcebergShadowSink(catalog, "app.totals", ["order_id"])
    staging = sink.staging_from_dict(run.staging)
    grown = rows(np.arange(2000, 2000 + size), 10**9).select(out_schema.names)
    at = grown.schema.get_field_index("_rewind_run_id")
    grown = grown.set_column(at, "_rewind_run_id", pa.array([run_id] * grown.num_rows)).cast(out_schema)
    t0 = time.monotonic()
    path = write_parquet(sink.data_folder(staging), grown, "grow")
    sink.commit_folded(staging, run_id, ["bench-grow"], [path], spec_fold(plan))
    grow_s = time.monotonic() - t0
    produce(conf, topic, 4000, 4000 + args.backlog)
    paced = Paced(conf, topic, 4000 + args.backlog, args.rate)
    paced.start()
    caught: dict[str, float] = {}
    lags: list[int] = []

    def stop(p: TailProgress) -> bool:
        if "seconds" not in caught:
            if p.max_lag <= args.threshold:
                caught.update(seconds=p.seconds, records=p.records)
            return False
        lags.append(p.max_lag)
        return p.seconds - caught["seconds"] >= args.steady

    result = start_shadow(settings, spec, stop=stop, sample_s=1.0)
    paced.halt.set()
    paced.join(60)
    rate = caught["records"] / caught["seconds"]
    return {
        "part": "tail",
        "sink": "iceberg",
        "v2_keys": size + 2000,
        "grow_s": round(grow_s, 1),
        "producer_rate": args.rate,
        "backlog": args.backlog,
        "caught_up_after_s": round(caught["seconds"], 1),
        "sustained_rate": round(rate),
        "ratio": round(rate / args.rate, 1),
        "tail_batches": result["batches"],
        "ms_per_batch": round(1000 * caught["seconds"] / max(result["batches"], 1)),
        "steady_samples": len(lags),
        "median_lag_s": round(statistics.median(lags) / args.rate, 2) if lags else None,
        "max_lag_s": round(max(lags) / args.rate, 2) if lags else None,
        "when": stamp(),
        "machine": machine(),
        "load_avg": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000,5000000")
    parser.add_argument("--sink", choices=["iceberg", "sqlite", "both"], default="both")
    parser.add_argument("--keys", choices=["recent", "spread"], default="recent")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--per-batch", type=int, default=200)
    parser.add_argument("--tail", action="store_true")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--steady", type=float, default=30.0)
    parser.add_argument("--threshold", type=int, default=100)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.tail:
        from common import broker

        with broker() as bootstrap:
            for size in sizes:
                print(json.dumps(tail(args, bootstrap, size)), flush=True)
        return
    for kind in ["iceberg", "sqlite"] if args.sink == "both" else [args.sink]:
        for size in sizes:
            print(json.dumps(commits(args, kind, size)), flush=True)


if __name__ == "__main__":
    main()
