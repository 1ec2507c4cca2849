"""The merge policy: how a run's rows meet live's (the spec's ``merge:`` with its cut line resolved).

A module of its own so that :mod:`rewind.core.merge` (the general path) and
:mod:`rewind.core.merge_pairs` (the numpy path it calls) both read it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

OnCollision = Literal["prefer-live", "prefer-backfill", "latest-event-time", "latest-offset"]


@dataclass(frozen=True)
class MergePolicy:
    """The spec's ``merge:`` with its cut line resolved (a group's offsets read at plan time)."""

    on_collision: OnCollision = "latest-event-time"
    ambiguous: Literal["route", "latest-offset"] = "latest-offset"
    cut_time_us: int | None = None
    """Microseconds since the epoch (the lineage time's unit)."""
    cut_offsets: Mapping[tuple[str, int], int] | None = None

    @property
    def has_cut(self) -> bool:
        return self.cut_time_us is not None or self.cut_offsets is not None
