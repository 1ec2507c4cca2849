"""Benchmark: a merge policy on the Iceberg sink vs the plain append of the same rows.

Same run, same N output rows with Rewind's lineage (default 1,000,000; --rows), into two
targets holding the same live rows (N/10, half of their keys also in the run, older):

(a) plain append: the rows written as Parquet files into the staging branch's data folder and
    committed by ``IcebergSink.commit`` (what a wave does);
(b) merge: the same, then the run's merge step (``rewind.job.merge.merge_iceberg``: read the
    branch, decide with ``latest-event-time``, delete what is not applied in one transaction).

Two scenarios: unique keys in the run (the usual read-model repair) and 1% of the run's keys
written twice (dedup rewrites the files holding the older rows). Prints seconds and the ratio
b/a per scenario, medians of ``--repeat`` runs of each side taken in turn.

``--job N``: also the whole backfill, end to end on the embedded broker (N records, default
200,000): ``rewind run`` of the same spec into a new Iceberg table without and with
``merge: {}`` (what a user waits for; target b/a <= 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, stamp

FILES = 8
RUN = "r-20261125-120000-b3nc4a"
"""A run id of the ledger's shape (longer than the 16 characters Iceberg keeps as a bound)."""


def rows(n: int, run_id: str, base_us: int, duplicates: float, start_key: int = 0) -> object:
    import numpy as np
    import pyarrow as pa

    keys = np.arange(start_key, start_key + n, dtype=np.int64)
    if duplicates:
        dup = int(n * duplicates)
        keys[-dup:] = keys[:dup]  # the last 1% repeat the first keys, later in time
    ts = base_us + np.arange(n, dtype=np.int64) * 1000
    return pa.table(
        {
            "order_id": keys,
            "customer": pa.array([f"c-{i % 50_000}" for i in range(n)]),
            "amount": (np.arange(n) % 9973) / 7.0,
            "_rewind_event_id": pa.array([f"{run_id}-{i:012d}" for i in range(n)]),
            "_rewind_source_topic": pa.array(["orders"] * n),
            "_rewind_source_partition": pa.array(np.arange(n) % 8, pa.int32()),
            "_rewind_source_offset": pa.array(np.arange(n), pa.int64()),
            "_rewind_source_timestamp": pa.array(ts, pa.timestamp("us", tz="UTC")),
            "_rewind_run_id": pa.array([run_id] * n),
        }
    )


def one(catalog: object, name: str, live: object, data: object, merge: bool) -> dict[str, float]:
    from rewind.core.merge import MergePolicy
    from rewind.core.parquet import write_parquet
    from rewind.job.merge import merge_iceberg
    from rewind.sinks.iceberg import IcebergSink

    table = catalog.create_table(name, schema=data.schema)  # type: ignore[attr-defined]
    table.append(live)
    sink = IcebergSink(catalog, name)  # type: ignore[arg-type]
    staging = sink.prepare(RUN, data.schema)  # type: ignore[attr-defined]
    began, cpu = time.perf_counter(), time.process_time()
    folder = sink.data_folder(staging)
    step = -(-data.num_rows // FILES)  # type: ignore[attr-defined]
    slices = range(0, data.num_rows, step)  # type: ignore[attr-defined]
    files = [write_parquet(folder, data.slice(i, step), "unit") for i in slices]  # type: ignore[attr-defined]
    sink.commit(staging, RUN, ["u"], files)
    appended, appended_cpu = time.perf_counter() - began, time.process_time() - cpu
    out = {"append_s": appended, "append_cpu_s": appended_cpu}
    if merge:
        result = merge_iceberg(sink, staging, RUN, ["order_id"], MergePolicy())
        out["merge_s"] = time.perf_counter() - began - appended
        out["merge_cpu_s"] = time.process_time() - cpu - appended_cpu
        out["counts"] = result.counts  # type: ignore[assignment]
    # the process's CPU time (all its threads) moves far less with other processes' load than
    # the wall clock does: both are reported
    out["total_s"] = time.perf_counter() - began
    out["total_cpu_s"] = time.process_time() - cpu
    if merge:  # checked outside the timed part
        loaded = catalog.load_table(name)  # type: ignore[attr-defined]
        head = loaded.snapshot_by_name(staging.ref).snapshot_id
        keys = loaded.scan(snapshot_id=head, selected_fields=("order_id",)).to_arrow()["order_id"]
        assert len(keys) == len(set(keys.to_pylist())), "a key twice after the merge"
    return out


def job(n: int) -> dict[str, object]:
    """The whole run, plain append vs merge, same topic, same process."""
    import shutil

    from common import bare_produce, broker, create_topic

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.spark import session
    from rewind.spec import parse_spec

    state = Path(tempfile.mkdtemp(prefix="bench-merge-job-"))
    out: dict[str, object] = {"records": n}
    with broker() as bootstrap:
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        conf = settings.kafka_config()
        create_topic(conf, "orders", 4)
        bare_produce(conf, "orders", n, 4)
        session(settings, app_name="bench-merge").range(1).count()  # JVM warm before either side
        for label, merge in (("plain", None), ("merge", {}), ("plain again", None)):
            spec: dict[str, object] = {
                "name": f"bench-{label.replace(' ', '-')}",
                "source": {"kafka": {"topics": ["orders"]}},
                "decode": "json",
                "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
                "key": ["order_id"],
                "sink": {"iceberg": {"table": f"bench.t_{label.replace(' ', '_')}"}},
                "run": {"work_unit_records": 100_000},
            }
            if merge is not None:
                spec["merge"] = merge
            began = time.perf_counter()
            outcome = run_job(settings, parse_spec(spec))
            out[f"{label}_s"] = round(time.perf_counter() - began, 2)
            assert outcome.counts.rows_out == n, outcome.to_dict()
            if outcome.merged is not None:
                out["decisions"] = outcome.merged
    shutil.rmtree(state, ignore_errors=True)
    plain = min(float(out["plain_s"]), float(out["plain again_s"]))  # type: ignore[arg-type]
    out["ratio_b_over_a"] = round(float(out["merge_s"]) / plain, 2)  # type: ignore[arg-type]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side (medians)")
    parser.add_argument("--job", type=int, default=0, help="records of the end-to-end run (0: skip)")
    args = parser.parse_args()
    n = args.rows

    from pyiceberg.catalog.sql import SqlCatalog

    tmp = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    (tmp / "wh").mkdir()
    catalog = SqlCatalog("bench", uri=f"sqlite:///{tmp / 'c.db'}", warehouse=(tmp / "wh").as_uri())
    catalog.create_namespace("b")
    base = 1_790_000_000_000_000
    live = rows(n // 10, "live", base - 10**9, 0.0, start_key=n - n // 20)  # older; half overlap
    results = {}
    for label, dups in (("unique keys", 0.0), ("1% duplicate keys", 0.01)):
        data = rows(n, RUN, base, dups)
        live_cast = live.cast(data.schema)
        tag = "u" if not dups else "d"
        plains, merges = [], []
        for r in range(args.repeat):  # (a) and (b) in turn, medians: the load moves under both
            plains.append(one(catalog, f"b.plain_{tag}{r}", live_cast, data, merge=False))
            merges.append(one(catalog, f"b.merged_{tag}{r}", live_cast, data, merge=True))

        def median(runs: list[dict[str, float]], what: str) -> float:
            return statistics.median(r[what] for r in runs)

        results[label] = {
            "plain_append_s": round(median(plains, "total_s"), 2),
            "merge_total_s": round(median(merges, "total_s"), 2),
            "of_which_merge_step_s": round(median(merges, "merge_s"), 2),
            "ratio_b_over_a": round(median(merges, "total_s") / median(plains, "total_s"), 2),
            "plain_append_cpu_s": round(median(plains, "total_cpu_s"), 2),
            "merge_total_cpu_s": round(median(merges, "total_cpu_s"), 2),
            "of_which_merge_step_cpu_s": round(median(merges, "merge_cpu_s"), 2),
            "ratio_b_over_a_cpu": round(median(merges, "total_cpu_s") / median(plains, "total_cpu_s"), 2),
            "decisions": merges[0]["counts"],
        }
    report: dict[str, object] = {"when": stamp(), "machine": machine(), "rows": n, "live_rows": n // 10}
    report["load_average"] = [round(x, 1) for x in os.getloadavg()]
    report["sink_only"] = results
    if args.job:
        report["whole_run"] = job(args.job)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
