"""Benchmark: a quarantine re-drive's records processed in the driver vs in Spark tasks.

For each size N (``--sizes``, records to re-drive), a quarantine table holding N entries of one
run (JSON orders of ~100 bytes, quarantined by a translate error), and the part of
``rewind.job.redrive.redrive`` that differs between its two paths, timed on the same entries:

* driver: the entries' bytes read with pyiceberg (``_with_bytes``), decoded and translated in
  one ``process_batch`` (``bench.job_translate:order_amount``), one Parquet file written;
* Spark: the entries read by Spark and joined with the chosen ones, processed and written in
  the tasks (``_in_spark`` → :func:`rewind.spark.redrive_stage.run_redrive`), ``local[*]``,
  the session warmed first.

Also timed: choosing the entries in the driver from their coordinate columns (``_latest``, both
paths do it). Prints medians of ``--repeat`` runs of each side (taken in turn), spark/driver,
and the smallest size at which Spark was faster, if any.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine, stamp

RUN = "r-20261127-120000-b3nc4a"
TABLE = "b.quarantine"
SPEC = {
    "name": "bench-redrive",
    "source": {"kafka": {"topics": ["orders"]}},
    "decode": {"format": "json", "schema": {"order_id": "long", "status": "string", "amount": "double"}},
    "translate": {
        "function": "bench.job_translate:order_amount",
        "version": "2",
        "output_schema": {"order_id": "long", "status": "string", "amount_cents": "long"},
    },
    "key": ["order_id"],
    "sink": {"iceberg": {"table": "b.target"}},
}


def entries(n: int) -> Any:
    import pyarrow as pa

    from rewind.translate.quarantine import QUARANTINE_SCHEMA

    now = datetime.now(UTC)
    values = [json.dumps({"order_id": i, "status": "paid", "amount": i % 997 / 7}).encode() for i in range(n)]
    data = {
        "run_id": [RUN] * n,
        "unit_id": [f"orders-{i % 8}-0" for i in range(n)],
        "topic": ["orders"] * n,
        "partition": [i % 8 for i in range(n)],
        "offset": [i // 8 for i in range(n)],
        "timestamp": [now] * n,
        "key": [str(i).encode() for i in range(n)],
        "value": values,
        "stage": ["translate-error"] * n,
        "reason": ["ValueError: broken"] * n,
        "at": [now] * n,
    }
    return pa.Table.from_pydict(data, schema=QUARANTINE_SCHEMA)


def output_schema_b64(spec: Any) -> str:
    """The run's output schema (user columns and lineage), as a plan holds it."""
    from rewind.core.arrow import schema_to_b64
    from rewind.spark.redrive_stage import kafka_batch
    from rewind.translate.factory import lineage_options, make_decoder, make_translator
    from rewind.translate.process import ProcessContext, process_batch

    ctx = ProcessContext(RUN, "u", "t", "1", datetime.now(UTC))
    user = {"order_id": "int64", "status": "string", "amount_cents": "int64"}
    import pyarrow as pa

    result = process_batch(
        kafka_batch(entries(2)), make_decoder(spec.decode), make_translator(spec.translate), spec.key, ctx,
        output_schema=pa.schema(list(user.items())), **lineage_options(spec),
    )  # fmt: skip
    return schema_to_b64(result.rows.schema)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="20000,100000,300000,1000000", help="records to re-drive")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.config import load_settings
    from rewind.core.arrow import schema_from_b64
    from rewind.core.parquet import write_parquet
    from rewind.job.redrive import ENTRY, _in_spark, _latest, _quarantine_rows, _with_bytes
    from rewind.spark import session
    from rewind.spark.redrive_stage import RedriveContext, kafka_batch
    from rewind.spec import parse_spec
    from rewind.translate.factory import lineage_options, make_decoder, make_translator
    from rewind.translate.process import ProcessContext, process_batch

    state = Path(tempfile.mkdtemp(prefix="bench-redrive-"))
    settings = load_settings(env={"REWIND_STATE_DIR": str(state)})
    session(settings, app_name="bench-redrive")
    catalog = load_catalog(settings)
    catalog.create_namespace("b")
    spec = parse_spec(SPEC)
    schema_b64 = output_schema_b64(spec)
    schema = schema_from_b64(schema_b64)
    user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
    out = state / "out"
    ctx = RedriveContext(
        RUN, "redrive-2-bench", spec.model_dump_json(), schema_b64, (out / "data").as_uri(),
        (out / "quarantine").as_uri(), datetime.now(UTC),
    )  # fmt: skip

    def driver(latest: list[dict[str, Any]]) -> None:
        batch = kafka_batch(_with_bytes(settings, TABLE, RUN, latest))
        pctx = ProcessContext(f"{RUN}/{ctx.unit_id}", ctx.unit_id, "order_amount", "2", ctx.extracted_at)
        result = process_batch(
            batch, make_decoder(spec.decode), make_translator(spec.translate), spec.key, pctx,
            output_schema=user_schema, **lineage_options(spec),
        )  # fmt: skip
        assert result.counts.emitted == len(latest), result.counts
        write_parquet(ctx.data_folder, result.rows.select(schema.names).cast(schema), ctx.unit_id)

    def in_spark(latest: list[dict[str, Any]]) -> None:
        _, _, counts = _in_spark(settings, TABLE, ctx, latest)
        assert counts.emitted == len(latest), counts

    catalog.create_table(TABLE, schema=entries(1).schema).append(entries(1000))
    warm = _latest(_quarantine_rows(settings, TABLE, RUN, ENTRY), None, {})
    driver(warm)  # the JVM, the Python workers and the imports warm before either side is timed
    in_spark(warm)
    rows_out, crossing = [], None
    for n in [int(s) for s in args.sizes.split(",")]:
        if catalog.table_exists(TABLE):
            catalog.purge_table(TABLE)
        catalog.create_table(TABLE, schema=entries(1).schema).append(entries(n))
        began = time.perf_counter()
        latest = _latest(_quarantine_rows(settings, TABLE, RUN, ENTRY), None, {})
        choose = time.perf_counter() - began
        assert len(latest) == n
        times: dict[str, list[float]] = {"driver": [], "spark": []}
        for _ in range(args.repeat):
            for side, fn in (("driver", driver), ("spark", in_spark)):
                began = time.perf_counter()
                fn(latest)
                times[side].append(time.perf_counter() - began)
        d, s = statistics.median(times["driver"]), statistics.median(times["spark"])
        row = {
            "records": n,
            "choose_entries_s": round(choose, 2),
            "driver_s": round(d, 2),
            "spark_s": round(s, 2),
            "spark_over_driver": round(s / d, 2),
            "load_average": [round(x, 1) for x in os.getloadavg()],
        }
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        if crossing is None and s < d:
            crossing = n
    print(
        json.dumps(
            {"when": stamp(), "machine": machine(), "sizes": rows_out, "spark_faster_from": crossing},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
