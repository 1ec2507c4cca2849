"""History plans: which offsets of a window come from the archive, which from Kafka, which from nowhere.

For each partition the window resolves to offsets ``[start, end)`` over the whole log, the
part that left Kafka included. Two sources can hold an offset:

* the **archive** holds ``[from, hw)`` (minus the gaps the broker skipped while it was read),
  as of one snapshot, pinned in the plan so every read of the plan sees the same data;
* **Kafka** holds ``[low, high)``: ``low`` is the log start (or a *declared* log start above
  it, which simulates retention on brokers that cannot expire records), ``high`` the high
  watermark from a fetch response.

The seam. Offsets below the **seam** are read from the archive, offsets at or above it from
Kafka; each offset has exactly one source, so the union holds every record once and there is
no overlap left to deduplicate. By default (``prefer="kafka"``) the seam is the log start
``low``: whatever Kafka still holds is read from Kafka, the system of record, and the archive
only fills in what retention removed. ``prefer="archive"`` moves the seam up to the archived
high-water when the archive covers the log start: a backfill then reads most of its window
from the lake (faster, and no load on the brokers) and only the tail from Kafka.

Windows in time resolve over both sources consistently, as "the first offset whose
timestamp is >= T" over the whole log: Kafka's part by :func:`rewind.kafka.resolve.resolve`
(which checks the broker's answer); when that answer is the log start itself, the window may
begin earlier, in the archive, and the first archived offset at or after T below the log
start (from the ``timestamp`` column, files pruned by the ``day(timestamp)`` partitions and
statistics) decides. One offset per bound, over one log: the seam cannot double-count or drop.
Where no source knows the records around a time bound (before the archive's first offset,
between the archived high-water and the log start), the window is widened to include those
offsets, as the Kafka planner does: an upper bound, reported as lost.

Coverage, per partition, of ``[start, end)`` below the seam:

* **skipped**: offsets the broker itself skipped (transaction markers, aborted records under
  ``read_committed``, compaction) while an archive pass read the partition contiguously,
  recorded at archive time in ``<archive>__gaps``. Not a failure: there were no records.
* **lost**: offsets below the log start that the archive never copied (before its first
  offset, or after its high-water, or recorded lost by a pass run with ``allow_loss``).
  A failure: :func:`plan_history` raises :class:`HistoryGapError` naming them unless
  ``allow_gaps=True``, in which case they are in the plan for the ledger and the report.

Offsets the broker skips above the seam (markers read from Kafka) are not in the plan: the
Kafka reader sees them at read time, as for any Kafka window.

"earliest" means offset 0, the beginning of the log: when the archive starts later (it was
first run after retention had already removed records), ``[0, from)`` is lost.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rewind.catalog import load_catalog
from rewind.core.ranges import OffsetRange
from rewind.core.windows import EARLIEST, LATEST, Timestamp, WindowRequest
from rewind.history import spans
from rewind.history.exceptions import HistoryGapError
from rewind.history.schema import TP, archive_state, open_archive, recorded_gaps
from rewind.kafka.resolve import resolve

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from rewind.config import Settings
    from rewind.kafka.read_plan import PartitionPlan

GapKind = Literal["skipped", "lost"]
Prefer = Literal["kafka", "archive"]
Source = Literal["archive", "kafka"]


@dataclass(frozen=True)
class Gap:
    """Offsets ``[start, end)`` of the window that no source returns, and why."""

    topic: str
    partition: int
    start: int
    end: int
    kind: GapKind
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gap:
        return cls(
            str(data["topic"]),
            int(data["partition"]),
            int(data["start"]),
            int(data["end"]),
            data["kind"],
            str(data.get("reason", "")),
        )

    def describe(self) -> str:
        return f"{self.topic}/{self.partition} [{self.start}, {self.end})"


@dataclass(frozen=True)
class PartitionHistory:
    """One partition of a history plan.

    ``start``/``end``: the window in offsets. ``low``/``high``: Kafka's effective log start and
    high watermark. ``archive_from``/``archive_hw``: what the archive holds (None: nothing).
    ``seam``: offsets below it come from the archive, the others from Kafka.
    """

    topic: str
    partition: int
    start: int
    end: int
    low: int
    high: int
    archive_from: int | None
    archive_hw: int | None
    seam: int
    archive_ranges: tuple[OffsetRange, ...]
    kafka_ranges: tuple[OffsetRange, ...]
    gaps: tuple[Gap, ...]
    notes: tuple[str, ...] = ()

    @property
    def expected_archive_records(self) -> int:
        """Records the archive ranges hold: exact, because every gap below the hw is recorded."""
        holes = [(g.start, g.end) for g in self.gaps]
        return sum(
            r.size - spans.total(spans.intersect(holes, (r.start, r.end))) for r in self.archive_ranges
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
            "low": self.low,
            "high": self.high,
            "archive_from": self.archive_from,
            "archive_hw": self.archive_hw,
            "seam": self.seam,
            "archive_ranges": [r.to_dict() for r in self.archive_ranges],
            "kafka_ranges": [r.to_dict() for r in self.kafka_ranges],
            "gaps": [g.to_dict() for g in self.gaps],
            "expected_archive_records": self.expected_archive_records,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionHistory:
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            start=int(data["start"]),
            end=int(data["end"]),
            low=int(data["low"]),
            high=int(data["high"]),
            archive_from=None if data.get("archive_from") is None else int(data["archive_from"]),
            archive_hw=None if data.get("archive_hw") is None else int(data["archive_hw"]),
            seam=int(data["seam"]),
            archive_ranges=tuple(OffsetRange.from_dict(r) for r in data.get("archive_ranges", ())),
            kafka_ranges=tuple(OffsetRange.from_dict(r) for r in data.get("kafka_ranges", ())),
            gaps=tuple(Gap.from_dict(g) for g in data.get("gaps", ())),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )


@dataclass(frozen=True)
class HistoryUnit:
    """A piece of work: one range read from one source. ``expected_records`` is exact for the archive."""

    source: Source
    range: OffsetRange
    expected_records: int | None

    @property
    def id(self) -> str:
        r = self.range
        return f"{r.topic}/{r.partition}/{r.start}-{r.end}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "range": self.range.to_dict(),
            "expected_records": self.expected_records,
        }


@dataclass(frozen=True)
class HistoryPlan:
    """A frozen, JSON-serialisable plan of a history read (see the module docstring)."""

    topics: tuple[str, ...]
    archive_table: str
    archive_snapshot_id: int | None
    prefer: Prefer
    allow_gaps: bool
    partitions: tuple[PartitionHistory, ...]
    notes: tuple[str, ...] = ()

    def archive_ranges(self) -> list[OffsetRange]:
        return [r for p in self.partitions for r in p.archive_ranges]

    def kafka_ranges(self) -> list[OffsetRange]:
        return [r for p in self.partitions for r in p.kafka_ranges]

    def gaps(self, kind: GapKind | None = None) -> list[Gap]:
        return [g for p in self.partitions for g in p.gaps if kind is None or g.kind == kind]

    def lost(self) -> list[Gap]:
        return self.gaps("lost")

    @property
    def total_offsets(self) -> int:
        return sum(p.end - p.start for p in self.partitions)

    def units(self, max_offsets: int | None = None) -> list[HistoryUnit]:
        """Work units: every archive and Kafka range, cut into pieces of at most ``max_offsets``."""
        out: list[HistoryUnit] = []
        for p in self.partitions:
            holes = [(g.start, g.end) for g in p.gaps]
            for rng in p.archive_ranges:
                for piece in rng.split(max_offsets) if max_offsets else [rng]:
                    if piece.size:
                        missing = spans.total(spans.intersect(holes, (piece.start, piece.end)))
                        out.append(HistoryUnit("archive", piece, piece.size - missing))
            for rng in p.kafka_ranges:
                for piece in rng.split(max_offsets) if max_offsets else [rng]:
                    if piece.size:
                        out.append(HistoryUnit("kafka", piece, None))
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "archive_table": self.archive_table,
            "archive_snapshot_id": self.archive_snapshot_id,
            "prefer": self.prefer,
            "offsets": self.total_offsets,
            "archive_offsets": sum(r.size for r in self.archive_ranges()),
            "kafka_offsets": sum(r.size for r in self.kafka_ranges()),
            "skipped_offsets": sum(g.end - g.start for g in self.gaps("skipped")),
            "lost": [g.to_dict() for g in self.lost()],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "topics": list(self.topics),
            "archive_table": self.archive_table,
            "archive_snapshot_id": self.archive_snapshot_id,
            "prefer": self.prefer,
            "allow_gaps": self.allow_gaps,
            "partitions": [p.to_dict() for p in self.partitions],
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HistoryPlan:
        return cls(
            topics=tuple(data["topics"]),
            archive_table=str(data["archive_table"]),
            archive_snapshot_id=data.get("archive_snapshot_id"),
            prefer=data.get("prefer", "kafka"),
            allow_gaps=bool(data.get("allow_gaps", False)),
            partitions=tuple(PartitionHistory.from_dict(p) for p in data["partitions"]),
            notes=tuple(data.get("notes", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> HistoryPlan:
        return cls.from_dict(json.loads(text))


# -- planning -------------------------------------------------------------------------------


def first_archived_at_or_after(
    table: Table, snapshot_id: int | None, tp: TP, ms: int, lo: int, hi: int
) -> int | None:
    """The first archived offset in ``[lo, hi)`` of ``tp`` whose timestamp is >= ``ms``, or None."""
    if hi <= lo or snapshot_id is None:
        return None
    # lazy: avoids pyarrow, pyiceberg at import
    import pyarrow.compute as pc
    import pyiceberg.expressions as ex

    # pyiceberg's predicates are pydantic models that mypy cannot call positionally
    e: Any = ex

    row_filter = e.And(
        e.And(e.EqualTo("topic", tp[0]), e.EqualTo("partition", tp[1])),
        e.And(
            e.And(e.GreaterThanOrEqual("offset", lo), e.LessThan("offset", hi)),
            e.GreaterThanOrEqual("timestamp", ms * 1000),
        ),
    )
    found = table.scan(row_filter=row_filter, selected_fields=("offset",), snapshot_id=snapshot_id).to_arrow()
    if found.num_rows == 0:
        return None
    return int(pc.min(found["offset"]).as_py())


def _resolve_time(
    which: Literal["start", "end"],
    ms: int,
    kafka_answer: int,
    low: int,
    coverage: tuple[int, int] | None,
    lookup: Any,
) -> tuple[int, str | None]:
    """One time bound over archive and Kafka: the first offset whose timestamp is >= ``ms``."""
    if kafka_answer > low or low == 0:
        return kafka_answer, None  # the record before the answer is in Kafka and earlier than ms
    if coverage is None:  # nothing archived: whatever left Kafka may be in the window
        return (0 if which == "start" else low), None
    a_from, a_hw = coverage
    found = lookup(ms, a_from, min(a_hw, low))
    if found is None:
        if which == "start" and a_hw < low:
            return a_hw, f"offsets [{a_hw}, {low}) are in neither source and may hold the start of the window"
        return low, None
    if found == a_from and a_from > 0:
        return (0 if which == "start" else found), None
    return found, None


def plan_history(
    settings: Settings,
    topics: Sequence[str],
    archive_table: str,
    window: WindowRequest | None = None,
    *,
    declared_log_start: Mapping[TP, int] | None = None,
    allow_gaps: bool = False,
    prefer: Prefer = "kafka",
    catalog: Catalog | None = None,
) -> HistoryPlan:
    """Plan a history read of ``topics`` over ``window`` (default: earliest to latest).

    ``window``'s subscription is replaced by ``topics``; its bounds (offsets, times, earliest,
    latest, per-partition overrides) are used as given. ``declared_log_start`` declares a log
    start above the broker's (simulated retention; production leaves it None). Raises
    :class:`HistoryGapError` naming every lost range unless ``allow_gaps``.
    """
    if not topics:
        raise HistoryGapError("name at least one topic for the history source")
    catalog = catalog or load_catalog(settings)
    table = open_archive(catalog, archive_table)
    state = archive_state(table)
    snapshot_id = state.snapshot_id
    request = dataclasses.replace(
        window or WindowRequest(subscribe=tuple(topics)),
        subscribe=tuple(dict.fromkeys(topics)),
        assign=(),
        subscribe_pattern=None,
    )
    kafka = resolve(settings.kafka_config(), request, declared_log_start=declared_log_start)
    recorded = recorded_gaps(catalog, archive_table, [(p.topic, p.partition) for p in kafka.partitions])
    partitions = []
    for p in kafka.partitions:
        tp = (p.topic, p.partition)

        def lookup(ms: int, lo: int, hi: int, tp: TP = tp) -> int | None:
            return first_archived_at_or_after(table, snapshot_id, tp, ms, lo, hi)

        partitions.append(
            _plan_partition(
                p,
                request,
                state.coverage(tp),
                recorded.get((tp, "skipped"), []),
                recorded.get((tp, "lost"), []),
                lookup,
                prefer,
            )
        )
    plan = HistoryPlan(
        topics=tuple(dict.fromkeys(topics)),
        archive_table=archive_table,
        archive_snapshot_id=snapshot_id,
        prefer=prefer,
        allow_gaps=allow_gaps,
        partitions=tuple(partitions),
        notes=tuple(kafka.notes),
    )
    lost = plan.lost()
    if lost and not allow_gaps:
        shown = ", ".join(g.describe() for g in lost[:8]) + (
            f" and {len(lost) - 8} more" if len(lost) > 8 else ""
        )
        raise HistoryGapError(
            f"history of {', '.join(plan.topics)} is missing offsets in both the archive {archive_table} and "
            f"Kafka: {shown} (lost: below the log start and never archived); set allow_gaps to read the rest"
        )
    return plan


def _plan_partition(
    p: PartitionPlan,
    request: WindowRequest,
    coverage: tuple[int, int] | None,
    skipped: list[tuple[int, int]],
    recorded_lost: list[tuple[int, int]],
    lookup: Any,
    prefer: Prefer,
) -> PartitionHistory:
    name = f"{p.topic}/{p.partition}"
    notes = list(p.notes)
    low, high = p.low, p.high
    start_bound = request.start.for_partition(p.topic, p.partition)
    end_bound = request.end.for_partition(p.topic, p.partition)
    if isinstance(start_bound, Timestamp):
        start, note = _resolve_time("start", start_bound.ms, p.start, low, coverage, lookup)
        if note:
            notes.append(f"{name}: {note}")
    elif start_bound == EARLIEST:
        start = 0
    elif start_bound == LATEST:
        start = high
    else:
        assert isinstance(start_bound, int)
        start = min(start_bound, high)
    if isinstance(end_bound, Timestamp):
        end, note = _resolve_time("end", end_bound.ms, p.end, low, coverage, lookup)
        if note:
            notes.append(f"{name}: {note}")
    elif end_bound == LATEST or end_bound is None:
        end = high
    else:
        assert isinstance(end_bound, int)
        end = min(end_bound, high)
    end = max(end, start)

    a_from, a_hw = coverage if coverage is not None else (None, None)
    seam = low
    if prefer == "archive" and a_from is not None and a_hw is not None and a_from <= low < a_hw:
        seam = min(a_hw, high)
    seam = min(max(seam, start), end) if end > start else start

    archive_ranges: list[OffsetRange] = []
    if a_from is not None and a_hw is not None:
        lo, hi = max(start, a_from), min(end, seam, a_hw)
        if hi > lo:
            archive_ranges.append(OffsetRange(p.topic, p.partition, lo, hi))
    kafka_ranges: list[OffsetRange] = []
    k_lo = max(start, seam, low)
    if end > k_lo:
        kafka_ranges.append(OffsetRange(p.topic, p.partition, k_lo, end))

    below = (start, min(end, max(seam, start)))
    gaps: list[Gap] = []
    known = [(a_from, a_hw)] if a_from is not None and a_hw is not None else []
    for g_start, g_end in spans.subtract([below], known):
        if a_from is None:
            why = f"below the log start {low} and the archive holds nothing of {name}"
        elif g_end <= a_from:
            why = f"below the archive's first offset {a_from} and the log start {low}: never archived"
        else:
            why = (
                f"after the archive's high-water {a_hw} and below the log start {low}: left Kafka before "
                "the archive copied them (archive more often than retention removes)"
            )
        gaps.append(Gap(p.topic, p.partition, g_start, g_end, "lost", why))
    for g_start, g_end in spans.intersect(recorded_lost, below):
        gaps.append(
            Gap(
                p.topic,
                p.partition,
                g_start,
                g_end,
                "lost",
                "left Kafka before archiving (recorded by a pass with allow_loss)",
            )
        )
    for rng in archive_ranges:
        for g_start, g_end in spans.intersect(skipped, (rng.start, rng.end)):
            gaps.append(
                Gap(
                    p.topic,
                    p.partition,
                    g_start,
                    g_end,
                    "skipped",
                    "skipped by the broker while archived (transaction markers, aborted or compacted)",
                )
            )
    gaps.sort(key=lambda g: (g.start, g.kind))
    return PartitionHistory(
        topic=p.topic,
        partition=p.partition,
        start=start,
        end=end,
        low=low,
        high=high,
        archive_from=a_from,
        archive_hw=a_hw,
        seam=seam,
        archive_ranges=tuple(archive_ranges),
        kafka_ranges=tuple(kafka_ranges),
        gaps=tuple(gaps),
        notes=tuple(notes),
    )
