"""The Iceberg merge's decisions in Spark (:mod:`rewind.spark.merge_stage`) against the driver's.

Two identical branches are merged, one with the driver deciding (threshold above the contested
set), one with Spark deciding (threshold forced to 0): the branches must hold the same rows, the
counts must be equal and the routed rows the same, whole and in the same order.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from rewind.core.merge import MergePolicy
from rewind.job.merge_iceberg import MERGED_PROPERTY, merge_iceberg
from tests.test_merge_iceberg import RUN, rows, staged

POLICIES = [
    MergePolicy(),
    MergePolicy("prefer-live"),
    MergePolicy("prefer-backfill", ambiguous="route"),
    MergePolicy("latest-offset", ambiguous="route"),
    MergePolicy(cut_time_us=1_790_000_000_000_000 + 5_000),
    MergePolicy(cut_offsets={("orders", 0): 2}),
]


def scenario() -> tuple[list[pa.Table], list[pa.Table]]:
    """Live in three files (one the run cannot meet); the run in three: keys written twice at
    different times and at the same time with other values, keys live holds older and newer,
    a live key held twice."""
    far = rows(list(range(1000, 1010)), 500.0, "live", -10_000)
    near = rows([3, 4, 5, 50, 50], 100.0, "live", -10_000)
    ahead = rows([6, 8], 600.0, "live", 10_000)
    run = [rows([1, 2, 3, 4], 1.0, RUN, 0), rows([5, 6, 7, 1, 7], 10.0, RUN, 0, offset0=4)]
    run.append(rows([50, 60, 8, 9, 9], 20.0, RUN, 0, offset0=9))
    run[1] = run[1].set_column(6, "_rewind_source_timestamp", run[0].column(6).take([0, 1, 2, 0, 3]))
    return [far, near, ahead], run


def branch_rows(catalog: Any, name: str, ref: str) -> list[tuple[Any, ...]]:
    table = catalog.load_table(f"m.{name}")
    head = table.snapshot_by_name(ref)
    assert head.summary.additional_properties[MERGED_PROPERTY] == RUN
    got = table.scan(snapshot_id=head.snapshot_id).to_arrow()
    return sorted(tuple(r.values()) for r in got.to_pylist())


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.on_collision}-{p.ambiguous}-{p.has_cut}")
def test_spark_decides_as_the_driver_does(iceberg_catalog: Any, spark: Any, policy: MergePolicy) -> None:
    live, run = scenario()
    results = {}
    for side, threshold in (("driver", 10**9), ("spark", 0)):
        sink, staging = staged(iceberg_catalog, side, live, run)
        results[side] = merge_iceberg(
            sink, staging, RUN, ["k"], policy, spark=lambda: spark, spark_rows=threshold
        )
        results[side + "_rows"] = branch_rows(iceberg_catalog, side, staging.ref)  # type: ignore[assignment]
        iceberg_catalog.purge_table(f"m.{side}")
    driver, in_spark = results["driver"], results["spark"]
    assert in_spark.applied.num_rows == 0 < driver.applied.num_rows, "each side took its path"
    assert in_spark.counts == driver.counts
    assert sum(driver.counts.values()) == sum(t.num_rows for t in run)
    assert results["spark_rows"] == results["driver_rows"]
    assert in_spark.routed.to_pylist() == driver.routed.to_pylist()
    if policy.ambiguous == "route":
        assert driver.counts["routed"] == 2


def test_a_composite_key_with_nulls_is_decided_alike(iceberg_catalog: Any, spark: Any) -> None:
    live, run = scenario()

    def with_region(t: pa.Table) -> pa.Table:
        region = [None if k % 3 == 0 else f"r{k % 2}" for k in t.column("k").to_pylist()]
        return t.add_column(1, "region", pa.array(region, pa.string()))

    live, run = [with_region(t) for t in live], [with_region(t) for t in run]
    out = {}
    for side, threshold in (("driver", 10**9), ("spark", 0)):
        sink, staging = staged(iceberg_catalog, side, live, run)
        result = merge_iceberg(
            sink, staging, RUN, ["k", "region"], MergePolicy(), spark=lambda: spark, spark_rows=threshold
        )
        out[side] = (result.counts, branch_rows(iceberg_catalog, side, staging.ref))
    assert out["spark"] == out["driver"]
