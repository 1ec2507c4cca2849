"""Benchmark: JSON decode in bulk vs record by record, the share of each stage, and a JSON job end to end.

Same run, same broker, same topic (default 1,000,000 records of 200 bytes, 8 partitions):

  (a) bare fetch: a confluent-kafka batch consume loop (best of read_committed / read_uncommitted);
  (b) per stage, in this process, on 100,000-record Arrow batches of the same values (best of 3):
      the per-record decode (orjson) and the bulk decode (Arrow's JSON reader), schemaless and with
      ``decode.schema``; the pandas translate (``bench/job_translate.py``); ``process_batch``
      whole (decode + translate + keys + accounting + lineage + quarantine); the Parquet write of
      its output (what the Iceberg staging does per unit) — each as seconds per million records
      and as a share of one record's path from fetch to staged file;
  (c) ``rewind run``: a JSON job (``decode.schema``, the pandas translate, Iceberg staging sink)
      end to end, plan and commit included, against (a).

Usage: ``python bench/decode.py [--records N]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import bare_consume, bare_produce, broker, create_topic, machine, stamp, value_of  # noqa: E402

SCHEMA = {"order_id": "long", "status": "string", "amount": "double"}
RUNS = (("first run, cold session", "order_amounts"), ("warm session", "order_amounts_2"))
"""The end-to-end job's two runs: (label, table)."""


def json_job(
    topic: str, table: str, to: dict[int, int] | None = None, work_unit_records: int | None = None
) -> Any:
    """The JSON job of the decode, profile and scale benches: ``decode.schema``, the pandas
    translate (bench/job_translate.py), Iceberg staging into ``table``; ``to``: offsets per
    partition where the window ends (default: the log end)."""
    from rewind.spec import parse_spec

    kafka: dict[str, Any] = {"topics": [topic]}
    if to is not None:
        kafka["to"] = {topic: {str(p): o for p, o in to.items()}}
    spec: dict[str, Any] = {
        "name": table.replace(".", "-").replace("_", "-"),
        "source": {"kafka": kafka},
        "decode": {"format": "json", "schema": SCHEMA},
        "translate": {"function": "bench.job_translate:order_amount", "version": "1"},
        "key": ["order_id"],
        "sink": {"iceberg": {"table": table}},
    }
    if work_unit_records is not None:
        spec["run"] = {"work_unit_records": work_unit_records}
    return parse_spec(spec)


def best(fn: Any, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def stage_times(n: int = 100_000) -> dict[str, float]:
    """Seconds per million records for each stage, on one in-memory batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench.job_translate import order_amount
    from rewind.core.arrow import kafka_record_schema
    from rewind.translate.json_decoder import JsonDecoder
    from rewind.translate.process import ProcessContext, process_batch

    batch = pa.RecordBatch.from_pydict(
        {
            "key": [b"%d" % (i % 50_000) for i in range(n)],
            "value": [value_of(i) for i in range(n)],
            "topic": ["bench-orders"] * n,
            "partition": [i % 8 for i in range(n)],
            "offset": list(range(n)),
            "timestamp": [datetime(2026, 1, 1, tzinfo=UTC)] * n,
            "timestampType": [0] * n,
        },
        schema=kafka_record_schema(False),
    )
    per_m = 1_000_000 / n
    out: dict[str, float] = {}
    for label, schema in (("schemaless", None), ("schema", SCHEMA)):
        dec = JsonDecoder(schema)
        out[f"decode per record ({label})"] = best(lambda d=dec: d.decode_each(batch)) * per_m
        out[f"decode bulk ({label})"] = best(lambda d=dec: d.decode(batch)) * per_m
    dec = JsonDecoder(SCHEMA)
    events = dec.decode(batch).events
    out["translate (pandas)"] = best(lambda: order_amount(events)) * per_m
    ctx = ProcessContext("run", "unit", "bench", "1", datetime(2026, 1, 1, tzinfo=UTC))

    def whole(decoder: Any) -> Any:
        return process_batch(batch, decoder, order_amount, ["order_id"], ctx)

    out["process_batch, bulk decode (schema)"] = best(lambda: whole(dec)) * per_m
    table = whole(dec).rows
    folder = tempfile.mkdtemp(prefix="bench-decode-")

    def write() -> None:
        pq.write_table(table, f"{folder}/part.parquet")

    out["Parquet write of the output"] = best(write) * per_m
    shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    n, parts = args.records, args.partitions

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from rewind.spark import session

    stages = stage_times()
    state = Path(tempfile.mkdtemp(prefix="bench-decode-"))
    rates: dict[str, float] = {}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = "bench-orders"
        create_topic(conf, topic, parts)
        bare_produce(conf, topic, n, parts)
        got, ru = bare_consume(conf, topic, parts, "read_uncommitted")
        got2, rc = bare_consume(conf, topic, parts, "read_committed")
        assert got == got2 == n
        rates["bare fetch (best of two isolation levels)"] = max(ru, rc)
        settings = load_settings(env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(state)})
        spark = session(settings, app_name="bench-decode")
        spark.range(1).count()
        # twice into fresh tables: the first run is also the JVM's first Python job (its
        # Python runner's classes and JIT, ~1-3 s once per session, as a fresh `rewind run`
        # pays); the second is a run on a warm session, as small_job.py and scale.py measure
        for label, table in RUNS:
            spec = json_job(topic, f"bench.{table}", work_unit_records=250_000)
            t0 = time.perf_counter()
            outcome = run_job(settings, spec)
            rates[f"rewind run ({label})"] = n / (time.perf_counter() - t0)
            assert outcome.counts.records_read == n == outcome.counts.rows_out, outcome.to_dict()
        spark.stop()
    shutil.rmtree(state, ignore_errors=True)

    fetch = rates["bare fetch (best of two isolation levels)"]
    fetch_s = 1_000_000 / fetch
    path = fetch_s + stages["process_batch, bulk decode (schema)"] + stages["Parquet write of the output"]
    print(f"# decode benchmark, {stamp()}, {machine()}, {n:,} records x 200 B, {parts} partitions")
    print("## stages: seconds per million records (best of 3), share of fetch + process_batch + write")
    print(f"{'fetch (bare consume)':42s} {fetch_s:8.2f} s/M {fetch_s / path:6.0%}")
    for key, value in stages.items():
        print(f"{key:42s} {value:8.2f} s/M {value / path:6.0%}")
    for key in ("schemaless", "schema"):
        ratio = stages[f"decode per record ({key})"] / stages[f"decode bulk ({key})"]
        print(f"bulk decode speed-up ({key}) {ratio:20.2f}x")
    print("## end to end")
    for key, value in rates.items():
        print(f"{key:42s} {value:>12,.0f} rec/s")
    ratios = {label: rates[f"rewind run ({label})"] / fetch for label, _ in RUNS}
    for label, ratio in ratios.items():
        print(f"{'run / bare fetch, ' + label:42s} {ratio:12.2f}   (target >= 0.8)")
    print(json.dumps({"stages_s_per_million": stages, "rates": rates, "run_over_fetch": ratios}))


if __name__ == "__main__":
    main()
