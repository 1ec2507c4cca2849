"""Steps 3 and 4 of a comparison: cell checksums, decoding single-key cells, bisection.

See :mod:`rewind.verify.compare` for the whole algorithm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rewind.verify.prepare import NULL_CATEGORY, any_of
from rewind.verify.rules import Rules
from rewind.verify.spark_util import Timer

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FIRST_BITS = 8
"""Key-hash bits of the first level: 256 cells per time bucket (64 per bucket and category)."""
CACHE_ROWS = 4_000_000
"""The rows of the differing cells are cached for the next levels when at most this many."""
MAX_BITS = 62
MAX_BUCKETS = 5000
"""Time buckets returned for the report (the earliest ones)."""
MAX_CATEGORIES = 30
BROADCAST_CELLS = 1_000_000
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
Stats = dict[int, tuple[int, int]]
"""Per window flag: (differing cells, rows they hold)."""


class CellSearch:
    """Steps 3 and 4: the cells, their decoding and bisection, down to the rows that may differ."""

    def __init__(self, spark: SparkSession, wide: DataFrame, rules: Rules, timer: Timer) -> None:
        self.spark, self.wide, self.rules, self.timer = spark, wide, rules, timer
        self.keys = cell_keys(rules)
        self.levels: list[dict[str, Any]] = []
        self.cached: list[DataFrame] = []
        self.first_stats: Stats = {}
        self.first_bits = 0
        self.agg: DataFrame | None = None

    def keep(self, df: DataFrame) -> DataFrame:
        df = df.cache()
        self.cached.append(df)
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()

    def first_level(self, bits: int) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
        with self.timer.step("level 1"):
            narrow = self.wide.select(*self.keys, "kh", "h", "side")
            self.agg = self.keep(_cells(narrow, self.keys, bits, None, 0, 0, moments=True))
            buckets, totals, stats = _rollup(self.agg)  # one action; it fills the cache
            categories = _category_rollup(self.agg, self.rules)
        self.first_bits, self.first_stats = bits, stats
        self.levels.append(_level(1, bits, stats))
        return buckets, totals, categories

    def rows_that_differ(self) -> tuple[DataFrame, dict[str, Any] | None]:
        """Both sides' rows of the decoded keys and of the cells left after bisection."""
        assert self.agg is not None
        differing = self.agg.where(_cell_differs())
        found: list[dict[str, Any]] = []
        if self.levels[0]["differing_cells"] <= DECODE_CELLS:
            with self.timer.step("decode"):
                moments = differing.select(*self.keys, "kb", "n_s", "n_r", "d1", "d2", "d3", "d4")
                found, rest = decode_cells(moments.toArrow().to_pylist(), self.keys)
            stats: Stats = {}
            for cell in rest:
                n, held = stats.get(int(cell["w"]), (0, 0))
                stats[int(cell["w"])] = (n + 1, held + int(cell["n_s"]) + int(cell["n_r"]))
            self.levels[0].update(decoded_cells=len(found), undecoded_rows=sum(n for _, n in stats.values()))
            left = _cell_frame(self.spark, rest, self.keys) if rest else None
        else:
            left, stats = differing, self.first_stats
        cells: DataFrame | None = None
        bits, n_cells, sampled = 0, 0, None
        if left is not None:
            cells, bits, n_cells, sampled = self.bisect(left, stats)
        with self.timer.step("fetch"):
            decoded = _cell_frame(self.spark, found, self.keys, sig=True) if found else None
            inside = _select(
                self.wide, self.keys, decoded, self.first_bits, cells, bits, n_cells, found=found
            )
        return inside, sampled

    def bisect(self, differing: DataFrame, stats: Stats) -> tuple[DataFrame, int, int, dict[str, Any] | None]:
        """Split the differing cells until their rows fit ``drill_rows`` (or splitting stops helping)."""
        from pyspark.sql import functions as F

        rules, keys, bits = self.rules, self.keys, self.first_bits
        n_cells, n_rows = sum(c for c, _ in stats.values()), sum(n for _, n in stats.values())
        source = self.wide
        if n_rows > rules.drill_rows:
            # the rows of the cells to split, both sides, every column: the finer levels read
            # them instead of the tables
            source = _select(self.wide, keys, None, 0, differing, bits, n_cells)
            if n_rows <= CACHE_ROWS:
                source = self.keep(source)
        history = [n_rows]
        while True:
            dense = len(history) > 1 and n_rows > history[-2] / 2
            if n_rows <= rules.drill_rows or dense or bits >= MAX_BITS:
                differing, sampled = _limit_changes(differing, stats, rules)
                return differing, bits, n_cells, sampled
            previous_bits, per_cell = bits, n_rows / max(n_cells, 1)
            bits = min(MAX_BITS, bits + max(1, min(20, math.ceil(math.log2(max(per_cell / 2, 2))))))
            with self.timer.step(f"level {len(self.levels) + 1}"):
                narrow = source.select(*keys, "kh", "h", "side")
                agg = self.keep(_cells(narrow, keys, bits, differing, previous_bits, n_cells))
                differing = agg.where(_cell_differs())
                stats = {
                    int(row["w"]): (int(row["cells"]), int(row["rows"]))
                    for row in differing.groupBy("w")
                    .agg(F.count(F.lit(1)).alias("cells"), F.sum(F.col("n_s") + F.col("n_r")).alias("rows"))
                    .collect()
                }
            self.levels.append(_level(len(self.levels) + 1, bits, stats))
            n_cells, n_rows = self.levels[-1]["differing_cells"], self.levels[-1]["rows"]
            history.append(n_rows)


def _level(number: int, bits: int, stats: dict[int, tuple[int, int]]) -> dict[str, Any]:
    return {
        "level": number,
        "bits": bits,
        "differing_cells": sum(c for c, _ in stats.values()),
        "rows": sum(n for _, n in stats.values()),
    }


def first_bits(staging: DataFrame, rules: Rules) -> int:
    """Key-hash bits of the first level: coarse cells, so that a pass that finds nothing is cheap.

    With time buckets: 256 cells per bucket (64 per bucket and category). Without: sized on
    staging's row count (about 1,000 rows per cell), since all rows share one bucket.
    """
    if rules.bucket_column is not None:
        return FIRST_BITS - (2 if rules.category else 0)
    rows = staging.count()
    return max(FIRST_BITS, min(18, math.ceil(math.log2(max(rows, 1) / 1000))))


def _in_set(expression: str, values: list[int]) -> Column:
    """``expression IN (values)`` as one SQL text: Spark makes it a hash-set lookup, and one
    parse costs far less than a literal per value through py4j (``Column.isin``)."""
    from pyspark.sql import functions as F

    return F.expr(f"{expression} IN ({', '.join(str(v) for v in values)})")


def _select(
    wide: DataFrame,
    keys: list[str],
    decoded: DataFrame | None,
    decoded_bits: int,
    cells: DataFrame | None,
    cell_bits: int,
    n_cells: int,
    *,
    found: list[dict[str, Any]] | None = None,
) -> DataFrame:
    """The rows of ``wide`` of the ``decoded`` keys (cell and key signature) or in ``cells``.

    One pass. A row's signature (or its cell's key-hash bits) is first looked up in a hash
    set, which drops nearly every row cheaply; the few left are matched exactly against the
    sets (broadcast: a semi-join for one set, two left joins and a filter for both).
    """
    from pyspark.sql import functions as F

    def kb(bits: int) -> Column:
        return F.col("kh").bitwiseAND(F.lit((1 << bits) - 1)) if bits < 64 else F.col("kh")

    lookups: list[tuple[DataFrame, list[str], dict[str, Column]]] = []
    quick: list[Column] = []
    cheap = True  # every set has a cheap test
    if decoded is not None:
        d = F.broadcast(decoded.select(*keys, F.col("kb").alias("_kb1"), F.col("sig").alias("_sig")))
        lookups.append(
            (d, [*keys, "_kb1", "_sig"], {"_kb1": kb(decoded_bits), "_sig": _signature(F.col("kh"))})
        )
        sigs = sorted({int(f["sig"]) for f in found or ()})
        if found is not None and len(sigs) <= PREFILTER_VALUES:
            quick.append(_in_set(f"pmod(kh, {P})", sigs))
        else:
            cheap = False
    if cells is not None:
        c = cells.select(*keys, F.col("kb").alias("_kb2"))
        if n_cells <= BROADCAST_CELLS:
            c = F.broadcast(c)
        lookups.append((c, [*keys, "_kb2"], {"_kb2": kb(cell_bits)}))
        if n_cells <= PREFILTER_VALUES:  # a hash of the whole cell: selective, one long per row
            values = sorted(
                {int(row[0]) for row in cells.select(F.xxhash64(*keys, F.col("kb"))).distinct().collect()}
            )
            mask = (1 << cell_bits) - 1
            quick.append(_in_set(f"xxhash64({', '.join(keys)}, kh & {mask})", values))
        else:
            cheap = False
    if not lookups:
        return wide.limit(0)
    df = wide.where(any_of(quick)) if quick and cheap else wide
    helpers = [name for _, _, cols in lookups for name in cols]
    for _, _, cols in lookups:
        for name, value in cols.items():
            df = df.withColumn(name, value)
    if len(lookups) == 1:
        table, on, _ = lookups[0]
        return df.join(table, on, "left_semi").drop(*helpers)
    hits = []
    for i, (table, on, _) in enumerate(lookups):
        df = df.join(table.withColumn(f"_hit{i}", F.lit(True)), on, "left")
        hits.append(F.col(f"_hit{i}").isNotNull())
    return df.where(any_of(hits)).drop(*helpers, *[f"_hit{i}" for i in range(len(lookups))])


def cell_keys(rules: Rules) -> list[str]:
    """What a cell is, besides its key-hash bits: window flag, time bucket, category."""
    return ["w", "tb", "cat"] if rules.category is not None else ["w", "tb"]


def _signature(kh: Column) -> Column:
    """A key's 31-bit signature (its key hash modulo the prime :data:`P`)."""
    from pyspark.sql import functions as F

    return F.pmod(kh, F.lit(P))


def _cells(
    narrow: DataFrame,
    keys: list[str],
    bits: int,
    previous: DataFrame | None,
    previous_bits: int,
    previous_cells: int,
    *,
    moments: bool = False,
) -> DataFrame:
    """Per cell (keys, kb): row count and hash sums of each side; only rows of ``previous`` cells.

    With ``moments``, also ``d1`` to ``d4``: the differences between the sides of the sums of
    ``b``, ``a*b``, ``a^2*b`` and ``a^3*b`` modulo :data:`P`, where ``a`` is the key's signature
    and ``b`` the row hash modulo ``P``: what :func:`decode_cells` needs to name the key of a
    cell that differs by one key.
    """
    from pyspark.sql import functions as F

    src = narrow
    if previous is not None:
        parents = previous.select(*keys, F.col("kb").alias("pkb"))
        if previous_cells <= BROADCAST_CELLS:
            parents = F.broadcast(parents)
        src = src.withColumn("pkb", F.col("kh").bitwiseAND(F.lit((1 << previous_bits) - 1))).join(
            parents, [*keys, "pkb"], "left_semi"
        )
    kb = F.col("kh").bitwiseAND(F.lit((1 << bits) - 1)) if bits < 64 else F.col("kh")
    hi = F.shiftright(F.col("h"), 32)
    lo = F.col("h").bitwiseAND(F.lit(_U32))
    staging, reference = F.col("side") == 0, F.col("side") == 1

    def total(cond: Column, value: Column) -> Column:
        return F.coalesce(F.sum(F.when(cond, value)), F.lit(0).cast("long"))

    sums = [
        total(staging, F.lit(1).cast("long")).alias("n_s"),
        total(reference, F.lit(1).cast("long")).alias("n_r"),
        total(staging, hi).alias("hi_s"),
        total(staging, lo).alias("lo_s"),
        total(reference, hi).alias("hi_r"),
        total(reference, lo).alias("lo_r"),
    ]
    if moments:
        # per row, modulo P: a (the key's signature), m1 = h, m2 = a*m1, m3 = a*m2, m4 = a*m3; products of
        # two numbers below 2^31 fit in a long. Reference rows count negatively (P - m), so one
        # sum per moment holds the difference of the sides; it fits for up to 2^32 rows a cell.
        src = src.withColumn("_a", _signature(F.col("kh"))).withColumn("_m1", F.pmod(F.col("h"), F.lit(P)))
        for i in (2, 3, 4):
            src = src.withColumn(f"_m{i}", F.pmod(F.col("_a") * F.col(f"_m{i - 1}"), F.lit(P)))
        for i in (1, 2, 3, 4):
            signed = F.when(staging, F.col(f"_m{i}")).otherwise(F.lit(P) - F.col(f"_m{i}"))
            sums.append(F.coalesce(F.sum(signed), F.lit(0).cast("long")).alias(f"d{i}"))
    return src.groupBy(*keys, kb.alias("kb")).agg(*sums)


P = 2_147_483_647
"""The prime 2^31 - 1: moments are sums modulo P."""
DECODE_CELLS = 200_000
"""Differing cells up to this many are brought to the driver and decoded."""
PREFILTER_VALUES = 50_000
"""Up to this many signatures (or cell hashes) also filter the fetch pass as a hash set."""


def decode_cells(
    rows: list[dict[str, Any]], keys: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Name the one key that makes each cell differ, where there is one; return (found, rest).

    In a cell whose staging and reference rows differ only by the rows of one key (a changed
    row, a missing or an extra one, duplicates of it), every row of that key has the same
    signature ``a``, so the moment differences are ``d1 = D``, ``d2 = a*D``, ``d3 = a^2*D``
    and ``d4 = a^3*D`` (modulo P) for some ``D``: ``a = d2 / d1``, confirmed by ``d3 = a*d2``
    and ``d4 = a*d3``. A cell where several keys differ passes both checks with a chance of
    about 2^-62 (the same order as two different rows having equal 64-bit hashes, which
    every checksum comparison accepts); it fails them otherwise and is left in ``rest`` for
    bisection, as is a cell with ``d1 = 0``.

    ``found`` rows are the cell (``keys``, ``kb``) and the key's signature ``sig``; ``rest``
    rows the cell and its counts.
    """
    found, rest = [], []
    for row in rows:
        d1, d2, d3, d4 = (int(row[f"d{i}"]) % P for i in (1, 2, 3, 4))
        cell = {**{k: row[k] for k in keys}, "kb": row["kb"]}
        if d1:
            a = d2 * pow(d1, P - 2, P) % P
            if (a * d2 - d3) % P == 0 and (a * d3 - d4) % P == 0:
                found.append({**cell, "sig": a})
                continue
        rest.append({**cell, "n_s": int(row["n_s"]), "n_r": int(row["n_r"])})
    return found, rest


def _cell_frame(
    spark: SparkSession, rows: list[dict[str, Any]], keys: list[str], *, sig: bool = False
) -> DataFrame:
    """Cells (from the driver) as a small DataFrame to join on."""
    types = {"w": "int", "tb": "bigint", "cat": "string", "kb": "bigint", "sig": "bigint"}
    names = [*keys, "kb", *(["sig"] if sig else [])]
    schema = ", ".join(f"{n} {types[n]}" for n in names)
    return spark.createDataFrame([tuple(r[n] for n in names) for r in rows], schema)


def _cell_differs() -> Column:
    from pyspark.sql import functions as F

    return (
        (F.col("n_s") != F.col("n_r")) | (F.col("hi_s") != F.col("hi_r")) | (F.col("lo_s") != F.col("lo_r"))
    )


def checksum(hi: int, lo: int) -> str:
    """The 64-bit sum of row hashes (from its two 32-bit halves), as 16 hex digits."""
    return f"{((hi << 32) + lo) & _U64:016x}"


def _rollup(agg: DataFrame) -> tuple[list[dict[str, Any]], dict[str, int], dict[int, tuple[int, int]]]:
    """Per time bucket: counts and checksums of both sides, cells and differing cells.

    Also returns, per window flag, the differing cells and the rows they hold.
    """
    from pyspark.sql import functions as F

    differs = F.when(_cell_differs(), F.lit(1)).otherwise(F.lit(0))
    differing_rows = F.when(_cell_differs(), F.col("n_s") + F.col("n_r")).otherwise(F.lit(0))
    rows = (
        agg.groupBy("tb", "w")
        .agg(
            F.sum("n_s").alias("n_s"),
            F.sum("n_r").alias("n_r"),
            F.sum("hi_s").alias("hi_s"),
            F.sum("lo_s").alias("lo_s"),
            F.sum("hi_r").alias("hi_r"),
            F.sum("lo_r").alias("lo_r"),
            F.count(F.lit(1)).alias("cells"),
            F.sum(differs).alias("differing_cells"),
            F.sum(differing_rows).alias("differing_rows"),
        )
        .collect()
    )
    stats: dict[int, tuple[int, int]] = {}
    for row in rows:
        if row["differing_cells"]:
            cells, held = stats.get(int(row["w"]), (0, 0))
            stats[int(row["w"])] = (cells + int(row["differing_cells"]), held + int(row["differing_rows"]))
    merged: dict[int, dict[str, int]] = {}
    totals = {"staging": 0, "reference": 0, "staging_in_window": 0, "reference_in_window": 0}
    for row in rows:
        d = row.asDict()
        m = merged.setdefault(int(d["tb"]), dict.fromkeys(("n_s", "n_r", "hi_s", "lo_s", "hi_r", "lo_r"), 0))
        for k in ("n_s", "n_r", "hi_s", "lo_s", "hi_r", "lo_r"):
            m[k] += int(d[k])
        m["cells"] = m.get("cells", 0) + int(d["cells"])
        m["differing_cells"] = m.get("differing_cells", 0) + int(d["differing_cells"])
        totals["staging"] += int(d["n_s"])
        totals["reference"] += int(d["n_r"])
        if d["w"] == 1:
            totals["staging_in_window"] += int(d["n_s"])
            totals["reference_in_window"] += int(d["n_r"])
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


def _category_rollup(agg: DataFrame, rules: Rules) -> list[dict[str, Any]]:
    """Rows of each side per category value (the largest ones), from the cells."""
    from pyspark.sql import functions as F

    if rules.category is None:
        return []
    rows = (
        agg.groupBy("cat")
        .agg(F.sum("n_s").alias("n_s"), F.sum("n_r").alias("n_r"))
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
