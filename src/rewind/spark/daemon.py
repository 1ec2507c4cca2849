"""The Python daemon of a local Spark session: PySpark's own, started with Rewind's task modules
already imported (``spark.python.daemon.module``, set by :mod:`rewind.spark.session`).

Spark forks every Python worker from this daemon. PySpark's daemon imports only PySpark, so each
worker imported pandas, pyarrow, confluent-kafka, the spec models and Rewind's task code again on
its first task: ~2-4 s of CPU per worker (measured here, 2 cores under load), paid by every run's
first wave and again by every worker Spark starts later (an idle worker is stopped after a
minute). Imported once here, the forked workers share them, copy on write.
"""

from __future__ import annotations

import importlib

PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.parquet",
    "confluent_kafka",
    "pyspark.sql.pandas.serializers",
    "rewind.spec",
    "rewind.translate.process",
    "rewind.translate.factory",
    "rewind.spark.job_stage",
    "rewind.spark.pace_server",
    "rewind.spark.progress_channel",
)
"""Modules every Rewind task imports (the layers above :mod:`rewind.spark` import little more)."""


def preload() -> None:
    """Import :data:`PRELOAD`, best effort: a module that fails here fails in the task, as before."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # the task reports it with its own traceback
            continue


if __name__ == "__main__":  # `python -m rewind.spark.daemon pyspark.worker`, run by Spark
    import sys

    # Spark starts one daemon per worker module: only the tasks' (pyspark.worker) gains from the
    # preload; a data source's planning workers (pyspark.sql.worker.*) import what they need
    if sys.argv[1:2] in ([], ["pyspark.worker"]):
        preload()  # nothing on stdout: the daemon tells the JVM its port there
    from pyspark.daemon import manager

    manager()
