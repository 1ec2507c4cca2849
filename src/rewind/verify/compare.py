"""The Spark side of verification: bucket checksums, the keys that differ, row-level drill-down.

Both sides are Spark DataFrames and stay in Spark: the driver only ever receives
aggregates (per bucket, per cell), counts and a bounded number of sample rows.

1. **Scope.** Both sides are cut to the scope (filter, key range and, in ``match`` mode,
   the window). Reference columns are cast (``try_cast``) to staging's types, so that equal
   values hash equally; a value that does not cast becomes null and shows as a difference.
2. **Row hashes.** Every row gets ``kh = xxhash64(key)`` and ``h = xxhash64(kh, compared
   columns)`` (the key in it, so that two keys of one cell trading their values change the
   cell's numbers), plus a null bitmask (Spark's hash skips nulls, so ``(null, 1)`` and
   ``(1, null)`` would otherwise collide). Timestamps enter ``h`` floored to their precision,
   which is exact. Columns with an ``abs``/``rel`` tolerance enter ``h`` with their exact
   value: a tolerance cannot be hashed (two values within tolerance can straddle any
   rounding boundary), so a within-tolerance difference makes its cell differ and is
   settled by value in step 5, where it does not count. That costs a drill-down, never a
   wrong answer. A column where null must not equal null (``nulls_equal: false``) adds a
   side-specific salt to ``h`` when null, so its cell always drills down.
3. **Cells.** A cell is (window flag, time bucket, category, low ``bits`` bits of ``h``);
   the category enters as its 64-bit hash, so that the grouping stays on fixed-width
   numbers (Spark's fast hash aggregate; a string key costs as much as the rest of the
   pass). The first level is coarse (64 to 256 cells per bucket), so that a pass that finds
   nothing costs little more than reading the data: its per-row work is hashing and one
   hash aggregate per side (grouping the union of both would break Spark's generated code)
   with four numbers per cell: the count, the sum of the low 32 bits of ``h`` (it cannot
   overflow under ANSI SQL), the XOR of ``h`` and the XOR of ``kh``. Its rows are brought to
   the driver, which puts the sides side by side. A cell whose count, sum or XOR differ
   holds a difference. The report's per-bucket and per-category counts and checksums are
   these cells summed up (the largest categories named from a few rows, or a pass over the
   category column if those do not name them all): no other pass when nothing differs.
4. **Keys.** Rows equal on both sides fall into the same cell and cancel; a changed row's
   two versions have two row hashes, so they usually fall into two cells. A differing cell
   that holds one row of the difference (its count differs by one, and its sums agree with
   the XOR) names that row's key hash: the XOR of the sides' key-hash XORs
   (:mod:`~rewind.verify.first_level`). One more pass reads the rows of the keys so named,
   and whole cells only for the cells that hold more; these go to the driver, which checks
   that they account for each named cell (one that only looked pure is read whole) and
   groups them by ``kh``: the keys whose counts or sums differ, whose rows are kept there
   for step 5. (When the undecoded cells hold many rows, Spark first keeps only the rows of
   the keys whose counts or sums differ, with a window per ``kh``.) When the differences are
   dense (too many for the driver), the pass reads the rows of every differing cell instead:
   they are cached and grouped by ``kh`` (on the driver, or in Spark when they are many), and
   the rows of the differing keys taken from the cache (a broadcast semi-join). Inside the
   repaired window, beyond ``drill_rows`` rows of differing keys (dense differences, e.g. a
   repaired window where every row changed), a sample of them is drilled, and the report
   says so.
5. **Drill-down.** On the driver when step 4 kept the rows there (the same classification,
   on values Spark prepared for it: no Spark query, whose fixed cost is most of the work
   for a few thousand rows); otherwise in Spark: one aggregation by key (null keys
   included) puts each differing key's staging and reference values side by side, and its
   row counts per side; the values are compared column by column with the tolerances:
   *missing* (reference only), *extra* (staging only), *changed* (naming the columns that
   differ) or equal within tolerance.
   In ``repair`` mode a difference is a *change* when every side's row lies inside the
   repaired window, and a failure otherwise.

Duplicate keys are found where they make the two sides differ (a key twice in staging and
once in the reference); duplicates present identically on both sides agree and are not
reported.

Modules, in step order: :mod:`~rewind.verify.prepare` (1, 2), :mod:`~rewind.verify.first_level`
(3), :mod:`~rewind.verify.cells` (3, 4), :mod:`~rewind.verify.drill` (5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.verify.cells import MAX_CATEGORIES, CellSearch, first_bits
from rewind.verify.drill import drill_down, drill_local, empty_drill
from rewind.verify.first_level import MAX_BUCKETS
from rewind.verify.prepare import NULL_CATEGORY, bucket_label, prepare_side
from rewind.verify.rules import Rules
from rewind.verify.spark_util import Timer, spark_types

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def compare(spark: SparkSession, staging: DataFrame, reference: DataFrame, rules: Rules) -> dict[str, Any]:
    """Compare staging with the reference under ``rules``; returns JSON-ready results.

    Keys of the result: ``rows`` (counts per side), ``record`` (missing, extra, duplicate
    keys with samples), ``state`` (changed rows by column with side-by-side samples),
    ``changes`` (repair mode: the differences inside the window), ``buckets``,
    ``categories``, ``bisection`` (one entry per level: the cells, then the keys) and ``seconds`` per step.

    Passes over the data: one when nothing differs (the first level, coarse cells). When
    something does, one more: the rows of the keys the cells name (and of the cells that name
    none), for the keys that differ and the drill-down.
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    timer = Timer()
    types = spark_types(staging)
    with timer.step("prepare"):
        s = prepare_side(staging, rules, types, side=0, name="staging").withColumn("side", F.lit(0))
        r = prepare_side(reference, rules, types, side=1, name="reference").withColumn("side", F.lit(1))
        bits = first_bits(staging, rules)
    search = CellSearch(spark, [s, r], rules, timer)
    try:
        buckets, totals, categories = search.first_level(bits)
        result: dict[str, Any] = {"rows": totals, "bisection": search.levels}
        sampled: dict[str, Any] | None = None
        if not search.first_stats:
            drill = empty_drill()
        else:
            inside, sampled = search.rows_that_differ()
            with timer.step("drill-down"):
                drill = drill_local(inside, rules) if isinstance(inside, list) else drill_down(inside, rules)
        drill["changes"]["sampled"] = sampled
        by_bucket, by_category = drill.pop("_by_bucket"), drill.pop("_by_category")
        result.update(drill)
        _attach_buckets(result, buckets, by_bucket, rules)
        result["categories"] = _categories(categories, by_category, rules)
        result["seconds"] = timer.steps
        return result
    finally:
        search.release()


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
