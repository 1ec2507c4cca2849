"""A representative slice of a plan's units, for ``rewind rehearse``.

Each partition (per source: Kafka log or archive) gets a share proportional to its size, and
that share is laid out as ``k`` evenly spaced pieces over the partition's whole window, not
bunched at its start: a window whose records change over time (schema versions, bursts,
malformed stretches) is rehearsed on records from all of it.

Placement, for a partition of ``size`` offsets (its units' ranges end to end, gaps between
units skipped) and a share ``n < size``: ``k = min(pieces, n)`` pieces, piece ``i`` of
length ``n_i`` (``n`` split as evenly as integers allow) starts at position
``floor(i * (size - n) / (k - 1)) + n_0 + ... + n_{i-1}``: the first piece starts at the
partition's first offset, the last ends at its last, and pieces never overlap (the free
space ``size - n`` is spread between them). A share ``n >= size`` takes the whole partition.
"""

from __future__ import annotations

import math
from itertools import groupby

from rewind.core.units import WorkUnit

PIECES_PER_PARTITION = 4


class SliceError(ValueError):
    """A fraction or record count that does not describe a slice (one line)."""


def shares(sizes: list[int], *, fraction: float | None = None, records: int | None = None) -> list[int]:
    """Records per partition: ``ceil(fraction * size)`` each, or ``records`` split in proportion to
    the sizes by largest remainder (exactly ``records`` in total, each at most its size)."""
    if (fraction is None) == (records is None):
        raise SliceError("give --fraction or --records, not both and not neither")
    if fraction is not None:
        if not 0 < fraction <= 1:
            raise SliceError(f"--fraction {fraction} is outside (0, 1]; a rehearsal reads a share, like 0.01")
        return [min(size, math.ceil(fraction * size)) for size in sizes]
    assert records is not None
    if records <= 0:
        raise SliceError(f"--records {records} must be positive")
    total = sum(sizes)
    if records >= total:
        return list(sizes)
    exact = [records * size / total for size in sizes]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(sizes)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: records - sum(out)]:
        out[i] += 1
    return out


def positions(size: int, n: int, pieces: int = PIECES_PER_PARTITION) -> list[tuple[int, int]]:
    """``[start, end)`` positions (0-based, within ``size``) of the pieces of a share ``n``."""
    if n <= 0:
        return []
    if n >= size:
        return [(0, size)]
    k = min(pieces, n)
    lengths = [n // k + (1 if i < n % k else 0) for i in range(k)]
    free = size - n
    out, taken = [], 0
    for i, length in enumerate(lengths):
        start = (i * free) // (k - 1) + taken if k > 1 else 0
        out.append((start, start + length))
        taken += length
    return out


def slice_units(
    units: tuple[WorkUnit, ...] | list[WorkUnit],
    *,
    fraction: float | None = None,
    records: int | None = None,
    pieces: int = PIECES_PER_PARTITION,
) -> tuple[WorkUnit, ...]:
    """The slice of ``units``: per (topic, partition, source), evenly spaced pieces of its share."""
    key = lambda u: (u.topic, u.partition, u.source)  # noqa: E731
    groups = [list(g) for _, g in groupby(sorted(units, key=lambda u: (key(u), u.start)), key=key)]
    sizes = [sum(u.end - u.start for u in g) for g in groups]
    out: list[WorkUnit] = []
    for group, n in zip(groups, shares(sizes, fraction=fraction, records=records), strict=True):
        size = sum(u.end - u.start for u in group)
        for lo, hi in positions(size, n, pieces):
            out.extend(_map(group, lo, hi))
    return tuple(sorted(out))


def _map(group: list[WorkUnit], lo: int, hi: int) -> list[WorkUnit]:
    """Positions ``[lo, hi)`` of a partition (its units end to end) as offset ranges."""
    out: list[WorkUnit] = []
    base = 0
    for u in group:
        size = u.end - u.start
        a, b = max(lo, base), min(hi, base + size)
        if a < b:
            start, end = u.start + a - base, u.start + b - base
            if out and out[-1].end == start:  # adjacent units: one piece stays one range
                start = out.pop().start
            out.append(WorkUnit(u.topic, u.partition, start, end, u.source))
        base += size
    return out
