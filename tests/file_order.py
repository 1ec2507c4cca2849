"""Longest test files first, for ``--dist loadfile``.

xdist's loadfile hands out one file at a time, by default the files with the most tests
first; the long end-to-end files (a few tests of a minute or two each) then start last and
one of them runs alone at the end while the other workers idle. Handing out the longest
first (the classic longest-processing-time rule) keeps the workers' ends close together.
The seconds per file come from a real run (tests/durations.json, written by
scripts/test_durations.py); a file not in it counts as a middling one. The Makefile passes
``--no-loadscope-reorder`` so that xdist keeps this order.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Protocol, TypeVar

DURATIONS = Path(__file__).with_name("durations.json")


def recorded_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except FileNotFoundError:
        return {}


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_Item)


def longest_files_first(items: list[ItemT], seconds: dict[str, float]) -> None:
    """Reorder ``items`` in place: files by recorded seconds, longest first; a file's own
    tests keep their order (module fixtures are set up once per file)."""
    unknown = statistics.median(seconds.values()) if seconds else 0.0
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::", 1)[0], len(first_seen))

    def key(item: ItemT) -> tuple[float, int]:
        path = item.nodeid.split("::", 1)[0]
        return (-seconds.get(path, unknown), first_seen[path])

    items.sort(key=key)  # stable: a file's tests stay in collection order
