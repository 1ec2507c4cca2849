"""A shadow's v2 may add a field to the read model: the SQL sink adds the output's new columns
to v2 (nullable, after v1's), resumes it, and still refuses them on an ordinary repair. SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.sink import SqlSink
from tests.test_sink_postgres import SCHEMA, commit, rows


def _v1(db: Path) -> None:
    """v1 without ``status`` (the new field of v2), unique on the key, with one row."""
    from rewind.sinks.sql.types import sqlite_type

    cols = ", ".join(f'"{f.name}" {sqlite_type(f.type)}' for f in SCHEMA if f.name != "status")
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TABLE orders ({cols})")
        conn.execute("CREATE UNIQUE INDEX orders_key ON orders (order_id)")
        conn.execute("INSERT INTO orders (order_id, amount) VALUES (1, 9.5)")


def test_a_shadows_v2_gets_the_new_column_and_a_repair_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "sink.db"
    _v1(db)
    url = f"sqlite:///{db}"
    with pytest.raises(SqlSinkError, match="output column status is not in"):
        SqlSink(url, "orders", key=["order_id"], spool_dir=tmp_path).check(SCHEMA)

    sink = SqlSink(url, "orders", key=["order_id"], spool_dir=tmp_path, copy_target=False)
    sink.check(SCHEMA)
    staging = sink.prepare("r1", SCHEMA)
    with sqlite3.connect(db) as conn:
        v2_cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{staging.table}")')]
        v1_cols = [r[1] for r in conn.execute("PRAGMA table_info(orders)")]
        assert conn.execute(f'SELECT COUNT(*) FROM "{staging.table}"').fetchone()[0] == 0
    assert v2_cols == [*v1_cols, "status"]  # v1's columns in order, the new one after them

    commit(sink, staging, "u1", rows("r1", [(2, 0, 3.0), (3, 1, 4.0)], status="open"))
    again = sink.prepare("r1", SCHEMA)  # a restarted shadow finds its v2 again
    assert again.table == staging.table
    with sqlite3.connect(db) as conn:
        got = sorted(conn.execute(f'SELECT order_id, status, amount FROM "{staging.table}"').fetchall())
        assert got == [(2, "open", 3.0), (3, "open", 4.0)]
        assert conn.execute("SELECT order_id, amount FROM orders").fetchall() == [(1, 9.5)]  # v1 untouched
