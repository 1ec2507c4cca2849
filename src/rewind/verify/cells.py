"""Steps 3 and 4 of a comparison: cell checksums, then the keys that differ in the differing cells.

See :mod:`rewind.verify.compare` for the whole algorithm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rewind.verify.prepare import NULL_CATEGORY
from rewind.verify.rules import Rules
from rewind.verify.spark_util import Timer

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FIRST_BITS = 8
"""Key-hash bits of the first level: 256 cells per time bucket."""
MAX_BUCKETS = 5000
"""Time buckets returned for the report (the earliest ones)."""
MAX_CATEGORIES = 30
BROADCAST_CELLS = 1_000_000
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
Stats = dict[int, tuple[int, int]]
"""Per window flag: (differing cells, rows they hold)."""


class CellSearch:
    """Steps 3 and 4: the cells, then the keys that differ in them, down to the rows to drill."""

    def __init__(self, spark: SparkSession, wide: DataFrame, rules: Rules, timer: Timer) -> None:
        self.spark, self.wide, self.rules, self.timer = spark, wide, rules, timer
        self.keys = cell_keys(rules)
        self.levels: list[dict[str, Any]] = []
        self.cached: list[DataFrame] = []
        self.first_stats: Stats = {}
        self.first_bits = 0
        self.differing: list[dict[str, int]] = []

    def keep(self, df: DataFrame) -> DataFrame:
        df = df.cache()
        self.cached.append(df)
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()

    def first_level(self, bits: int) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
        """One pass: per cell and side a count and hash sums, brought to the driver (cells are few)."""
        with self.timer.step("level 1"):
            narrow = self.wide.select(*self.keys, "kh", "h", "side")
            rows = _per_side(narrow, self.keys, bits).toArrow().to_pylist()
            cells = _side_by_side(rows)
            buckets, totals, stats = _rollup(cells)
            self.differing = [c for c in cells if _differs(c)]
        with self.timer.step("categories"):
            categories = _category_rollup(self.wide, self.rules)
        self.first_bits, self.first_stats = bits, stats
        self.levels.append(_level(1, bits, stats))
        return buckets, totals, categories

    def rows_that_differ(self) -> tuple[DataFrame, dict[str, Any] | None]:
        """Both sides' rows of the keys that differ (a sample of them beyond ``drill_rows``).

        The second level reads the narrow rows (cell, key hash, row hash) of the differing
        cells only, picked by their exact cell number, and groups them by whole key hash:
        the keys that differ. A last pass fetches the full rows of those keys only (a hash
        set of key hashes, then an exact broadcast semi-join), for the drill-down.
        """
        from pyspark.sql import functions as F

        keys = self.keys
        with self.timer.step("level 2"):
            narrow = _select(
                self.spark,
                self.wide.select(*keys, "kh", "h", "side"),
                self.differing,
                self.first_bits,
                self.rules,
            )
            per_key = self.keep(_cells(narrow, keys, KEY_BITS))
            differing = per_key.where(_cell_differs())
            stats: Stats = {
                int(row["w"]): (int(row["cells"]), int(row["rows"]))
                for row in differing.groupBy("w")
                .agg(F.count(F.lit(1)).alias("cells"), F.sum(F.col("n_s") + F.col("n_r")).alias("rows"))
                .collect()
            }
        self.levels.append(_level(2, KEY_BITS, stats))
        differing, sampled = _limit_changes(differing, stats, self.rules)
        with self.timer.step("fetch"):
            n_keys = sum(c for c, _ in stats.values())
            chosen = differing.select(*keys, F.col("kb").alias("kh"))
            rows = self.wide
            if n_keys <= PREFILTER_VALUES:
                hashes = sorted({int(row[0]) for row in chosen.select("kh").collect()})
                rows = rows.where(_in_set("kh", hashes)) if hashes else rows.limit(0)
            if n_keys <= BROADCAST_CELLS:
                chosen = F.broadcast(chosen)
            rows = rows.join(chosen, [*keys, "kh"], "left_semi")
        return rows, sampled


def _level(number: int, bits: int, stats: dict[int, tuple[int, int]]) -> dict[str, Any]:
    return {
        "level": number,
        "bits": bits,
        "differing_cells": sum(c for c, _ in stats.values()),
        "rows": sum(n for _, n in stats.values()),
    }


def first_bits(staging: DataFrame, rules: Rules) -> int:
    """Key-hash bits of the first level: coarse cells, so that a pass that finds nothing is cheap.

    With time buckets: 256 cells per bucket (the category is not part of a cell). Without: sized on
    staging's row count (about 1,000 rows per cell), since all rows share one bucket.
    """
    if rules.bucket_column is not None:
        return FIRST_BITS
    rows = staging.count()
    return max(FIRST_BITS, min(18, math.ceil(math.log2(max(rows, 1) / 1000))))


def _in_set(expression: str, values: list[int]) -> Column:
    """``expression IN (values)`` as one SQL text: Spark makes it a hash-set lookup, and one
    parse costs far less than a literal per value through py4j (``Column.isin``)."""
    from pyspark.sql import functions as F

    return F.expr(f"{expression} IN ({', '.join(str(v) for v in values)})")


def _cell_id(bits: int, rules: Rules) -> str:
    """A cell as one exact long (SQL): its bucket's number, window flag and key-hash bits.

    Buckets are multiples of the bucket length (or all 0), so the division is exact; the
    null bucket's number, about -2^62 / 3.6e9, leaves room for the shift.
    """
    return f"(tb div {rules.bucket_us}) * {1 << (bits + 1)} + w * {1 << bits} + (kh & {(1 << bits) - 1})"


def _select(
    spark: SparkSession, wide: DataFrame, cells: list[dict[str, int]], bits: int, rules: Rules
) -> DataFrame:
    """The rows of ``wide`` in ``cells`` (their ``bits`` low bits of the key hash), one pass.

    Each row's cell number is looked up in a hash set (up to :data:`PREFILTER_VALUES`
    cells) or a broadcast table of the cell numbers: exact either way.
    """
    from pyspark.sql import functions as F

    ids = sorted({(c["tb"] // rules.bucket_us << (bits + 1)) + (c["w"] << bits) + c["kb"] for c in cells})
    cell = F.expr(_cell_id(bits, rules))
    if len(ids) <= PREFILTER_VALUES:
        return wide.where(cell.isin(ids) if len(ids) < 10 else _in_set(_cell_id(bits, rules), ids))
    table = spark.createDataFrame([(i,) for i in ids], "_cell bigint")
    if len(ids) <= BROADCAST_CELLS:
        table = F.broadcast(table)
    return wide.withColumn("_cell", cell).join(table, ["_cell"], "left_semi").drop("_cell")


def cell_keys(rules: Rules) -> list[str]:
    """What a cell is, besides its key-hash bits: window flag and time bucket."""
    # the category is not part of a cell: grouping by a string costs far more per row than by
    # fixed-width numbers; its counts come from an aggregation of their own
    return ["w", "tb"]


def _per_side(narrow: DataFrame, keys: list[str], bits: int) -> DataFrame:
    """Per cell (keys, kb) and side: row count and hash sums (two 32-bit halves, so that the
    sums cannot overflow under ANSI SQL). The per-row work is a hash aggregate on fixed-width
    keys with no condition per sum."""
    from pyspark.sql import functions as F

    kb = F.col("kh").bitwiseAND(F.lit((1 << bits) - 1)) if bits < 64 else F.col("kh")
    return narrow.groupBy(*keys, kb.alias("kb"), "side").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.shiftright(F.col("h"), 32)).alias("hi"),
        F.sum(F.col("h").bitwiseAND(F.lit(_U32))).alias("lo"),
    )


def _cells(narrow: DataFrame, keys: list[str], bits: int) -> DataFrame:
    """:func:`_per_side`, the sides put side by side (in Spark: for the many cells of the second level)."""
    from pyspark.sql import functions as F

    staging, reference = F.col("side") == 0, F.col("side") == 1

    def total(cond: Column, value: str) -> Column:
        return F.coalesce(F.sum(F.when(cond, F.col(value))), F.lit(0).cast("long"))

    return (
        _per_side(narrow, keys, bits)
        .groupBy(*keys, "kb")
        .agg(
            total(staging, "n").alias("n_s"),
            total(reference, "n").alias("n_r"),
            total(staging, "hi").alias("hi_s"),
            total(staging, "lo").alias("lo_s"),
            total(reference, "hi").alias("hi_r"),
            total(reference, "lo").alias("lo_r"),
        )
    )


def _side_by_side(rows: list[dict[str, Any]]) -> list[dict[str, int]]:
    """The first level's rows per cell and side, as one row per cell (on the driver)."""
    cells: dict[tuple[int, int, int], dict[str, int]] = {}
    for row in rows:
        cell = (int(row["w"]), int(row["tb"]), int(row["kb"]))
        out = cells.get(cell)
        if out is None:
            out = cells[cell] = {"w": cell[0], "tb": cell[1], "kb": cell[2], **dict.fromkeys(_SUMS, 0)}
        suffix = "_s" if row["side"] == 0 else "_r"
        out["n" + suffix], out["hi" + suffix], out["lo" + suffix] = (
            int(row["n"]),
            int(row["hi"]),
            int(row["lo"]),
        )
    return list(cells.values())


_SUMS = ("n_s", "n_r", "hi_s", "lo_s", "hi_r", "lo_r")


def _differs(cell: dict[str, int]) -> bool:
    return cell["n_s"] != cell["n_r"] or cell["hi_s"] != cell["hi_r"] or cell["lo_s"] != cell["lo_r"]


PREFILTER_VALUES = 50_000
"""Up to this many cell hashes also filter the fetch pass as a hash set."""
KEY_BITS = 64
"""The second level's cells are whole key hashes: one cell per key (and window flag, bucket, category)."""


def _cell_differs() -> Column:
    from pyspark.sql import functions as F

    return (
        (F.col("n_s") != F.col("n_r")) | (F.col("hi_s") != F.col("hi_r")) | (F.col("lo_s") != F.col("lo_r"))
    )


def checksum(hi: int, lo: int) -> str:
    """The 64-bit sum of row hashes (from its two 32-bit halves), as 16 hex digits."""
    return f"{((hi << 32) + lo) & _U64:016x}"


def _rollup(cells: list[dict[str, int]]) -> tuple[list[dict[str, Any]], dict[str, int], Stats]:
    """Per time bucket: counts and checksums of both sides, cells and differing cells.

    Also returns, per window flag, the differing cells and the rows they hold.
    """
    stats: Stats = {}
    merged: dict[int, dict[str, int]] = {}
    totals = {"staging": 0, "reference": 0, "staging_in_window": 0, "reference_in_window": 0}
    for c in cells:
        m = merged.setdefault(c["tb"], dict.fromkeys((*_SUMS, "cells", "differing_cells"), 0))
        for k in _SUMS:
            m[k] += c[k]
        m["cells"] += 1
        if _differs(c):
            m["differing_cells"] += 1
            n, held = stats.get(c["w"], (0, 0))
            stats[c["w"]] = (n + 1, held + c["n_s"] + c["n_r"])
        totals["staging"] += c["n_s"]
        totals["reference"] += c["n_r"]
        if c["w"] == 1:
            totals["staging_in_window"] += c["n_s"]
            totals["reference_in_window"] += c["n_r"]
    out = []
    for tb, m in sorted(merged.items())[:MAX_BUCKETS]:
        out.append(
            {
                "tb": tb,
                "staging_rows": m["n_s"],
                "reference_rows": m["n_r"],
                "staging_checksum": checksum(m["hi_s"], m["lo_s"]),
                "reference_checksum": checksum(m["hi_r"], m["lo_r"]),
                "equal": m["differing_cells"] == 0,
                "cells": m["cells"],
                "differing_cells": m["differing_cells"],
            }
        )
    return out, totals, stats


def _category_rollup(wide: DataFrame, rules: Rules) -> list[dict[str, Any]]:
    """Rows of each side per category value (the largest ones): a pass reading the category
    column (and the scope's) only."""
    from pyspark.sql import functions as F

    if rules.category is None:
        return []
    rows = (
        wide.groupBy("cat")
        .agg(
            F.sum(F.when(F.col("side") == 0, 1).otherwise(0)).alias("n_s"),
            F.sum(F.when(F.col("side") == 1, 1).otherwise(0)).alias("n_r"),
        )
        .orderBy(F.desc(F.col("n_s") + F.col("n_r")), "cat")
        .limit(MAX_CATEGORIES + 1)
        .collect()
    )
    return [
        {
            "value": None if row["cat"] == NULL_CATEGORY else row["cat"],
            "n_s": int(row["n_s"]),
            "n_r": int(row["n_r"]),
        }
        for row in rows
    ]


def _limit_changes(
    differing: DataFrame, stats: dict[int, tuple[int, int]], rules: Rules
) -> tuple[DataFrame, dict[str, Any] | None]:
    """Keep every differing cell outside the window; sample those inside it beyond ``drill_rows``.

    Differences outside the window (and all of them in match mode) are failures and are
    always drilled in full; inside the repaired window they are the expected changes, of
    which a sample of cells is enough to show what changed.
    """
    from pyspark.sql import functions as F

    cells_in, rows_in = stats.get(1, (0, 0))
    if rows_in <= rules.drill_rows:
        return differing, None
    share = rules.drill_rows / rows_in
    keep = F.xxhash64("tb", "kb").bitwiseAND(F.lit(1023)) < F.lit(max(1, int(1024 * share)))  # whole cells
    return differing.where((F.col("w") == 0) | keep), {
        "cells": cells_in,
        "rows": rows_in,
        "share": round(max(1, int(1024 * share)) / 1024, 4),
    }
