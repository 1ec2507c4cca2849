"""Counts of what processing did with records: one batch, one unit or a whole run.

Every source record is exactly one of emitted, quarantined or filtered (the conservation
law); ``rows_out`` is how many output rows they made. A run with a ``merge:`` policy also
says what became of every output row (``merge``: applied, rejected_stale, deduplicated,
superseded, routed), and those add up to ``rows_out`` (the law's second half). The same type
serves a batch in a task, a unit's total and a run's total, so counts move between them
without conversion. A commit stores each unit's counts with its data under
:data:`UNIT_COUNTS_KEY` (an Iceberg snapshot property, a row of the SQL sink's bookkeeping, a
field of a Kafka commit marker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewind.errors import RewindError

UNIT_COUNTS_KEY = "rewind.unit-counts"
"""Where a sink's commit records ``{unit id: counts.to_dict()}`` as JSON (a key of ``extra``)."""

QUARANTINE_FILES_KEY = "quarantine_files"
"""The key of a task-loaded unit's quarantine files in the counts its sink records and its
loader returns (``StageContext.unit_loader``: the Kafka and PostgreSQL task loaders)."""

MAX_REASON_KEYS = 100
"""Distinct reason labels kept in :attr:`RecordCounts.reasons`; the rest add up under
:data:`OTHER_REASONS` (rejection reasons written by users can be unbounded)."""
OTHER_REASONS = "other reasons"

MERGE_DECISIONS: tuple[str, ...] = ("applied", "rejected_stale", "deduplicated", "superseded", "routed")
"""What a merge policy did with an output row (:mod:`rewind.core.merge`): written to the
target; not written because live wrote its key after the cut line; not written because a
later row of the run has the same key; not written because the policy preferred the row
already there; sent to the quarantine as ambiguous."""


def add_reasons(into: dict[str, int], reasons: Mapping[str, int]) -> None:
    for label, count in reasons.items():
        if label not in into and len(into) >= MAX_REASON_KEYS:
            label = OTHER_REASONS
        into[label] = into.get(label, 0) + count


@dataclass(frozen=True)
class RecordCounts:
    """Counts of one batch or, merged, of a unit or a run.

    ``emitted + quarantined + filtered == records_read`` (the conservation law); ``rows_out``
    may be anything (a record yields 0..n rows); ``reasons`` counts quarantined records by
    ``"<stage>: <kind>"``.
    """

    records_read: int = 0
    emitted: int = 0
    rows_out: int = 0
    quarantined: int = 0
    filtered: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    merge_decisions: Mapping[str, int] = field(default_factory=dict)
    """Output rows per merge decision (:data:`MERGE_DECISIONS`); empty without a merge policy."""

    @property
    def balanced(self) -> bool:
        if self.records_read != self.emitted + self.quarantined + self.filtered:
            return False
        return not self.merge_decisions or sum(self.merge_decisions.values()) == self.rows_out

    def check(self, unit_id: str, detail: str = "") -> None:
        """Raise :class:`ConservationError` unless the law holds."""
        if not self.balanced:
            raise ConservationError(
                unit_id,
                records_read=self.records_read,
                emitted=self.emitted,
                quarantined=self.quarantined,
                filtered=self.filtered,
                detail=detail,
            )

    def merge(self, other: RecordCounts) -> RecordCounts:
        reasons: dict[str, int] = dict(self.reasons)
        add_reasons(reasons, other.reasons)
        merge = dict(self.merge_decisions)
        for decision, count in other.merge_decisions.items():
            merge[decision] = merge.get(decision, 0) + count
        return RecordCounts(
            records_read=self.records_read + other.records_read,
            emitted=self.emitted + other.emitted,
            rows_out=self.rows_out + other.rows_out,
            quarantined=self.quarantined + other.quarantined,
            filtered=self.filtered + other.filtered,
            reasons=reasons,
            merge_decisions=merge,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordCounts:
        """The counts of :meth:`to_dict` (as stored with a unit's commit or in the ledger)."""
        return cls(
            int(data.get("records_read", 0)),
            int(data.get("emitted", 0)),
            int(data.get("rows_out", 0)),
            int(data.get("quarantined", 0)),
            int(data.get("filtered", 0)),
            {str(k): int(v) for k, v in dict(data.get("reasons") or {}).items()},
            {str(k): int(v) for k, v in dict(data.get("merge") or {}).items()},
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "records_read": self.records_read,
            "emitted": self.emitted,
            "rows_out": self.rows_out,
            "quarantined": self.quarantined,
            "filtered": self.filtered,
            "reasons": dict(self.reasons),
        }
        if self.merge_decisions:
            out["merge"] = dict(self.merge_decisions)
        return out


def flatten_reasons(reasons: Mapping[str, Any]) -> dict[str, int]:
    """The ledger's nested reasons (``{"decode": 2, "translate-reject": {"no id": 1}}``) as the
    flat ``"<stage>: <kind>"`` labels of :attr:`RecordCounts.reasons`."""
    out: dict[str, int] = {}
    for key, value in reasons.items():
        if isinstance(value, Mapping):
            for sub, count in flatten_reasons(value).items():
                out[f"{key}: {sub}"] = count
        else:
            out[key] = int(value)
    return out


class ConservationError(RewindError):
    """``records_read == emitted + quarantined + filtered`` does not hold for a unit.

    This is a bug in Rewind (or a translate function that invents source rows), never a data
    problem; the run must stop before anything is committed.
    """

    def __init__(
        self,
        unit_id: str,
        *,
        records_read: int,
        emitted: int,
        quarantined: int,
        filtered: int,
        detail: str = "",
    ) -> None:
        self.unit_id = unit_id
        self.records_read = records_read
        self.emitted = emitted
        self.quarantined = quarantined
        self.filtered = filtered
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"unit {unit_id}: conservation law broken: records_read={records_read} but emitted={emitted} + "
            f"quarantined={quarantined} + filtered={filtered} = {emitted + quarantined + filtered}{suffix}; "
            "nothing of this unit was committed; report this as a bug"
        )
