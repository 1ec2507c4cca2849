"""The Iceberg merge step: read little, decide only the contested rows, rewrite only losing files.

After every unit of a run is committed to the staging branch, the run's rows and live's may
share keys; :func:`merge_iceberg` resolves that in ONE transaction on the branch. Its cost is
what a merge adds to a plain append (``bench/merge_policy.py``), so it reads in stages:

1. **Plan** the branch's data files with their column bounds (manifests only).
2. **Keys**: the files that may hold the run's rows (their ``_rewind_run_id`` bounds admit the
   run id) are read, key columns and run id only; a file the run's own unit commits added (or
   whose bounds are exactly the run id, no nulls) is the run's without reading that column. The
   other files are read, key columns only, when their key bounds overlap the run's key range;
   a file whose keys cannot meet the run's is never opened.
3. **Contested** rows (:func:`rewind.core.merge_keys.contested`): the run writes the key twice
   or live holds it. None: every run row is applied where it already is, and the commit only
   marks the merge.
4. **Decide** those rows: their lineage (all their columns when ambiguous rows are routed,
   since the quarantine keeps them whole) is read from the files that hold them only, with the
   live rows of their keys, and :func:`rewind.core.merge.decide` decides. In the driver up to
   ``spark_rows`` contested rows (run's and live's together); above, in Spark
   (:mod:`rewind.spark.merge_stage`: tasks read the contested rows, group them by key and
   decide; the driver collects only the indices of the rows to delete and of the routed rows).
5. **Commit**: delete the run's rows that were not applied and the live rows of replaced keys
   by rewriting only the files that lose rows (:func:`rewind.sinks.iceberg.rewrite.rewrite`),
   and mark the snapshot (``rewind.merged=<run>``, the decision counts).

What the driver holds (docs/merge-policies.md, "What the merge reads"): the key columns of the
run's rows and of the live rows in files whose key bounds meet the run's, with a file index and
a position each, always; below the threshold also the contested rows and the files that will
most likely lose rows, whole; above it neither (the rewrite then reads each losing file alone).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.arrow import schema_to_b64
from rewind.core.columns import (
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from rewind.core.counts import MERGE_DECISIONS
from rewind.core.merge import MergePolicy, MergeResult, decide, key_array
from rewind.core.merge_keys import key_codes, key_range, repeated
from rewind.core.store import WarehouseStore
from rewind.sinks.iceberg import RUN_PROPERTY, UNITS_PROPERTY, IcebergSinkError
from rewind.sinks.iceberg.rewrite import rewrite
from rewind.spark import merge_stage
from rewind.spark.merge_stage import FileRows, MergeContext
from rewind.spark.session import default_parallelism

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyiceberg.table import FileScanTask, Table
    from pyspark.sql import SparkSession

    from rewind.sinks.iceberg import IcebergSink, IcebergStaging

MERGED_PROPERTY = "rewind.merged"
"""Snapshot summary key of the Iceberg merge commit: the run id."""
MERGE_COUNTS_PROPERTY = "rewind.merge-counts"
ORDERING = [SOURCE_TIMESTAMP, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET]
"""The lineage the decisions order rows by (event ids are long unique strings: not read)."""
SPARK_ROWS = 2_000_000
"""Contested rows (the run's and live's) above which the decisions run in Spark: the default
of the ``merge.spark_rows`` setting. ``bench/merge_spark.py`` (bench/RESULTS.md): on 2 cores
Spark was never faster (4-15x slower, +9 s per million rows), while deciding in the driver held
~100 bytes more per contested row (narrow rows; all columns with ``ambiguous: route``): the
driver decides up to where that stays a few hundred MB."""


@dataclass
class _Keys:
    """The key columns of the files read in step 2, row by row."""

    keys: pa.Table
    file: np.ndarray
    """Index into the task list of each row's file."""
    position: np.ndarray
    """Each row's position in its file."""
    mine: np.ndarray
    """The run's rows."""


def merge_iceberg(
    sink: IcebergSink,
    staging: IcebergStaging,
    run_id: str,
    key: list[str],
    policy: MergePolicy,
    route: Callable[[MergeResult], None] = lambda _: None,
    spark: Callable[[], SparkSession] | None = None,
    spark_rows: int = SPARK_ROWS,
) -> MergeResult:
    """Steps 1-5 of the module docstring. The result's ``counts`` cover every row of the run;
    its ``applied`` holds the applied rows among the contested only (the others stay in the
    files the units wrote), ``routed`` the routed rows whole. ``spark`` gives the session that
    decides more than ``spark_rows`` contested rows (without it the driver decides them all);
    decided there, ``applied`` and ``replaced`` are left empty (the decisions are in the files)."""
    # lazy: avoids numpy at import
    import numpy as np

    table = sink.catalog.load_table(staging.table)
    tasks = _plan(table, staging.ref)
    found = _read_keys(table, staging.ref, tasks, run_id, key)
    n_run = int(found.mine.sum())
    run_at, live_at = np.flatnonzero(found.mine), np.flatnonzero(~found.mine)
    codes, _ = key_codes(key_array(found.keys, key), None)
    twice = repeated(codes[run_at])
    hard = twice | np.isin(codes[run_at], codes[live_at])  # contested, as in core.merge_keys
    if not hard.any():
        result = _all_applied(found.keys, n_run)
        route(result)
        faults.point("before-merge-commit")
        _commit(table, staging, run_id, tasks, {}, result.counts)
        return result
    hard_at = run_at[hard]
    theirs_at = live_at[np.isin(codes[live_at], codes[hard_at])]
    columns = None if policy.ambiguous == "route" else [*key, *ORDERING]
    if spark is not None and len(hard_at) + len(theirs_at) > spark_rows:
        return _merge_in_spark(
            spark(), table, staging, run_id, tasks, found, (hard_at, theirs_at), key, policy, columns, route
        )
    # files that will most likely lose rows (the run's holding a key twice, live's holding a
    # contested key) are read whole once, for the decisions and then for their rewrite
    whole = {int(i) for i in np.unique(np.concatenate([found.file[run_at[twice]], found.file[theirs_at]]))}
    rows, read = _read_rows(table, tasks, found, np.concatenate([hard_at, theirs_at]), columns, whole)
    ours, theirs = rows.slice(0, len(hard_at)), rows.slice(len(hard_at))
    result = decide(ours, theirs, key, policy)
    result.counts["applied"] += n_run - len(hard_at)
    route(result)
    faults.point("before-merge-commit")
    lost = np.ones(len(hard_at), dtype=bool)
    lost[result.applied_positions] = False
    drop = [hard_at[lost]]
    if result.replaced.num_rows:
        live_codes, gone = key_codes(key_array(theirs, key), key_array(result.replaced, key))
        drop.append(theirs_at[np.isin(live_codes, gone)])
    _commit(table, staging, run_id, tasks, _keep_masks(found, np.concatenate(drop)), result.counts, read)
    return result


def _merge_in_spark(
    spark: SparkSession,
    table: Table,
    staging: IcebergStaging,
    run_id: str,
    tasks: Sequence[FileScanTask],
    found: _Keys,
    contested: tuple[np.ndarray, np.ndarray],
    key: list[str],
    policy: MergePolicy,
    columns: list[str] | None,
    route: Callable[[MergeResult], None],
) -> MergeResult:
    """Steps 4 and 5 with the decisions in Spark (:func:`rewind.spark.merge_stage.decide_in_spark`):
    the driver sends each file's contested positions, gets back the rows to delete and the
    routed ones, reads the routed rows whole (the quarantine keeps them) and commits."""
    # lazy: avoids numpy at import
    import numpy as np

    hard_at, theirs_at = contested
    at = np.concatenate([hard_at, theirs_at])
    mine = np.arange(len(at)) < len(hard_at)
    files = []
    for index in np.unique(found.file[at]):
        here = found.file[at] == index
        files.append(
            FileRows(tasks[int(index)].file.file_path, found.position[at[here]], at[here], mine[here])
        )
    schema = table.schema() if columns is None else table.schema().select(*columns)
    store = WarehouseStore.from_catalog_properties(table.io.properties)
    ctx = MergeContext(tuple(key), policy, schema_to_b64(schema.as_arrow()), store)
    folder = f"{table.location().rstrip('/')}/_rewind_merge/{run_id}"
    decided = merge_stage.decide_in_spark(spark, files, ctx, default_parallelism(spark), folder)
    counts = dict.fromkeys(MERGE_DECISIONS, 0)
    for name, n in decided.counts.items():
        counts[name] += n
    counts["applied"] += int(found.mine.sum()) - len(hard_at)
    routed = _read_rows(table, tasks, found, decided.routed, None, set())[0] if len(decided.routed) else None
    none = found.keys.slice(0, 0)
    result = MergeResult(
        none,
        routed if routed is not None else table.schema().as_arrow().empty_table(),
        none,
        counts,
        np.zeros(0, dtype=np.int64),
        decided.routed,
    )
    route(result)
    faults.point("before-merge-commit")
    _commit(table, staging, run_id, tasks, _keep_masks(found, decided.drop), counts)
    return result


def _plan(table: Table, ref: str) -> list[FileScanTask]:
    head = table.snapshot_by_name(ref)
    if head is None:
        return []
    tasks = list(table.scan(snapshot_id=head.snapshot_id).plan_files())
    if any(t.delete_files for t in tasks):
        raise IcebergSinkError(
            f"{table.name()} at {ref} has row-level delete files; a merge rewrites data files only: "
            "compact the table first"
        )
    return tasks


def _bound(table: Table, task: FileScanTask, column: str, upper: bool) -> Any:
    """A file's lower or upper bound of ``column`` as a Python value (None if not recorded)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import PrimitiveType

    field = table.schema().find_field(column)
    found = (task.file.upper_bounds if upper else task.file.lower_bounds) or {}
    raw = found.get(field.field_id)
    if raw is None or not isinstance(field.field_type, PrimitiveType):
        return None
    return from_bytes(field.field_type, raw)


def _run_file(table: Table, task: FileScanTask, run_id: str) -> bool | None:
    """True: only the run's rows; False: none of them; None: read the run id to tell."""
    low, high = _bound(table, task, RUN_ID, False), _bound(table, task, RUN_ID, True)
    if low is None or high is None:
        return None
    if not (low <= run_id and run_id[: len(high)] <= high):
        return False
    nulls = (task.file.null_value_counts or {}).get(table.schema().find_field(RUN_ID).field_id)
    return True if low == high == run_id and nulls == 0 else None


def _unit_files(table: Table, ref: str, run_id: str) -> set[str]:
    """Paths of the files the run's own unit commits added to ``ref``: a unit's files hold only
    rows of the run (a ledger run id is longer than the 16 characters Iceberg keeps as a bound,
    so the bounds alone cannot tell, and reading every row's run id costs). Re-drives, whose
    rows name the re-drive, and the file-less marker commits are not unit commits."""
    ours = set()
    for snap in table.metadata.snapshots:
        props = snap.summary.additional_properties if snap.summary else {}
        units = props.get(UNITS_PROPERTY, "")
        if props.get(RUN_PROPERTY) == run_id and units and not units.startswith("redrive-"):
            ours.add(snap.snapshot_id)
    head = table.snapshot_by_name(ref)
    if not ours or head is None:
        return set()
    found = set()
    for manifest in head.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id in ours:
                found.add(entry.data_file.file_path)
    return found


def _may_meet(table: Table, task: FileScanTask, key: Sequence[str], span: tuple[Any, Any] | None) -> bool:
    """Whether a file's key bounds admit a key in ``span`` (the run's smallest and largest)."""
    if span is None or len(key) != 1:
        return True
    low, high = _bound(table, task, key[0], False), _bound(table, task, key[0], True)
    if low is None or high is None or type(low) is not type(span[0]):
        return True
    return not (high < span[0] or low > span[1])


def _read_keys(table: Table, ref: str, tasks: Sequence[FileScanTask], run_id: str, key: list[str]) -> _Keys:
    """Step 2: the run's files first (key and run id), then live's that may meet its keys."""
    # lazy: avoids pyarrow / numpy at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: list[tuple[int, pa.Table, np.ndarray]] = []
    rest = []
    units = _unit_files(table, ref, run_id)
    for index, task in enumerate(tasks):
        kind = _run_file(table, task, run_id)
        if kind is None and task.file.file_path in units:
            kind = True
        if kind is False:
            rest.append(index)
            continue
        cols = key if kind else [*key, RUN_ID]
        got = _scan(table, [task], cols)
        mine = (
            np.ones(got.num_rows, dtype=bool)
            if kind
            else pc.fill_null(pc.equal(got.column(RUN_ID), run_id), False).to_numpy(zero_copy_only=False)
        )
        parts.append((index, got.select(key), mine))
    if any(p[2].any() for p in parts):  # live rows matter only where the run wrote keys
        span = _span([p[1].column(0).combine_chunks() for p in parts], [p[2] for p in parts], key)
        for index in rest:
            if _may_meet(table, tasks[index], key, span):
                got = _scan(table, [tasks[index]], key)
                parts.append((index, got, np.zeros(got.num_rows, dtype=bool)))
    if not parts:
        empty = table.schema().select(*key).as_arrow().empty_table()
        nothing = np.zeros(0, dtype=np.int64)
        return _Keys(empty, nothing, nothing, nothing.astype(bool))
    return _Keys(
        keys=pa.concat_tables([p[1] for p in parts]),
        file=np.concatenate([np.full(p[1].num_rows, p[0], dtype=np.int64) for p in parts]),
        position=np.concatenate([np.arange(p[1].num_rows, dtype=np.int64) for p in parts]),
        mine=np.concatenate([p[2] for p in parts]),
    )


def _span(keys: list[pa.Array], mine: list[np.ndarray], key: list[str]) -> tuple[Any, Any] | None:
    """The run's smallest and largest key over the files read (None: no pruning by bounds)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if len(key) != 1:
        return None
    pairs = zip(keys, mine, strict=True)
    found = [key_range(k if m.all() else k.filter(pa.array(m))) for k, m in pairs if m.any()]
    if not found or any(f is None for f in found):
        return None
    return min(f[0] for f in found if f), max(f[1] for f in found if f)


def _scan(table: Table, tasks: Sequence[FileScanTask], columns: Sequence[str] | None) -> pa.Table:
    # lazy: avoids pyiceberg at import
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    schema = table.schema() if columns is None else table.schema().select(*columns)
    return ArrowScan(table.metadata, table.io, schema, AlwaysTrue()).to_table(list(tasks))


def _read_rows(
    table: Table,
    tasks: Sequence[FileScanTask],
    found: _Keys,
    at: np.ndarray,
    columns: list[str] | None,
    whole: set[int],
) -> tuple[pa.Table, dict[int, pa.Table]]:
    """The rows ``at`` (indices into ``found``), in that order, read from their files only
    (``columns`` of them, or all), and the files of ``whole`` as read, all their columns."""
    # lazy: avoids pyarrow / numpy at import
    import numpy as np
    import pyarrow as pa

    pieces, order, kept = [], [], {}
    for index in np.unique(found.file[at]):
        here = at[found.file[at] == index]
        if int(index) in whole:
            got = kept[int(index)] = _scan(table, [tasks[int(index)]], None)
            if columns is not None:  # in the table's order, as a projected scan gives them
                got = got.select([c for c in got.column_names if c in columns])
        else:
            got = _scan(table, [tasks[int(index)]], columns)
        pieces.append(got.take(pa.array(found.position[here])))
        order.append(here)
    rows = pa.concat_tables(pieces)
    # back into the order asked for: ``at`` lists the run's rows first, then live's
    where = np.argsort(np.concatenate(order), kind="stable")
    rank = np.empty(len(at), dtype=np.int64)
    rank[np.argsort(at, kind="stable")] = np.arange(len(at))
    return rows.take(pa.array(where[rank])), kept


def _keep_masks(found: _Keys, drop: np.ndarray) -> dict[int, Any]:
    """Task index → keep-mask over the file's rows, for each file that loses a row."""
    # lazy: avoids pyarrow / numpy at import
    import numpy as np
    import pyarrow as pa

    keep: dict[int, Any] = {}
    for index in np.unique(found.file[drop]):
        in_file = found.file == index
        mask = np.ones(int(in_file.sum()), dtype=bool)
        mask[found.position[drop[found.file[drop] == index]]] = False
        keep[int(index)] = pa.array(mask)
    return keep


def _all_applied(keys: pa.Table, n_run: int) -> MergeResult:
    # lazy: avoids numpy at import
    import numpy as np

    counts = dict.fromkeys(MERGE_DECISIONS, 0)
    counts["applied"] = n_run
    none = keys.slice(0, 0)
    at = np.zeros(0, dtype=np.int64)
    return MergeResult(none, none, none, counts, at, at)


def _commit(
    table: Table,
    staging: IcebergStaging,
    run_id: str,
    tasks: Sequence[FileScanTask],
    keep: dict[int, Any],
    counts: dict[str, int],
    read: dict[int, pa.Table] | None = None,
) -> None:
    """Step 5, one transaction on the staging ref: the losing files rewritten in one snapshot
    carrying the marker (``rewind.merged``), or, when no row is lost, a file-less append
    carrying it."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    props = {
        RUN_PROPERTY: run_id,
        UNITS_PROPERTY: "",
        MERGED_PROPERTY: run_id,
        MERGE_COUNTS_PROPERTY: json.dumps(counts, sort_keys=True),
    }
    branch = staging.branch or "main"
    with table.transaction() as tx:
        if keep:
            rewrite(tx, table, branch, tasks, keep, props, tables=read)
            faults.point("mid-merge-commit")  # new files written, the branch not moved yet
        else:
            empty = pa.Table.from_batches([], schema=table.schema().as_arrow())
            tx.append(empty, snapshot_properties=props, branch=branch)
