"""Step 3 of a comparison: the first level's cells, put side by side, summed up and decoded.

See :mod:`rewind.verify.compare` for the whole algorithm. A cell is (window flag, time bucket,
category hash, low bits of the row hash ``h``). Per cell and side Spark returns four numbers:

- ``n``: rows;
- ``lo``: the sum of the low 32 bits of ``h`` (an exact integer: it cannot overflow);
- ``xh``: the XOR of ``h``;
- ``xk``: the XOR of the key hash ``kh``.

A cell differs when ``n``, ``lo`` or ``xh`` differ: a missing or extra row changes the count, a
changed row the XOR (a row's hash holds its key, so two keys trading values change it too),
and the 32-bit sum catches what the XOR cancels (one side holding rows a, a, b, b where the
other holds c, c, d, d: both XORs are 0).

Rows that are the same on both sides fall into the same cell and cancel in every number. A
row whose copies differ (a changed value) falls, as two different row hashes, into two cells.
So a differing cell that holds *one* row of the difference ("pure") names it: the count
differs by one, the XORs of the two sides give its row hash and its key hash. Purity is
checked: the differing sum of low halves must equal the low half of the decoded row hash
(for two or more rows it does so by chance once in 2**32). A changed key is named when either
of its two cells is pure. With differences sparse (0.1% of rows, 64 cells per day and
category) nearly every key is named here, and the next step reads only the rows of these
keys, plus whole cells only for the impure ones, instead of whole cells throughout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

MAX_BUCKETS = 5000
"""Time buckets returned for the report (the earliest ones)."""
CELL = ("w", "tb", "cath", "kb")
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
SUMS = ("n_s", "n_r", "lo_s", "lo_r", "xh_s", "xh_r", "xk_s", "xk_r")
Stats = dict[int, tuple[int, int]]
"""Per window flag: (differing cells, rows they hold)."""
Pure = dict[tuple[int, ...], tuple[int, int, int]]
"""Per pure cell (w, tb, cath, kb): what :func:`decode` names in it."""


def per_side(sides: list[DataFrame], bits: int) -> DataFrame:
    """Per cell and side: n, lo, xh, xk (see the module's docstring).

    Each side is grouped on its own and the results put together after: grouping the union of
    both sides would break Spark's generated code at the union, which then hands every row
    over as an object (~15% of the pass in a micro-run at 10M rows).
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    out = []
    for number, side in enumerate(sides):
        kb = F.col("h").bitwiseAND(F.lit((1 << bits) - 1)) if bits < 64 else F.col("h")
        cells = side.groupBy("w", "tb", "cath", kb.alias("kb")).agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.col("h").bitwiseAND(F.lit(_U32))).alias("lo"),
            F.bit_xor("h").alias("xh"),
            F.bit_xor("kh").alias("xk"),
        )
        out.append(cells.withColumn("side", F.lit(number)))
    return out[0].unionByName(out[1])


def side_by_side(table: pa.Table) -> pa.Table:
    """The first level's rows per cell and side (Arrow), as one row per cell with both sides'
    numbers (0 for a side with no row in the cell) and ``differs`` (a boolean): an Arrow join,
    since a loop over the cells in Python cost ~0.1 s per 36k cells."""
    # lazy: avoids pyarrow at import
    import pyarrow.compute as pc

    def side(number: int, suffix: str) -> pa.Table:
        own = table.filter(pc.equal(table.column("side"), number))
        return own.select([*CELL, "n", "lo", "xh", "xk"]).rename_columns(
            [*CELL, *(f"{c}{suffix}" for c in ("n", "lo", "xh", "xk"))]
        )

    both = side(0, "_s").join(side(1, "_r"), keys=list(CELL), join_type="full outer", coalesce_keys=True)
    for name in SUMS:
        both = both.set_column(both.schema.get_field_index(name), name, pc.fill_null(both.column(name), 0))
    differs = pc.or_(
        pc.or_(
            pc.not_equal(both.column("n_s"), both.column("n_r")),
            pc.not_equal(both.column("lo_s"), both.column("lo_r")),
        ),
        pc.not_equal(both.column("xh_s"), both.column("xh_r")),
    )
    return both.append_column("differs", differs)


def checksum(hi: int, lo: int) -> str:
    """A 64-bit sum (from its two 32-bit halves), as 16 hex digits."""
    return f"{((hi << 32) + lo) & _U64:016x}"


def rollup(cells: pa.Table) -> tuple[list[dict[str, Any]], dict[str, int], Stats]:
    """Per time bucket: counts and checksums of both sides, cells and differing cells.

    A bucket's checksum is the sum of its cells' XORs (mod 2**64): equal buckets have equal
    checksums. Also returns, per window flag, the differing cells and the rows they hold.
    ``cells`` is :func:`side_by_side`'s table.
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    def total(table: pa.Table, column: str) -> int:
        return int(pc.sum(table.column(column)).as_py() or 0)

    in_window = cells.filter(pc.equal(cells.column("w"), 1))
    totals = {
        "staging": total(cells, "n_s"),
        "reference": total(cells, "n_r"),
        "staging_in_window": total(in_window, "n_s"),
        "reference_in_window": total(in_window, "n_r"),
    }
    differing = cells.filter(cells.column("differs"))
    # aggregated once, then read column by column: a group-by on threads gives its groups in
    # any order, so two aggregations of the same table need not list them alike
    per_window = differing.group_by("w").aggregate([("w", "count"), ("n_s", "sum"), ("n_r", "sum")])
    stats: Stats = {}
    for w, n, n_s, n_r in zip(
        *(per_window.column(c).to_pylist() for c in ("w", "w_count", "n_s_sum", "n_r_sum")), strict=True
    ):
        stats[w] = (n, n_s + n_r)
    thirty_two = pa.scalar(32, pa.int64())
    with_halves = cells
    for s in ("s", "r"):  # the XORs summed exactly as 32-bit halves, wrapped to 64 bits at the end
        xh = cells.column(f"xh_{s}")
        with_halves = with_halves.append_column(f"ch_{s}", pc.shift_right(xh, thirty_two))
        with_halves = with_halves.append_column(f"cl_{s}", pc.bit_wise_and(xh, pa.scalar(_U32, pa.int64())))
    sums = ("n_s", "n_r", "ch_s", "cl_s", "ch_r", "cl_r", "differs")
    per_bucket = (
        with_halves.group_by("tb")
        .aggregate([(c, "sum") for c in sums] + [("tb", "count")])
        .sort_by("tb")
        .slice(0, MAX_BUCKETS)
    )
    out = []
    for m in per_bucket.to_pylist():
        out.append(
            {
                "tb": m["tb"],
                "staging_rows": m["n_s_sum"],
                "reference_rows": m["n_r_sum"],
                "staging_checksum": checksum(m["ch_s_sum"], m["cl_s_sum"]),
                "reference_checksum": checksum(m["ch_r_sum"], m["cl_r_sum"]),
                "equal": m["differs_sum"] == 0,
                "cells": m["tb_count"],
                "differing_cells": m["differs_sum"],
            }
        )
    return out, totals, stats


def decode(cell: dict[str, int]) -> tuple[int, int, int] | None:
    """(key hash, row hash, side: 1 staging, -1 reference) of the one row of the difference a
    differing cell holds, or None when it holds more than one (see the module's docstring)."""
    dn = cell["n_s"] - cell["n_r"]
    if dn not in (1, -1):
        return None
    h = (cell["xh_s"] ^ cell["xh_r"]) & _U64
    if dn * (cell["lo_s"] - cell["lo_r"]) != h & _U32:
        return None
    return _signed(cell["xk_s"] ^ cell["xk_r"]), _signed(h), dn


def _signed(value: int) -> int:
    """A 64-bit pattern as Spark's (signed) long."""
    value &= _U64
    return value - (1 << 64) if value >> 63 else value


def unexplained(rows: pa.Table, pure: Pure, bits: int) -> list[tuple[int, ...]]:
    """The pure cells whose difference the fetched rows do not account for (a cell taken for pure
    that was not): the fetched rows of each pure cell (the rows of the keys decoded) must differ
    between the sides exactly as the cell does. ``rows`` holds w, tb, cath, kh, h and side."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.array(sorted({kh for kh, _, _ in pure.values()}), pa.int64())
    mine = rows.filter(pc.is_in(rows.column("kh"), value_set=keys))
    seen: dict[tuple[int, ...], list[int]] = {}
    mask = (1 << bits) - 1
    columns = [mine.column(c).to_pylist() for c in ("w", "tb", "cath", "h", "side")]
    for w, tb, cath, h, side in zip(*columns, strict=True):
        at: tuple[int, ...] = (w, tb, cath, h if bits >= 64 else h & mask)
        if at in pure:
            count, xor = seen.setdefault(at, [0, 0])
            seen[at] = [count + (1 if side == 0 else -1), xor ^ h]
    out: list[tuple[int, ...]] = []
    for cell, (_, h, dn) in pure.items():
        count, xor = seen.get(cell, [0, 0])
        if count != dn or (xor & _U64) != (h & _U64):
            out.append(cell)
    return out
