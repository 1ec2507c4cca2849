"""Iceberg staging, promotion and rollback on a real SQL catalog (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from rewind.core.parquet import write_parquet
from rewind.sinks.iceberg import IcebergSink, IcebergSinkError

SCHEMA = pa.schema(
    [("k", pa.int64()), ("v", pa.string()), ("_rewind_source_timestamp", pa.timestamp("us", tz="UTC"))]
)


def ts(hour: int) -> datetime:
    return datetime(2026, 10, 1, hour, tzinfo=UTC)


def rows(*items: tuple[int, str, int]) -> pa.Table:
    return pa.table(
        {
            "k": [k for k, _, _ in items],
            "v": [v for _, v, _ in items],
            "_rewind_source_timestamp": pa.array([ts(h) for _, _, h in items], pa.timestamp("us", tz="UTC")),
        }
    )


def main_values(catalog: Any, name: str) -> list[str]:
    return sorted(catalog.load_table(name).scan().to_arrow().column("v").to_pylist())


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    if request.param == "sqlite":
        uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    else:
        uri = request.getfixturevalue("pg_url").replace("postgresql://", "postgresql+psycopg://")
    cat = SqlCatalog(f"t{request.param}", uri=uri, warehouse=warehouse.as_uri())
    cat.create_namespace_if_not_exists("an")
    return cat


def test_branch_promote_rollback_promote_again(catalog: Any) -> None:
    table = catalog.create_table("an.totals", schema=SCHEMA)
    table.append(rows((1, "a", 1), (2, "b", 2)))
    sink = IcebergSink(catalog, "an.totals")
    staging = sink.prepare("r1", SCHEMA)
    assert staging.branch == "rewind-r1" and not staging.created_table
    sink.commit(staging, "r1", ["u1"], [write_parquet(sink.data_folder(staging), rows((3, "c", 3)), "x")])
    assert main_values(catalog, "an.totals") == ["a", "b"]  # staging is invisible to main's readers
    assert sink.committed_units(staging, "r1") == {"u1"}

    promoted = sink.promote(staging)
    assert main_values(catalog, "an.totals") == ["a", "b", "c"]
    again = sink.promote(staging)  # a re-run after a crash between the swap and the ledger
    assert again.already_done and main_values(catalog, "an.totals") == ["a", "b", "c"]

    back = sink.rollback(staging, promoted.to_dict())
    assert not back.already_done and main_values(catalog, "an.totals") == ["a", "b"]
    assert sink.rollback(staging, promoted.to_dict()).already_done

    sink.promote(staging)
    assert main_values(catalog, "an.totals") == ["a", "b", "c"]


def test_promotion_refuses_when_main_moved(catalog: Any) -> None:
    table = catalog.create_table("an.moving", schema=SCHEMA)
    table.append(rows((1, "a", 1)))
    sink = IcebergSink(catalog, "an.moving")
    staging = sink.prepare("r2", SCHEMA)
    sink.commit(staging, "r2", ["u1"], [write_parquet(sink.data_folder(staging), rows((2, "b", 2)), "x")])
    catalog.load_table("an.moving").append(rows((9, "live write", 5)))  # production moved on
    with pytest.raises(IcebergSinkError, match="main moved"):
        sink.promote(staging)
    assert main_values(catalog, "an.moving") == ["a", "live write"]  # nothing dropped


def test_new_read_model_is_a_staging_table_renamed_on_promotion(catalog: Any) -> None:
    sink = IcebergSink(catalog, "an.fresh")
    assert "does not exist" in sink.check(SCHEMA)
    staging = sink.prepare("r3", SCHEMA)
    assert staging.created_table and staging.table == "an.fresh__rewind_r3"
    sink.commit(staging, "r3", ["u1"], [write_parquet(sink.data_folder(staging), rows((1, "a", 1)), "x")])
    promoted = sink.promote(staging)
    assert main_values(catalog, "an.fresh") == ["a"]
    sink.rollback(staging, promoted.to_dict())
    assert main_values(catalog, "an.fresh__rewind_r3") == ["a"]  # kept for a re-promotion


def test_replace_window_replaces_only_the_window(catalog: Any) -> None:
    table = catalog.create_table("an.window", schema=SCHEMA)
    table.append(rows((1, "a", 1), (2, "b", 2), (3, "c", 3), (4, "d", 4)))
    sink = IcebergSink(catalog, "an.window", "replace-window", "_rewind_source_timestamp", (ts(2), ts(4)))
    staging = sink.prepare("r4", SCHEMA)
    sink.commit(staging, "r4", ["u1"], [write_parquet(sink.data_folder(staging), rows((2, "B", 2)), "x")])
    sink.promote(staging)
    assert main_values(catalog, "an.window") == ["B", "a", "d"]


def test_bad_targets_are_one_line_errors_before_anything_is_written(catalog: Any) -> None:
    with pytest.raises(IcebergSinkError, match="does not exist; replace-window needs an existing target"):
        IcebergSink(catalog, "an.absent", "replace-window", "_rewind_source_timestamp", (ts(1), ts(2))).check(
            SCHEMA
        )
    catalog.create_table("an.other", schema=pa.schema([("k", pa.int64()), ("v", pa.int64())]))
    with pytest.raises(IcebergSinkError, match="output column v is string"):
        IcebergSink(catalog, "an.other").check(pa.schema([("k", pa.int64()), ("v", pa.string())]))
    with pytest.raises(IcebergSinkError, match=r"not in an\.other"):
        IcebergSink(catalog, "an.other").check(pa.schema([("k", pa.int64()), ("extra", pa.string())]))
    assert catalog.load_table("an.other").current_snapshot() is None


# -- promote --rebase -------------------------------------------------------------------------


def main_snapshot(catalog: Any, name: str) -> int:
    return int(catalog.load_table(name).metadata.refs["main"].snapshot_id)


def test_rebase_replaces_the_window_on_a_main_that_moved_and_rollback_restores_it(catalog: Any) -> None:
    table = catalog.create_table("an.rebase", schema=SCHEMA)
    table.append(rows((1, "a", 1), (2, "b", 2), (3, "c", 3), (4, "d", 4)))
    sink = IcebergSink(catalog, "an.rebase", "replace-window", "_rewind_source_timestamp", (ts(2), ts(4)))
    staging = sink.prepare("r5", SCHEMA)
    run_rows = rows((2, "B", 2), (3, "C", 3))
    sink.commit(staging, "r5", ["u1"], [write_parquet(sink.data_folder(staging), run_rows, "x")])
    # production moved on: a write outside the window, a delete outside it, a write inside it
    live = catalog.load_table("an.rebase")
    live.append(rows((9, "late", 6), (8, "inside", 3)))
    catalog.load_table("an.rebase").delete("k = 1")
    moved = main_snapshot(catalog, "an.rebase")

    with pytest.raises(IcebergSinkError, match=r"main moved.*--rebase"):
        sink.promote(staging)
    assert main_snapshot(catalog, "an.rebase") == moved

    swap = sink.promote(staging, rebase=True)
    # outside the window: the new main as it is now (a gone, late kept); inside: the run's rows
    assert main_values(catalog, "an.rebase") == ["B", "C", "d", "late"]
    assert not swap.already_done and swap.before == moved
    recorded = swap.to_dict()["rebase"]
    assert recorded["onto"] == moved and recorded["cut_from"] == staging.base_snapshot_id
    assert recorded["run_files"] == 1 and recorded["run_rows"] == 2
    assert recorded["rows_replaced"] == 3  # b, c and the live "inside" row
    assert recorded["window"]["column"] == "_rewind_source_timestamp"
    again = sink.promote(staging)  # a re-run after a kill between the commit and the ledger
    assert again.already_done and again.before == moved and again.after == swap.after
    assert main_values(catalog, "an.rebase") == ["B", "C", "d", "late"]

    back = sink.rollback(staging, swap.to_dict())
    assert not back.already_done and main_snapshot(catalog, "an.rebase") == moved
    assert main_values(catalog, "an.rebase") == ["b", "c", "d", "inside", "late"]
    assert sink.promote(staging, rebase=True).after != swap.after  # re-applied after the rollback
    assert main_values(catalog, "an.rebase") == ["B", "C", "d", "late"]


def test_rebase_of_a_folded_run_re_applies_the_folded_rows(catalog: Any) -> None:
    from rewind.job.finalize import _commit_iceberg
    from rewind.spark.fold_stage import FoldCounts

    schema = SCHEMA.append(pa.field("_rewind_run_id", pa.string()))

    def mine(table: pa.Table) -> pa.Table:
        return table.append_column("_rewind_run_id", pa.array(["r7"] * len(table), pa.string()))

    table = catalog.create_table("an.folded", schema=schema)
    table.append(
        rows((1, "a", 1), (2, "b", 2), (4, "d", 4)).append_column("_rewind_run_id", pa.nulls(3, pa.string()))
    )
    sink = IcebergSink(catalog, "an.folded", "replace-window", "_rewind_source_timestamp", (ts(2), ts(4)))
    staging = sink.prepare("r7", schema)
    folder = sink.data_folder(staging)
    partial = mine(rows((2, "B-part1", 2), (2, "B-part2", 3)))
    sink.commit(staging, "r7", ["u1"], [write_parquet(folder, partial, "x")])
    # the finalize commit: the partial rows give way to the folded one
    _commit_iceberg(
        sink, staging, "r7", [write_parquet(folder, mine(rows((2, "B", 3))), "x")], FoldCounts(2, 1, 0)
    )
    catalog.load_table("an.folded").append(
        rows((9, "late", 6)).append_column("_rewind_run_id", pa.nulls(1, pa.string()))
    )

    sink.promote(staging, rebase=True)
    assert main_values(catalog, "an.folded") == ["B", "a", "d", "late"]


def test_rebase_of_an_append_adds_the_run_rows_to_the_new_main(catalog: Any) -> None:
    table = catalog.create_table("an.appends", schema=SCHEMA)
    table.append(rows((1, "a", 1)))
    sink = IcebergSink(catalog, "an.appends")
    staging = sink.prepare("r6", SCHEMA)
    folder = sink.data_folder(staging)
    sink.commit(staging, "r6", ["u1"], [write_parquet(folder, rows((2, "b", 2)), "x")])
    sink.commit(staging, "r6", ["u2"], [])  # a unit with no rows: a marker commit, no file
    sink.commit(staging, "r6", ["u3"], [write_parquet(folder, rows((3, "c", 3)), "y")])
    catalog.load_table("an.appends").append(rows((9, "live", 5)))
    moved = main_snapshot(catalog, "an.appends")

    swap = sink.promote(staging, rebase=True)
    assert main_values(catalog, "an.appends") == ["a", "b", "c", "live"]
    recorded = swap.to_dict()["rebase"]
    assert recorded["run_files"] == 2 and recorded["rows_replaced"] == 0 and recorded["window"] is None
    sink.rollback(staging, swap.to_dict())
    assert main_snapshot(catalog, "an.appends") == moved
    assert main_values(catalog, "an.appends") == ["a", "live"]


def test_rebase_when_main_did_not_move_is_the_plain_swap(catalog: Any) -> None:
    table = catalog.create_table("an.still", schema=SCHEMA)
    table.append(rows((1, "a", 1)))
    sink = IcebergSink(catalog, "an.still")
    staging = sink.prepare("r7", SCHEMA)
    sink.commit(staging, "r7", ["u1"], [write_parquet(sink.data_folder(staging), rows((2, "b", 2)), "x")])
    head = catalog.load_table("an.still").snapshot_by_name(staging.ref).snapshot_id
    swap = sink.promote(staging, rebase=True)
    assert swap.after == head and "rebase" not in swap.to_dict()


def test_a_new_read_model_cannot_be_rebased_onto_a_target_created_since(catalog: Any) -> None:
    sink = IcebergSink(catalog, "an.late")
    staging = sink.prepare("r8", SCHEMA)
    sink.commit(staging, "r8", ["u1"], [write_parquet(sink.data_folder(staging), rows((1, "a", 1)), "x")])
    catalog.create_table("an.late", schema=SCHEMA).append(rows((5, "theirs", 5)))
    refused = r"cannot rebase an\.late__rewind_r8: .* was created since; re-run the backfill"
    with pytest.raises(IcebergSinkError, match=refused):
        sink.promote(staging, rebase=True)
    with pytest.raises(IcebergSinkError, match="already exists"):
        sink.promote(staging)
    assert main_values(catalog, "an.late") == ["theirs"]  # nothing of either was touched
    assert main_values(catalog, "an.late__rewind_r8") == ["a"]
