"""Both sides of ``rewind compensate`` on a PostgreSQL or SQLite read model, read by Spark tasks.

Production (the target table) and the run's staging table (the target, once promoted) are cut
into slices of their physical row positions; each Spark task reads one slice of one table with
the backend's own reader (``read_arrow``: the same types as a read through the driver). The
driver holds no row: only the slices, and one transaction kept open while the sides are read,
which makes both sides of one moment:

* **PostgreSQL**: the driver's ``REPEATABLE READ`` transaction reads both tables (taking their
  ``ACCESS SHARE`` locks, so neither is renamed, dropped or rewritten, and a promote waits,
  while it is open), exports its snapshot (``pg_export_snapshot()``) and cuts each table into
  ranges of its pages (``ctid``: a TID range scan on PostgreSQL 14+). Each task opens a
  ``REPEATABLE READ`` transaction whose first statement is ``SET TRANSACTION SNAPSHOT`` to the
  driver's: every task sees exactly the driver's moment, whatever a live writer commits
  meanwhile. A row version that snapshot sees stays on its page while the snapshot is held
  (vacuum keeps it), so the ranges hold every row once.
* **SQLite**: one file, and no way to hand a snapshot to another connection (Python's driver
  has no ``sqlite3_snapshot_open``). The driver holds the file's write lock (``BEGIN
  IMMEDIATE``, as the read through the driver did) while the tasks read ``rowid`` ranges, each
  in a read transaction of its own: no other connection can commit a change to the file in
  the meantime (a writer waits for the lock), while readers go on, in WAL and rollback-journal
  mode alike, so every task reads the same state. A table whose columns SQLite types by their
  values (a column declared without a type) or that has no ``rowid`` is read through the driver
  as before: its slices could not agree on one Arrow schema, or it has no positions to cut.

:func:`open_sides` yields the two DataFrames; the transaction ends when its ``with`` block does,
so the caller keeps it open until the last Spark job over the sides has run (a task that
recomputes a lost partition reads the same moment).
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.sinks.sql.backend import Tx
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.names import TableName
from rewind.sinks.sql.postgres import PostgresBackend
from rewind.sinks.sql.sqlite import SqliteBackend
from rewind.sinks.sql.types import arrow_of

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from rewind.sinks.sql.sink import SqlSink, SqlStaging

SLICE_PAGES = 1024
"""PostgreSQL pages (8 KiB) per slice: 8 MiB of heap, ~50-100k rows of a read model."""
SLICE_ROWS = 100_000
"""SQLite rows per slice (by rowid span)."""


@dataclass(frozen=True)
class Slice:
    """One task's part of one table: SQL after ``FROM table`` (a range of row positions)."""

    table: str
    where: str


@dataclass(frozen=True)
class _ReadSlices:
    """The ``mapInArrow`` function of a side (pickled to the tasks): slice indices in, rows out."""

    url: str
    sqlite: bool
    snapshot: str | None
    slices: tuple[Slice, ...]
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from self._read(self.slices[index])

    def _read(self, piece: Slice) -> Iterator[pa.RecordBatch]:
        backend = SqliteBackend() if self.sqlite else PostgresBackend()
        with _connect(self.url, self.sqlite, write_lock=False) as tx:
            if self.snapshot is not None:  # first statement of the transaction
                tx.cur.execute(f"SET TRANSACTION SNAPSHOT '{self.snapshot}'")
            backend.session(tx)
            table = backend.read_arrow(tx, TableName.parse(piece.table), piece.where)
        yield from table.cast(self.schema).to_batches(max_chunksize=10_000)


@contextlib.contextmanager
def open_sides(
    spark: SparkSession, sink: SqlSink, staging: SqlStaging
) -> Iterator[tuple[DataFrame, DataFrame]]:
    """Production's rows and the staged rows as DataFrames read by the tasks (see the module
    docstring); production is empty when the target does not exist. The driver's transaction
    is open until the block ends."""
    target, sname = TableName.parse(staging.target_table), TableName.parse(staging.table)
    backend = sink._backend
    with _connect(sink.url, sink.is_sqlite, write_lock=True) as tx:
        snapshot = None
        if not sink.is_sqlite:
            tx.cur.execute("SELECT pg_export_snapshot()")
            snapshot = str(tx.cur.fetchone()[0])
        backend.session(tx)
        state = sink._state(tx, sname)
        name = target if state in ("promoted", "final") else sname
        if not backend.exists(tx, name):
            raise SqlSinkError(f"staging table {name} does not exist")
        new = _side(spark, sink, tx, name, snapshot)
        if backend.exists(tx, target):
            old = _side(spark, sink, tx, target, snapshot)
        else:
            old = spark.createDataFrame([], new.schema)
        yield old, new


def _side(spark: SparkSession, sink: SqlSink, tx: Tx, name: TableName, snapshot: str | None) -> DataFrame:
    """One table as a DataFrame: its slices read by the tasks, or (see the module docstring) its
    rows read here."""
    # lazy: avoids pyspark at import
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    backend = sink._backend
    empty = backend.read_arrow(tx, name, " LIMIT 0")  # the schema, and the table's lock (PostgreSQL)
    slices = _pg_slices(tx, name) if not sink.is_sqlite else _sqlite_slices(tx, name, sink)
    if slices is None:
        rows = backend.read_arrow(tx, name)
        if rows.num_rows:
            return spark.createDataFrame(rows)
        return spark.createDataFrame([], from_arrow_schema(rows.schema))
    schema = from_arrow_schema(empty.schema)
    read = _ReadSlices(sink.url, sink.is_sqlite, snapshot, tuple(slices), to_arrow_schema(schema))
    ids = spark.range(0, len(slices), 1, len(slices))
    return ids.mapInArrow(read, schema)  # type: ignore[arg-type]


def _pg_slices(tx: Tx, name: TableName) -> list[Slice]:
    """Ranges of ``SLICE_PAGES`` pages of the table as the snapshot sees it; the last one open."""
    tx.cur.execute(
        "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::bigint", (name.sql,)
    )
    pages = int(tx.cur.fetchone()[0])
    count = max(1, math.ceil(pages / SLICE_PAGES))
    out = []
    for i in range(count):
        where = f" WHERE ctid >= '({i * SLICE_PAGES},0)'::tid"
        if i + 1 < count:
            where += f" AND ctid < '({(i + 1) * SLICE_PAGES},0)'::tid"
        out.append(Slice(str(name), where))
    return out


def _sqlite_slices(tx: Tx, name: TableName, sink: SqlSink) -> list[Slice] | None:
    """Ranges of ``rowid`` of about ``SLICE_ROWS`` rows each, the first and last open; None for a
    table the tasks cannot read (see the module docstring)."""
    if any(arrow_of(c.type, "sqlite") is None for c in sink._backend.columns(tx, name)):
        return None
    try:
        tx.cur.execute(f"SELECT min(rowid), max(rowid), count(*) FROM {name.sql}")
    except sqlite3.OperationalError:  # WITHOUT ROWID
        return None
    low, high, rows = tx.cur.fetchone()
    count = max(1, math.ceil((rows or 0) / SLICE_ROWS))
    if low is None or count == 1:
        return [Slice(str(name), "")]
    span = math.ceil((high - low + 1) / count)
    out = []
    for i in range(count):
        bounds = []
        if i:
            bounds.append(f"rowid >= {low + i * span}")
        if i + 1 < count:
            bounds.append(f"rowid < {low + (i + 1) * span}")
        out.append(Slice(str(name), " WHERE " + " AND ".join(bounds)))
    return out


@contextlib.contextmanager
def _connect(url: str, sqlite: bool, *, write_lock: bool) -> Iterator[Tx]:
    """A transaction on its own connection: PostgreSQL ``REPEATABLE READ``; SQLite ``BEGIN
    IMMEDIATE`` (``write_lock``, the driver's) or ``BEGIN`` (a task's read transaction)."""
    # lazy: avoids sqlalchemy at import
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import NullPool

    if sqlite:
        engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _connect_hook(dbapi: Any, _record: Any) -> None:
            dbapi.isolation_level = None  # transactions are ours

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write_lock else "BEGIN")

    else:
        engine = create_engine(url, poolclass=NullPool, isolation_level="REPEATABLE READ")
    try:
        with engine.begin() as conn:
            raw = conn.connection.driver_connection
            cur = raw.cursor()  # type: ignore[union-attr]
            yield Tx(conn, cur, raw)
    finally:
        engine.dispose()
