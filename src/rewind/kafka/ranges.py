"""Half-open offset ranges ``[start, end)`` per topic-partition, and their chunking.

Plain frozen dataclasses: they travel to Spark tasks (pickled) and into plans (JSON).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``start <= o < end`` of one partition. ``end == start`` is an empty range."""

    topic: str
    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"bad offset range {self.topic}/{self.partition} [{self.start}, {self.end})")

    @property
    def size(self) -> int:
        return self.end - self.start

    def split(self, max_records: int) -> list[OffsetRange]:
        """Consecutive chunks of at most ``max_records`` offsets covering this range exactly."""
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if self.size == 0:
            return [self]
        return [
            OffsetRange(self.topic, self.partition, lo, min(lo + max_records, self.end))
            for lo in range(self.start, self.end, max_records)
        ]

    def to_dict(self) -> dict[str, object]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> OffsetRange:
        return cls(str(data["topic"]), int(data["partition"]), int(data["start"]), int(data["end"]))  # type: ignore[call-overload]
