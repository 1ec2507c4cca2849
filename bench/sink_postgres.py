"""Benchmark: rows/s into PostgreSQL through ``SqlSink.commit`` against a plain COPY.

Same run, same server, same rows (default 5,000,000 order rows with the ten lineage columns,
as Parquet files of 250,000 rows, committed 1,000,000 rows at a time like a wave):

  (a) baseline: one process reads the same Parquet files with pyarrow, encodes them to CSV
      and streams them with one psycopg ``COPY`` into a plain table (no index, no
      constraint, one transaction);
  (b) ``commit`` into a new read model's staging (unique index on the key; rows are new, so
      they go straight in with ``COPY`` under a savepoint), unit bookkeeping included;
  (c) ``commit`` of newer events for every key already in staging (a repair: ``COPY`` into a
      temporary table, ``INSERT ... ON CONFLICT DO UPDATE``).

Prints rows/s of each and b/a, c/a. Usage: ``python bench/sink_postgres.py [--rows N]``;
``REWIND_BENCH_PG`` names the server (default ``postgresql://postgres@127.0.0.1:5432``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, stamp  # noqa: E402

FILE_ROWS = 250_000
COMMIT_ROWS = 1_000_000


def order_rows(start: int, n: int, offset_base: int, run_id: str) -> Any:
    """``n`` output rows for orders ``start..start+n`` (numpy-built, no per-row Python)."""
    import numpy as np
    import pyarrow as pa

    from rewind.translate.lineage import LINEAGE_SCHEMA

    ids = np.arange(start, start + n, dtype="int64")
    offsets = ids + offset_base
    base = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp() * 1_000_000)
    ts = pa.array(base + offsets * 1000, pa.timestamp("us", tz="UTC"))
    event_ids = pa.array(np.char.add("e-", offsets.astype("U20")).astype(object), pa.string())
    statuses = pa.DictionaryArray.from_arrays(
        pa.array(ids % 4, pa.int8()), pa.array(["placed", "paid", "shipped", "cancelled"])
    ).cast(pa.string())
    schema = pa.schema(
        [
            pa.field("order_id", pa.int64()),
            pa.field("status", pa.string()),
            pa.field("amount", pa.float64()),
            *LINEAGE_SCHEMA,
        ]
    )
    return pa.Table.from_arrays(
        [
            pa.array(ids),
            statuses,
            pa.array((ids % 9973) / 7.0),
            event_ids,
            pa.array(["orders"] * n, pa.string()),
            pa.array((ids % 8).astype("int32")),
            pa.array(offsets),
            ts,
            pa.array(np.full(n, base), pa.timestamp("us", tz="UTC")),
            pa.array(["order_amount"] * n, pa.string()),
            pa.array(["1"] * n, pa.string()),
            pa.array([run_id] * n, pa.string()),
            pa.array(np.ones(n, dtype=bool)),
        ],
        schema=schema,
    )


def write_files(folder: str, rows: int, offset_base: int, run_id: str) -> list[str]:
    from rewind.core.parquet import write_parquet

    return [
        write_parquet(folder, order_rows(start, min(FILE_ROWS, rows - start), offset_base, run_id), "data")
        for start in range(0, rows, FILE_ROWS)
    ]


def baseline(url: str, files: list[str], columns: list[str]) -> float:
    """(a): pyarrow reads and encodes, one psycopg COPY into a plain table."""
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE plain (order_id bigint, status text, amount double precision, "
            "_rewind_event_id text, _rewind_source_topic text, _rewind_source_partition integer, "
            "_rewind_source_offset bigint, "
            "_rewind_source_timestamp timestamptz, _rewind_extracted_at timestamptz, _rewind_transform text, "
            "_rewind_transform_version text, _rewind_run_id text, _rewind_synthetic boolean)"
        )
        conn.commit()
        began = time.perf_counter()
        conn.execute("SET TimeZone = 'UTC'")
        with conn.cursor().copy(f"COPY plain ({', '.join(columns)}) FROM STDIN (FORMAT csv)") as copy:
            for path in files:
                for batch in pq.ParquetFile(path.removeprefix("file://")).iter_batches(batch_size=65_536):
                    cols = [
                        c.cast(pa.timestamp("us")).cast(pa.string()) if pa.types.is_timestamp(c.type) else c
                        for c in batch.columns
                    ]
                    buf = io.BytesIO()
                    pcsv.write_csv(
                        pa.table(cols, names=batch.schema.names), buf, pcsv.WriteOptions(include_header=False)
                    )
                    copy.write(buf.getvalue())
        conn.commit()
        seconds = time.perf_counter() - began
        (count,) = conn.execute("SELECT count(*) FROM plain").fetchone() or (0,)
        assert count == sum(pq.ParquetFile(f.removeprefix("file://")).metadata.num_rows for f in files)
    return seconds


def through_sink(
    sink: Any, staging: Any, files: list[str], run_id: str, first_unit: int
) -> tuple[float, set[str]]:
    """(b)/(c): commits of COMMIT_ROWS rows each, as waves of units."""
    per_commit = max(1, COMMIT_ROWS // FILE_ROWS)
    seconds, paths = 0.0, set[str]()
    for i in range(0, len(files), per_commit):
        group = files[i : i + per_commit]
        units = [f"orders/0/{first_unit + i + k}" for k in range(len(group))]
        counts = {u: {"rows_out": FILE_ROWS} for u in units}
        began = time.perf_counter()
        out = sink.commit(staging, run_id, units, group, extra={"rewind.unit-counts": json.dumps(counts)})
        seconds += time.perf_counter() - began
        paths.add(out["path"])
    return seconds, paths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    args = parser.parse_args()
    n = args.rows

    import psycopg

    from rewind.sinks.sql.sink import SqlSink
    from rewind.translate.lineage import LINEAGE_SCHEMA

    server = os.environ.get("REWIND_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
    db = f"rewind_bench_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
    url = f"{server}/{db}"
    spool = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    columns = ["order_id", "status", "amount", *LINEAGE_SCHEMA.names]
    seconds: dict[str, float] = {}
    try:
        run_id = "r-bench"
        sink = SqlSink(url, "public.order_amounts", key=["order_id"], spool_dir=spool)
        schema = order_rows(0, 1, 0, run_id).schema
        staging = sink.prepare(run_id, schema)
        folder = sink.data_folder(staging)

        files = write_files(folder, n, 0, run_id)
        copies = [shutil.copy(f.removeprefix("file://"), spool / Path(f).name) for f in files]
        seconds["a: plain COPY into a plain table"] = baseline(url, [f"file://{c}" for c in copies], columns)
        for c in copies:
            Path(c).unlink()

        took, paths = through_sink(sink, staging, files, run_id, 0)
        seconds[f"b: commit, new read model ({'/'.join(sorted(paths))})"] = took

        newer = write_files(folder, n, 10 * n, run_id)  # the same keys, later events
        took, paths = through_sink(sink, staging, newer, run_id, len(files))
        seconds[f"c: commit, every key updated ({'/'.join(sorted(paths))})"] = took
        with psycopg.connect(url) as conn:
            got = conn.execute(f"SELECT count(*), min(_rewind_source_offset) FROM {staging.table}").fetchone()
        assert got == (n, 10 * n), got
        sink.close()
    finally:
        shutil.rmtree(spool, ignore_errors=True)
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    rates = {k: n / v for k, v in seconds.items()}
    base = next(iter(rates.values()))
    print(f"# sink_postgres benchmark, {stamp()}, {machine()}, {n:,} rows x {len(columns)} columns")
    for key, value in rates.items():
        print(f"{key:52s} {value:>12,.0f} rows/s  ({seconds[key]:.1f} s)  x{value / base:.2f}")
    print(json.dumps({"rows": n, "rows_per_s": {k: round(v) for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
