"""What the ledger hands back: frozen records, the run state machine, unit results and totals.

Every datetime here is timezone-aware UTC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, get_args

from rewind.core.counts import RecordCounts, flatten_reasons

RunState = Literal[
    "planned", "running", "succeeded", "failed", "interrupted", "refused", "promoted", "rolled_back"
]
UnitState = Literal["pending", "running", "done", "failed"]

RUN_STATES: tuple[RunState, ...] = get_args(RunState)
UNIT_STATES: tuple[UnitState, ...] = get_args(UnitState)

TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    # running -> running is a resume of a run whose process died without saying so: the lease,
    # not the state, keeps two live processes off one run
    # refused: a new run whose target's lease another run held; nothing of it ran
    "planned": frozenset({"running", "failed", "interrupted", "refused"}),
    "running": frozenset({"running", "succeeded", "failed", "interrupted"}),
    "failed": frozenset({"running"}),
    "interrupted": frozenset({"running"}),
    "refused": frozenset({"running"}),
    "succeeded": frozenset({"promoted"}),
    "promoted": frozenset({"rolled_back"}),
    "rolled_back": frozenset({"promoted"}),
}
"""Allowed moves of a run: ``TRANSITIONS[current]`` is the set of states it may go to."""

FINISHED: frozenset[RunState] = frozenset({"succeeded", "failed", "interrupted", "refused"})
"""States that stamp ``finished_at`` when entered."""


def unit_id(topic: str, partition: int, start: int, end: int) -> str:
    """The id of the work unit ``[start, end)`` of ``topic/partition``: ``topic/partition/start-end``."""
    return f"{topic}/{partition}/{start}-{end}"


class UnitRange(Protocol):
    """Anything shaped like :class:`rewind.core.ranges.OffsetRange`."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


@dataclass(frozen=True)
class PlanRecord:
    id: str
    name: str
    spec: dict[str, Any]
    plan: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RunRecord:
    id: str
    plan_id: str
    name: str
    target: str
    state: RunState
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    user: str
    """Who created the run."""
    host: str
    """Host of the process that last started (or resumed) the run."""
    pid: int
    staging: dict[str, Any] | None
    totals: dict[str, Any] | None
    error: str | None


@dataclass(frozen=True)
class UnitRecord:
    run_id: str
    unit_id: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    state: UnitState
    attempts: int
    records_read: int
    emitted: int
    rows_out: int
    quarantined: int
    filtered: int
    reasons: dict[str, Any]
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


@dataclass(frozen=True)
class UnitResult:
    """The counts of one finished unit, as the runner measured them.

    ``reasons`` counts quarantined records by reason or stage; its values are ints or, for
    a breakdown, nested mappings of ints (``{"decode": 2, "translate-reject": {"no id": 3}}``).
    """

    unit_id: str
    records_read: int
    emitted: int
    rows_out: int
    quarantined: int = 0
    filtered: int = 0
    reasons: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, unit_id: str, counts: RecordCounts) -> UnitResult:
        """The result of ``unit_id`` from the counts its task measured (or its commit kept)."""
        return cls(
            unit_id,
            records_read=counts.records_read,
            emitted=counts.emitted,
            rows_out=counts.rows_out,
            quarantined=counts.quarantined,
            filtered=counts.filtered,
            reasons=dict(counts.reasons),
        )

    def __post_init__(self) -> None:
        for name in ("records_read", "emitted", "rows_out", "quarantined", "filtered"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"unit {self.unit_id}: {name} must be a count >= 0, got {value!r}")

    @property
    def conserved(self) -> bool:
        """The conservation law: every record read was emitted, quarantined or filtered."""
        return self.records_read == self.emitted + self.quarantined + self.filtered


@dataclass(frozen=True)
class RunTotals:
    """Totals over the units of a run: how many in each state, and their summed counts.

    ``reasons`` keeps the ledger's nested breakdown; :attr:`counts` is the same totals as the
    one counts type of the pipeline (:class:`~rewind.core.counts.RecordCounts`).
    """

    units: int
    by_state: dict[str, int]
    records_read: int
    emitted: int
    rows_out: int
    quarantined: int
    filtered: int
    reasons: dict[str, Any]

    @property
    def done(self) -> int:
        return self.by_state.get("done", 0)

    @property
    def all_done(self) -> bool:
        return self.units > 0 and self.done == self.units

    @property
    def conserved(self) -> bool:
        return self.counts.balanced

    @property
    def counts(self) -> RecordCounts:
        return RecordCounts(
            self.records_read,
            self.emitted,
            self.rows_out,
            self.quarantined,
            self.filtered,
            flatten_reasons(self.reasons),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form, e.g. for a run's ``totals``."""
        return {
            "units": self.units,
            "by_state": dict(self.by_state),
            "records_read": self.records_read,
            "emitted": self.emitted,
            "rows_out": self.rows_out,
            "quarantined": self.quarantined,
            "filtered": self.filtered,
            "reasons": self.reasons,
        }


@dataclass(frozen=True)
class Lease:
    target: str
    holder: str
    """The run id holding the target."""
    owner: str
    """``host:pid`` of the process holding it."""
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    run_id: str | None
    action: str
    user: str
    details: dict[str, Any]
