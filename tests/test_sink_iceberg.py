"""Iceberg staging, promotion and rollback on a real SQL catalog (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from rewind.sinks.files import write_parquet
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
