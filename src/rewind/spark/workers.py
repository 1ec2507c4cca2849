"""Start a session's Python workers in the background, while the driver still prepares a run.

A session's first Python task waits for Spark to start the Python daemon and fork a worker per
core, and for the worker's imports: 5-15 s of a run's first wave here (2 cores; measured as a
trivial ``mapInArrow`` job, 15 s under load 11 on a fresh session, ~1 s on the next ones). A run
asks for them as soon as it holds its lease (:func:`rewind.spark.session`), so they start
while the driver prepares staging; the first wave's tasks then find them running (a wave
submitted meanwhile waits for the task slots, as it would have waited for the workers).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_lock = threading.Lock()


def start_workers(spark: SparkSession) -> None:
    """Once per SparkContext: one trivial task per core, in a daemon thread (never waited for;
    a failure, a cancelled job or a stopped session only costs the head start)."""
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: the server's workers are not ours to start
        return
    with _lock:
        if getattr(context, "_rewind_workers_started", False):
            return
        context._rewind_workers_started = True  # type: ignore[attr-defined]
    tasks = max(1, int(context.defaultParallelism))

    def run() -> None:
        try:
            spark.range(0, tasks, 1, tasks).mapInArrow(_ready, "ready int").collect()
        except Exception as exc:  # a head start only
            log.debug("starting the Python workers in the background failed: %s", exc)

    threading.Thread(target=run, name="rewind-start-workers", daemon=True).start()


def _ready(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A worker's task: import what Rewind's tasks import (already done by a local session's
    daemon, :mod:`rewind.spark.daemon`; a cluster's workers do it here)."""
    import pyarrow as pa

    from rewind.spark.daemon import preload

    with contextlib.suppress(Exception):
        preload()
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"ready": 1}], schema=pa.schema([("ready", pa.int32())]))
