"""The Spark side of verification: bucket checksums, bisection, row-level drill-down.

Both sides are Spark DataFrames and stay in Spark: the driver only ever receives
aggregates (per bucket, per cell), counts and a bounded number of sample rows.

1. **Scope.** Both sides are cut to the scope (filter, key range and, in ``match`` mode,
   the window). Reference columns are cast (``try_cast``) to staging's types, so that equal
   values hash equally; a value that does not cast becomes null and shows as a difference.
2. **Row hashes.** Every row gets ``kh = xxhash64(key)`` and ``h = xxhash64(compared
   columns)``, plus a null bitmask (Spark's hash skips nulls, so ``(null, 1)`` and
   ``(1, null)`` would otherwise collide). Timestamps enter ``h`` floored to their precision,
   which is exact. Columns with an ``abs``/``rel`` tolerance enter ``h`` with their exact
   value: a tolerance cannot be hashed (two values within tolerance can straddle any
   rounding boundary), so a within-tolerance difference makes its cell differ and is
   settled by value in step 5, where it does not count. That costs a drill-down, never a
   wrong answer. A column where null must not equal null (``nulls_equal: false``) adds a
   side-specific salt to ``h`` when null, so its cell always drills down.
3. **Cells.** A cell is (window flag, time bucket, category, low ``bits`` bits of ``kh``);
   the first level is coarse (64 to 256 cells per bucket), so that a pass that finds
   nothing costs little more than reading the data. One aggregation over the union of both
   sides gives, per cell and side, the row count and the sum of ``h`` as two 32-bit halves
   (so it cannot overflow under ANSI SQL). A cell whose counts or sums differ holds a
   difference: a missing or extra row changes the count, a changed row the sum. The
   report's per-bucket and per-category counts and checksums are these cells summed up.
4. **Decoding, then bisection.** The first level also sums four moments per cell modulo
   a prime (of ``b``, ``a*b``, ``a^2*b``, ``a^3*b``, with ``a`` a 31-bit signature of the key
   and ``b`` of the row hash). In a cell where one key differs they name that key
   (``a = d2/d1``, checked twice; see :func:`decode_cells`), so most differing cells need no
   further pass. The other cells are split, as data-diff does between two databases: while
   they hold more than ``drill_rows`` rows, their rows are aggregated again with more bits
   of ``kh`` (each cell into 2^k); it stops when the rows fit, or when splitting no longer
   helps (dense differences, e.g. a repaired window where every row changed: those are
   then sampled, and the report says so).
5. **Drill-down.** One pass fetches both sides' rows of the decoded keys and of the cells
   left (a hash-set test per row, then exact broadcast joins). One aggregation by key
   (null keys included) puts each key's staging and reference values side by side, and its
   row counts per side; the values are compared column by column with the tolerances:
   *missing* (reference only), *extra* (staging only), *changed* (naming the columns that
   differ) or equal within tolerance. In ``repair`` mode a difference is a *change* when
   every side's row lies inside the repaired window, and a failure otherwise.

Duplicate keys are found where they make the two sides differ (a key twice in staging and
once in the reference); duplicates present identically on both sides agree and are not
reported.
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.verify.exceptions import VerifyError
from rewind.verify.rules import ColumnRule, Rules, is_time

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

FIRST_BITS = 8
"""Key-hash bits of the first level: 256 cells per time bucket (64 per bucket and category)."""
CACHE_ROWS = 4_000_000
"""The rows of the differing cells are cached for the next levels when at most this many."""
MAX_BITS = 62
NULL_BUCKET = -(2**62)
"""Time bucket of rows whose time is null."""
NULL_CATEGORY = "\x00null"
"""Category of rows whose category is null (a cell key must not be null: it is joined on)."""
MAX_BUCKETS = 5000
"""Time buckets returned for the report (the earliest ones)."""
MAX_CATEGORIES = 30
BROADCAST_CELLS = 1_000_000
WINDOW_FLAG = "_rewind_w"
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1


class Timer:
    """Seconds per named step, for the report."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.steps[name] = round(self.steps.get(name, 0.0) + time.perf_counter() - began, 3)


@contextmanager
def quiet_query_errors() -> Iterator[None]:
    """Silence pyspark's loggers that print a user query's error with a stack trace.

    A failing assertion or filter is reported in one line by Rewind; pyspark would also
    log the whole JVM trace on stderr.
    """
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def spark_types(df: DataFrame) -> dict[str, str]:
    """Column name → Spark's simple type name (``bigint``, ``decimal(10,2)``...)."""
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


def compare(spark: SparkSession, staging: DataFrame, reference: DataFrame, rules: Rules) -> dict[str, Any]:
    """Compare staging with the reference under ``rules``; returns JSON-ready results.

    Keys of the result: ``rows`` (counts per side), ``record`` (missing, extra, duplicate
    keys with samples), ``state`` (changed rows by column with side-by-side samples),
    ``changes`` (repair mode: the differences inside the window), ``buckets``,
    ``categories``, ``bisection`` (one entry per level) and ``seconds`` per step.

    Passes over the data: one when nothing differs (the first level, coarse cells). When
    something does, the cells whose difference is one key are decoded from their moments
    (:func:`decode_cells`), the others are split further (bisection, a pass per level),
    and one more pass fetches the rows of those keys and cells for the drill-down.
    """
    from pyspark.sql import functions as F

    timer = Timer()
    types = spark_types(staging)
    with timer.step("prepare"):
        s = _prepare(staging, rules, types, side=0, name="staging").withColumn("side", F.lit(0))
        r = _prepare(reference, rules, types, side=1, name="reference").withColumn("side", F.lit(1))
        bits = _first_bits(staging, rules)
    search = _Search(spark, s.unionByName(r), rules, timer)
    try:
        buckets, totals, categories = search.first_level(bits)
        result: dict[str, Any] = {"rows": totals, "bisection": search.levels}
        sampled: dict[str, Any] | None = None
        if not search.first_stats:
            drill = _empty_drill()
        else:
            inside, sampled = search.rows_that_differ()
            with timer.step("drill-down"):
                drill = _drill(inside, rules)
        drill["changes"]["sampled"] = sampled
        by_bucket, by_category = drill.pop("_by_bucket"), drill.pop("_by_category")
        result.update(drill)
        _attach_buckets(result, buckets, by_bucket, rules)
        result["categories"] = _categories(categories, by_category, rules)
        result["seconds"] = timer.steps
        return result
    finally:
        search.release()


Stats = dict[int, tuple[int, int]]
"""Per window flag: (differing cells, rows they hold)."""


class _Search:
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


def _first_bits(staging: DataFrame, rules: Rules) -> int:
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
    df = wide.where(_any(quick)) if quick and cheap else wide
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
    return df.where(_any(hits)).drop(*helpers, *[f"_hit{i}" for i in range(len(lookups))])


# -- step 1 and 2: scope, alignment, hashes ---------------------------------------------------


def _analysis(side: str, what: str, exc: Exception) -> VerifyError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return VerifyError(f"verify.{what} on {side}: {first}")


def apply_scope(df: DataFrame, rules: Rules, types: dict[str, str], *, side: int, name: str) -> DataFrame:
    """``df`` cut to the scope: filter, key range and (``match`` mode) the window.

    ``types`` are staging's column types: the reference's key and time columns are cast to
    them first, so both sides are cut by the same values. Adds the window flag ``_rewind_w``
    (1 inside the window, 0 outside or when there is no window).
    """
    from pyspark.sql import functions as F

    own = spark_types(df)

    def col(column: str) -> Column:
        c = F.col(f"`{column}`")
        if side == 1 and own.get(column) != types[column]:
            c = c.try_cast(types[column])
        return c

    if rules.filter:
        try:
            with quiet_query_errors():
                df = df.where(F.expr(rules.filter))
        except Exception as exc:  # pyspark's AnalysisException, ParseException...
            raise _analysis(name, "scope.filter", exc) from None
    first = col(rules.key[0])
    if rules.key_from is not None:
        df = df.where(first >= F.lit(rules.key_from))
    if rules.key_to is not None:
        df = df.where(first < F.lit(rules.key_to))
    # repair mode with no bounded window: the whole table is the repaired window, so every
    # difference is a change (as the rules' note says), none a failure
    w: Column = F.lit(1 if rules.mode == "repair" and not rules.windowed else 0)
    if rules.time_column is not None and rules.windowed:
        t = _as_timestamp(col(rules.time_column), types[rules.time_column])
        lo, hi = rules.window
        inside = F.lit(True)
        if lo is not None:
            inside = inside & (t >= F.lit(lo))
        if hi is not None:
            inside = inside & (t < F.lit(hi))
        if rules.mode == "match":
            df = df.where(inside)
        else:
            w = F.when(inside, F.lit(1)).otherwise(F.lit(0))
    return df.withColumn(WINDOW_FLAG, w.cast("int"))


def without_flag(df: DataFrame) -> DataFrame:
    """``df`` without the window flag :func:`apply_scope` added (for the assertions' views)."""
    return df.drop(WINDOW_FLAG)


def _prepare(df: DataFrame, rules: Rules, types: dict[str, str], *, side: int, name: str) -> DataFrame:
    """One side in scope, aligned to staging's types, with w, tb, cat, kh, h, k*, c*."""
    from pyspark.sql import functions as F

    own = spark_types(df)

    def col(column: str) -> Column:
        c = F.col(f"`{column}`")
        if side == 1 and own.get(column) != types[column]:
            c = c.try_cast(types[column])
        return c

    df = apply_scope(df, rules, types, side=side, name=name)
    w = F.col(WINDOW_FLAG)
    if rules.bucket_column is not None:
        micros = F.unix_micros(_as_timestamp(col(rules.bucket_column), types[rules.bucket_column]))
        tb = F.coalesce(_truncate(micros, rules.bucket_us), F.lit(NULL_BUCKET))
    else:
        tb = F.lit(0).cast("long")

    keys = [col(k).alias(f"k{i}") for i, k in enumerate(rules.key)]
    values = [col(c.name).alias(f"c{i}") for i, c in enumerate(rules.columns)]
    extra = [w.cast("int").alias("w"), tb.alias("tb")]
    if rules.category is not None:
        extra.append(F.coalesce(col(rules.category).cast("string"), F.lit(NULL_CATEGORY)).alias("cat"))
    projected = df.select(*keys, *values, *extra)

    key_cols = [F.col(f"k{i}") for i in range(len(rules.key))]
    kh = F.xxhash64(*key_cols, *_null_masks(key_cols))
    normal = [_normalise(F.col(f"c{i}"), rule, types[rule.name]) for i, rule in enumerate(rules.columns)]
    value_cols = [F.col(f"c{i}") for i in range(len(rules.columns))]
    unequal = [F.col(f"c{i}").isNull() for i, rule in enumerate(rules.columns) if not rule.nulls_equal]
    salt = [F.when(_any(unequal), F.lit(side + 1)).otherwise(F.lit(0))] if unequal else []
    h = F.xxhash64(*normal, *_null_masks(value_cols), *salt) if normal else F.lit(0).cast("long")
    return projected.withColumn("kh", kh).withColumn("h", h)


def _any(conditions: list[Column]) -> Column:
    out = conditions[0]
    for c in conditions[1:]:
        out = out | c
    return out


def _null_masks(columns: list[Column]) -> list[Column]:
    """One long per 62 columns: bit i set when column i is null."""
    from pyspark.sql import functions as F

    masks = []
    for start in range(0, len(columns), 62):
        mask: Column = F.lit(0).cast("long")
        for i, c in enumerate(columns[start : start + 62]):
            mask = mask + F.when(c.isNull(), F.lit(1 << i)).otherwise(F.lit(0)).cast("long")
        masks.append(mask)
    return masks


def _as_timestamp(column: Column, spark_type: str) -> Column:
    return column.cast("timestamp") if spark_type == "date" else column


def _truncate(micros: Column, unit: int) -> Column:
    """``micros`` rounded down to a multiple of ``unit`` (also before 1970), in integers."""
    from pyspark.sql import functions as F

    if unit == 1:
        return micros
    return micros - F.pmod(micros, F.lit(unit).cast("long"))


def _normalise(column: Column, rule: ColumnRule, spark_type: str) -> Column:
    """The value that enters the row hash: timestamps floored to their precision."""
    from pyspark.sql import functions as F

    if rule.kind == "timestamp" and is_time(spark_type):
        return _truncate(F.unix_micros(_as_timestamp(column, spark_type)), rule.precision_us)
    return column


# -- step 3 and 4: cells and bisection --------------------------------------------------------


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


# -- step 5: drill-down -----------------------------------------------------------------------


def _empty_drill() -> dict[str, Any]:
    return {
        "record": {
            "missing": 0,
            "extra": 0,
            "duplicates": {"staging": 0, "reference": 0},
            "missing_sample": [],
            "extra_sample": [],
            "duplicate_sample": [],
        },
        "state": {"changed": 0, "within_tolerance": 0, "by_column": {}, "changed_sample": []},
        "changes": {
            "missing": 0,
            "extra": 0,
            "changed": 0,
            "by_column": {},
            "missing_sample": [],
            "extra_sample": [],
            "changed_sample": [],
        },
        "_by_bucket": {},
        "_by_category": {},
    }


class _Tally:
    """Counts and samples of the classified rows, filled row by row (driver side)."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.counts: dict[tuple[str, bool], int] = {}
        self.by_column: dict[tuple[str, bool], int] = {}
        self.by_bucket: dict[int, dict[str, int]] = {}
        self.by_category: dict[str | None, dict[str, int]] = {}
        self.samples: dict[tuple[str, bool], list[dict[str, Any]]] = {}
        self.duplicates: dict[str, dict[tuple[Any, ...], int]] = {"staging": {}, "reference": {}}

    def add(self, kind: str, change: bool, n: int, diff_cols: Any, tb: Any, cat: Any) -> None:
        self.counts[(kind, change)] = self.counts.get((kind, change), 0) + n
        for name in diff_cols or ():
            self.by_column[(name, change)] = self.by_column.get((name, change), 0) + n
        if kind == "tolerated":
            return
        label = ("change_" if change else "") + kind
        bucket = self.by_bucket.setdefault(int(tb), {})
        bucket[label] = bucket.get(label, 0) + n
        category = self.by_category.setdefault(cat, {})
        category[label] = category.get(label, 0) + n

    def result(self, has_cat: bool) -> dict[str, Any]:
        counts, samples = self.counts, self.samples

        def columns(change: bool) -> dict[str, int]:
            found = {name: n for (name, ch), n in self.by_column.items() if ch == change}
            return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))

        dup_sample = [
            {"side": side, "key": dict(zip(self.rules.key, key, strict=True)), "rows": n}
            for side in ("staging", "reference")
            for key, n in sorted(self.duplicates[side].items(), key=lambda kv: _order(kv[0]))[
                : self.rules.samples
            ]
        ]
        return {
            "record": {
                "missing": counts.get(("missing", False), 0),
                "extra": counts.get(("extra", False), 0),
                "duplicates": {side: len(keys) for side, keys in self.duplicates.items()},
                "missing_sample": samples.get(("missing", False), []),
                "extra_sample": samples.get(("extra", False), []),
                "duplicate_sample": dup_sample,
            },
            "state": {
                "changed": counts.get(("changed", False), 0),
                "within_tolerance": counts.get(("tolerated", False), 0) + counts.get(("tolerated", True), 0),
                "by_column": columns(False),
                "changed_sample": samples.get(("changed", False), []),
            },
            "changes": {
                "missing": counts.get(("missing", True), 0),
                "extra": counts.get(("extra", True), 0),
                "changed": counts.get(("changed", True), 0),
                "by_column": columns(True),
                "missing_sample": samples.get(("missing", True), []),
                "extra_sample": samples.get(("extra", True), []),
                "changed_sample": samples.get(("changed", True), []),
            },
            "_by_bucket": self.by_bucket,
            "_by_category": self.by_category if has_cat else {},
        }


def _order(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A sort key for key tuples that may hold nulls."""
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in values)


LOCAL_ROWS = 50_000
"""Classified rows up to this many are tallied on the driver in one Spark action."""


def _drill(inside: DataFrame, rules: Rules) -> dict[str, Any]:
    """Bring each key's rows of both sides together (``side`` 0 and 1) and classify them.

    One aggregation by key puts a key's staging and reference values side by side (and
    counts its rows per side, which finds duplicates): a single shuffle, where a join would
    need two and a sort. One Spark action when at most :data:`LOCAL_ROWS` rows differ (they
    are tallied on the driver); otherwise counts and samples are aggregated in Spark.
    """
    from pyspark.sql import functions as F

    nk, nc = len(rules.key), len(rules.columns)
    has_cat = rules.category is not None
    staging, reference = F.col("side") == 0, F.col("side") == 1

    def first(side: Column, column: str) -> Column:
        return F.first(F.when(side, F.col(column)), ignorenulls=True)

    sums = [
        F.sum(F.when(staging, 1).otherwise(0)).alias("s_n"),
        F.sum(F.when(reference, 1).otherwise(0)).alias("r_n"),
    ]
    for prefix, side in (("s_", staging), ("r_", reference)):
        sums += [first(side, f"c{i}").alias(f"{prefix}c{i}") for i in range(nc)]
        sums += [first(side, "w").alias(f"{prefix}w"), first(side, "tb").alias(f"{prefix}tb")]
        if has_cat:
            sums.append(first(side, "cat").alias(f"{prefix}cat"))
    per_key = inside.groupBy(*[f"k{i}" for i in range(nk)]).agg(*sums)
    present = {p: F.when(F.col(f"{p}n") > 0, F.lit(True)) for p in ("s_", "r_")}
    joined = per_key.select(
        "*",
        *[
            F.when(present[p].isNotNull(), F.col(f"k{i}")).alias(f"{p}k{i}")
            for p in ("s_", "r_")
            for i in range(nk)
        ],
        present["s_"].alias("s_p"),
        present["r_"].alias("r_p"),
    )

    s_p, r_p = F.col("s_p").isNotNull(), F.col("r_p").isNotNull()
    differs = [_differs(F.col(f"s_c{i}"), F.col(f"r_c{i}"), rule) for i, rule in enumerate(rules.columns)]
    exact_diff = [
        ~F.col(f"s_c{i}").eqNullSafe(F.col(f"r_c{i}"))
        for i, rule in enumerate(rules.columns)
        if rule.kind == "numeric"
    ]
    status = (
        F.when(~s_p, F.lit("missing"))
        .when(~r_p, F.lit("extra"))
        .when(_any(differs) if differs else F.lit(False), F.lit("changed"))
        .when(_any(exact_diff) if exact_diff else F.lit(False), F.lit("tolerated"))
        .otherwise(F.lit("equal"))
    )
    in_window = (~s_p | (F.col("s_w") == 1)) & (~r_p | (F.col("r_w") == 1))
    names = F.array(*[F.when(d, F.lit(rule.name)) for d, rule in zip(differs, rules.columns, strict=True)])
    duplicated = (F.col("s_n") > 1) | (F.col("r_n") > 1)
    result = (
        joined.withColumn("status", status)
        .where((F.col("status") != "equal") | duplicated)
        .withColumn("change", in_window if rules.mode == "repair" else F.lit(False))
        .withColumn("diff_cols", F.array_compact(names) if differs else F.array().cast("array<string>"))
        .withColumn("tb_row", F.coalesce(F.col("s_tb"), F.col("r_tb")))
        .withColumn("cat_row", F.coalesce(F.col("s_cat"), F.col("r_cat")) if has_cat else F.lit(None))
    )
    tally = _Tally(rules)
    local = result.limit(LOCAL_ROWS + 1).toArrow().to_pylist()
    if len(local) <= LOCAL_ROWS:
        _tally_rows(tally, local, rules)
        return tally.result(has_cat)
    result = result.cache()
    try:
        _tally_in_spark(tally, result, rules)
    finally:
        result.unpersist()
    return tally.result(has_cat)


def _tally_in_spark(tally: _Tally, result: DataFrame, rules: Rules) -> None:
    """Counts, samples and duplicates of many classified rows, aggregated in Spark."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    nk = len(rules.key)
    classified = result.where(F.col("status") != "equal")
    for row in (
        classified.groupBy("status", "change", "tb_row", "cat_row", "diff_cols")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    ):
        tally.add(
            row["status"], bool(row["change"]), int(row["n"]), row["diff_cols"], row["tb_row"], row["cat_row"]
        )
    if rules.samples:
        order = [F.coalesce(F.col(f"s_k{i}"), F.col(f"r_k{i}")) for i in range(nk)]
        ranked = classified.where(F.col("status") != "tolerated").withColumn(
            "rank", F.row_number().over(Window.partitionBy("status", "change").orderBy(*order))
        )
        for d in (
            ranked.where(F.col("rank") <= rules.samples)
            .orderBy("status", "change", "rank")
            .toArrow()
            .to_pylist()
        ):
            tally.samples.setdefault((d["status"], bool(d["change"])), []).append(
                _sample_row(d, d["status"], rules)
            )
    for side, prefix in (("staging", "s_"), ("reference", "r_")):
        keys = [f"{prefix}k{i}" for i in range(nk)]
        dups = result.where(F.col(f"{prefix}n") > 1).select(*keys, f"{prefix}n").distinct()
        for d in dups.limit(10_000).toArrow().to_pylist():
            tally.duplicates[side][tuple(plain(d[k]) for k in keys)] = int(d[f"{prefix}n"])


def _tally_rows(tally: _Tally, rows: list[dict[str, Any]], rules: Rules) -> None:
    """Counts, samples and duplicates of the classified rows, on the driver."""
    nk = len(rules.key)
    keyed: dict[tuple[str, bool], list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}
    for d in rows:
        for side, prefix in (("staging", "s_"), ("reference", "r_")):
            if (d.get(f"{prefix}n") or 0) > 1:
                key = tuple(plain(d[f"{prefix}k{i}"]) for i in range(nk))
                tally.duplicates[side][key] = int(d[f"{prefix}n"])
        kind = d["status"]
        if kind == "equal":
            continue
        change = bool(d["change"])
        tally.add(kind, change, 1, d["diff_cols"], d["tb_row"], d["cat_row"])
        if kind != "tolerated" and rules.samples:
            prefix = "r_" if kind == "missing" else "s_"
            key = tuple(d[f"{prefix}k{i}"] for i in range(nk))
            keyed.setdefault((kind, change), []).append((key, d))
    for group, items in keyed.items():
        items.sort(key=lambda item: _order(item[0]))
        tally.samples[group] = [_sample_row(d, group[0], rules) for _, d in items[: rules.samples]]


def _differs(s: Column, r: Column, rule: ColumnRule) -> Column:
    """True when both rows exist and the column differs under its rule."""
    from pyspark.sql import functions as F

    if rule.kind == "timestamp" and rule.precision_us > 1:
        s = _truncate(F.unix_micros(s.cast("timestamp")), rule.precision_us)
        r = _truncate(F.unix_micros(r.cast("timestamp")), rule.precision_us)
    both = F.col("s_p").isNotNull() & F.col("r_p").isNotNull()
    if rule.kind == "numeric":
        sd, rd = s.cast("double"), r.cast("double")
        close = F.abs(sd - rd) <= F.lit(rule.abs) + F.lit(rule.rel) * F.abs(rd)
        equal = F.when(s.isNull() & r.isNull(), F.lit(rule.nulls_equal)).otherwise(
            F.coalesce(s.eqNullSafe(r) & s.isNotNull() | close, F.lit(False))
        )
    elif rule.nulls_equal:
        equal = s.eqNullSafe(r)
    else:
        equal = F.coalesce(s == r, F.lit(False))
    return both & ~equal


def _sample_row(d: dict[str, Any], kind: str, rules: Rules) -> dict[str, Any]:
    prefix = "r_" if kind == "missing" else "s_"
    row: dict[str, Any] = {
        "key": {k: plain(d[f"{prefix}k{i}"]) for i, k in enumerate(rules.key)},
        "columns": list(d.get("diff_cols") or []),
    }
    if kind != "missing":
        row["staging"] = {c.name: plain(d[f"s_c{i}"]) for i, c in enumerate(rules.columns)}
    if kind != "extra":
        row["reference"] = {c.name: plain(d[f"r_c{i}"]) for i, c in enumerate(rules.columns)}
    tb = d.get("tb_row")
    row["bucket"] = bucket_label(int(tb), rules) if tb is not None else None
    return row


def plain(value: Any) -> Any:
    """A value as JSON can hold it: times in ISO-8601, decimals as text, bytes as base64."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return plain(value.asDict())
    return value


def bucket_label(tb: int, rules: Rules) -> str:
    if rules.bucket_column is None:
        return "all"
    if tb == NULL_BUCKET:
        return "null"
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=tb)
    return start.strftime("%Y-%m-%dT%H:00Z" if rules.granularity == "hour" else "%Y-%m-%d")


def _attach_buckets(
    result: dict[str, Any], buckets: list[dict[str, Any]], by_bucket: dict[int, dict[str, int]], rules: Rules
) -> None:
    out = []
    for b in buckets:
        diffs = by_bucket.get(b["tb"], {})
        out.append(
            {
                "bucket": bucket_label(b["tb"], rules),
                **{k: v for k, v in b.items() if k != "tb"},
                "missing": diffs.get("missing", 0),
                "extra": diffs.get("extra", 0),
                "changed": diffs.get("changed", 0),
                "changes": sum(n for k, n in diffs.items() if k.startswith("change_")),
            }
        )
    result["buckets"] = {
        "time_column": rules.bucket_column,
        "granularity": rules.granularity if rules.bucket_column else None,
        "rows": out,
        "truncated": len(buckets) >= MAX_BUCKETS,
    }


def _categories(
    rows: list[dict[str, Any]], by_category: dict[str | None, dict[str, int]], rules: Rules
) -> dict[str, Any] | None:
    """Rows per category value on each side (from the cells) and differences per value."""
    if rules.category is None:
        return None
    out = []
    for row in rows[:MAX_CATEGORIES]:
        diffs = by_category.get(NULL_CATEGORY if row["value"] is None else row["value"], {})
        out.append(
            {
                "value": row["value"],
                "staging_rows": row["n_s"],
                "reference_rows": row["n_r"],
                "missing": diffs.get("missing", 0),
                "extra": diffs.get("extra", 0),
                "changed": diffs.get("changed", 0),
                "changes": sum(n for k, n in diffs.items() if k.startswith("change_")),
            }
        )
    return {"column": rules.category, "rows": out, "truncated": len(rows) > MAX_CATEGORIES}
