"""Offsets a plan counted on that left Kafka before the run read them.

A plan resolves its window against the log as it was; retention (or DeleteRecords) may move
a partition's log start past the start of units that have not run yet. Reading them then
fails deep inside a Spark task with "Offset out of range"; worse, a broker that answers from
the new log start would hand back fewer records than the unit spans. So before each wave the
runner asks where each partition's log starts now, and a wave with offsets below it fails
with the exact lost ranges, recorded in the ledger, before anything of the wave is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rewind.core.ranges import OffsetRange
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.kafka.resolve import log_starts


class OffsetsLostError(RewindError):
    """Units of the plan start below the partition's current log start."""

    def __init__(self, lost: list[tuple[OffsetRange, int]]) -> None:
        self.lost = lost
        where = ", ".join(f"{r.topic}/{r.partition} [{r.start}, {r.end}) (the log now starts at {low})"
                          for r, low in lost)
        total = sum(r.size for r, _low in lost)
        super().__init__(
            f"{total} offsets of the plan left Kafka after it was made (retention or DeleteRecords): "
            f"{where}; they are lost for this run. Nothing of them was written. Plan again to "
            "see the window as it is now (source.history reads such offsets from an archive)"
        )

    def to_dict(self) -> list[dict[str, Any]]:
        return [{**r.to_dict(), "log_start": low} for r, low in self.lost]


def lost_offsets(
    units: Iterable[WorkUnit], log_start: dict[tuple[str, int], int]
) -> list[tuple[OffsetRange, int]]:
    """Per partition, the offsets of Kafka units below its log start (adjacent units merged)."""
    below: dict[tuple[str, int], list[OffsetRange]] = {}
    for unit in sorted(units):
        low = log_start.get((unit.topic, unit.partition))
        if unit.source != "kafka" or low is None or unit.start >= low:
            continue
        gone = OffsetRange(unit.topic, unit.partition, unit.start, min(unit.end, low))
        ranges = below.setdefault((unit.topic, unit.partition), [])
        if ranges and ranges[-1].end == gone.start:
            ranges[-1] = OffsetRange(gone.topic, gone.partition, ranges[-1].start, gone.end)
        else:
            ranges.append(gone)
    return [(r, log_start[tp]) for tp, ranges in sorted(below.items()) for r in ranges]


def check_still_in_kafka(conf: dict[str, Any], units: list[WorkUnit]) -> None:
    """Raise :class:`OffsetsLostError` when some unit starts below its log start now."""
    partitions = sorted({(u.topic, u.partition) for u in units if u.source == "kafka"})
    if not partitions:
        return
    lost = lost_offsets(units, log_starts(conf, partitions))
    if lost:
        raise OffsetsLostError(lost)
