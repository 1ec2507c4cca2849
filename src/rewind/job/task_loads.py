"""A Kafka-source run whose tasks load their units into the sink (PostgreSQL): the driver's part.

With a loader (:mod:`rewind.sinks.sql.task_load`), the order of a wave becomes: each task
loads each of its Kafka units with its ids and counts in one transaction; then the driver
checks the conservation law, commits the quarantine files, records the units no task loaded
(units without records, archive units) through the sink's own commit, and marks the ledger.
The driver handles only metadata.

A driver killed after a task's load and before the quarantine commit loses nothing: the
reconcile marks the unit done from the sink, and :func:`reconcile_quarantine` commits the
quarantine files its unit row names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.core.counts import QUARANTINE_FILES_KEY as QUARANTINE_FILES
from rewind.sinks.sql.sink import SqlSink, SqlStaging
from rewind.sinks.sql.task_load import task_loader

if TYPE_CHECKING:
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink


def loader_for(sink: StagingSink[Any], staging: Staging, plan: JobPlan) -> Any:
    """The tasks' unit loader for this sink, or None when the driver commits."""
    if not isinstance(sink, SqlSink) or not isinstance(staging, SqlStaging):
        return None

    return task_loader(sink, staging, plan.output_schema())


def reconcile_quarantine(
    ledger: Ledger,
    run_id: str,
    sink: StagingSink[Any],
    staging: Staging,
    run: Any,
) -> None:
    """Commit the quarantine files of task-loaded units whose quarantine commit did not happen
    (``run``: the runner's context, its quarantine table and the units committed to it)."""
    if not isinstance(sink, SqlSink):
        return
    missing = {
        uid: list(counts[QUARANTINE_FILES])
        for uid, counts in sink.committed_counts(staging, run_id).items()  # type: ignore[arg-type]
        if counts.get(QUARANTINE_FILES) and uid not in run.done_q
    }
    if not missing:
        return
    units = sorted(missing)
    qsink, qstaging = run.quarantine()
    done_q: set[str] = run.done_q
    qsink.commit(qstaging, run_id, units, [f for u in units for f in missing[u]])
    done_q.update(units)
    ledger.audit(run_id, "reconcile-quarantine", {"units": units})
