"""The frozen, JSON-serializable result of :func:`rewind.kafka.resolve.resolve`.

One :class:`PartitionPlan` per partition (its range, how each bound was found, what is
missing below the log start, notes) and the :class:`ReadPlan` that splits them into chunks
for Spark tasks.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rewind.core.ranges import OffsetRange
from rewind.errors import PlanError

if TYPE_CHECKING:
    pass


Method = Literal["earliest", "latest", "offset", "list-offsets", "search"]


@dataclass(frozen=True)
class PartitionPlan:
    """The resolved window of one partition, with the broker facts it was resolved from.

    ``low`` is the effective low watermark (a declared log start when above the broker's),
    ``high`` the high watermark from a fetch response, ``listed_high`` what ListOffsets
    ``latest`` said. ``missing_below_low`` is the part of the window no longer in Kafka.
    """

    topic: str
    partition: int
    low: int
    high: int
    listed_high: int
    start: int
    end: int
    missing_below_low: OffsetRange | None = None
    start_method: Method = "earliest"
    end_method: Method = "latest"
    notes: tuple[str, ...] = ()

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "low": self.low,
            "high": self.high,
            "listed_high": self.listed_high,
            "start": self.start,
            "end": self.end,
            "missing_below_low": self.missing_below_low.to_dict() if self.missing_below_low else None,
            "start_method": self.start_method,
            "end_method": self.end_method,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionPlan:
        missing = data.get("missing_below_low")
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            low=int(data["low"]),
            high=int(data["high"]),
            listed_high=int(data["listed_high"]),
            start=int(data["start"]),
            end=int(data["end"]),
            missing_below_low=OffsetRange.from_dict(missing) if missing else None,
            start_method=data["start_method"],
            end_method=data["end_method"],
            notes=tuple(str(n) for n in data.get("notes", ())),
        )


@dataclass(frozen=True)
class ReadPlan:
    """Per-partition ranges in (topic, partition) order, and what was learnt resolving them."""

    partitions: tuple[PartitionPlan, ...]
    notes: tuple[str, ...] = ()

    def ranges(self) -> list[OffsetRange]:
        return [p.range for p in self.partitions]

    def missing(self) -> list[OffsetRange]:
        """Parts of the window that are no longer in Kafka (below the low watermark)."""
        return [p.missing_below_low for p in self.partitions if p.missing_below_low is not None]

    @property
    def total_offsets(self) -> int:
        """Offsets covered by the ranges: an upper bound of the records (markers take offsets)."""
        return sum(p.end - p.start for p in self.partitions)

    def chunks(
        self, max_records_per_partition: int | None = None, min_partitions: int | None = None
    ) -> list[OffsetRange]:
        """Ranges cut into Spark tasks, as Spark's Kafka source cuts them.

        Each non-empty range is divided evenly into ``ceil(size / max_records)`` pieces; then,
        while there are fewer pieces than ``min_partitions``, the range with the biggest
        pieces gets one piece more (pieces of one offset are not split). Empty ranges give no
        chunk. The result covers the ranges exactly, in (topic, partition, start) order.
        """
        if max_records_per_partition is not None and max_records_per_partition <= 0:
            raise PlanError(
                f"maxRecordsPerPartition must be positive, got {max_records_per_partition}",
                option="maxRecordsPerPartition",
            )
        if min_partitions is not None and min_partitions <= 0:
            raise PlanError(f"minPartitions must be positive, got {min_partitions}", option="minPartitions")
        ranges = [r for r in self.ranges() if r.size > 0]
        pieces = [
            math.ceil(r.size / max_records_per_partition) if max_records_per_partition else 1 for r in ranges
        ]
        if min_partitions is not None:
            heap = [(-math.ceil(r.size / k), i) for i, (r, k) in enumerate(zip(ranges, pieces, strict=True))]
            heapq.heapify(heap)
            count = sum(pieces)
            while count < min_partitions and heap:
                neg_size, i = heapq.heappop(heap)
                if -neg_size <= 1:
                    break
                pieces[i] += 1
                count += 1
                heapq.heappush(heap, (-math.ceil(ranges[i].size / pieces[i]), i))
        return [chunk for r, k in zip(ranges, pieces, strict=True) for chunk in _divide(r, k)]

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "partitions": [p.to_dict() for p in self.partitions], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadPlan:
        if data.get("version") != 1:
            raise PlanError(f"unknown read plan version {data.get('version')!r}; this Rewind reads version 1")
        return cls(
            tuple(PartitionPlan.from_dict(p) for p in data["partitions"]),
            tuple(str(n) for n in data.get("notes", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> ReadPlan:
        return cls.from_dict(json.loads(text))


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``parts`` consecutive pieces of ``r`` whose sizes differ by at most one."""
    base, extra = divmod(r.size, parts)
    out: list[OffsetRange] = []
    lo = r.start
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, lo, hi))
        lo = hi
    return out
