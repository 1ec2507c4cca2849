"""The second level: the keys that differ, found in the rows of the differing cells (grouped on
the driver, or in Spark when they are many)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.spec import Verify
from rewind.verify import cells
from rewind.verify.service import verify_frames

ROWS = 20_000
WINDOW_END = "2026-11-01T00:00:00Z"  # every row lies inside: 20,000 minutes
T0 = int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())


@pytest.fixture(params=["driver", "window", "spark"])
def sides(request: Any, monkeypatch: pytest.MonkeyPatch, spark: Any) -> tuple[Any, Any]:
    if request.param == "window":  # as when the rows read hold too many values for the driver
        monkeypatch.setattr(cells, "LOCAL_VALUES", 0)
    if request.param == "spark":  # as when the differing cells hold more rows than the driver takes
        monkeypatch.setattr(cells, "DRIVER_ROWS", 0)
        monkeypatch.setattr(cells, "WINDOW_ROWS", 0)
    return _sides(spark)


def _sides(spark: Any) -> tuple[Any, Any]:
    from pyspark.sql import functions as F

    reference = spark.range(ROWS).select(
        F.col("id").alias("order_id"),
        (F.col("id") * 2).alias("total"),
        (F.lit(T0) + F.col("id") * 60).cast("timestamp").alias("updated_at"),
    )
    staging = reference.withColumn(
        "total", F.when(F.col("order_id") % 1000 == 3, F.col("total") + 1).otherwise(F.col("total"))
    )
    return staging, reference


def test_only_the_keys_that_differ_are_drilled(spark: Any, sides: tuple[Any, Any]) -> None:
    staging, reference = sides
    by_window = cells.WINDOW_ROWS > 0
    read_whole = by_window and cells.LOCAL_VALUES > 0
    v = Verify.model_validate({"reference": {"iceberg": "a.b"}, "key": ["order_id"], "compare": ["total"]})
    report = verify_frames(spark, staging, reference, v)
    assert report["state"]["changed"] == 20
    first, keys = report["bisection"]
    # a changed row's two versions have two row hashes: two cells, or one by a chance of 1 in 256
    assert 20 <= first["differing_cells"] <= 40 and first["rows"] > 40
    assert {k: keys[k] for k in ("level", "bits", "differing_cells", "rows")} == {
        "level": 2,
        "bits": 64,
        "differing_cells": 20,
        "rows": 40,
    }
    assert first["pure_cells"] >= first["differing_cells"] - 2
    if read_whole:  # the keys the pure cells name: their rows, and whole cells only for the others
        assert 40 <= keys["rows_read"] < first["rows"]
    elif by_window:  # of these, Spark hands over only the rows of the keys that differ
        assert keys["rows_read"] == 40
    assert sorted(s["key"]["order_id"] for s in report["state"]["changed_sample"]) == [
        i for i in range(ROWS) if i % 1000 == 3
    ]


def test_dense_changes_in_the_repaired_window_are_sampled(spark: Any, sides: tuple[Any, Any]) -> None:
    from pyspark.sql import functions as F

    staging, reference = sides
    staging = staging.withColumn("total", F.col("total") + 1)  # every row of the window changed
    v = Verify.model_validate(
        {
            "reference": {"iceberg": "a.b"},
            "key": ["order_id"],
            "compare": ["total"],
            "mode": "repair",
            "scope": {
                "time_column": "updated_at",
                "from": "2026-10-01T00:00:00Z",
                "to": "2026-11-01T00:00:00Z",
            },
            "drill_rows": 2_000,
        }
    )
    report = verify_frames(spark, staging, reference, v)
    sampled = report["changes"]["sampled"]
    assert sampled["cells"] == ROWS and sampled["rows"] == 2 * ROWS
    changed = report["changes"]["changed"]
    assert 0.5 * ROWS * sampled["share"] < changed < 1.5 * ROWS * sampled["share"]  # about the share
    assert report["state"]["changed"] == 0  # nothing outside the window


@pytest.mark.parametrize("path", ["driver", "spark"])
def test_nan_and_null_are_compared_as_spark_compares_them(
    spark: Any, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    # the drill-down runs in Python on the driver path: NaN equals NaN (Spark's <=>), a null
    # differs from a value, a number is not within any tolerance of a NaN or an infinity, and
    # both paths classify the same rows the same way
    if path == "spark":
        monkeypatch.setattr(cells, "DRIVER_ROWS", 0)
    nan, inf, schema = float("nan"), float("inf"), "order_id bigint, x double, y double, z string"
    staging = spark.createDataFrame(
        [(1, nan, nan, "a"), (2, 1.0, nan, "a"), (3, None, 2.0, None), (4, 5.0, 5.0, "b"),
         (5, 1.0, 0.0, "d"), (6, inf, 0.0, "d"), (7, inf, 0.0, "d")], schema
    )
    reference = spark.createDataFrame(
        [(1, nan, nan, "a"), (2, 1.0, 3.0, "a"), (3, None, None, "c"), (4, 5.001, 5.0, "b"),
         (5, nan, 0.0, "d"), (6, 1.0, 0.0, "d"), (7, inf, 0.0, "d")], schema
    )
    v = Verify.model_validate(
        {
            "reference": {"iceberg": "a.b"},
            "key": ["order_id"],
            "compare": {"x": {"abs": 0.01, "rel": 0.5}, "y": "exact", "z": "exact"},
        }
    )
    report = verify_frames(spark, staging, reference, v)
    changed = {s["key"]["order_id"]: sorted(s["columns"]) for s in report["state"]["changed_sample"]}
    assert changed == {2: ["y"], 3: ["y", "z"], 5: ["x"], 6: ["x"]}
    assert report["state"]["within_tolerance"] == 1  # order 4's x: 5.0 against 5.001


@given(
    value=st.floats(allow_nan=True, allow_infinity=True, width=32),
    expected=st.floats(allow_nan=True, allow_infinity=True, width=32),
    abs_tol=st.sampled_from([0.0, 0.01, 1.0]),
    rel_tol=st.sampled_from([0.0, 0.001, 0.5]),
)
def test_an_assertion_tolerance_is_numpys_isclose(
    value: float, expected: float, abs_tol: float, rel_tol: float
) -> None:
    # the row-level assertions' tolerance: NaN equals NaN, an infinity only itself
    import numpy as np

    from rewind.verify.assertions import within

    want = bool(np.isclose(value, expected, rtol=rel_tol, atol=abs_tol, equal_nan=True))
    assert within(value, expected, abs_tol, rel_tol) is want


@pytest.mark.parametrize("change", ["swap", "rename"])
def test_keys_that_trade_values_or_names_are_found(spark: Any, change: str) -> None:
    """Two keys trade their values (swap), or a key is replaced by another with the same values
    (rename): both sides then hold the same values, so if a row's hash held only its values, every
    cell's count, sums and XORs would stay as they were. A row's hash must hold its key too."""
    from pyspark.sql import functions as F

    reference = spark.range(1_000).select(F.col("id").alias("order_id"), (F.col("id") * 2).alias("total"))
    v = Verify.model_validate({"reference": {"iceberg": "a.b"}, "key": ["order_id"], "compare": ["total"]})
    a, b = 3, 7
    if change == "swap":
        total = F.when(F.col("order_id") == a, b * 2).when(F.col("order_id") == b, a * 2)
        staging = reference.withColumn("total", total.otherwise(F.col("total")))
    else:  # a renamed to b (which the reference does not hold), keeping a's total
        reference = reference.where(F.col("order_id") != b)
        renamed = F.when(F.col("order_id") == a, b).otherwise(F.col("order_id"))
        staging = reference.withColumn("order_id", renamed)
    report = verify_frames(spark, staging, reference, v)
    assert not report["passed"]
    if change == "swap":
        assert report["state"]["changed"] == 2
        assert sorted(s["key"]["order_id"] for s in report["state"]["changed_sample"]) == sorted([a, b])
    else:
        record = report["record"]
        assert (record["missing"], record["extra"], report["state"]["changed"]) == (1, 1, 0)


def test_cells_taken_for_pure_by_mistake_are_read_whole(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell that only looks pure names a key hash that does not account for its difference (a
    chance of 2**-32 per impure cell): the rows read show it, and the cell is read whole."""
    real = cells.decode

    def wrong(cell: dict[str, int]) -> tuple[int, int, int] | None:
        named = real(cell)
        return None if named is None else (named[0] ^ 1, named[1], named[2])  # a key hash no row has

    monkeypatch.setattr(cells, "decode", wrong)
    staging, reference = _sides(spark)
    v = Verify.model_validate({"reference": {"iceberg": "a.b"}, "key": ["order_id"], "compare": ["total"]})
    report = verify_frames(spark, staging, reference, v)
    assert report["state"]["changed"] == 20
    assert sorted(s["key"]["order_id"] for s in report["state"]["changed_sample"]) == [
        i for i in range(ROWS) if i % 1000 == 3
    ]
    first, keys = report["bisection"]
    assert keys["rows_read"] >= first["rows"]  # every differing cell read whole in the end
