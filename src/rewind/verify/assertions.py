"""Outcome-level checks: the user's assertions in Spark SQL over ``staging`` and ``reference``.

Three forms (see :class:`rewind.spec.Assertion`):

* ``expect``: the query returns one value, equal to ``expect`` within ``abs + rel * |expect|``;
* ``compare_to_reference``: the query runs as written, then again with the view ``staging``
  bound to the reference; the two results must hold the same rows, matched on their
  non-numeric columns, with numeric columns within ``abs + rel * |reference value|``;
* neither: the query lists offending rows and must return none.

A query that fails (a typo, a missing column) fails its assertion with the error's first
line; it does not stop the verification.
"""

from __future__ import annotations

import math
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.verify.spark_util import plain, quiet_query_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rewind.spec import Assertion

MAX_RESULT_ROWS = 10_000


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float | Decimal):
        return float(value)
    return None


def within(value: float, expected: float, abs_tol: float | None, rel_tol: float | None) -> bool:
    """``|value - expected| <= abs + rel * |expected|`` (numpy's isclose); NaN equals NaN.

    An infinity is within a tolerance of the same infinity only: by the formula alone a
    finite value would be within ``rel * inf`` of one."""
    if math.isnan(value) or math.isnan(expected):
        return math.isnan(value) and math.isnan(expected)
    if math.isinf(value) or math.isinf(expected):
        return value == expected
    return abs(value - expected) <= (abs_tol or 0.0) + (rel_tol or 0.0) * abs(expected)


def tolerance_text(a: Assertion) -> str:
    parts = [f"abs {a.abs:g}" if a.abs else "", f"rel {a.rel:g}" if a.rel else ""]
    return " + ".join(p for p in parts if p) or "exact"


def run_assertions(
    spark: SparkSession,
    assertions: list[Assertion],
    staging: DataFrame,
    reference: DataFrame,
    samples: int = 20,
) -> list[dict[str, Any]]:
    """Run every assertion with the views ``staging`` and ``reference`` registered."""
    out = []
    for assertion in assertions:
        staging.createOrReplaceTempView("staging")
        reference.createOrReplaceTempView("reference")
        began = time.perf_counter()
        try:
            with quiet_query_errors():
                result = _run(spark, assertion, staging, reference, samples)
        except Exception as exc:  # the query itself failed: the assertion fails, the rest go on
            text = " ".join(str(exc).strip().splitlines()[:1]) or type(exc).__name__
            result = {"passed": False, "error": text[:500], "detail": f"the query failed: {text[:300]}"}
        finally:
            staging.createOrReplaceTempView("staging")
        out.append(
            {
                "name": assertion.name,
                "sql": assertion.sql,
                "form": "compare"
                if assertion.compare_to_reference
                else "value"
                if assertion.expect is not None
                else "no-rows",
                "tolerance": tolerance_text(assertion),
                **result,
                "seconds": round(time.perf_counter() - began, 3),
            }
        )
    return out


def _run(
    spark: SparkSession, a: Assertion, staging: DataFrame, reference: DataFrame, samples: int
) -> dict[str, Any]:
    if a.expect is not None:
        rows = spark.sql(a.sql).limit(2).collect()
        if len(rows) != 1 or len(rows[0]) != 1:
            shape = f"{len(rows)} rows" if len(rows) != 1 else f"{len(rows[0])} columns"
            return {
                "passed": False,
                "expected": a.expect,
                "detail": f"expected one value, the query returned {shape}",
            }
        value = _number(rows[0][0])
        if value is None:
            return {
                "passed": False,
                "value": plain(rows[0][0]),
                "expected": a.expect,
                "detail": "the query's value is not a number",
            }
        ok = within(value, a.expect, a.abs, a.rel)
        return {
            "passed": ok,
            "value": value,
            "expected": a.expect,
            "detail": f"{value:g} {'is' if ok else 'is not'} {a.expect:g} ({tolerance_text(a)})",
        }
    if a.compare_to_reference:
        mine = _collect(spark.sql(a.sql))
        reference.createOrReplaceTempView("staging")
        theirs = _collect(spark.sql(a.sql))
        return compare_results(mine, theirs, a, samples)
    query = spark.sql(a.sql)
    count = query.count()
    rows = [plain(r.asDict()) for r in query.limit(samples).collect()] if count else []
    return {
        "passed": count == 0,
        "value": count,
        "expected": 0,
        "rows": rows,
        "detail": "no rows" if count == 0 else f"{count} offending rows",
    }


def _collect(df: DataFrame) -> tuple[list[str], list[tuple[Any, ...]]]:
    rows = df.limit(MAX_RESULT_ROWS + 1).collect()
    if len(rows) > MAX_RESULT_ROWS:
        raise ValueError(f"the query returns more than {MAX_RESULT_ROWS} rows; aggregate it")
    return list(df.columns), [tuple(r) for r in rows]


def compare_results(
    staging: tuple[list[str], list[tuple[Any, ...]]],
    reference: tuple[list[str], list[tuple[Any, ...]]],
    a: Assertion,
    samples: int = 20,
) -> dict[str, Any]:
    """Match rows on their non-numeric values; numbers must agree within the tolerance."""
    columns, mine = staging
    _, theirs = reference
    numeric = [
        i
        for i in range(len(columns))
        if all(_number(r[i]) is not None or r[i] is None for r in mine + theirs)
        and any(_number(r[i]) is not None for r in mine + theirs)
    ]
    if len(numeric) == len(columns) and len(mine) <= 1 and len(theirs) <= 1:
        labels: list[int] = []  # a single row of numbers: compare it as is
    else:
        labels = [i for i in range(len(columns)) if i not in numeric]
        if not labels and numeric:  # only numbers over many rows: the first column labels them
            labels, numeric = [numeric[0]], numeric[1:]

    def label(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(plain(row[i]) for i in labels)

    by_label: dict[tuple[Any, ...], tuple[Any, ...]] = {label(r): r for r in theirs}
    mine_labels = {label(r) for r in mine}
    problems: list[dict[str, Any]] = []
    worst = 0.0
    for row in mine:
        other = by_label.get(label(row))
        if other is None:
            problems.append(
                {"row": dict(zip(columns, plain(list(row)), strict=True)), "problem": "only in staging"}
            )
            continue
        for i in numeric:
            s, r = _number(row[i]), _number(other[i])
            if s is None or r is None:
                if (s is None) != (r is None):
                    problems.append({"row": _named(columns, row), "problem": f"{columns[i]}: {s} vs {r}"})
                continue
            if r:
                worst = max(worst, abs(s - r) / abs(r))
            if not within(s, r, a.abs, a.rel):
                problems.append(
                    {"row": _named(columns, row), "problem": f"{columns[i]}: {s:g} vs reference {r:g}"}
                )
    for key, row in by_label.items():
        if key not in mine_labels:
            problems.append({"row": _named(columns, row), "problem": "only in reference"})
    # a row with two differing columns is two problems but one differing row
    rows_off = len({repr(sorted(p["row"].items())) for p in problems})
    detail = (
        f"{len(mine)} rows agree ({tolerance_text(a)}; largest relative difference {worst:.3g})"
        if not problems
        else f"{rows_off} of {max(len(mine), len(theirs))} rows differ in {len(problems)} values "
        f"({tolerance_text(a)})"
    )
    return {
        "passed": not problems,
        "value": len(problems),
        "expected": 0,
        "rows": problems[:samples],
        "detail": detail,
        "largest_relative_difference": worst,
    }


def _named(columns: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(columns, plain(list(row)), strict=True))
