"""The Iceberg merge step (:mod:`rewind.job.merge_iceberg`) on a real pyiceberg table, no Spark.

The step reads in stages and decides only the contested rows; these check that what it leaves
on the branch is what deciding every row would leave (the branch's rows against
:func:`rewind.core.merge.decide` over all the run's and live's rows), that a live file whose key
bounds cannot meet the run's keys is never opened, that a run meeting nothing rewrites no
file (a file-less commit carries the marker), and that routed rows come back whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rewind.core.merge import MergePolicy, _decide_all
from rewind.core.parquet import write_parquet
from rewind.job.merge_iceberg import MERGED_PROPERTY, merge_iceberg
from rewind.sinks.iceberg import IcebergSink

BASE = 1_790_000_000_000_000
RUN = "r-20261125-120000-abc123"
"""Ledger-shaped: longer than an Iceberg bound (16 characters), so files are told by commit."""


def rows(keys: list[int], value: float, run: str, t0: int, offset0: int = 0) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "v": pa.array([value + i for i in range(n)], pa.float64()),
            "_rewind_event_id": pa.array([f"{run}-{i}" for i in range(n)]),
            "_rewind_source_topic": pa.array(["orders"] * n),
            "_rewind_source_partition": pa.array([0] * n, pa.int32()),
            "_rewind_source_offset": pa.array(range(offset0, offset0 + n), pa.int64()),
            "_rewind_source_timestamp": pa.array(
                [BASE + t0 + i for i in range(n)], pa.timestamp("us", tz="UTC")
            ),
            "_rewind_run_id": pa.array([run] * n),
        }
    )


def staged(catalog: Any, name: str, live: list[pa.Table], run: list[pa.Table]) -> tuple[IcebergSink, Any]:
    """A target holding ``live`` (one file each), a staging branch with the run's files committed."""
    catalog.create_namespace_if_not_exists("m")
    table = catalog.create_table(f"m.{name}", schema=run[0].schema)
    for part in live:
        table.append(part.cast(run[0].schema))
    sink = IcebergSink(catalog, f"m.{name}")
    staging = sink.prepare(RUN, run[0].schema)
    files = [write_parquet(sink.data_folder(staging), part, "unit") for part in run]
    sink.commit(staging, RUN, [f"u{i}" for i in range(len(run))], files)
    return sink, staging


def branch(catalog: Any, name: str, ref: str) -> tuple[Any, set[str]]:
    table = catalog.load_table(f"m.{name}")
    head = table.snapshot_by_name(ref)
    files = {t.file.file_path for t in table.scan(snapshot_id=head.snapshot_id).plan_files()}
    return head, files


def local(uri: str) -> str:
    return urlparse(uri).path


def as_set(t: pa.Table) -> set[tuple[Any, ...]]:
    return {(r["k"], r["v"], r["_rewind_run_id"]) for r in t.to_pylist()}


@pytest.mark.parametrize(
    "policy", [MergePolicy(), MergePolicy("prefer-live"), MergePolicy(ambiguous="route")]
)
def test_the_branch_holds_what_deciding_every_row_says(iceberg_catalog: Any, policy: MergePolicy) -> None:
    far = rows(list(range(1000, 1010)), 500.0, "live", -10_000)  # keys the run never writes
    near = rows([3, 4, 5, 50], 100.0, "live", -10_000)  # 3, 4, 5 older than the run's
    ahead = rows([6], 600.0, "live", 10_000)  # newer than the run's 6
    run = [rows([1, 2, 3, 4], 1.0, RUN, 0), rows([5, 6, 7, 1, 7], 10.0, RUN, 0, offset0=4)]
    run.append(rows([50, 60], 20.0, RUN, 0, offset0=9))  # meets live, no key twice: not read whole
    # 7 twice at different times (dedup); 1 twice at the same time with other values (a tie)
    run[1] = run[1].set_column(6, "_rewind_source_timestamp", run[0].column(6).take([0, 1, 2, 0, 3]))
    name = policy.on_collision.replace("-", "_") + policy.ambiguous.replace("-", "_")
    sink, staging = staged(iceberg_catalog, name, [far, near, ahead], run)
    _, before = branch(iceberg_catalog, name, staging.ref)
    far_file = next(f for f in before if pq.read_table(local(f)).column("k")[0].as_py() == 1000)
    hidden = Path(local(far_file) + ".away")
    Path(local(far_file)).rename(hidden)  # opening it now would fail the merge
    result = merge_iceberg(sink, staging, RUN, ["k"], policy)
    hidden.rename(local(far_file))

    everything = pa.concat_tables(run)
    live = pa.concat_tables([far, near, ahead]).cast(everything.schema)
    expected = _decide_all(everything, live, ["k"], policy)
    assert result.counts == expected.counts
    head, after = branch(iceberg_catalog, name, staging.ref)
    table = iceberg_catalog.load_table(f"m.{name}")
    got = table.scan(snapshot_id=head.snapshot_id).to_arrow()
    replaced = set(expected.replaced.column("k").to_pylist())
    kept_live = live.filter(pa.array([k not in replaced for k in live.column("k").to_pylist()]))
    assert as_set(got) == as_set(expected.applied) | as_set(kept_live)
    assert got.num_rows == len(set(got.column("k").to_pylist())), "a key twice"
    assert head.summary.additional_properties[MERGED_PROPERTY] == RUN
    assert far_file in after, "the live file the run's keys cannot meet is kept as it is"
    assert result.routed.num_rows == result.counts["routed"]
    if policy.ambiguous == "route":
        assert result.counts["routed"] == 2
        assert set(result.routed.column_names) == set(everything.column_names), "routed rows whole"


def test_a_run_meeting_nothing_rewrites_no_file(iceberg_catalog: Any) -> None:
    live = rows([100, 101], 5.0, "live", -10_000)
    sink, staging = staged(iceberg_catalog, "quiet", [live], [rows([1, 2, 3], 1.0, RUN, 0)])
    _, before = branch(iceberg_catalog, "quiet", staging.ref)
    result = merge_iceberg(sink, staging, RUN, ["k"], MergePolicy())
    head, after = branch(iceberg_catalog, "quiet", staging.ref)
    assert result.counts["applied"] == 3 and sum(result.counts.values()) == 3
    assert after == before
    assert head.summary.additional_properties[MERGED_PROPERTY] == RUN


CHILD = """
import json, sys
from pyiceberg.catalog.sql import SqlCatalog
from rewind.core.merge import MergePolicy
from rewind.job.merge_iceberg import merge_iceberg
from rewind.sinks.iceberg import IcebergSink, IcebergStaging

catalog = SqlCatalog("test", uri=sys.argv[1], warehouse=sys.argv[2])
staging = IcebergStaging.from_dict(json.loads(sys.argv[4]))
merge_iceberg(IcebergSink(catalog, sys.argv[3]), staging, sys.argv[5], ["k"], MergePolicy())
"""


def test_a_driver_killed_during_the_merge_commit_merges_once_on_resume(iceberg_catalog: Any) -> None:
    """SIGKILL inside the commit (the rewritten files written, the branch not moved): the branch
    is as before, the merge is not seen as done, and the merge on resume leaves what a clean
    merge does, no key twice."""
    import json
    import os
    import subprocess
    import sys

    from rewind.job.merge import _done

    live = rows([2, 3, 40], 100.0, "live", -10_000)
    run = [rows([1, 2, 3, 5], 1.0, RUN, 0), rows([5, 6], 10.0, RUN, 1_000, offset0=4)]
    sink, staging = staged(iceberg_catalog, "killed", [live], run)
    before, files = branch(iceberg_catalog, "killed", staging.ref)
    env = {**os.environ, "REWIND_FAULT": "mid-merge-commit"}
    args = [iceberg_catalog.properties["uri"], iceberg_catalog.properties["warehouse"], "m.killed"]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *args, json.dumps(staging.to_dict()), RUN],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    head, after = branch(iceberg_catalog, "killed", staging.ref)
    assert head.snapshot_id == before.snapshot_id and after == files
    assert _done(sink, staging, RUN, None) is None

    result = merge_iceberg(sink, staging, RUN, ["k"], MergePolicy())
    assert result.counts == {
        "applied": 5,
        "deduplicated": 1,
        "superseded": 0,
        "rejected_stale": 0,
        "routed": 0,
    }
    assert _done(sink, staging, RUN, None) == result.counts
    head, _ = branch(iceberg_catalog, "killed", staging.ref)
    got = iceberg_catalog.load_table("m.killed").scan(snapshot_id=head.snapshot_id).to_arrow()
    assert sorted((r["k"], r["_rewind_run_id"]) for r in got.to_pylist()) == [
        (1, RUN),
        (2, RUN),
        (3, RUN),
        (5, RUN),
        (6, RUN),
        (40, "live"),
    ]
