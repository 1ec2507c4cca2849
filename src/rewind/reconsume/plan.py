"""A reconsume as data: which partitions, where the temporary group starts, what it costs.

:class:`ReconsumePlan` is frozen and JSON-serializable; ``rewind reconsume plan`` stores it
in the ledger and ``start`` executes exactly it. The pure parts (the id's shape, parsing
``--from-offsets``, the estimate) live here so they can be tested without a broker.

Counts are offset differences: transaction markers and compacted records occupy offsets
too, so on such topics they are an upper bound.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rewind.core.windows import TP
from rewind.ledger.reconsumes import MODES, ReconsumeMode, temp_group_name
from rewind.reconsume.exceptions import ReconsumeInputError

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
DEFAULT_RATE = 1000.0
"""Records per second assumed for the ETA when none is given: a modest handler's pace."""


def check_id(reconsume_id: str) -> str:
    """The id names the temporary group, so it must be a plain, short name."""
    if not _ID.fullmatch(reconsume_id or ""):
        raise ReconsumeInputError(
            f"reconsume id {reconsume_id!r}: use 1-100 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (it names the temporary group rewind-reconsume-<id>)",
            option="RECONSUME_ID",
        )
    return reconsume_id


def check_mode(mode: str) -> ReconsumeMode:
    if mode not in MODES:
        raise ReconsumeInputError(f"--mode {mode!r}: expected {' or '.join(MODES)}", option="--mode")
    return mode


def parse_offsets(text: str) -> dict[TP, int]:
    """``--from-offsets`` as Spark writes offsets: ``{"orders": {"0": 120, "1": 80}}``."""
    option = "--from-offsets"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReconsumeInputError(
            f'{option} is not JSON ({exc.msg}); expected {{"topic": {{"0": 120, "1": 80}}}}', option=option
        ) from None
    if not isinstance(data, dict) or not data:
        raise ReconsumeInputError(
            f'{option}: expected {{"topic": {{"0": 120}}}}, got {text!r}', option=option
        )
    out: dict[TP, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict) or not parts:
            raise ReconsumeInputError(
                f'{option}: topic {topic!r} needs partitions and offsets, like {{"0": 120}}', option=option
            )
        for partition, offset in parts.items():
            if not str(partition).isdigit():
                raise ReconsumeInputError(f"{option}: partition {partition!r} of {topic!r} is not a number",
                                          option=option)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ReconsumeInputError(
                    f"{option}: offset {offset!r} of {topic}/{partition} must be a whole number >= 0",
                    option=option,
                )
            out[(str(topic), int(partition))] = offset
    return out


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


@dataclass(frozen=True)
class PlannedPartition:
    """One partition: where the live group is, where the temporary group starts, the log.

    ``live`` is the live group's committed offset when planned (None: none); ``start`` the
    temporary group's first offset; ``missing`` offsets below the log start the request
    reached (gone from Kafka; only with ``--allow-gaps``).
    """

    topic: str
    partition: int
    live: int | None
    start: int
    low: int
    high: int
    method: str
    missing: int = 0
    notes: tuple[str, ...] = ()

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def reread(self) -> int:
        """Records the temporary side reads to reach the end of the log as it is now."""
        return max(0, self.high - self.start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "live": self.live,
            "start": self.start,
            "low": self.low,
            "high": self.high,
            "method": self.method,
            "missing": self.missing,
            "reread": self.reread,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlannedPartition:
        return cls(
            topic=str(d["topic"]),
            partition=int(d["partition"]),
            live=None if d.get("live") is None else int(d["live"]),
            start=int(d["start"]),
            low=int(d["low"]),
            high=int(d["high"]),
            method=str(d.get("method", "")),
            missing=int(d.get("missing", 0)),
            notes=tuple(d.get("notes", ())),
        )


@dataclass(frozen=True)
class ReconsumePlan:
    """A whole reconsume: the groups, the mode, how the start was asked for, the partitions."""

    reconsume_id: str
    live_group: str
    mode: ReconsumeMode
    start: Mapping[str, Any]
    partitions: tuple[PlannedPartition, ...]
    allow_gaps: bool = False
    idle_handover_s: float = 30.0
    rate: float = DEFAULT_RATE
    notes: tuple[str, ...] = ()
    planned_at: str = ""

    @property
    def temp_group(self) -> str:
        return temp_group_name(self.reconsume_id)

    @property
    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})

    @property
    def start_offsets(self) -> dict[TP, int]:
        return {p.tp: p.start for p in self.partitions}

    @property
    def reread(self) -> int:
        return sum(p.reread for p in self.partitions)

    @property
    def eta_s(self) -> float:
        return self.reread / self.rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "reconsume_id": self.reconsume_id,
            "live_group": self.live_group,
            "temp_group": self.temp_group,
            "mode": self.mode,
            "start": dict(self.start),
            "topics": self.topics,
            "allow_gaps": self.allow_gaps,
            "idle_handover_s": self.idle_handover_s,
            "rate": self.rate,
            "partitions": [p.to_dict() for p in self.partitions],
            "reread": self.reread,
            "eta_s": round(self.eta_s, 1),
            "eta": duration_text(self.eta_s),
            "notes": list(self.notes),
            "planned_at": self.planned_at or datetime.now(UTC).isoformat(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReconsumePlan:
        return cls(
            reconsume_id=str(d["reconsume_id"]),
            live_group=str(d["live_group"]),
            mode=check_mode(str(d["mode"])),
            start=dict(d.get("start", {})),
            partitions=tuple(PlannedPartition.from_dict(p) for p in d["partitions"]),
            allow_gaps=bool(d.get("allow_gaps", False)),
            idle_handover_s=float(d.get("idle_handover_s", 30.0)),
            rate=float(d.get("rate", DEFAULT_RATE)),
            notes=tuple(d.get("notes", ())),
            planned_at=str(d.get("planned_at", "")),
        )
