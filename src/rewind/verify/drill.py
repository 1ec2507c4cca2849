"""Step 5 of a comparison: the row-level drill-down of the keys and cells that differ.

See :mod:`rewind.verify.compare` for the whole algorithm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rewind.verify.assertions import within
from rewind.verify.prepare import any_of, bucket_label, truncate_micros
from rewind.verify.rules import ColumnRule, Rules
from rewind.verify.spark_util import plain

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


def empty_drill() -> dict[str, Any]:
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


def drill_down(inside: DataFrame, rules: Rules) -> dict[str, Any]:
    """Bring each key's rows of both sides together (``side`` 0 and 1) and classify them.

    One aggregation by key puts a key's staging and reference values side by side (and
    counts its rows per side, which finds duplicates): a single shuffle, where a join would
    need two and a sort. One Spark action when at most :data:`LOCAL_ROWS` rows differ (they
    are tallied on the driver); otherwise counts and samples are aggregated in Spark.
    """
    # lazy: avoids pyspark at import
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
        .when(any_of(differs) if differs else F.lit(False), F.lit("changed"))
        .when(any_of(exact_diff) if exact_diff else F.lit(False), F.lit("tolerated"))
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
    # lazy: avoids pyspark at import
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
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    if rule.kind == "timestamp" and rule.precision_us > 1:
        s = truncate_micros(F.unix_micros(s.cast("timestamp")), rule.precision_us)
        r = truncate_micros(F.unix_micros(r.cast("timestamp")), rule.precision_us)
    both = F.col("s_p").isNotNull() & F.col("r_p").isNotNull()
    if rule.kind == "numeric":
        sd, rd = s.cast("double"), r.cast("double")
        # a tolerance holds between two finite numbers only: in Spark NaN <= NaN is true, so
        # a number against a NaN (|s - NaN| <= abs + rel * NaN) or an infinity (inf <= inf)
        # would pass as close; equal NaNs and infinities are equal through <=> below
        finite = (F.abs(sd) < F.lit(math.inf)) & (F.abs(rd) < F.lit(math.inf))
        close = finite & (F.abs(sd - rd) <= F.lit(rule.abs) + F.lit(rule.rel) * F.abs(rd))
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


def drill_local(rows: list[dict[str, Any]], rules: Rules) -> dict[str, Any]:
    """:func:`drill_down` on the driver, for the few rows of the keys that differ (as dicts).

    The same classification as the Spark query, without its fixed cost: each value is
    compared as Spark would (``n{i}``, computed by Spark: a double for a tolerance, floored
    microseconds for a timestamp; Spark's NaN equals NaN, and a tolerance holds between two
    finite numbers only, as in :func:`_differs`).
    """
    nk, has_cat = len(rules.key), rules.category is not None
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for d in rows:
        groups.setdefault(tuple(_hashable(d[f"k{i}"]) for i in range(nk)), []).append(d)
    names = [f"c{i}" for i in range(len(rules.columns))] + [f"n{i}" for i in range(len(rules.columns))]
    names += ["w", "tb", *(["cat"] if has_cat else [])]
    out = []
    for key_rows in groups.values():
        row: dict[str, Any] = {}
        for side, p in ((0, "s_"), (1, "r_")):
            mine = [d for d in key_rows if d["side"] == side]
            row[f"{p}n"] = len(mine)
            for i in range(nk):
                row[f"{p}k{i}"] = mine[0][f"k{i}"] if mine else None
            for name in names:  # F.first(..., ignorenulls=True)
                row[p + name] = next((d[name] for d in mine if d[name] is not None), None)
        s_p, r_p = row["s_n"] > 0, row["r_n"] > 0
        diff_cols = [r.name for i, r in enumerate(rules.columns) if s_p and r_p and _differs_local(row, i, r)]
        if not s_p:
            status = "missing"
        elif not r_p:
            status = "extra"
        elif diff_cols:
            status = "changed"
        elif any(
            r.kind == "numeric" and not _same(row[f"s_c{i}"], row[f"r_c{i}"])
            for i, r in enumerate(rules.columns)
        ):
            status = "tolerated"
        else:
            status = "equal"
        if status == "equal" and row["s_n"] <= 1 and row["r_n"] <= 1:
            continue
        in_window = (not s_p or row["s_w"] == 1) and (not r_p or row["r_w"] == 1)
        row.update(
            status=status,
            change=in_window if rules.mode == "repair" else False,
            diff_cols=diff_cols,
            tb_row=row["s_tb"] if row["s_tb"] is not None else row["r_tb"],
            cat_row=(row["s_cat"] if row["s_cat"] is not None else row["r_cat"]) if has_cat else None,
        )
        out.append(row)
    tally = _Tally(rules)
    _tally_rows(tally, out, rules)
    return tally.result(has_cat)


def _hashable(value: Any) -> Any:
    """A grouping key as Spark groups: NaN equals NaN; arrays and structs by value."""
    if isinstance(value, float) and math.isnan(value):
        return ("NaN",)
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


def _same(s: Any, r: Any) -> bool:
    """Spark's ``<=>``: null equals null, NaN equals NaN."""
    if s is None or r is None:
        return s is None and r is None
    if isinstance(s, float) and isinstance(r, float) and math.isnan(s) and math.isnan(r):
        return True
    return bool(s == r)


def _differs_local(row: dict[str, Any], i: int, rule: ColumnRule) -> bool:
    """:func:`_differs` for two present rows, on the values Spark prepared (``n{i}``)."""
    s, r = row[f"s_c{i}"], row[f"r_c{i}"]
    if rule.kind == "numeric":
        if s is None and r is None:
            return not rule.nulls_equal
        if s is None or r is None:
            return True
        if _same(s, r):
            return False
        # the tolerance as the row assertions apply it (numpy's isclose): equal NaNs and
        # infinities were settled by _same, a finite number is never close to either
        return not within(row[f"s_n{i}"], row[f"r_n{i}"], rule.abs, rule.rel)
    if rule.kind == "timestamp" and rule.precision_us > 1:
        s, r = row[f"s_n{i}"], row[f"r_n{i}"]
    if rule.nulls_equal:
        return not _same(s, r)
    return s is None or r is None or not _same(s, r)
