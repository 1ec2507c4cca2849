"""Where history comes from: the Kafka log, the lake archive, or both.

* :func:`archive_once` / :func:`start_continuous` (``rewind archive``) copy topics into an
  Iceberg archive with a fixed schema, exactly once (:mod:`rewind.history.archive`,
  :mod:`rewind.history.schema`); :func:`compact_archive` rewrites its small files.
* :func:`plan_history` plans a window over both sources, with a seam and a coverage check
  (:mod:`rewind.history.plan`); :func:`read_history` and :func:`read_ranges_from_archive`
  read it with Spark (:mod:`rewind.history.read`); :func:`iter_history` yields it in bounded
  chunks without Spark (:mod:`rewind.history.iterate`); :func:`query_history` runs SQL over it.

Names are imported lazily: ``import rewind.history`` pulls in neither pyarrow nor pyspark.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ArchivePass": "rewind.history.archive_pass",
    "PassResult": "rewind.history.archive_pass",
    "ContinuousArchive": "rewind.history.archive",
    "archive_once": "rewind.history.archive",
    "start_continuous": "rewind.history.archive",
    "compact_archive": "rewind.history.compact",
    "CompactionResult": "rewind.history.compact",
    "Gap": "rewind.history.plan",
    "HistoryPlan": "rewind.history.plan",
    "HistoryUnit": "rewind.history.plan",
    "PartitionHistory": "rewind.history.plan",
    "plan_history": "rewind.history.plan",
    "read_history": "rewind.history.read",
    "read_ranges_from_archive": "rewind.history.read",
    "read_kafka_ranges": "rewind.history.read",
    "iter_history": "rewind.history.iterate",
    "iter_plan": "rewind.history.iterate",
    "query_history": "rewind.history.query",
    "window_from_bounds": "rewind.history.query",
    "ArchiveState": "rewind.history.schema",
    "archive_state": "rewind.history.schema",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rewind.history' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
