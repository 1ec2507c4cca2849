"""Work units: the chunks of Kafka partitions a run is made of, and their counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewind.core.ranges import OffsetRange


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
