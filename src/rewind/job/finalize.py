"""A run's last step for read models: fold the staged rows per key, keep the replaced window.

Runs after every unit is committed and before the run is declared succeeded, only when the
spec asks for it (``translate.fold``, or ``replace-window`` keyed by a column of the output,
whose values may fall outside the window). The Spark part is
:mod:`rewind.spark.fold_stage`; this module decides whether it is needed and commits.

Exactly once: the folded files replace the run's partial rows in ONE Iceberg transaction on
the staging ref (delete the run's rows, add the folded files), and that commit carries
``rewind.finalized=<run>``. A run killed before the commit folds again on resume (its orphan
files are never referenced); a run killed after it finds the marker and skips the step.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rewind.job import faults
from rewind.translate.columns import RUN_ID, SOURCE_TIMESTAMP

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.sinks.iceberg import IcebergSink, IcebergStaging
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

FINALIZED_PROPERTY = "rewind.finalized"
FOLD_COUNTS_PROPERTY = "rewind.fold-counts"


def needs_finalize(spec: JobSpec) -> bool:
    """A fold is asked for, or a replace-window keyed by an output column (rows may fall outside)."""
    ice = spec.sink.iceberg
    if ice is None:
        return False
    user_window = ice.mode == "replace-window" and ice.window_column != SOURCE_TIMESTAMP
    return spec.translate.fold is not None or user_window


def replaced_window(spec: JobSpec) -> tuple[datetime, datetime] | None:
    """The window a replace-window run replaces: ``window_from``/``window_to``, else the source's."""
    window = spec.source.window
    lo, hi = window.from_, window.to
    ice = spec.sink.iceberg
    if ice is not None:
        lo = ice.window_from or lo
        hi = ice.window_to or hi
    if isinstance(lo, datetime) and isinstance(hi, datetime):
        return lo, hi
    return None


def _finalized(sink: IcebergSink, staging: IcebergStaging, run_id: str) -> dict[str, Any] | None:
    """The fold counts recorded by this run's finalize commit, if it happened."""
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
    sink: IcebergSink,
    staging: IcebergStaging,
    run_id: str,
) -> dict[str, Any]:
    """Fold and trim the run's rows on staging, once; returns the counts (rows in, out, outside)."""
    from rewind.sinks.iceberg import RUN_PROPERTY, UNITS_PROPERTY, read_iceberg
    from rewind.spark import session
    from rewind.spark.fold_stage import FoldContext, run_fold
    from rewind.spark.job_stage import schema_to_b64

    done = _finalized(sink, staging, run_id)
    if done is not None:
        return done
    spec = plan.job_spec()
    ice = spec.sink.iceberg
    assert ice is not None
    spark = session(settings)
    table = sink.catalog.load_table(staging.table)
    ctx = FoldContext(
        run_id=run_id,
        key=tuple(spec.key),
        fold=spec.translate.fold,
        schema_b64=schema_to_b64(plan.output_schema()),
        data_folder=sink.data_folder(staging),
        window_column=ice.window_column if ice.mode == "replace-window" else None,
        window=replaced_window(spec) if ice.mode == "replace-window" else None,
    )
    rows = read_iceberg(spark, table, staging.ref)
    files, counts = run_fold(rows, ctx, spark.sparkContext.defaultParallelism)
    faults.point("before-fold-commit")
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
    faults.point("after-fold-commit")
    ledger.audit(run_id, "finalized", counts.to_dict())
    log.info("run %s: folded %s", run_id, counts.to_dict())
    return counts.to_dict()
