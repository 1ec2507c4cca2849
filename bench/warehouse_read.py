"""Benchmark: warehouse Parquet files read by Spark's JVM reader vs by pyarrow in the Python tasks.

An ``s3://`` warehouse cannot be read by the JVM here (no hadoop-aws), so
:func:`rewind.spark.parquet_files.read_parquet_files` reads such files in the Python tasks
(``mapInArrow`` over the file list). This measures what that path costs on local files, where
both paths work, to decide whether it should be the only one: same session, same files
(archive-shaped rows: key, value of ``--value-bytes``, topic, partition, offset, timestamp),
each figure the median of ``--repeat`` runs of ``count(*)`` and ``sum(length(value))``:

  (j) Spark's own Parquet reader (the path local warehouses keep);
  (p) pyarrow in the Python tasks (the object-store path), on the same local files;
  (s) optional (``--s3``): (p) against moto's S3 server on loopback (moto is a test double
      written in Python, so this shows the path works, not what S3 costs).

Usage: ``make bench-warehouse``, or
``python bench/warehouse_read.py [--rows 2000000] [--files 16] [--repeat 3] [--s3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import machine, stamp  # noqa: E402


def write_files(folder_uri: str, rows: int, files: int, value_bytes: int, store: Any = None) -> list[str]:
    import pyarrow as pa

    from rewind.core.parquet import write_parquet

    per = rows // files
    out = []
    for f in range(files):
        start = f * per
        offsets = pa.array(range(start, start + per), pa.int64())
        value = b"x" * value_bytes
        table = pa.table(
            {
                "key": pa.array([str(i).encode() for i in range(start, start + per)], pa.binary()),
                "value": pa.array([value] * per, pa.binary()),
                "topic": pa.array(["orders"] * per),
                "partition": pa.array([f % 4] * per, pa.int32()),
                "offset": offsets,
                "timestamp": pa.array(range(start, start + per), pa.timestamp("us", tz="UTC")),
            }
        )
        out.append(write_parquet(folder_uri, table, "bench", store))
    return out


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3", action="store_true")
    args = parser.parse_args()

    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from rewind.config import load_settings
    from rewind.spark.parquet_files import read_parquet_files
    from rewind.spark.session import session

    tmp = Path(tempfile.mkdtemp(prefix="rewind-bench-wh-"))
    paths = write_files(tmp.as_uri(), args.rows, args.files, args.value_bytes)
    spark = session(load_settings(env={"REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp))
    schema = StructType.fromDDL(
        "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp"
    )
    assert isinstance(schema, StructType)

    def run(python: bool, files: list[str], store: Any = None) -> Any:
        df = read_parquet_files(spark, files, schema, python=python, store=store)
        return df.agg(F.count(F.lit(1)), F.sum(F.length("value"))).collect()[0]

    run(False, paths)  # warm both paths (JVM classes, Python workers)
    run(True, paths)
    load = os.getloadavg()
    jvm_s, jvm = timed(lambda: run(False, paths), args.repeat)
    py_s, py = timed(lambda: run(True, paths), args.repeat)
    load_after = os.getloadavg()
    assert tuple(jvm) == tuple(py), (jvm, py)
    rate = args.rows / 1e6
    print(f"# warehouse read: {args.rows:,} rows in {args.files} files, {stamp()}, {machine()}")
    print(f"# load average before {load[0]:.1f}, after {load_after[0]:.1f}")
    print(f"(j) Spark JVM reader        {jvm_s:7.2f} s   {rate / jvm_s:6.2f} M rows/s")
    print(
        f"(p) pyarrow in Python tasks {py_s:7.2f} s   {rate / py_s:6.2f} M rows/s   p/j = {py_s / jvm_s:.2f}"
    )
    if args.s3:
        import socket

        import pyarrow.fs as pafs
        from moto.server import ThreadedMotoServer

        from rewind.core.store import WarehouseStore

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            endpoint = f"http://127.0.0.1:{port}"
            props = {
                "s3.endpoint": endpoint,
                "s3.access-key-id": "k",
                "s3.secret-access-key": "s",
                "s3.region": "us-east-1",
            }
            pafs.S3FileSystem(
                endpoint_override=endpoint,
                access_key="k",
                secret_key="s",
                region="us-east-1",
                allow_bucket_creation=True,
            ).create_dir("bench")
            store = WarehouseStore.from_catalog_properties(props)
            s3_paths = write_files("s3://bench/wh", args.rows, args.files, args.value_bytes, store)
            s3_s, s3 = timed(lambda: run(True, s3_paths, store), args.repeat)
            assert tuple(s3) == tuple(jvm)
            ratio = s3_s / jvm_s
            print(f"(s) pyarrow from moto S3 {s3_s:7.2f} s {rate / s3_s:6.2f} M rows/s  s/j = {ratio:.2f}")
        finally:
            server.stop()
    spark.stop()


if __name__ == "__main__":
    main()
