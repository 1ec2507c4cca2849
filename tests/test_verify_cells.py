"""The first level's cells on the driver: both sides put side by side, then summed up per time
bucket (:mod:`rewind.verify.cells`), checked against plain Python sums of the same rows."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from rewind.verify.cells import _rollup, _side_by_side, checksum

CELL = st.tuples(st.integers(0, 1), st.integers(0, 3), st.integers(-2, 2), st.integers(0, 3))
"""(window flag, time bucket, category hash, key-hash bits): few values, so cells collide."""
SUMS = st.tuples(st.integers(1, 50), st.integers(-(2**31), 2**31 - 1), st.integers(0, 2**32 - 1))
"""A side's (rows, sum of the hashes' high halves, sum of their low halves) in one cell."""


def level_one(staging: dict[Any, Any], reference: dict[Any, Any]) -> pa.Table:
    """The first level's rows as Spark returns them: one per cell and side that has rows."""
    rows = [
        {"w": w, "tb": tb, "cath": cath, "kb": kb, "side": side, "n": n, "hi": hi, "lo": lo}
        for side, cells in ((0, staging), (1, reference))
        for (w, tb, cath, kb), (n, hi, lo) in cells.items()
    ]
    narrow = {"w": pa.int32(), "side": pa.int32()}
    names = ("w", "tb", "cath", "kb", "side", "n", "hi", "lo")
    schema = pa.schema([(c, narrow.get(c, pa.int64())) for c in names])
    return pa.Table.from_pylist(rows, schema=schema)


@given(st.dictionaries(CELL, SUMS, max_size=12), st.dictionaries(CELL, SUMS, max_size=12), st.booleans())
def test_cells_side_by_side_and_per_bucket_match_plain_sums(
    staging: dict[Any, Any], reference: dict[Any, Any], copy: bool
) -> None:
    if copy:  # the common case: both sides equal, nothing differs
        reference = dict(staging)
    cells = _side_by_side(level_one(staging, reference))
    zero = (0, 0, 0)
    every = set(staging) | set(reference)
    assert cells.num_rows == len(every)
    differing = {c for c in every if staging.get(c, zero) != reference.get(c, zero)}
    rows = cells.to_pylist()
    assert {(r["w"], r["tb"], r["cath"], r["kb"]) for r in rows if r["differs"]} == differing
    for r in rows:
        cell = (r["w"], r["tb"], r["cath"], r["kb"])
        assert (r["n_s"], r["hi_s"], r["lo_s"]) == staging.get(cell, zero)
        assert (r["n_r"], r["hi_r"], r["lo_r"]) == reference.get(cell, zero)

    buckets, totals, stats = _rollup(cells)
    assert totals == {
        "staging": sum(n for n, _, _ in staging.values()),
        "reference": sum(n for n, _, _ in reference.values()),
        "staging_in_window": sum(v[0] for c, v in staging.items() if c[0] == 1),
        "reference_in_window": sum(v[0] for c, v in reference.items() if c[0] == 1),
    }
    assert stats == {
        w: (
            len([c for c in differing if c[0] == w]),
            sum(staging.get(c, zero)[0] + reference.get(c, zero)[0] for c in differing if c[0] == w),
        )
        for w in {c[0] for c in differing}
    }
    assert [b["tb"] for b in buckets] == sorted({c[1] for c in every})
    for b in buckets:
        own = [c for c in every if c[1] == b["tb"]]
        for side, cells_of in (("staging", staging), ("reference", reference)):
            hi = sum(cells_of.get(c, zero)[1] for c in own)
            lo = sum(cells_of.get(c, zero)[2] for c in own)
            assert b[f"{side}_rows"] == sum(cells_of.get(c, zero)[0] for c in own)
            assert b[f"{side}_checksum"] == checksum(hi, lo)
        assert b["cells"] == len(own)
        assert b["differing_cells"] == len([c for c in own if c in differing])
        assert b["equal"] == (b["differing_cells"] == 0)


def test_no_rows_on_either_side() -> None:
    buckets, totals, stats = _rollup(_side_by_side(level_one({}, {})))
    assert (buckets, stats) == ([], {})
    assert set(totals.values()) == {0}
