"""A run's merge step: the spec's ``merge:`` policy applied to the run's rows, once.

The decisions are :func:`rewind.core.merge.decide`; this module resolves the cut line at plan
time (a group's committed offsets are read then, so the run uses what the plan showed), and
after every unit is committed reads the run's rows and the rows live wrote, decides, and
commits exactly once:

* **Iceberg**: the units' rows were committed to the staging branch like any run's rows
  (keys may repeat there for a moment); ONE transaction on the branch then deletes the run's
  rows and the live rows of the keys it replaces, and appends the applied rows, marked
  ``rewind.merged=<run>`` with the decision counts. The branch never shows a key twice
  after it.
* **PostgreSQL/SQLite** (upsert): the units commit to the run's scratch Iceberg table (as a
  fold's partial rows do, :func:`rewind.job.finalize.parts_sink`); the applied rows are then
  committed to staging as one more unit, :data:`MERGE_UNIT`, with the counts, in the sink's
  own transaction. Rows the policy does not apply never reach the staging table.

Rows routed as ambiguous go to the quarantine first, under the unit :data:`MERGE_UNIT`
(skipped when a resume finds them there). A run killed before the final commit decides again
on resume (the decisions are deterministic), one killed after it finds the commit and only
reads its counts.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.columns import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from rewind.core.counts import MERGE_DECISIONS, UNIT_COUNTS_KEY, RecordCounts
from rewind.core.merge import MergePolicy, MergeResult, decide
from rewind.core.parquet import write_parquet
from rewind.job.merge_iceberg import MERGE_COUNTS_PROPERTY, MERGED_PROPERTY, SPARK_ROWS, merge_iceberg
from rewind.kafka.groups import committed_offsets
from rewind.sinks.iceberg import IcebergSink, IcebergStaging
from rewind.spark import session

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings
    from rewind.core.units import WorkUnit
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

MERGE_UNIT = "merge"
"""The unit id of the merged rows in a SQL sink, and of the routed rows in the quarantine."""
CUT_LINE_KEY = "merge_cut_line"
"""Where the plan's read plan keeps the resolved cut line (what the run applies)."""


def needs_merge(spec: JobSpec) -> bool:
    return spec.merge is not None


# -- plan time ------------------------------------------------------------------------------------


def resolve_cut_line(
    settings: Settings, spec: JobSpec, units: Iterable[WorkUnit]
) -> tuple[tuple[str, bool, str] | None, dict[str, Any] | None]:
    """The ``merge`` gate and the resolved cut line (``{"time_us": ...}`` or ``{"offsets":
    [[topic, partition, offset], ...]}``), or ``(None, None)`` without a merge policy.

    A cut line naming a partition the source does not read is refused: a typo there would
    silently reject nothing. A group's offsets are read now and pinned in the plan.
    """
    merge = spec.merge
    if merge is None:
        return None, None
    read = sorted({(u.topic, u.partition) for u in units})
    described = f"on_collision {merge.on_collision}, dedup {merge.dedup}, ambiguous {merge.ambiguous}"
    cut = merge.reject_stale_after
    if cut is None:
        return ("merge", True, described), None
    if cut.time is not None:
        return (
            ("merge", True, f"{described}; live rows from events at or after {cut.time.isoformat()} win"),
            {"time_us": int(cut.time.timestamp() * 1_000_000)},
        )
    if cut.offsets is not None:
        offsets = {(t, p): o for t, parts in cut.offsets.items() for p, o in parts.items()}
        source = "merge.reject_stale_after.offsets"
    else:
        assert cut.group is not None

        topics = sorted({t for t, _ in read})
        try:
            found = committed_offsets(settings.kafka_config(), cut.group, topics)
        except Exception as exc:  # one line: the group cannot be read
            return ("merge", False, f"merge.reject_stale_after.group {cut.group}: {exc}"), None
        offsets = {(tp[0], tp[1]): o for tp, o in found.items() if o is not None}
        if not offsets:
            return (
                (
                    "merge",
                    False,
                    f"merge.reject_stale_after.group {cut.group} has no committed offsets on "
                    f"{', '.join(topics)}; name the live service's group or give offsets",
                ),
                None,
            )
        source = f"group {cut.group}"
    unknown = sorted(tp for tp in offsets if tp not in set(read))
    if unknown:
        names = ", ".join(f"{t}:{p}" for t, p in unknown)
        have = ", ".join(f"{t}:{p}" for t, p in read)
        return (
            (
                "merge",
                False,
                f"merge.reject_stale_after names {names}, which the source does not read ({have}); "
                "give offsets of the source's partitions",
            ),
            None,
        )
    cut_list = [[t, p, o] for (t, p), o in sorted(offsets.items())]
    shown = ", ".join(f"{t}:{p}@{o}" for t, p, o in cut_list)
    return ("merge", True, f"{described}; cut line from {source}: {shown}"), {"offsets": cut_list}


def policy_of(spec: JobSpec, cut: dict[str, Any] | None) -> MergePolicy:
    merge = spec.merge
    assert merge is not None
    cut = cut or {}
    offsets = cut.get("offsets")
    return MergePolicy(
        on_collision=merge.on_collision,
        ambiguous=merge.ambiguous,
        cut_time_us=cut.get("time_us"),
        cut_offsets={(str(t), int(p)): int(o) for t, p, o in offsets} if offsets is not None else None,
    )


# -- run time -------------------------------------------------------------------------------------


def merge_run(
    settings: Settings,
    ledger: Ledger,
    plan: JobPlan,
    sink: StagingSink[Any],
    staging: Staging,
    run_id: str,
    quarantine: tuple[IcebergSink, IcebergStaging],
    parts: tuple[IcebergSink, IcebergStaging] | None = None,
) -> dict[str, int]:
    """Apply the merge policy to the run's rows, once; returns the counts per decision.

    Steps: (1) a merge commit of this run found: return its counts (and write the audit entry
    if a kill lost it); (2) read the run's rows and the live rows; (3) decide; (4) commit the
    routed rows to the quarantine under :data:`MERGE_UNIT` unless a kill left them there;
    (5) commit the applied rows (and, on Iceberg, the deletes) in one sink transaction.
    """
    spec = plan.job_spec()
    done = _done(sink, staging, run_id, parts)
    if done is not None:
        if not any(a.action == "merged" for a in ledger.audit_log(run_id)):
            ledger.audit(run_id, "merged", done)
        return done
    policy = policy_of(spec, plan.read_plan.get(CUT_LINE_KEY))
    if parts is None:
        assert isinstance(sink, IcebergSink) and isinstance(staging, IcebergStaging)

        threshold = settings.merge.spark_rows
        result = merge_iceberg(
            sink,
            staging,
            run_id,
            spec.key,
            policy,
            lambda r: _route(quarantine, run_id, r),
            spark=lambda: session(settings),
            spark_rows=SPARK_ROWS if threshold is None else threshold,
        )
    else:
        rows = _scan(*parts)
        live = sink.read_arrow(staging)  # type: ignore[attr-defined]
        result = decide(rows, live, spec.key, policy)
        _route(quarantine, run_id, result)
        faults.point("before-merge-commit")
        folder = sink.data_folder(staging)
        files = [write_parquet(folder, result.applied, "merge")] if result.applied.num_rows else []
        counts = RecordCounts(merge_decisions=result.counts)
        extra = {UNIT_COUNTS_KEY: json.dumps({MERGE_UNIT: counts.to_dict()}, sort_keys=True)}
        _replacing(sink).commit(staging, run_id, [MERGE_UNIT], files, extra=extra)
    faults.point("after-merge-commit")
    ledger.audit(run_id, "merged", result.counts)
    log.info("run %s: merged %s", run_id, result.counts)
    return result.counts


def _replacing(sink: StagingSink[Any]) -> StagingSink[Any]:
    """The SQL sink writing in ``replace`` mode: the policy decided, so its rows overwrite their
    key (the sink's own upsert would keep a row of a later event, undoing prefer-backfill)."""
    replacing = copy.copy(sink)
    replacing.mode = "replace"  # type: ignore[attr-defined]
    return replacing


def _scan(sink: IcebergSink, staging: IcebergStaging) -> pa.Table:
    table = sink.catalog.load_table(staging.table)
    head = table.snapshot_by_name(staging.ref)
    if head is None:
        return table.schema().as_arrow().empty_table()
    return table.scan(snapshot_id=head.snapshot_id).to_arrow()


def _done(
    sink: StagingSink[Any], staging: Staging, run_id: str, parts: tuple[IcebergSink, IcebergStaging] | None
) -> dict[str, int] | None:
    """The counts of this run's merge commit, if it happened."""
    if parts is not None:
        found = sink.committed_counts(staging, run_id).get(MERGE_UNIT)
        return None if found is None else dict(RecordCounts.from_dict(found).merge_decisions)
    # lazy: avoids pyiceberg at import
    from pyiceberg.table.snapshots import ancestors_of

    assert isinstance(sink, IcebergSink) and isinstance(staging, IcebergStaging)
    table = sink.catalog.load_table(staging.table)
    head = table.snapshot_by_name(staging.ref)
    for snap in ancestors_of(head, table.metadata) if head is not None else []:
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(MERGED_PROPERTY) == run_id:
            counts: dict[str, int] = json.loads(props.get(MERGE_COUNTS_PROPERTY, "{}"))
            return counts
    return None


def _route(quarantine: tuple[IcebergSink, IcebergStaging], run_id: str, result: MergeResult) -> None:
    """The ambiguous rows into the quarantine, once (the row itself as JSON in ``value``)."""
    if not result.routed.num_rows:
        return
    qsink, qstaging = quarantine
    if MERGE_UNIT in qsink.committed_units(qstaging, run_id):
        return
    table = quarantine_rows(result.routed, run_id)
    qsink.commit(qstaging, run_id, [MERGE_UNIT], [write_parquet(qsink.data_folder(qstaging), table, "merge")])


def quarantine_rows(routed: pa.Table, run_id: str) -> pa.Table:
    """Quarantine rows for output rows routed as ambiguous: the source coordinates from their
    lineage, the output row as JSON in ``value`` (the source bytes are not at hand here)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids pandas / pyarrow / numpy at import
    from rewind.translate.lineage import TIMESTAMP
    from rewind.translate.quarantine import QUARANTINE_SCHEMA

    n = routed.num_rows
    values = [json.dumps(r, default=str, sort_keys=True).encode() for r in routed.to_pylist()]
    now = datetime.now(UTC)
    arrays = [
        pa.array([run_id] * n, pa.string()),
        pa.array([MERGE_UNIT] * n, pa.string()),
        routed.column(SOURCE_TOPIC).cast(pa.string()),
        routed.column(SOURCE_PARTITION).cast(pa.int32()),
        routed.column(SOURCE_OFFSET).cast(pa.int64()),
        routed.column(SOURCE_TIMESTAMP).cast(TIMESTAMP),
        pa.nulls(n, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(["merge"] * n, pa.string()),
        pa.array(["ambiguous"] * n, pa.string()),
        pa.array([now] * n, TIMESTAMP),
    ]
    return pa.Table.from_arrays(arrays, schema=QUARANTINE_SCHEMA)


def recorded_merge(ledger: Ledger, run_id: str) -> dict[str, int] | None:
    """The decision counts of the run's merge, as its audit entry recorded them."""
    found = [a.details for a in ledger.audit_log(run_id) if a.action == "merged"]
    return dict(found[-1]) if found else None


def describe_merge(counts: dict[str, int]) -> str:
    """``merge: applied 3, rejected stale 1, ...`` for summaries and reports."""
    shown = (f"{name.replace('_', ' ')} {counts.get(name, 0):,}" for name in MERGE_DECISIONS)
    return "merge: " + ", ".join(shown)
