"""OpenLineage run events of Rewind's commands (docs/lineage.md).

Off unless the user configured an OpenLineage transport the standard way (``OPENLINEAGE_URL``,
``OPENLINEAGE__TRANSPORT__*`` variables, ``OPENLINEAGE_CONFIG`` or an ``openlineage.yml``);
then each command (plan, run, verify, promote, rollback, archive pass, shadow, re-produce,
compensate, reconsume) emits START, COMPLETE or FAIL/ABORT, and a run RUNNING per wave,
through the ``openlineage-python`` client. Nothing here ever fails a command: an event that
cannot be sent is logged and dropped.

The client is imported only when a transport is configured, so commands without lineage pay
nothing for it. Datasets are named by :mod:`.datasets` (OpenLineage's naming rules), facets
built by :mod:`.facets`, and :class:`.runs.LineageRun` is the one object the commands hold.
"""

from __future__ import annotations

from rewind.openlineage.datasets import Dataset, iceberg, kafka, spec_datasets, sql
from rewind.openlineage.emitter import Emitter, configured, get_emitter
from rewind.openlineage.runs import LineageRun, as_parent, track

__all__ = [
    "Dataset",
    "Emitter",
    "LineageRun",
    "as_parent",
    "configured",
    "get_emitter",
    "iceberg",
    "kafka",
    "spec_datasets",
    "sql",
    "track",
]
