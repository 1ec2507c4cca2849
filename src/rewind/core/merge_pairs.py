"""Merge decisions for one run row meeting one live row, in numpy.

Most contested rows of a repair are a key the run writes once and live holds once: the rules of
:mod:`rewind.core.merge` then reduce to comparing two rows' lineage, which numpy does for all
pairs at once without the sort and join of the general path (measured: most of the decisions'
time). A pair whose outcome needs the rows' values (the same source time across partitions: a
tie, told apart by the values or by the offsets) is left to the general path, as are keys
either side writes twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.core.columns import SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TIMESTAMP, SOURCE_TOPIC

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from rewind.core.merge_policy import MergePolicy

APPLIED, REJECTED_STALE, SUPERSEDED, UNDECIDED = 0, 1, 2, 3
_NEVER = -(2**62)
"""Source time of a row without one (as :mod:`rewind.core.merge` orders it)."""


def _lineage(table: pa.Table, at: np.ndarray) -> tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray]:
    """Source time (µs), topic, partition and offset of the rows ``at``, nulls filled as the
    general path fills them."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    part = table.select([SOURCE_TIMESTAMP, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET]).take(pa.array(at))
    ts = part.column(0)
    if pa.types.is_timestamp(ts.type):
        ts = pc.cast(pc.cast(ts, pa.timestamp("us", tz="UTC")), pa.int64())
    return (
        pc.fill_null(ts.cast(pa.int64()), _NEVER).to_numpy(),
        pc.fill_null(part.column(1).cast(pa.string()), "").combine_chunks(),
        pc.fill_null(part.column(2).cast(pa.int64()), -1).to_numpy(),
        pc.fill_null(part.column(3).cast(pa.int64()), -1).to_numpy(),
    )


def decide_pairs(
    run: pa.Table, live: pa.Table, run_at: np.ndarray, live_at: np.ndarray, policy: MergePolicy
) -> np.ndarray:
    """The decision for each pair (``run_at[i]`` of the run meets ``live_at[i]`` of live, the
    only row of its key on either side): :data:`APPLIED`, :data:`REJECTED_STALE`,
    :data:`SUPERSEDED`, or :data:`UNDECIDED` (for the general path)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow.compute as pc

    ts, topic, part, off = _lineage(run, run_at)
    lts, ltopic, lpart, loff = _lineage(live, live_at)
    out = np.full(len(run_at), APPLIED, dtype=np.int8)
    stale = np.zeros(len(run_at), dtype=bool)
    if policy.cut_time_us is not None:
        stale |= lts >= policy.cut_time_us
    if policy.cut_offsets is not None:
        cut = np.full(len(live_at), np.inf)
        names = ltopic.to_numpy(zero_copy_only=False)
        for t, p in {(str(t), int(p)) for t, p in zip(names, lpart, strict=True)}:
            found = policy.cut_offsets.get((t, p))
            if found is not None:
                cut[(names == t) & (lpart == p)] = found
        stale |= loff >= cut
    out[stale] = REJECTED_STALE
    open_ = ~stale
    how = policy.on_collision
    if how == "prefer-live":
        out[open_] = SUPERSEDED
    elif how in ("latest-event-time", "latest-offset"):
        later, same = ts > lts, ts == lts
        if how == "latest-offset":
            same_tp = pc.equal(topic, ltopic).to_numpy(zero_copy_only=False) & (part == lpart)
            later = np.where(same_tp, off >= loff, later)
            same &= ~same_tp
        out[open_ & ~later & ~same] = SUPERSEDED
        out[open_ & same] = UNDECIDED
    return out
