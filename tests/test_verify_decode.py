"""Decoding the one key that makes a cell differ, and bisection when it cannot be decoded."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rewind.spec import Verify
from rewind.verify import cells
from rewind.verify.cells import P, decode_cells
from rewind.verify.service import verify_frames


def cell(staging: list[tuple[int, int]], reference: list[tuple[int, int]]) -> dict[str, Any]:
    """A cell's aggregate as the first level computes it, from (key hash, row hash) pairs."""

    def moments(rows: list[tuple[int, int]]) -> list[int]:
        out = [0, 0, 0, 0]
        for kh, h in rows:
            a, m = kh % P, h % P
            for i in range(4):
                out[i] += m
                m = a * m % P
        return out

    s, r = moments(staging), moments(reference)
    return {
        "w": 0,
        "tb": 0,
        "kb": 5,
        "n_s": len(staging),
        "n_r": len(reference),
        **{f"d{i + 1}": s[i] - r[i] for i in range(4)},
    }


def test_a_cell_where_one_key_differs_names_it() -> None:
    rng = random.Random(7)
    same = [(rng.getrandbits(63), rng.getrandbits(63)) for _ in range(100)]
    key = rng.getrandbits(63)
    changed = cell([*same, (key, 111)], [*same, (key, 222)])
    missing = cell(same, [*same, (key, 333)])
    extra = cell([*same, (key, 444), (key, 444)], same)  # a duplicated extra key
    found, rest = decode_cells([changed, missing, extra], ["w", "tb"])
    assert [f["sig"] for f in found] == [key % P] * 3 and rest == []


def test_a_cell_where_two_keys_differ_is_left_for_bisection() -> None:
    rng = random.Random(8)
    same = [(rng.getrandbits(63), rng.getrandbits(63)) for _ in range(100)]
    one, two = rng.getrandbits(63), rng.getrandbits(63)
    two_keys = cell([*same, (one, 1), (two, 2)], [*same, (one, 3), (two, 4)])
    nothing_to_divide = cell([*same, (one, P)], [*same, (one, 2 * P)])  # the same hash modulo P
    found, rest = decode_cells([two_keys, nothing_to_divide], ["w", "tb"])
    assert found == [] and len(rest) == 2 and rest[0]["n_s"] == 102


@pytest.fixture
def sides(spark: Any) -> tuple[Any, Any]:
    from pyspark.sql import functions as F

    reference = spark.range(20_000).select(F.col("id").alias("order_id"), (F.col("id") * 2).alias("total"))
    staging = reference.withColumn(
        "total", F.when(F.col("order_id") % 1000 == 3, F.col("total") + 1).otherwise(F.col("total"))
    )
    return staging, reference


def test_decoded_cells_are_fetched_in_one_pass(spark: Any, sides: tuple[Any, Any]) -> None:
    staging, reference = sides
    v = Verify.model_validate({"reference": {"iceberg": "a.b"}, "key": ["order_id"]})
    report = verify_frames(spark, staging, reference, v)
    assert report["state"]["changed"] == 20
    [level] = report["bisection"]
    assert level["decoded_cells"] == level["differing_cells"] == 20


def test_without_decoding_bisection_finds_the_same(
    spark: Any, sides: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cells, "DECODE_CELLS", 0)
    staging, reference = sides
    v = Verify.model_validate({"reference": {"iceberg": "a.b"}, "key": ["order_id"], "drill_rows": 100})
    report = verify_frames(spark, staging, reference, v)
    assert "decoded_cells" not in report["bisection"][0] and len(report["bisection"]) >= 2
    assert report["state"]["changed"] == 20
    assert sorted(s["key"]["order_id"] for s in report["state"]["changed_sample"]) == [
        i for i in range(20_000) if i % 1000 == 3
    ]
