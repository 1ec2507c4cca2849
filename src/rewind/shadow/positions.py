"""Where v2 is per partition: the unit ranges its sink committed (history units and tail batches).

A unit id is its range (``topic/partition/start-end``), recorded by the sink in the same
transaction as the unit's rows, so these ranges are exactly what reached v2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rewind.core.windows import TP


@dataclass(frozen=True)
class Coverage:
    """The committed ranges of one partition, merged; ``overlaps`` lists ranges committed twice."""

    topic: str
    partition: int
    ranges: tuple[tuple[int, int], ...]
    overlaps: tuple[tuple[int, int], ...]

    @property
    def end(self) -> int:
        """The end of the first contiguous run of ranges: every offset below it is in v2."""
        return self.ranges[0][1] if self.ranges else 0

    @property
    def start(self) -> int:
        return self.ranges[0][0] if self.ranges else 0


def parse_unit(unit_id: str) -> tuple[str, int, int, int]:
    topic, partition, span = unit_id.rsplit("/", 2)
    start, end = span.split("-")
    return topic, int(partition), int(start), int(end)


def coverage(unit_ids: Iterable[str]) -> dict[TP, Coverage]:
    """Per partition, the committed ranges merged where they touch, and any that overlap."""
    by_tp: dict[TP, list[tuple[int, int]]] = {}
    for uid in unit_ids:
        if uid.count("/") < 2:  # not a range: a folded history's own unit (its ranges are named beside it)
            continue
        topic, partition, start, end = parse_unit(uid)
        by_tp.setdefault((topic, partition), []).append((start, end))
    out = {}
    for tp, spans in by_tp.items():
        merged: list[list[int]] = []
        overlaps: list[tuple[int, int]] = []
        for start, end in sorted(spans):
            if merged and start < merged[-1][1]:
                overlaps.append((start, min(end, merged[-1][1])))
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        out[tp] = Coverage(tp[0], tp[1], tuple((a, b) for a, b in merged), tuple(overlaps))
    return out
