"""A run's last step for read models: fold the run's rows per key, keep the repaired window.

Runs after every unit is committed and before the run is declared succeeded, only when the
spec asks for it (``translate.fold``, or ``replace-window`` keyed by a column of the output,
whose values may fall outside the window). The Spark part is
:mod:`rewind.spark.fold_stage`; this module decides whether it is needed, where the partial
rows wait, and commits the folded rows exactly once:

* **Iceberg**: the units' partial rows are committed to the staging branch like any run's
  rows; the folded files then replace them in ONE Iceberg transaction on the staging ref
  (delete the run's rows, add the folded files), marked ``rewind.finalized=<run>``.
* **PostgreSQL/SQLite** (upsert), and a shadow's Iceberg v2 (upserted on the key): one row
  per key, so partial rows cannot wait in staging. The units commit them to a scratch Iceberg
  table of the run (:func:`parts_sink`, ``rewind.<table>_parts__rewind_<run>``, with the usual per-unit
  bookkeeping); the folded rows are then committed to staging as one more unit,
  :data:`FOLD_UNIT`, in the sink's own transaction with its counts (a shadow's v2 names the
  history's units in that commit too: its cut line is proven from the ranges v2 holds).

Either way a run killed before the final commit folds again on resume (orphan files are never
referenced) and a run killed after it finds the commit and skips the step.
"""

from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.catalog import load_catalog
from rewind.core.arrow import schema_to_b64
from rewind.core.columns import RUN_ID, SOURCE_TIMESTAMP
from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.job.snapshot import read_sql_state
from rewind.sinks.iceberg import (
    FINALIZED_PROPERTY,
    FOLD_COUNTS_PROPERTY,
    RUN_PROPERTY,
    UNITS_PROPERTY,
    IcebergSink,
    IcebergStaging,
    read_iceberg,
)
from rewind.spark import session
from rewind.spark.fold_stage import FoldContext, run_fold
from rewind.spark.session import default_parallelism
from rewind.spark.snapshot_rows import with_state_rows

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink
    from rewind.spark.fold_stage import FoldCounts
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

FOLD_UNIT = "fold"
"""The unit id under which a PostgreSQL sink records the folded rows of a run."""
PARTS_NAMESPACE = "rewind"
FOLD_TASK_ROWS = 1_000_000
"""Partial rows one fold task is sized for (each record read gives about one partial row)."""


def needs_finalize(spec: JobSpec) -> bool:
    """A fold is asked for, or a replace-window whose rows may fall outside the replaced window:
    keyed by an output column, or narrower than the source window (``window_from``/``window_to``)."""
    ice = spec.sink.iceberg
    user_window = (
        ice is not None
        and ice.mode == "replace-window"
        and (
            ice.window_column != SOURCE_TIMESTAMP or ice.window_from is not None or ice.window_to is not None
        )
    )
    return spec.translate.fold is not None or user_window


def parts_in_scratch(spec: JobSpec) -> bool:
    """The partial rows of a fold (or the rows a merge decides on) wait in a scratch Iceberg
    table, for sinks that keep one row per key: PostgreSQL/SQLite, and a shadow's Iceberg v2
    (upserted on the key)."""
    one_row_per_key = spec.sink.iceberg is None or spec.shadow is not None
    return (spec.translate.fold is not None or spec.merge is not None) and one_row_per_key


def parts_sink(settings: Settings, spec: JobSpec) -> IcebergSink:
    """The scratch Iceberg table of a fold's partial rows (its staging table is per run)."""
    target = spec.sink.postgres or spec.sink.iceberg
    assert target is not None
    name = re.sub(r"[^A-Za-z0-9_]", "_", target.table)
    return IcebergSink(load_catalog(settings), f"{PARTS_NAMESPACE}.{name}_parts")


def _iceberg_finalized(sink: IcebergSink, staging: IcebergStaging, run_id: str) -> dict[str, Any] | None:
    """The fold counts recorded by this run's finalize commit on the branch, if it happened."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.table.snapshots import ancestors_of

    table = sink.catalog.load_table(staging.table)
    head = table.snapshot_by_name(staging.ref)
    for snap in ancestors_of(head, table.metadata) if head is not None else []:
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(FINALIZED_PROPERTY) == run_id:
            counts: dict[str, Any] = json.loads(props.get(FOLD_COUNTS_PROPERTY, "{}"))
            return counts
    return None


def finalize_run(
    settings: Settings,
    ledger: Ledger,
    plan: JobPlan,
    sink: StagingSink[Any],
    staging: Staging,
    run_id: str,
    parts: tuple[IcebergSink, IcebergStaging] | None = None,
) -> dict[str, Any]:
    """Fold and trim the run's rows, once; returns the counts (rows in, out, outside the window).

    ``parts``: the scratch table holding the partial rows when the sink is not Iceberg.
    """
    if parts is None:
        assert isinstance(sink, IcebergSink) and isinstance(staging, IcebergStaging)
        done = _iceberg_finalized(sink, staging, run_id)
    else:
        done = sink.committed_counts(staging, run_id).get(FOLD_UNIT)
    if done is not None:
        # killed between the commit and its audit entry: the entry is written now, once
        if not any(a.action == "finalized" for a in ledger.audit_log(run_id)):
            ledger.audit(run_id, "finalized", done)
        return done
    source_sink, source_staging = parts or (sink, staging)
    assert isinstance(source_sink, IcebergSink) and isinstance(source_staging, IcebergStaging)
    files, counts = _fold(settings, plan, source_sink, source_staging, sink.data_folder(staging), run_id)
    faults.point("before-fold-commit")
    if parts is None:
        _commit_iceberg(source_sink, source_staging, run_id, files, counts)
    else:
        extra = {UNIT_COUNTS_KEY: json.dumps({FOLD_UNIT: counts.to_dict()}, sort_keys=True)}
        sink.commit(staging, run_id, [FOLD_UNIT, *_folded_units(plan)], files, extra=extra)
    faults.point("after-fold-commit")
    ledger.audit(run_id, "finalized", counts.to_dict())
    log.info("run %s: folded %s", run_id, counts.to_dict())
    return counts.to_dict()


def _folded_units(plan: JobPlan) -> list[str]:
    """A shadow's v2 records the history's ranges with the folded rows, in the same commit: they
    are what its cut line proves (every offset below it in v2, once), and its tail continues them."""
    return sorted(u.id for u in plan.units) if plan.job_spec().shadow is not None else []


def _fold(
    settings: Settings,
    plan: JobPlan,
    sink: IcebergSink,
    staging: IcebergStaging,
    data_folder: str,
    run_id: str,
) -> tuple[list[str], FoldCounts]:
    """The Spark stage over the run's rows in ``staging``; the files written and the counts."""
    spec = plan.job_spec()
    spark = session(settings)
    column = spec.sink.window_column
    ctx = FoldContext(
        run_id=run_id,
        key=tuple(spec.key),
        fold=spec.translate.fold,
        schema_b64=schema_to_b64(plan.output_schema()),
        data_folder=data_folder,
        window_column=column,
        window=spec.replaced_window() if column else None,
    )
    rows = read_iceberg(spark, sink.catalog.load_table(staging.table), staging.ref)
    state = plan.read_plan.get("snapshot")
    if state is not None:  # source.kafka.snapshot: the state's rows are folded with the new ones
        if state.get("sql") is not None:  # a SQL table's state, through the driver
            state_rows = spark.createDataFrame(read_sql_state(state))
        else:
            state_rows = read_iceberg(spark, sink.catalog.load_table(state["table"]), state["ref"])
        rows = with_state_rows(rows, state_rows, run_id, state["table"])
    # a task holds all rows of its keys in memory: at most ~FOLD_TASK_ROWS partial rows each
    tasks = max(default_parallelism(spark), -(-plan.offsets // FOLD_TASK_ROWS))
    return run_fold(rows, ctx, tasks)


def _commit_iceberg(
    sink: IcebergSink, staging: IcebergStaging, run_id: str, files: list[str], counts: FoldCounts
) -> None:
    """Replace the run's partial rows on the staging ref by the folded files, in one transaction."""
    props = {
        RUN_PROPERTY: run_id,
        UNITS_PROPERTY: "",
        FINALIZED_PROPERTY: run_id,
        FOLD_COUNTS_PROPERTY: json.dumps(counts.to_dict(), sort_keys=True),
    }
    branch = staging.branch or "main"
    table = sink.catalog.load_table(staging.table)
    with table.transaction() as tx:
        tx.delete(f"{RUN_ID} == '{run_id}'", snapshot_properties=props, branch=branch)
        if files:
            tx.add_files(files, snapshot_properties=props, branch=branch)
