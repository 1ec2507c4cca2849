"""Which archive files hold some offset ranges: pyiceberg planning with row filters.

Shared by the Spark reader (:mod:`rewind.history.read`) and the Spark-free iterator
(:mod:`rewind.history.iterate`). The filter names topic, partition and offset bounds, so
pyiceberg prunes by the files' column statistics (the archive writes one file per partition
and day, sorted by offset) and only the files that hold the ranges are read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.core.ranges import OffsetRange
from rewind.history import spans
from rewind.history.exceptions import ArchiveTableError

if TYPE_CHECKING:
    from pyiceberg.table import Table

_OFFSET_FIELD = "offset"


def merged_by_partition(ranges: Sequence[OffsetRange]) -> dict[tuple[str, int], list[tuple[int, int]]]:
    by_tp: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for r in ranges:
        if r.size:
            by_tp.setdefault((r.topic, r.partition), []).append((r.start, r.end))
    return {tp: spans.merge(s) for tp, s in sorted(by_tp.items())}


def row_filter(ranges: Sequence[OffsetRange]) -> Any:
    """A pyiceberg expression selecting exactly the records of ``ranges``."""
    # lazy: avoids pyiceberg at import
    import pyiceberg.expressions as ex

    # pyiceberg's predicates are pydantic models that mypy cannot call positionally
    e: Any = ex

    expr: Any = e.AlwaysFalse()
    for (topic, partition), found in merged_by_partition(ranges).items():
        offsets: Any = e.AlwaysFalse()
        for start, end in found:
            offsets = e.Or(offsets, e.And(e.GreaterThanOrEqual("offset", start), e.LessThan("offset", end)))
        expr = e.Or(expr, e.And(e.And(e.EqualTo("topic", topic), e.EqualTo("partition", partition)), offsets))
    return expr


@dataclass(frozen=True)
class ArchiveFile:
    path: str
    records: int
    offset_min: int | None
    offset_max: int | None


def plan_files(
    table: Table, ranges: Sequence[OffsetRange], snapshot_id: int | None = None
) -> list[ArchiveFile]:
    """The data files that may hold records of ``ranges``, in order of their first offset."""
    if not any(r.size for r in ranges):
        return []
    if snapshot_id is None:
        current = table.current_snapshot()
        snapshot_id = current.snapshot_id if current else None
    if snapshot_id is None:
        return []
    if table.snapshot_by_id(snapshot_id) is None:
        # reading "nothing" from a snapshot that is gone would lose the whole range silently
        raise ArchiveTableError(
            f"{'.'.join(table.name())} has no snapshot {snapshot_id}, the one the plan pinned (the table was "
            "recreated or its snapshots expired); plan the job again"
        )
    # lazy: avoids pyiceberg at import
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    field_id = table.schema().find_field(_OFFSET_FIELD).field_id
    out = []
    for task in table.scan(row_filter=row_filter(ranges), snapshot_id=snapshot_id).plan_files():
        if task.delete_files:
            raise ArchiveTableError(
                f"{'.'.join(table.name())} has row-level delete files (on {task.file.file_path}); "
                "an archive is append-only: rewrite it with compact_archive"
            )
        lower = (task.file.lower_bounds or {}).get(field_id)
        upper = (task.file.upper_bounds or {}).get(field_id)
        out.append(
            ArchiveFile(
                task.file.file_path,
                task.file.record_count,
                int(from_bytes(LongType(), lower)) if lower is not None else None,
                int(from_bytes(LongType(), upper)) if upper is not None else None,
            )
        )
    out.sort(key=lambda f: (f.offset_min if f.offset_min is not None else -1, f.path))
    return out
