"""A class-data-sharing archive of Spark's classes, so that a cold Spark session starts sooner.

Every CLI command that uses Spark starts a new JVM, which loads, parses and verifies some 10,000
of Spark's classes from its jars before its first job can finish. A dynamic CDS archive
(``-XX:ArchiveClassesAtExit``, Java 13+) holds them already parsed and verified; a JVM started
with ``-XX:SharedArchiveFile`` maps it instead. Measured on a 2-core machine: a session's start
and its first job (Parquet, a join, an aggregate) 8.7 s against 12.1 s without it.

:func:`build` makes the archive once, at install (``make install``, which calls :func:`main`:
about a minute, most of it the JVM writing the archive), from a JVM that runs a small job of
the kinds Rewind runs; it lives in the virtualenv, beside the jars it was made from.
:func:`java_options` gives a local session's driver the option, only when the archive is whole
and was made by the same Java:

* a JVM maps the file, and one cut short (a full disk, a copy interrupted) crashes it with
  SIGBUS, so the archive is written under another name, tried, and renamed; its size and the
  Java that made it are recorded beside it and checked before each use;
* a JVM that cannot use an archive made for other jars or another JVM build says so and goes
  on without it; ``-Xlog:cds=off`` keeps that note off the terminal.

``REWIND_CLASS_ARCHIVE=off`` starts sessions without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FOLDER = Path(sys.prefix) / "share" / "rewind"
"""Where the archive lives: the virtualenv's, with the PySpark (and jars) it was made from."""
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
BUILDER = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The options of the JVMs that make and try the archive: what a JVM maps is the classes it
loaded, not what its JIT compiled, so the C2 compiler's threads and the parallel collector are
spared (measured on a 2-core machine: the build 35 s instead of 40 s, 39 s of CPU instead of 54,
and a cold run's JVM as fast with either archive)."""


def archive_path() -> Path:
    # lazy: avoids pyspark at import (its version is all this needs)
    from pyspark.version import __version__

    return FOLDER / f"spark-{__version__}-classes.jsa"


def java_options() -> str:
    """The driver's JVM options that map the archive, or "" when there is none to trust."""
    # lazy: the Java check starts a JVM once per process, and only sessions need it
    from rewind.javacheck import java_version

    if os.environ.get("REWIND_CLASS_ARCHIVE") == "off":  # to measure, or to rule it out
        return ""
    path = archive_path()
    try:
        made = json.loads(path.with_suffix(".json").read_text())
        whole = path.stat().st_size == made["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    if not whole or made.get("java") != java_version()[1]:
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


_TRAINING = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession, functions as F
from rewind.spark.session import register
options, data, mode = sys.argv[1:4]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         .config("spark.driver.extraJavaOptions", options).getOrCreate())
if mode == "train":
    register(spark)
    def same(batches):
        yield from batches
    rows = spark.range(0, 200_000).select(
        (F.col("id") % 5000).alias("k"), F.col("id").cast("string").alias("v"),
        F.current_timestamp().alias("t"))
    rows.mapInArrow(same, rows.schema).write.mode("overwrite").parquet(data)
    a = spark.read.parquet(data)
    b = spark.read.parquet(data).select(F.col("k").alias("j"), F.col("v").alias("w"))
    joined = a.join(b, a["k"].eqNullSafe(b["j"]), "full_outer").where(F.col("v") != F.col("w"))
    joined.groupBy(F.pmod(F.hash("k"), F.lit(8))).agg(F.count(F.lit(1)), F.max("t")).collect()
    a.repartition(4, "k").sortWithinPartitions("k").toPandas()
    spark.sql("select k, count(*) over (partition by k) from parquet.`" + data + "`").collect()
else:
    spark.range(0, 1000).groupBy((F.col("id") % 7).alias("m")).count().collect()
jvm = SparkContext._gateway.proc
spark.stop()
jvm.stdin.close()  # the JVM exits when its stdin closes, writing the archive first: wait for it
jvm.wait(timeout=300)
"""


def build() -> Path:
    """Make the archive (~170 MB): a training JVM dumps the classes it loaded at exit; a JVM
    that must map it (``-Xshare:on``) tries it; then it is put in place."""
    # lazy: the Java check starts a JVM
    from rewind.javacheck import require_java

    _major, java = require_java()
    path = archive_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rewind-cds-") as tmp:
        made = Path(tmp) / path.name
        data = str(Path(tmp) / "rows")
        _spark_python(f"-XX:ArchiveClassesAtExit={made} {BUILDER} {QUIET}", data, "train")
        if not made.is_file():
            raise RuntimeError("the training JVM wrote no class archive")
        # a JVM that must map it, and checks every region it maps (a cut file fails here)
        _spark_python(
            f"-XX:SharedArchiveFile={made} -Xshare:on -XX:+VerifySharedSpaces {BUILDER} {QUIET}", data, "try"
        )
        for old in path.parent.glob("spark-*-classes.*"):  # another PySpark's, or a cut copy
            old.unlink()
        partial = path.with_name(path.name + ".partial")
        _copy(made, partial)
        os.replace(partial, path)
    path.with_suffix(".json").write_text(json.dumps({"size": path.stat().st_size, "java": java}))
    return path


def _spark_python(*args: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = subprocess.run(
        [sys.executable, "-c", _TRAINING, *args], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"the class archive's training job failed: {' | '.join(tail)}")


def _copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as r, open(dst, "wb") as w:
        while chunk := r.read(1 << 24):
            w.write(chunk)
        w.flush()
        os.fsync(w.fileno())


def main() -> None:
    """``make install``'s step: a failure costs only the speed-up, never the install."""
    try:
        print(f"Spark's class archive: {build()}")
    except Exception as exc:  # any failure: sessions start without it, as before
        print(f"Spark's class archive not made ({exc}); Spark sessions start without it", file=sys.stderr)
