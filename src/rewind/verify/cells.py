"""Steps 3 and 4 of a comparison: the cells (numbers from :mod:`~rewind.verify.first_level`), then
the keys that differ and their rows.

See :mod:`rewind.verify.compare` for the whole algorithm.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rewind.verify.first_level import CELL, Pure, Stats, decode, per_side, rollup, side_by_side, unexplained
from rewind.verify.prepare import NULL_CATEGORY, truncate_micros
from rewind.verify.rules import Rules
from rewind.verify.spark_util import Timer

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

FIRST_BITS = 8
"""Row-hash bits of the first level: 256 cells per time bucket (64 per bucket and category)."""
MAX_CATEGORIES = 30
BROADCAST_CELLS = 1_000_000
"""Differing cells (or keys) up to this many are joined on as a broadcast table."""
CACHE_ROWS = 4_000_000
"""The rows of the differing cells are cached (read once) when they are at most this many."""
NAME_SAMPLE = 1_000
"""Rows read for the names of the largest categories before a pass that looks for the rest."""
KEY_BITS = 64
"""The second level's cells are whole key hashes: one per key."""
_U32 = 0xFFFFFFFF
_SUMS = ("n_s", "n_r", "hi_s", "lo_s", "hi_r", "lo_r")


class CellSearch:
    """Steps 3 and 4: the cells, then the keys that differ in them, down to the rows to drill."""

    def __init__(self, spark: SparkSession, sides: list[DataFrame], rules: Rules, timer: Timer) -> None:
        # lazy: avoids pyspark at import
        from pyspark.sql import functions as F

        self.spark, self.rules, self.timer = spark, rules, timer
        # the category enters a cell as its 64-bit hash: grouping by fixed-width numbers keeps
        # Spark's fast hash aggregate, where a string key costs about as much as the rest of the pass
        cath = F.xxhash64("cat") if rules.category is not None else F.lit(0).cast("long")
        self.sides = [side.withColumn("cath", cath) for side in sides]
        self.wide = self.sides[0].unionByName(self.sides[1])
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
        """One pass: per cell and side a count, a sum and two XORs, brought to the driver.

        The per-row work is hashing and one hash aggregate per side on fixed-width numbers (no
        condition per sum); the sides are put side by side, and buckets and categories summed
        up, on the driver from these rows.
        """
        with ThreadPoolExecutor(1) as pool:
            # the common categories' names from a few rows, a small Spark job run beside the
            # pass instead of after it (its fixed cost is most of it)
            sample = pool.submit(self._sample_names) if self.rules.category is not None else None
            with self.timer.step("level 1"):
                table = per_side(self.sides, bits).toArrow()
                cells = side_by_side(table)
                buckets, totals, stats = rollup(cells)
                self.differing = cells.filter(cells.column("differs")).drop_columns(["differs"]).to_pylist()
            with self.timer.step("categories"):
                categories = self._categories(table, sample.result() if sample is not None else {})
        self.first_bits, self.first_stats = bits, stats
        self.levels.append(_level(1, bits, stats))
        return buckets, totals, categories

    def _sample_names(self) -> dict[int, str]:
        """Category hash → value, for the categories of the first :data:`NAME_SAMPLE` rows."""
        rows = self.wide.select("cat", "cath").limit(NAME_SAMPLE).collect()
        return {int(r["cath"]): r["cat"] for r in rows}

    def _categories(self, table: Any, names: dict[int, str]) -> list[dict[str, Any]]:
        """Rows of each side per category value (the largest ones), from the first level's rows.

        The values are named from their hashes: a few thousand rows name the common values;
        a pass over the category column alone looks for any other of the largest ones.
        """

        if self.rules.category is None:
            return []
        per_side = table.group_by(["cath", "side"]).aggregate([("n", "sum")])
        counts: dict[int, list[int]] = {}
        for cath, side, n in zip(
            per_side.column("cath").to_pylist(),
            per_side.column("side").to_pylist(),
            per_side.column("n_sum").to_pylist(),
            strict=True,
        ):
            counts.setdefault(cath, [0, 0])[side] += n
        top = sorted(counts.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[: MAX_CATEGORIES + 1]
        wanted = {cath for cath, _ in top}
        missing = sorted(wanted - names.keys())
        if missing:
            found = self.wide.select("cat", "cath").where(_in_set("cath", missing)).distinct().collect()
            names.update({int(r["cath"]): r["cat"] for r in found})
        rows = [
            {
                "value": None if names.get(cath) == NULL_CATEGORY else names.get(cath),
                "n_s": n[0],
                "n_r": n[1],
            }
            for cath, n in top
        ]
        return sorted(rows, key=lambda r: (-(r["n_s"] + r["n_r"]), r["value"] is None, r["value"] or ""))

    def rows_that_differ(self) -> tuple[DataFrame | list[dict[str, Any]], dict[str, Any] | None]:
        """Both sides' rows of the keys that differ (a sample of them beyond ``drill_rows``).

        One more pass. Where the first level named the keys (its pure cells, see
        :mod:`rewind.verify.first_level`), it reads the rows of those keys, and whole cells only
        for the cells it could not decode; these rows go to the driver, which checks that they
        account for every pure cell's difference (a cell that only looked pure is read whole
        then), finds the keys that differ and hands back their rows as a list, for the
        drill-down on the driver: no Spark query after this pass, whose fixed cost (planning,
        code generation, a shuffle) is most of a drill-down of a few thousand rows.

        When the differences are dense (too many cells or rows for the driver), the pass reads
        the rows of every differing cell (an exact broadcast join on the cell); they are kept
        (cached) and grouped by whole key hash, on the driver or in Spark, and the drill-down
        takes the rows of the keys that differ from the kept rows. No table is read a third
        time unless the keys' rows are too many for the driver.
        """
        # lazy: avoids pyspark at import
        from pyspark.sql import functions as F

        width = len(self.rules.key) + 2 * len(self.rules.columns) + 6
        pure, whole = self._decoded()
        wanted = sum(c["n_s"] + c["n_r"] for c in whole) + 2 * len(pure)
        self.levels[0]["pure_cells"] = len(pure)
        with self.timer.step("level 2"):
            if len(pure) + len(whole) <= PREFILTER_VALUES and wanted <= WINDOW_ROWS:
                found = self._decoded_rows(pure, whole, whole_rows=wanted * width <= LOCAL_VALUES)
                if found is not None:
                    return found
            n_rows = sum(n for _, n in self.first_stats.values())
            rows = _select(self.spark, self.wide, self.differing, self.first_bits)
            if n_rows <= DRIVER_ROWS and n_rows * width <= LOCAL_VALUES:
                return self._on_driver(rows, self._arrow(rows))
            if n_rows <= CACHE_ROWS:
                rows = self.keep(rows)
            if n_rows <= DRIVER_ROWS:
                keys, stats, sampled = _keys_on_driver(self.spark, rows, self.rules)
            else:
                keys, stats, sampled = _keys_in_spark(self.keep, rows, self.rules)
        self.levels.append(_level(2, KEY_BITS, stats))
        with self.timer.step("fetch"):
            if sum(c for c, _ in stats.values()) <= BROADCAST_CELLS:
                keys = F.broadcast(keys)
            inside = rows.join(keys, ["kh"], "left_semi")
        return inside, sampled

    def _decoded(self) -> tuple[Pure, list[dict[str, int]]]:
        """The differing cells that name their one row of the difference, and the others."""
        pure: Pure = {}
        whole = []
        for cell in self.differing:
            named = decode(cell)
            if named is None:
                whole.append(cell)
            else:
                pure[tuple(cell[c] for c in CELL)] = named
        return pure, whole

    def _decoded_rows(
        self, pure: Pure, whole: list[dict[str, int]], *, whole_rows: bool
    ) -> tuple[DataFrame | list[dict[str, Any]], dict[str, Any] | None] | None:
        """The rows of the keys that differ among those the pure cells name and those of the other
        differing cells, on the driver; None when they are too many for it.

        With ``whole_rows`` every row read goes to the driver, which finds the keys that differ;
        otherwise (the impure cells hold many rows) Spark keeps the rows of the keys whose
        counts or sums differ (a window per key hash: one shuffle of the rows read).
        """
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        keys = sorted({kh for kh, _, _ in pure.values()})
        rows = _pick(self.wide, keys, [tuple(c[k] for k in CELL) for c in whole], self.first_bits)
        if whole_rows:
            table = self._arrow(rows)
        else:
            table = self._arrow(_of_differing_keys(rows).limit(OUTPUT_ROWS + 1))
            if table.num_rows > OUTPUT_ROWS:
                return None
        missed = unexplained(table, pure, self.first_bits)
        if missed:  # taken for pure by a chance of 2**-32: read those cells whole (their other rows)
            more = _pick(self.wide, [], missed, self.first_bits)
            more = more.join(_lookup(self.spark, "kh", keys), "kh", "left_anti").select(*self.wide.columns)
            rows = rows.unionByName(more)
            table = pa.concat_tables([table, self._arrow(more)])
        out = self._on_driver(rows, table)
        self.levels[-1]["rows_read"] = table.num_rows
        return out

    def _arrow(self, rows: DataFrame) -> pa.Table:
        return rows.select(*rows.columns, *compared_values(self.rules)).toArrow()

    def _on_driver(
        self, rows: DataFrame, t: pa.Table
    ) -> tuple[DataFrame | list[dict[str, Any]], dict[str, Any] | None]:
        """Rows brought to the driver (``t``, the Arrow table of ``rows``): the keys that differ,
        and their rows as dicts (with ``n{i}``, each column's value as the drill-down compares it)."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc

        found, stats, sampled = _differing_keys(t, self.rules)
        self.levels.append(_level(2, KEY_BITS, stats))
        kept = pa.array(found, pa.int64())
        mine = t.filter(pc.is_in(t["kh"], value_set=kept)).drop_columns(["cath"])
        if mine.num_rows <= LOCAL_ROWS:
            return mine.to_pylist(), sampled
        # too many for the driver: read again
        return rows.join(_lookup(self.spark, "kh", found), ["kh"], "left_semi"), sampled


WINDOW_ROWS = 4_000_000
"""Rows read for the keys the cells name and the impure cells, up to which Spark keeps the rows of
the differing keys among them (a window per key) and hands those to the driver."""
OUTPUT_ROWS = 200_000
"""Rows of differing keys the window may hand to the driver; beyond, the cached path is taken."""
LOCAL_VALUES = 8_000_000
"""The rows of the differing cells go to the driver whole when they hold at most this many
values (rows times columns): a few hundred thousand rows of a narrow table."""
LOCAL_ROWS = 50_000
"""The rows of the keys that differ are classified on the driver when at most this many."""


def compared_values(rules: Rules) -> list[Column]:
    """``n{i}``: column i's value as the drill-down compares it (see :mod:`rewind.verify.drill`):
    a double for a tolerance, microseconds floored to the precision for a timestamp, computed
    by Spark so that the driver compares exactly what Spark would."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    out = []
    for i, rule in enumerate(rules.columns):
        c = F.col(f"c{i}")
        if rule.kind == "numeric":
            c = c.cast("double")
        elif rule.kind == "timestamp" and rule.precision_us > 1:
            c = truncate_micros(F.unix_micros(c.cast("timestamp")), rule.precision_us)
        out.append(c.alias(f"n{i}"))
    return out


DRIVER_ROWS = 2_000_000
"""Rows of the differing cells up to this many are grouped by key on the driver (Arrow):
a Spark aggregation of a few hundred thousand rows costs more in jobs than in work."""


def _keys_on_driver(
    spark: SparkSession, rows: DataFrame, rules: Rules
) -> tuple[DataFrame, Stats, dict[str, Any] | None]:
    """The key hashes that differ (a sample of them beyond ``drill_rows``), grouped with pyarrow."""
    kept, stats, sampled = _differing_keys(rows.select("kh", "w", "side", "h").toArrow(), rules)
    return spark.createDataFrame([(k,) for k in kept], "kh bigint"), stats, sampled


def _differing_keys(t: Any, rules: Rules) -> tuple[list[int], Stats, dict[str, Any] | None]:
    """The key hashes whose rows (an Arrow table with kh, w, side, h) differ between the sides,
    a sample of them beyond ``drill_rows``; grouped with pyarrow."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    staging = pc.equal(t["side"], 0)
    zero = pa.scalar(0, pa.int64())
    h = pc.cast(t["h"], pa.int64())
    halves = {
        "hi": pc.shift_right(h, pa.scalar(32, pa.int64())),
        "lo": pc.bit_wise_and(h, pa.scalar(_U32, pa.int64())),
    }
    columns = {"kh": t["kh"], "w": pc.cast(t["w"], pa.int64())}
    columns["n_s"] = pc.cast(staging, pa.int64())
    columns["n_r"] = pc.cast(pc.invert(staging), pa.int64())
    for name, value in halves.items():
        columns[f"{name}_s"] = pc.if_else(staging, value, zero)
        columns[f"{name}_r"] = pc.if_else(staging, zero, value)
    # a key with a row outside the window is a failure, never sampled: its smallest flag
    per_key = pa.table(columns).group_by("kh").aggregate([("w", "min"), *[(name, "sum") for name in _SUMS]])
    # filtered with pyarrow first: most keys of a differing cell agree, and a Python loop over
    # them all cost the driver more CPU than the rest of this step
    differs = pc.or_(
        pc.not_equal(per_key["n_s_sum"], per_key["n_r_sum"]),
        pc.or_(
            pc.not_equal(per_key["hi_s_sum"], per_key["hi_r_sum"]),
            pc.not_equal(per_key["lo_s_sum"], per_key["lo_r_sum"]),
        ),
    )
    per_key = per_key.filter(differs)
    found = list(
        zip(
            per_key["kh"].to_pylist(),
            per_key["w_min"].to_pylist(),
            pc.add(per_key["n_s_sum"], per_key["n_r_sum"]).to_pylist(),
            strict=True,
        )
    )
    stats: Stats = {}
    for _, w, n in found:
        keys, held = stats.get(w, (0, 0))
        stats[w] = (keys + 1, held + n)
    keys_in, rows_in = stats.get(1, (0, 0))
    sampled = None
    kept = [kh for kh, _, _ in found]
    if rows_in > rules.drill_rows:
        share = max(1, int(1024 * rules.drill_rows / rows_in))
        # the key hash's high bits pick the sample (the cell came from the row hash)
        kept = [kh for kh, w, _ in found if w == 0 or (kh >> 40) & 1023 < share]
        sampled = {"cells": keys_in, "rows": rows_in, "share": round(share / 1024, 4)}
    return kept, stats, sampled


def _keys_in_spark(
    keep: Any, rows: DataFrame, rules: Rules
) -> tuple[DataFrame, Stats, dict[str, Any] | None]:
    """:func:`_keys_on_driver` for many rows: the key hashes that differ, aggregated in Spark."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    staging, reference = F.col("side") == 0, F.col("side") == 1

    def total(cond: Column, value: Column) -> Column:
        return F.coalesce(F.sum(F.when(cond, value)), F.lit(0).cast("long"))

    hi, lo = F.shiftright(F.col("h"), 32), F.col("h").bitwiseAND(F.lit(_U32))
    one = F.lit(1).cast("long")
    per_key = rows.groupBy("kh").agg(
        F.min("w").alias("w"),  # a key with a row outside the window is a failure, never sampled
        total(staging, one).alias("n_s"),
        total(reference, one).alias("n_r"),
        total(staging, hi).alias("hi_s"),
        total(staging, lo).alias("lo_s"),
        total(reference, hi).alias("hi_r"),
        total(reference, lo).alias("lo_r"),
    )
    differing = keep(per_key.where(_cell_differs()).select("kh", "w", "n_s", "n_r"))
    stats: Stats = {
        int(row["w"]): (int(row["cells"]), int(row["rows"]))
        for row in differing.groupBy("w")
        .agg(F.count(F.lit(1)).alias("cells"), F.sum(F.col("n_s") + F.col("n_r")).alias("rows"))
        .collect()
    }
    differing, sampled = _limit_changes(differing, stats, rules)
    return differing.select("kh"), stats, sampled


def _level(number: int, bits: int, stats: dict[int, tuple[int, int]]) -> dict[str, Any]:
    return {
        "level": number,
        "bits": bits,
        "differing_cells": sum(c for c, _ in stats.values()),
        "rows": sum(n for _, n in stats.values()),
    }


def first_bits(staging: DataFrame, rules: Rules) -> int:
    """Row-hash bits of the first level: coarse cells, so that a pass that finds nothing is cheap.

    With time buckets: 256 cells per bucket (64 per bucket and category). Without: sized on
    staging's row count (about 1,000 rows per cell), since all rows share one bucket.
    """
    if rules.bucket_column is not None:
        return FIRST_BITS - (2 if rules.category else 0)
    rows = staging.count()
    return max(FIRST_BITS, min(18, math.ceil(math.log2(max(rows, 1) / 1000))))


def _in_set(expression: str, values: list[int]) -> Column:
    """``expression IN (values)`` as one SQL text, for a few values (a few dozen categories):
    one parse costs far less than a literal per value through py4j (``Column.isin``). Many
    values are looked up with :func:`_lookup` instead."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    return F.expr(f"{expression} IN ({', '.join(str(v) for v in values)})")


def _select(spark: SparkSession, wide: DataFrame, cells: list[dict[str, int]], bits: int) -> DataFrame:
    """The rows of ``wide`` in ``cells`` (their ``bits`` low bits of the row hash).

    Up to :data:`PREFILTER_VALUES` cells, the hash of each row's cell is first looked up (see
    :func:`_lookup`), so only the rows kept are projected whole. An exact (broadcast) semi-join
    on the cell follows.
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    tuples = [tuple(c[k] for k in CELL) for c in cells]
    table = spark.createDataFrame(tuples, _CELL_SCHEMA)
    rows = wide
    if len(cells) <= PREFILTER_VALUES:
        ids = _lookup(spark, "_cell", _cell_ids(spark, tuples))
        rows = rows.withColumn("_cell", _cell_id(bits)).join(ids, "_cell", "left_semi").drop("_cell")
    if len(cells) <= BROADCAST_CELLS:
        table = F.broadcast(table)
    kb = F.col("h").bitwiseAND(F.lit((1 << bits) - 1))
    return rows.withColumn("kb", kb).join(table, list(CELL), "left_semi").drop("kb")


_CELL_SCHEMA = "w int, tb bigint, cath bigint, kb bigint"


def _cell_id(bits: int) -> Column:
    """A row's cell as one number: the 64-bit hash of its four."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    return F.xxhash64("w", "tb", "cath", F.col("h").bitwiseAND(F.lit((1 << bits) - 1)))


def _cell_ids(spark: SparkSession, cells: list[tuple[int, ...]]) -> list[int]:
    """The distinct :func:`_cell_id` of ``cells``, computed by Spark, so that they match the rows'
    bit for bit (the cells' columns have the rows' types)."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    table = spark.createDataFrame(cells, _CELL_SCHEMA)
    return sorted({int(r[0]) for r in table.select(F.xxhash64(*CELL)).collect()})


def _lookup(spark: SparkSession, column: str, values: list[int], flag: str | None = None) -> DataFrame:
    """A broadcast table of distinct 64-bit ``values`` in ``column`` (with ``flag``, true, beside).

    Joined on, it is a lookup in Spark's long-keyed hash relation. An ``IN`` list of thousands
    of values is instead a hash set of boxed Longs: it cost ~0.4 s per pass at 10M rows a side
    (bench/RESULTS.md, ``bench/verify.py``).
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    if flag is None:
        return F.broadcast(spark.createDataFrame([(v,) for v in values], f"{column} bigint"))
    return F.broadcast(spark.createDataFrame([(v, True) for v in values], f"{column} bigint, {flag} boolean"))


def _of_differing_keys(rows: DataFrame) -> DataFrame:
    """The rows of ``rows`` whose key hash has different counts or hash sums on the two sides."""
    # lazy: avoids pyspark at import
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_key = Window.partitionBy("kh")
    staging = F.col("side") == 0

    def difference(value: Column) -> Column:  # staging's sum minus the reference's
        return F.sum(F.when(staging, value).otherwise(-value)).over(per_key)

    one = F.lit(1).cast("long")
    hi, lo = F.shiftright(F.col("h"), 32), F.col("h").bitwiseAND(F.lit(_U32))
    differs = (difference(one) != 0) | (difference(hi) != 0) | (difference(lo) != 0)
    return rows.withColumn("_differs", differs).where("_differs").drop("_differs")


def _pick(wide: DataFrame, keys: list[int], cells: list[tuple[int, ...]], bits: int) -> DataFrame:
    """The rows of ``wide`` whose key hash is in ``keys`` (distinct) or whose cell is in ``cells``.

    Both are lookups of one 64-bit number in a broadcast table (:func:`_lookup`; a cell by the
    hash of its four numbers). One of them is a semi-join, which computes a row's other columns
    only for the rows it keeps: with keys alone, the pass costs ~40% less than the left joins
    (on distinct values, so that no row is repeated) and filter that look up both. A row let
    through by a collision of cell hashes is harmless: its copy on the other side (if the sides
    agree) comes with it, and the two cancel.
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    spark = wide.sparkSession
    if not cells:
        return wide.join(_lookup(spark, "kh", keys), "kh", "left_semi").select(*wide.columns)
    ids = _cell_ids(spark, cells)
    with_cell = wide.withColumn("_cell", _cell_id(bits))
    if not keys:
        return with_cell.join(_lookup(spark, "_cell", ids), "_cell", "left_semi").select(*wide.columns)
    rows = with_cell.join(_lookup(spark, "kh", keys, "_by_key"), "kh", "left")
    rows = rows.join(_lookup(spark, "_cell", ids, "_by_cell"), "_cell", "left")
    return rows.where(F.col("_by_key").isNotNull() | F.col("_by_cell").isNotNull()).select(*wide.columns)


PREFILTER_VALUES = 50_000
"""Up to this many differing cells also filter the rows by a hash set of their cells."""


def _cell_differs() -> Column:
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    return (
        (F.col("n_s") != F.col("n_r")) | (F.col("hi_s") != F.col("hi_r")) | (F.col("lo_s") != F.col("lo_r"))
    )


def _limit_changes(
    differing: DataFrame, stats: dict[int, tuple[int, int]], rules: Rules
) -> tuple[DataFrame, dict[str, Any] | None]:
    """Keep every differing key outside the window; sample those inside it beyond ``drill_rows``.

    Differences outside the window (and all of them in match mode) are failures and are
    always drilled in full; inside the repaired window they are the expected changes, of
    which a sample of keys is enough to show what changed.
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    keys_in, rows_in = stats.get(1, (0, 0))
    if rows_in <= rules.drill_rows:
        return differing, None
    share = max(1, int(1024 * rules.drill_rows / rows_in))
    keep = F.shiftright(F.col("kh"), 40).bitwiseAND(F.lit(1023)) < F.lit(share)
    return differing.where((F.col("w") == 0) | keep), {
        "cells": keys_in,
        "rows": rows_in,
        "share": round(share / 1024, 4),
    }
