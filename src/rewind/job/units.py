"""Work units: the chunks of Kafka partitions a run is made of, and their counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rewind.kafka.ranges import OffsetRange


@dataclass(frozen=True, order=True)
class WorkUnit:
    """One chunk ``[start, end)`` of one partition; its id is stable across plans and runs.

    ``source`` says where its records are read: the Kafka log, or the lake archive (history
    sources read offsets below the log start from the archive).
    """

    topic: str
    partition: int
    start: int
    end: int
    source: str = "kafka"

    @property
    def id(self) -> str:
        return f"{self.topic}/{self.partition}/{self.start}-{self.end}"

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "start": self.start,
            "end": self.end,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkUnit:
        return cls(
            str(data["topic"]),
            int(data["partition"]),
            int(data["start"]),
            int(data["end"]),
            str(data.get("source", "kafka")),
        )


@dataclass
class UnitCounts:
    """What one unit did. ``records_read == emitted + quarantined + filtered`` must hold."""

    records_read: int = 0
    emitted: int = 0
    rows_out: int = 0
    quarantined: int = 0
    filtered: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def conserved(self) -> bool:
        return self.records_read == self.emitted + self.quarantined + self.filtered

    def add(self, other: UnitCounts) -> None:
        self.records_read += other.records_read
        self.emitted += other.emitted
        self.rows_out += other.rows_out
        self.quarantined += other.quarantined
        self.filtered += other.filtered
        for reason, count in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + count

    def to_dict(self) -> dict[str, Any]:
        return {
            "records_read": self.records_read,
            "emitted": self.emitted,
            "rows_out": self.rows_out,
            "quarantined": self.quarantined,
            "filtered": self.filtered,
            "reasons": dict(self.reasons),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnitCounts:
        return cls(
            int(data.get("records_read", 0)),
            int(data.get("emitted", 0)),
            int(data.get("rows_out", 0)),
            int(data.get("quarantined", 0)),
            int(data.get("filtered", 0)),
            {str(k): int(v) for k, v in dict(data.get("reasons") or {}).items()},
        )
