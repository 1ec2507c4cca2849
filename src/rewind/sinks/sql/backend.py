"""One small interface over the two databases, and the bookkeeping tables (the same on both).

:class:`Backend` holds what differs between PostgreSQL and SQLite (catalog queries, locks,
DDL of a staging, the upsert); everything else in the sink is written once against it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rewind.core.columns import (
    EVENT_ID,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
)
from rewind.secrets import mask_url
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.names import TableName, quote_ident
from rewind.sinks.sql.types import SqlColumn

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy import Table
    from sqlalchemy.engine import Connection

STAGINGS_TABLE = "rewind_stagings"
UNITS_TABLE = "rewind_unit_commits"
RUN_COL = RUN_ID
ORDER_COLS = (SOURCE_TIMESTAMP, SOURCE_PARTITION, SOURCE_OFFSET, EVENT_ID)
"""The event order that decides which row of a key wins (greatest wins)."""
Mode = Literal["upsert", "append", "replace"]
"""``replace``: rows a merge policy decided on (:mod:`rewind.job.merge`) overwrite their key."""


def lock_times(asked: float, granted: float) -> dict[str, float]:
    """How long the swap waited for its exclusive locks (new readers queue meanwhile) and held them."""
    return {
        "lock_wait_ms": round((granted - asked) * 1000, 1),
        "exclusive_ms": round((time.perf_counter() - granted) * 1000, 1),
    }


def sqlalchemy_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` → psycopg 3 (COPY needs it); SQLite as given."""
    if url.startswith("sqlite"):
        return url
    m = re.match(r"postgres(?:ql)?(?:\+\w+)?://", url)
    if not m:
        raise SqlSinkError(f"{mask_url(url)} is not a PostgreSQL or SQLite URL")
    return "postgresql+psycopg://" + url[m.end() :]


class Bookkeeping:
    """``rewind_stagings`` and ``rewind_unit_commits`` in the target's schema."""

    def __init__(self, schema: str | None) -> None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import BigInteger, Boolean, Column, DateTime, MetaData, String, Table, Text

        self.metadata = MetaData(schema=schema)
        self.stagings: Table = Table(
            STAGINGS_TABLE,
            self.metadata,
            Column("staging", String(63), primary_key=True),
            Column("run_id", String(200), nullable=False),
            Column("target", String(63), nullable=False),
            Column("target_existed", Boolean, nullable=False),
            Column("state", String(16), nullable=False),
            Column("base_rows", BigInteger),
            Column("base_fingerprint", Text),
            Column("promoted_fingerprint", Text),
            Column("created_at", DateTime(timezone=True), nullable=False),
            Column("updated_at", DateTime(timezone=True), nullable=False),
        )
        self.units: Table = Table(
            UNITS_TABLE,
            self.metadata,
            Column("run_id", String(200), primary_key=True),
            Column("unit_id", String(400), primary_key=True),
            Column("staging", String(63), nullable=False),
            Column("counts", Text),
            Column("rows_out", BigInteger),
            Column("committed_at", DateTime(timezone=True), nullable=False),
        )

    def create(self, tx: Tx) -> None:
        self.metadata.create_all(tx.conn, checkfirst=True)


@dataclass
class Tx:
    conn: Connection
    cur: Any
    raw: Any


class Backend:
    """What differs between PostgreSQL and SQLite: catalog queries, DDL, loading, reading."""

    def session(self, tx: Tx) -> None: ...

    def resolve(self, tx: Tx, table: str) -> TableName:
        raise NotImplementedError

    def exists(self, tx: Tx, name: TableName) -> bool:
        raise NotImplementedError

    def columns(self, tx: Tx, name: TableName) -> list[SqlColumn]:
        raise NotImplementedError

    def unique_keys(self, tx: Tx, name: TableName) -> list[frozenset[str]]:
        raise NotImplementedError

    def blockers(self, tx: Tx, name: TableName) -> list[str]:
        raise NotImplementedError

    def create_like(self, tx: Tx, target: TableName, staging: TableName) -> None:
        raise NotImplementedError

    def column_type(self, kind: pa.DataType) -> str:
        """The SQL type this database stores an Arrow type as."""
        raise NotImplementedError

    def create_new(
        self, tx: Tx, staging: TableName, schema: pa.Schema, conflict: list[str], index_name: str
    ) -> None:
        """A new table of ``schema``, with a unique index ``index_name`` on the conflict key."""
        cols = ", ".join(
            f"{quote_ident(f.name)} {self.column_type(f.type)}{'' if f.nullable else ' NOT NULL'}"
            for f in schema
        )
        tx.cur.execute(f"CREATE TABLE {staging.sql} ({cols})")
        keys = ", ".join(quote_ident(c) for c in conflict)
        tx.cur.execute(f"CREATE UNIQUE INDEX {quote_ident(index_name)} ON {staging.sql} ({keys})")

    def fingerprint(self, tx: Tx, name: TableName) -> tuple[int, str]:
        raise NotImplementedError

    def lock_share(self, tx: Tx, name: TableName) -> None: ...

    def lock_timeout(self, tx: Tx, seconds: float) -> None: ...

    def lock_exclusive(self, tx: Tx, *names: TableName) -> tuple[float, float]:
        """Take the swap's exclusive locks; returns when they were asked for and granted."""
        now = time.perf_counter()
        return now, now

    def rename_sql(self, name: TableName, new: str) -> str:
        return f"ALTER TABLE {name.sql} RENAME TO {quote_ident(new)}"

    def index_swap_sql(self, tx: Tx, a: TableName, b: TableName, tag: str) -> list[str]:
        """Statements that exchange the names of ``a``'s and ``b``'s matching indexes."""
        return []

    def key_index_sql(self, tx: Tx, where: TableName, old_table: str, new_table: str) -> list[str]:
        """Statements that rename a new table's key index along with the table."""
        return []

    def run_all(self, tx: Tx, statements: list[str]) -> None:
        for statement in statements:
            tx.cur.execute(statement)

    def drop(self, tx: Tx, name: TableName) -> None:
        tx.cur.execute(f"DROP TABLE {name.sql}")

    def is_lock_timeout(self, exc: BaseException) -> bool:
        return False

    def read_arrow(self, tx: Tx, name: TableName, join: str = "") -> pa.Table:
        """Every row of ``name`` (``join``: SQL after ``FROM name``, to keep some rows only)."""
        raise NotImplementedError

    def upsert_rows(
        self,
        tx: Tx,
        staging: TableName,
        columns: list[str],
        files: list[str],
        conflict: list[str],
        mode: Mode,
    ) -> int:
        raise NotImplementedError


def event_row(alias: str, minus_infinity: str, with_id: bool) -> str:
    """The event order of a row as a SQL row value: (source time, partition, offset[, event id])."""
    ts, part, off, eid = (quote_ident(c) for c in ORDER_COLS)
    tail = f", {alias}.{eid}" if with_id else ""
    return f"(COALESCE({alias}.{ts}, {minus_infinity}), {alias}.{part}, {alias}.{off}{tail})"


def conflict_sql(ref: str, columns: list[str], conflict: list[str], mode: Mode, sqlite: bool) -> str:
    """The ON CONFLICT clause: ``append`` skips, ``upsert`` replaces unless the row there is later.

    ``ref`` names the staging table in the statement. The row of the latest event wins:

    * a row of this run is replaced by a row of a later event (ties broken by event id), so
      the order in which units commit does not matter and a re-applied row changes nothing;
    * a row not of this run (a copied target row, an earlier backfill) is replaced unless it
      comes from a later source record: a window's replay never regresses a key that live
      traffic (with lineage) moved past the window; a tie on the source record goes to this
      run (a re-run with a fixed transform wins); rows without lineage are always replaced.
    """
    keys = ", ".join(quote_ident(c) for c in conflict)
    sets = ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in columns if c not in conflict)
    if mode == "append" or not sets:
        return f"ON CONFLICT ({keys}) DO NOTHING"
    if mode == "replace":  # a merge policy decided already: its rows replace whatever is there
        return f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"
    inf = "''" if sqlite else "'-infinity'"
    distinct = "IS NOT" if sqlite else "IS DISTINCT FROM"
    run, off = quote_ident(RUN_COL), quote_ident(ORDER_COLS[2])
    other_run = (
        f"({ref}.{run} {distinct} EXCLUDED.{run} AND ({ref}.{off} IS NULL "
        f"OR {event_row(ref, inf, False)} <= {event_row('EXCLUDED', inf, False)}))"
    )
    later = f"{event_row(ref, inf, True)} < {event_row('EXCLUDED', inf, True)}"
    same_run = f"({ref}.{run} = EXCLUDED.{run} AND {later})"
    return f"ON CONFLICT ({keys}) DO UPDATE SET {sets} WHERE {other_run} OR {same_run}"
