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


def group_for_tasks(
    chunks: list[OffsetRange], ranges_per_task: int, min_tasks: int | None = None
) -> list[list[OffsetRange]]:
    """Group chunks into tasks of at most ``ranges_per_task`` chunks of distinct partitions.

    One consumer can read several partitions at once but not two chunks of the same one,
    so a task never holds two chunks of a partition. Tasks are made layer by layer: all
    first chunks of every partition, then all second chunks, and so on, so that the tasks,
    in order, return each partition's records in offset order (as Spark's Kafka source
    does). At least ``min_tasks`` tasks are made when there are that many chunks; within a
    layer, chunks are spread over its tasks biggest first. Deterministic for the same input.
    """
    if ranges_per_task <= 0:
        raise ValueError("ranges_per_task must be positive")
    work = sorted(c for c in chunks if c.size > 0)
    if not work:
        return []
    layers: list[list[OffsetRange]] = []
    index: dict[tuple[str, int], int] = {}
    for chunk in work:  # sorted by (topic, partition, start): chunk j of a partition → layer j
        j = index.get((chunk.topic, chunk.partition), 0)
        index[(chunk.topic, chunk.partition)] = j + 1
        if j == len(layers):
            layers.append([])
        layers[j].append(chunk)
    wanted = min(min_tasks or 1, len(work))
    per_task = ranges_per_task
    while per_task > 1 and sum(-(-len(layer) // per_task) for layer in layers) < wanted:
        per_task -= 1
    tasks: list[list[OffsetRange]] = []
    for layer in layers:
        count = -(-len(layer) // per_task)
        group: list[list[OffsetRange]] = [[] for _ in range(count)]
        loads = [0] * count
        for chunk in sorted(layer, key=lambda c: (-c.size, c.topic, c.partition)):
            fits = [i for i in range(count) if len(group[i]) < per_task]
            best = min(fits, key=lambda i: (loads[i], i))
            group[best].append(chunk)
            loads[best] += chunk.size
        tasks.extend(sorted(g) for g in group if g)
    return tasks
