"""Half-open integer spans ``[start, end)`` as sorted, disjoint lists of tuples.

Plain tuples on purpose: gap lists can hold one entry per transaction of a topic.
"""

from __future__ import annotations

from collections.abc import Iterable

Span = tuple[int, int]


def merge(spans: Iterable[Span]) -> list[Span]:
    """Sorted, disjoint, non-empty spans covering exactly the union of ``spans``."""
    out: list[Span] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def subtract(spans: Iterable[Span], remove: Iterable[Span]) -> list[Span]:
    """The parts of ``spans`` not in ``remove``."""
    cuts = merge(remove)
    out: list[Span] = []
    for start, end in merge(spans):
        at = start
        for c_start, c_end in cuts:
            if c_end <= at:
                continue
            if c_start >= end:
                break
            if c_start > at:
                out.append((at, c_start))
            at = max(at, c_end)
            if at >= end:
                break
        if at < end:
            out.append((at, end))
    return out


def intersect(spans: Iterable[Span], window: Span) -> list[Span]:
    """The parts of ``spans`` inside ``window``."""
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in merge(spans) if min(e, hi) > max(s, lo)]


def total(spans: Iterable[Span]) -> int:
    return sum(e - s for s, e in merge(spans))


def runs(offsets: Iterable[int]) -> list[Span]:
    """Runs of consecutive offsets, from offsets in increasing order."""
    out: list[Span] = []
    for o in offsets:
        if out and o == out[-1][1]:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out
