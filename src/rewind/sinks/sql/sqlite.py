"""The SQLite backend (the embedded SQL sink): the same operations with SQLite's DDL and ``executemany``."""

from __future__ import annotations

import hashlib
import re
from datetime import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.sinks.sql.backend import Backend, Mode, Tx, conflict_sql
from rewind.sinks.sql.encoding import prepare_columns, read_batches
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.names import TableName, quote_ident
from rewind.sinks.sql.types import SqlColumn, arrow_of, from_text, sqlite_type

if TYPE_CHECKING:
    import pyarrow as pa


class SqliteBackend(Backend):
    def resolve(self, tx: Tx, table: str) -> TableName:
        return TableName(None, table.split(".")[-1])

    def exists(self, tx: Tx, name: TableName) -> bool:
        tx.cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name.name,))
        return tx.cur.fetchone() is not None

    def columns(self, tx: Tx, name: TableName) -> list[SqlColumn]:
        tx.cur.execute(f"PRAGMA table_xinfo({quote_ident(name.name)})")
        out = []
        for _cid, col, declared, notnull, default, pk, hidden in tx.cur.fetchall():
            generated = hidden in (2, 3)
            rowid = bool(pk) and declared.upper() == "INTEGER"
            out.append(
                SqlColumn(col, declared, bool(notnull), default is not None or generated or rowid, generated)
            )
        return out

    def unique_keys(self, tx: Tx, name: TableName) -> list[frozenset[str]]:
        keys: list[frozenset[str]] = []
        tx.cur.execute(f"PRAGMA table_info({quote_ident(name.name)})")
        pk = [r[1] for r in sorted(tx.cur.fetchall(), key=lambda r: r[5]) if r[5]]
        if pk:
            keys.append(frozenset(pk))
        tx.cur.execute(f"PRAGMA index_list({quote_ident(name.name)})")
        for _seq, index, unique, _origin, partial in tx.cur.fetchall():
            if not unique or partial:
                continue
            tx.cur.execute(f"PRAGMA index_info({quote_ident(index)})")
            cols = [r[2] for r in tx.cur.fetchall()]
            if cols and None not in cols:
                keys.append(frozenset(cols))
        return keys

    def blockers(self, tx: Tx, name: TableName) -> list[str]:
        out = []
        tx.cur.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('view', 'trigger') AND sql IS NOT NULL"
        )
        pattern = re.compile(rf"\b{re.escape(name.name)}\b", re.IGNORECASE)
        out += [f"{kind} {obj} mentions it" for kind, obj, sql in tx.cur.fetchall() if pattern.search(sql)]
        tx.cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        for (other,) in tx.cur.fetchall():
            tx.cur.execute(f"PRAGMA foreign_key_list({quote_ident(other)})")
            if any(r[2] == name.name for r in tx.cur.fetchall()):
                out.append(f"a foreign key of {other} references it")
        return out

    def create_like(self, tx: Tx, target: TableName, staging: TableName) -> None:
        tx.cur.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (target.name,))
        ddl = tx.cur.fetchone()[0]
        head = re.match(r'\s*CREATE\s+TABLE\s+(?:"(?:[^"]|"")+"|\[[^\]]+\]|`[^`]+`|[^\s(]+)\s*', ddl, re.I)
        if head is None:
            raise SqlSinkError(f"cannot read the DDL of {target}: {ddl[:80]}")
        tx.cur.execute(f"CREATE TABLE {staging.sql} " + ddl[head.end() :])
        tx.cur.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL "
            "ORDER BY name",
            (target.name,),
        )
        for n, (_index, sql) in enumerate(tx.cur.fetchall()):
            m = re.match(
                r"\s*CREATE\s+(UNIQUE\s+)?INDEX\s+(IF\s+NOT\s+EXISTS\s+)?.+?\s+ON\s+.+?\s*\(",
                sql,
                re.I | re.S,
            )
            if m is None:
                raise SqlSinkError(f"cannot read an index of {target}: {sql[:80]}")
            unique = "UNIQUE " if m.group(1) else ""
            tx.cur.execute(
                f"CREATE {unique}INDEX {quote_ident(f'{staging.name}_{n}')} ON {staging.sql} ("
                + sql[m.end() :]
            )
        cols = [c for c in self.columns(tx, target) if not c.generated]
        names = ", ".join(quote_ident(c.name) for c in cols)
        tx.cur.execute(f"INSERT INTO {staging.sql} ({names}) SELECT {names} FROM {target.sql}")

    def column_type(self, kind: pa.DataType) -> str:
        return sqlite_type(kind)

    def fingerprint(self, tx: Tx, name: TableName) -> tuple[int, str]:
        tx.cur.execute(f"SELECT * FROM {name.sql}")
        rows, total = 0, 0
        while True:
            chunk = tx.cur.fetchmany(10_000)
            if not chunk:
                break
            for r in chunk:
                digest = hashlib.blake2b(repr(r).encode(), digest_size=8).digest()
                total = (total + int.from_bytes(digest, "big")) % (1 << 64)
            rows += len(chunk)
        return rows, f"{rows}:{total}"

    def upsert_rows(
        self,
        tx: Tx,
        staging: TableName,
        columns: list[str],
        files: list[str],
        conflict: list[str],
        mode: Mode,
    ) -> int:
        names = ", ".join(quote_ident(c) for c in columns)
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {staging.sql} ({names}) VALUES ({marks}) " + conflict_sql(
            staging.sql, columns, conflict, mode, sqlite=True
        )
        rows = 0
        for batch in read_batches(files, columns):
            prepared = prepare_columns(batch, sqlite=True)
            values = list(zip(*(c.to_pylist() for c in prepared.columns), strict=True))
            tx.cur.executemany(sql, values)
            rows += batch.num_rows
        return rows

    def read_arrow(self, tx: Tx, name: TableName, join: str = "") -> pa.Table:
        """All rows, each column as the Arrow type of its declared type in SQLite (``REAL`` is a
        double: :func:`arrow_of`), or typed by its values where the declaration fixes none."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        cols = self.columns(tx, name)
        tx.cur.execute(f"SELECT {', '.join(quote_ident(c.name) for c in cols)} FROM {name.sql}{join}")
        data: list[list[Any]] = [[] for _ in cols]
        for row in tx.cur.fetchall():
            for i, v in enumerate(row):
                data[i].append(v)
        arrays = [_column(values, arrow_of(c.type, "sqlite")) for c, values in zip(cols, data, strict=True)]
        return pa.Table.from_arrays(arrays, names=[c.name for c in cols])


def _column(values: list[Any], t: pa.DataType | None) -> pa.Array:
    """SQLite's values of one column as ``t`` (None: as the values come, see :func:`_untyped`)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if t is None:
        return _untyped(values)
    if pa.types.is_decimal(t):  # NUMERIC affinity keeps number text as INTEGER or REAL
        return pa.array(
            [None if v is None else Decimal(repr(v) if isinstance(v, float) else str(v)) for v in values], t
        )
    if pa.types.is_time(t):
        return pa.array([None if v is None else time.fromisoformat(str(v)) for v in values], t)
    if pa.types.is_temporal(t):
        return from_text(pa.array([None if v is None else str(v) for v in values], pa.string()), t)
    if pa.types.is_boolean(t):
        return pa.array([None if v is None else bool(v) for v in values], pa.bool_())
    if pa.types.is_floating(t):  # a REAL column's integral values come as ints
        return pa.array([None if v is None else float(v) for v in values], t)
    return pa.array(values, t)


def _untyped(values: list[Any]) -> pa.Array:
    """A column whose declared type fixes none: integers as int64, numbers with a double among
    them as float64 (NUMERIC affinity stores a whole double as an integer), all bytes as binary,
    anything else as text."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int}:
        return pa.array(values, pa.int64())
    if kinds <= {int, float}:
        return pa.array([None if v is None else float(v) for v in values], pa.float64())
    if kinds == {bytes}:
        return pa.array(values, pa.binary())
    return pa.array([None if v is None else str(v) for v in values], pa.string())
