"""PostgreSQL sink (and SQLite, the embedded SQL sink): a staging table beside the target.

Where a run's output goes, and why:

* **Staging** is a table beside the target, ``<table>__rewind_<run id>``, in the same schema.
  When the target exists (a repair of a read model), staging is created ``LIKE target
  INCLUDING ALL`` (columns, defaults, constraints, indexes, identity, comments) plus the
  target's outgoing foreign keys, owner, grants and storage options, and it starts as a
  **copy of the target's rows**, made in the same transaction that creates it: the run's
  upserts then overwrite the repaired keys, and promotion swaps in *target + repaired rows*.
  When the target does not exist (a new read model), staging is created empty from the
  output's Arrow schema, with a unique index on the conflict columns, and promotion creates
  the target by renaming it. SQLite gets the same DDL (its ``CREATE TABLE`` text, renamed).
* **Conflict columns**: ``key`` in ``upsert`` mode, ``_rewind_event_id`` when ``key`` is
  empty or in ``append`` mode. A unique index on exactly those columns is required: Rewind
  creates it for a new table, and refuses (in :meth:`PostgresSink.check`, with the DDL to
  run) an existing target without one rather than silently changing a service's table.
  Likewise an existing target must already carry every output column, the lineage columns
  (``_rewind_*``) included: a backfill's rows must be traceable where they land.
* **Writes** are idempotent: ``upsert`` replaces a key's row unless the row already there
  comes from this run *and* from a later event (ordered by source timestamp, partition,
  offset, event id), so the result does not depend on the order in which units commit and
  re-applying a unit changes nothing; ``append`` inserts and skips event ids already there.
* **Commit** (one transaction, so the sink is the truth about which units are done): the
  Parquet files are encoded to CSV by pyarrow and streamed with ``COPY``; the unit ids and
  counts go to ``rewind_unit_commits`` (same database, same schema as the target) in the
  same transaction. While staging has shown no conflicts (a new read model), rows are
  ``COPY``-ed straight into staging under a savepoint; the first unique violation rolls
  that back and switches to ``COPY`` into a temporary table + ``INSERT ... ON CONFLICT``.
  SQLite: ``executemany`` upserts in one ``BEGIN IMMEDIATE`` transaction.
* **Promotion** is one transaction of renames: target → ``<table>__rewind_prev_<run>``,
  staging → target, and the index names are swapped too (PostgreSQL index names are per
  schema), so the promoted table has the target's index and constraint names. Readers
  wait on the ``ACCESS EXCLUSIVE`` locks for the duration of the renames and then see the
  new table: never a missing table, never a mix. A target changed since staging copied it
  (live writes) is detected (row count + a hash of every row, under a ``SHARE`` lock that
  blocks writers, not readers) and the promotion refused: the swap would drop those writes.
  **Rollback** is the reverse renames (the promoted table becomes the staging again, so a
  re-promotion works), refused likewise when the promoted table changed since. Both record
  their state in ``rewind_stagings`` in the same transaction as the renames and are
  idempotent after a crash: a re-run finds the state moved and only reports it. Fault points
  (:mod:`rewind.faults`): ``postgres-<promote|rollback>-before-commit`` (renames done,
  exclusive locks held, not committed) and ``-after-commit`` (committed, nothing returned yet).
* **Cleanup** (``rewind cleanup RUN``) drops what is not the live target: the previous
  table of a promoted run (rollback is then impossible), or the staging of a run that is not
  promoted (the run cannot be resumed or promoted afterwards), and the run's spool folder.
* **Reading** staging into Spark (verification) goes through the driver: ``COPY ... TO
  STDOUT`` as CSV, parsed by pyarrow, then ``spark.createDataFrame``. The whole staging table
  is held in driver memory once: fine for verification of read models up to a few million
  rows, not for billions (no JDBC driver is installable here).

Refused up front (a rename swap would silently break them): partitioned or inherited
targets, views depending on the target, foreign keys pointing at it, triggers, row-level
security, publications naming it. The sink's database user must own the target (renames
need it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rewind import faults
from rewind.core.columns import (
    EVENT_ID,
    LINEAGE_PREFIX,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
)
from rewind.errors import RewindError
from rewind.secrets import mask_url
from rewind.sinks.base import Swap

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from sqlalchemy import Table
    from sqlalchemy.engine import Connection, Engine

    from rewind.config import Settings
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

COUNTS_KEY = "rewind.unit-counts"
STAGINGS_TABLE = "rewind_stagings"
UNITS_TABLE = "rewind_unit_commits"

RUN_COL = RUN_ID
ORDER_COLS = (SOURCE_TIMESTAMP, SOURCE_PARTITION, SOURCE_OFFSET, EVENT_ID)
"""The event order that decides which row of a key wins (greatest wins)."""
MAX_IDENT = 63
CHUNK_ROWS = 65_536

Mode = Literal["upsert", "append"]


class PostgresSinkError(RewindError):
    """The SQL target or its staging cannot be used as asked."""


class TargetMoved(PostgresSinkError):
    """The target changed since staging was cut from it: a swap would drop those writes."""


# -- names ----------------------------------------------------------------------------------


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


@dataclass(frozen=True)
class _Name:
    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        return f"{_q(self.schema)}.{_q(self.name)}" if self.schema else _q(self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    def sibling(self, name: str) -> _Name:
        return _Name(self.schema, name)

    @classmethod
    def parse(cls, text: str) -> _Name:
        schema, _, name = text.rpartition(".")
        return cls(schema or None, name)


def _ident(base: str, suffix: str) -> str:
    """``base + suffix`` within PostgreSQL's 63 bytes; a shortened base keeps a hash of itself."""
    name = base + suffix
    if len(name.encode()) <= MAX_IDENT:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    keep = max(1, MAX_IDENT - len(suffix.encode()) - 9)
    return f"{base.encode()[:keep].decode(errors='ignore')}_{digest}{suffix}"


def _run_tag(run_id: str) -> str:
    tag = re.sub(r"[^a-z0-9_]", "_", run_id.lower())
    return tag if len(tag) <= 32 else hashlib.sha256(run_id.encode()).hexdigest()[:16]


def staging_name(table: str, run_id: str) -> str:
    return _ident(table, f"__rewind_{_run_tag(run_id)}")


def prev_name(table: str, run_id: str) -> str:
    return _ident(table, f"__rewind_prev_{_run_tag(run_id)}")


def _key_index_name(table: str) -> str:
    return _ident(table, "_rewind_key")


# -- staging --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PostgresStaging:
    """A run's staging table (JSON-able for the ledger). Names are ``schema.table``."""

    target: str
    table: str
    target_table: str
    prev_table: str
    run_id: str
    target_existed: bool
    spool: str
    base_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "postgres", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PostgresStaging:
        return cls(
            data["target"],
            data["table"],
            data["target_table"],
            data["prev_table"],
            data["run_id"],
            bool(data["target_existed"]),
            data["spool"],
            data.get("base_rows"),
        )

    def describe(self) -> str:
        if self.target_existed:
            return f"{self.table} (a copy of {self.target_table} plus this run's rows)"
        return f"{self.table} (a new table, becomes {self.target_table} on promotion)"


# -- columns and types ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Col:
    name: str
    type: str
    notnull: bool
    has_default: bool
    generated: bool = False


def _base_type(sql_type: str) -> str:
    return re.sub(r"\(.*\)", "", sql_type).strip().lower()


def _typmod(sql_type: str) -> tuple[int, int] | None:
    m = re.search(r"\((\d+)\s*(?:,\s*(\d+))?\)", sql_type)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def _nested(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_nested(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_duration(t)
        or pa.types.is_interval(t)
    )


def _pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type a new table gets for an Arrow type."""
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_time(t):
        return "time without time zone"
    raise PostgresSinkError(f"Arrow type {t} has no SQL column type here")


_SQLITE_TYPES = {
    "boolean": "BOOLEAN",
    "smallint": "SMALLINT",
    "integer": "INTEGER",
    "bigint": "BIGINT",
    "real": "REAL",
    "double precision": "DOUBLE",
    "text": "TEXT",
    "bytea": "BLOB",
    "date": "DATE",
    "timestamp with time zone": "TIMESTAMP",
    "timestamp without time zone": "TIMESTAMP",
    "time without time zone": "TIME",
}


def sqlite_type(t: pa.DataType) -> str:
    pg = _pg_type(t)
    return _SQLITE_TYPES.get(pg, pg.upper())


_TEXTS = {
    "text",
    "character varying",
    "character",
    "varchar",
    "char",
    "bpchar",
    "name",
    "citext",
    "json",
    "jsonb",
    "uuid",
    "xml",
}
_NUMBERS = {"smallint", "integer", "bigint", "numeric", "decimal", "real", "double precision"}


def _pg_compatible(t: pa.DataType, sql_type: str) -> bool:
    """Can a column of ``sql_type`` hold every value of Arrow type ``t`` (no silent loss)?"""
    import pyarrow as pa

    base = _base_type(sql_type)
    if pa.types.is_null(t):
        return True
    if pa.types.is_boolean(t):
        return base == "boolean"
    if pa.types.is_integer(t):
        width = t.bit_width + (1 if pa.types.is_unsigned_integer(t) else 0)
        sizes = {"smallint": 16, "integer": 32, "bigint": 64}
        if base in sizes:
            return width <= sizes[base]
        if base in ("numeric", "decimal"):
            mod = _typmod(sql_type)
            return (
                mod is None or mod[0] - mod[1] >= 20 if width > 32 else mod is None or mod[0] - mod[1] >= 10
            )
        return (base == "double precision" and width <= 32) or (base == "real" and width <= 16)
    if pa.types.is_floating(t):
        return base in ("double precision", "numeric", "decimal") or (base == "real" and t.bit_width <= 32)
    if pa.types.is_decimal(t):
        if base not in ("numeric", "decimal"):
            return False
        mod = _typmod(sql_type)
        return mod is None or (mod[1] >= t.scale and mod[0] - mod[1] >= t.precision - t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return base in _TEXTS
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return base == "bytea"
    if pa.types.is_date(t):
        return base in ("date", "timestamp with time zone", "timestamp without time zone")
    if pa.types.is_timestamp(t):
        return base in ("timestamp with time zone", "timestamp without time zone")
    if pa.types.is_time(t):
        return base.startswith("time")
    return False


def _sqlite_affinity(declared: str) -> str:
    d = declared.upper()
    if "INT" in d:
        return "INTEGER"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in d or not d:
        return "BLOB"
    if any(s in d for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def _sqlite_compatible(t: pa.DataType, declared: str) -> bool:
    import pyarrow as pa

    aff = _sqlite_affinity(declared)
    if aff == "BLOB" and not declared:
        return True
    if pa.types.is_null(t):
        return True
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return aff in ("INTEGER", "NUMERIC", "REAL")
    if pa.types.is_floating(t):
        return aff in ("REAL", "NUMERIC")
    if pa.types.is_decimal(t):
        return aff in ("NUMERIC", "REAL", "TEXT")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return aff in ("TEXT", "BLOB")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return aff == "BLOB"
    if pa.types.is_temporal(t):
        return aff in ("TEXT", "NUMERIC")
    return False


def _arrow_of(sql_type: str) -> pa.DataType:
    """The Arrow type a column reads back as (PostgreSQL or SQLite declared names)."""
    import pyarrow as pa

    base = _base_type(sql_type)
    simple: dict[str, pa.DataType] = {
        "boolean": pa.bool_(),
        "smallint": pa.int16(),
        "integer": pa.int32(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "real": pa.float32(),
        "double precision": pa.float64(),
        "double": pa.float64(),
        "float": pa.float64(),
        "bytea": pa.binary(),
        "blob": pa.binary(),
        "date": pa.date32(),
        "timestamp with time zone": pa.timestamp("us", tz="UTC"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "timestamp without time zone": pa.timestamp("us"),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "datetime": pa.timestamp("us", tz="UTC"),
    }
    if base in simple:
        return simple[base]
    if base in ("numeric", "decimal"):
        mod = _typmod(sql_type)
        if mod is not None and 0 < mod[0] <= 38:
            return pa.decimal128(mod[0], mod[1])
    return pa.string()


def _from_text(text: pa.Array, t: pa.DataType) -> pa.Array:
    """Text as SQLite keeps it (ISO-8601, with or without a zone) to ``t``."""
    import pyarrow as pa

    if pa.types.is_timestamp(t) and t.tz:
        try:
            return text.cast(pa.timestamp(t.unit)).cast(t)  # naive text is UTC (as written)
        except pa.ArrowInvalid:
            return text.cast(t)
    return text.cast(t)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__


# -- encoding Parquet output for COPY and executemany ---------------------------------------


def _prepare_columns(table: pa.Table, sqlite: bool = False) -> pa.Table:
    """Columns in a form that CSV (PostgreSQL COPY) or sqlite3 takes fast and exactly.

    Timestamps become naive UTC text (``2026-10-01 00:00:00.000000``; the session is in UTC):
    casting a zoned timestamp to text is 35x slower in Arrow than a naive one.
    """
    import pyarrow as pa

    arrays = []
    for col in table.columns:
        t = col.type
        if pa.types.is_timestamp(t):
            col = col.cast(pa.timestamp(t.unit)).cast(pa.string())
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            if not sqlite:
                col = pa.array([None if v is None else "\\x" + v.hex() for v in col.to_pylist()], pa.string())
        elif sqlite and (pa.types.is_date(t) or pa.types.is_decimal(t) or pa.types.is_time(t)):
            col = col.cast(pa.string())
        elif sqlite and pa.types.is_boolean(t):
            col = col.cast(pa.int8())
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names)


def _csv(table: pa.Table) -> bytes:
    import pyarrow.csv as pcsv

    buf = io.BytesIO()
    pcsv.write_csv(_prepare_columns(table), buf, pcsv.WriteOptions(include_header=False))
    return buf.getvalue()


def _batches(files: list[str], columns: list[str]) -> Iterator[pa.Table]:
    """The rows of ``files`` in chunks, only ``columns``, in that order."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    for uri in files:
        fs, path = pafs.FileSystem.from_uri(uri)
        with fs.open_input_file(path) as handle:
            reader = pq.ParquetFile(handle)
            missing = [c for c in columns if c not in reader.schema_arrow.names]
            if missing:
                raise PostgresSinkError(f"{uri} lacks output columns {missing}; the run's files do not match")
            for batch in reader.iter_batches(batch_size=CHUNK_ROWS, columns=columns):
                if batch.num_rows:
                    yield pa.Table.from_batches([batch]).select(columns)


def _prefetch(items: Iterable[Any], depth: int = 3) -> Iterator[Any]:
    """Produce ``items`` on a thread, ``depth`` ahead: encoding overlaps the COPY stream."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
            q.put(done)
        except BaseException as exc:
            q.put(exc)

    thread = threading.Thread(target=run, name="rewind-pg-encode", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()
        thread.join(timeout=10)


def _has_duplicates(keys: list[pa.Table]) -> bool:
    import pyarrow as pa

    if not keys:
        return False
    table = pa.concat_tables(keys)
    if table.num_rows < 2:
        return False
    if table.num_columns == 1:
        return bool(len(table.column(0).unique()) < table.num_rows)
    return bool(table.group_by(table.column_names).aggregate([]).num_rows < table.num_rows)


# -- the sink -------------------------------------------------------------------------------


class PostgresSink:
    """Writes a run's output into a staging table beside a PostgreSQL (or SQLite) table."""

    kind = "postgres"

    def __init__(
        self,
        url: str,
        table: str,
        *,
        mode: Mode = "upsert",
        key: list[str] | tuple[str, ...] = (),
        spool_dir: str | Path = ".rewind/spool",
        lock_timeout_s: float = 5.0,
        lock_wait_s: float = 120.0,
    ) -> None:
        """No I/O here: the engine is made on first use."""
        self.url = _sqlalchemy_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        self.table_name = table
        self.mode: Mode = mode
        self.key = list(key)
        self.spool_dir = Path(spool_dir).expanduser().resolve()
        self.lock_timeout_s = lock_timeout_s
        self.lock_wait_s = lock_wait_s
        self._engine_: Engine | None = None
        self._backend: _Backend = _Sqlite() if self.is_sqlite else _Postgres()
        self._resolved: _Name | None = None
        self._direct: dict[str, bool] = {}
        if self.is_sqlite and "." in table and table.split(".")[0] != "main":
            raise PostgresSinkError(
                f"sink.postgres.table {table}: SQLite has no schemas; name the table alone"
            )

    @classmethod
    def from_spec(cls, settings: Settings, spec: JobSpec) -> PostgresSink:
        """The sink of ``spec.sink.postgres``; the URL defaults to the ledger's when that is PostgreSQL."""
        cfg = spec.sink.postgres
        if cfg is None:
            raise PostgresSinkError("the spec has no sink.postgres section")
        url = cfg.url
        if url is None:
            ledger = settings.ledger
            if not re.match(r"postgres(ql)?(\+\w+)?://", ledger):
                raise PostgresSinkError(
                    f"sink.postgres.url is not set and the ledger ({mask_url(ledger)}) is not PostgreSQL; "
                    "set sink.postgres.url: postgresql://user@host:5432/db"
                )
            url = ledger
        return cls(url, cfg.table, mode=cfg.mode, key=spec.key, spool_dir=settings.state_path / "spool")

    @property
    def target(self) -> str:
        return f"postgres:{self.table_name}"

    @property
    def where(self) -> str:
        """The masked URL, for messages."""
        return mask_url(self.url.replace("+psycopg", ""))

    @property
    def conflict_columns(self) -> list[str]:
        return list(self.key) if self.mode == "upsert" and self.key else [EVENT_ID]

    # -- connections ----------------------------------------------------------------------

    def _engine(self) -> Engine:
        if self._engine_ is None:
            from sqlalchemy import create_engine, event
            from sqlalchemy.pool import NullPool

            if self.is_sqlite:
                engine = create_engine(self.url, poolclass=NullPool, connect_args={"timeout": 30})

                @event.listens_for(engine, "connect")
                def _connect(dbapi: Any, _record: Any) -> None:
                    dbapi.isolation_level = None  # transactions are ours: BEGIN IMMEDIATE below

                @event.listens_for(engine, "begin")
                def _begin(conn: Any) -> None:
                    conn.exec_driver_sql("BEGIN IMMEDIATE")

            else:
                engine = create_engine(self.url, poolclass=NullPool)
            self._engine_ = engine
        return self._engine_

    @contextlib.contextmanager
    def _tx(self) -> Iterator[_Tx]:
        """One transaction: a SQLAlchemy connection and the driver's cursor on it."""
        from sqlalchemy.exc import OperationalError

        try:
            ctx = self._engine().begin()
            conn = ctx.__enter__()
        except OperationalError as exc:
            raise PostgresSinkError(
                f"database at {self.where} is not reachable: {mask_url(_first_line(exc.orig or exc))}"
            ) from exc
        try:
            raw = conn.connection.driver_connection
            cur = raw.cursor()  # type: ignore[union-attr]
            tx = _Tx(conn, cur, raw)
            self._backend.session(tx)
            yield tx
        except BaseException as exc:
            ctx.__exit__(type(exc), exc, exc.__traceback__)
            raise
        else:
            ctx.__exit__(None, None, None)

    def close(self) -> None:
        if self._engine_ is not None:
            self._engine_.dispose()
            self._engine_ = None

    def _name(self, tx: _Tx) -> _Name:
        if self._resolved is None:
            self._resolved = self._backend.resolve(tx, self.table_name)
        return self._resolved

    def _tables(self, tx: _Tx) -> _Book:
        return _Book(self._name(tx).schema)

    # -- gates ----------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        """Raise a one-line error when the output cannot go to the target; else say where it goes."""
        self._check_output(schema)
        with self._tx() as tx:
            name = self._name(tx)
            if not self._backend.exists(tx, name):
                return (
                    f"{name} does not exist at {self.where}: a staging table is created from the output "
                    "schema and becomes the target on promotion"
                )
            self._check_target(tx, name, schema)
        return (
            f"{name} exists at {self.where}: staging is a copy of it, {self.mode} on "
            f"({', '.join(self.conflict_columns)}), swapped in by renames"
        )

    def _check_output(self, schema: pa.Schema) -> None:
        names = set(schema.names)
        for f in schema:
            if _nested(f.type):
                raise PostgresSinkError(
                    f"output column {f.name} is {f.type}: the SQL sink takes scalar columns; "
                    "serialize it to JSON text in the translate"
                )
        missing = [c for c in (*self.conflict_columns, *ORDER_COLS, RUN_COL) if c not in names]
        if missing:
            raise PostgresSinkError(
                f"output has no column {missing[0]}; the SQL sink needs the key and lineage columns"
            )

    def _check_target(self, tx: _Tx, name: _Name, schema: pa.Schema) -> None:
        cols = {c.name: c for c in self._backend.columns(tx, name)}
        lineage = [f.name for f in schema if f.name.startswith(LINEAGE_PREFIX) and f.name not in cols]
        if lineage:
            raise PostgresSinkError(
                f"{name} has no lineage columns {lineage[:3]}{'...' if len(lineage) > 3 else ''}: a backfill "
                f"writes them on every row; add them to {name} (ALTER TABLE ... ADD COLUMN) first"
            )
        compatible = _sqlite_compatible if self.is_sqlite else _pg_compatible
        for f in schema:
            col = cols.get(f.name)
            if col is None:
                raise PostgresSinkError(
                    f"output column {f.name} is not in {name}; add it to the table or drop it from the output"
                )
            if col.generated:
                raise PostgresSinkError(f"output column {f.name} is a generated column of {name}; drop it")
            if not compatible(f.type, col.type):
                raise PostgresSinkError(
                    f"output column {f.name} is {f.type}, {name}.{f.name} is {col.type}; "
                    "cast it in the translate or alter the column"
                )
        for col in cols.values():
            if col.name not in schema.names and col.notnull and not col.has_default:
                raise PostgresSinkError(
                    f"{name}.{col.name} is NOT NULL without a default and the output has no such column; "
                    "add it to the translate's output"
                )
        conflict = frozenset(self.conflict_columns)
        if conflict not in self._backend.unique_keys(tx, name):
            cols_sql = ", ".join(_q(c) for c in self.conflict_columns)
            raise PostgresSinkError(
                f"{name} has no unique index on ({', '.join(self.conflict_columns)}) for {self.mode}; "
                f"create it: CREATE UNIQUE INDEX ON {name.sql} ({cols_sql})"
            )
        blockers = self._backend.blockers(tx, name)
        if blockers:
            raise PostgresSinkError(
                f"{name} cannot be swapped by renames: {blockers[0]}; a swap would leave it on the old table"
            )

    # -- staging --------------------------------------------------------------------------

    def _staging(self, name: _Name, run_id: str, existed: bool, base_rows: int | None) -> PostgresStaging:
        return PostgresStaging(
            self.target,
            str(name.sibling(staging_name(name.name, run_id))),
            str(name),
            str(name.sibling(prev_name(name.name, run_id))),
            run_id,
            existed,
            (self.spool_dir / _run_tag(run_id)).as_uri(),
            base_rows,
        )

    def prepare(self, run_id: str, schema: pa.Schema) -> PostgresStaging:
        """Create staging (a copy of the target, or a new table), or find it again on resume.

        Steps, in one transaction: (1) the bookkeeping tables exist; (2) a staging already
        recorded for the run is checked against the target's columns and returned; (3) else
        staging is created LIKE the target and filled with its rows (or created from the output
        schema with its unique index); (4) its base (row count and hash of the copied rows) is
        recorded in ``rewind_stagings`` so promotion can tell whether the target moved since.
        """
        from sqlalchemy import insert, select

        self._check_output(schema)
        book_ready = False
        for attempt in range(3):  # two runs creating the bookkeeping tables at once: retry
            try:
                with self._tx() as tx:
                    _Book(self._name(tx).schema).create(tx)
                book_ready = True
                break
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(0.2)
        assert book_ready
        with self._tx() as tx:
            name = self._name(tx)
            book = self._tables(tx)
            sname = name.sibling(staging_name(name.name, run_id))
            row = tx.conn.execute(
                select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
            ).first()
            if row is not None:
                return self._resume(tx, name, sname, row, schema)
            existed = self._backend.exists(tx, name)
            if existed:
                self._check_target(tx, name, schema)
            if self._backend.exists(tx, sname):
                raise PostgresSinkError(
                    f"{sname} exists but is not run {run_id}'s recorded staging; "
                    "drop it or use another run id"
                )
            if existed:
                self._backend.create_like(tx, name, sname)
                rows, fingerprint = self._backend.fingerprint(tx, sname)
            else:
                self._backend.create_new(
                    tx, sname, schema, self.conflict_columns, _key_index_name(sname.name)
                )
                rows, fingerprint = 0, None
            now = datetime.now(UTC)
            tx.conn.execute(
                insert(book.stagings).values(
                    staging=sname.name,
                    run_id=run_id,
                    target=name.name,
                    target_existed=existed,
                    state="staged",
                    base_rows=rows if existed else None,
                    base_fingerprint=fingerprint,
                    created_at=now,
                    updated_at=now,
                )
            )
            log.info("prepared %s for run %s (%s rows copied)", sname, run_id, rows)
            return self._staging(name, run_id, existed, rows if existed else None)

    def _resume(self, tx: _Tx, name: _Name, sname: _Name, row: Any, schema: pa.Schema) -> PostgresStaging:
        if row.state != "staged":
            what = "promoted" if row.state in ("promoted", "final") else "dropped by `rewind cleanup`"
            raise PostgresSinkError(f"staging {sname} of run {row.run_id} was {what}; start a new run")
        if not self._backend.exists(tx, sname):
            raise PostgresSinkError(f"staging {sname} of run {row.run_id} disappeared; start a new run")
        if row.target_existed:
            if not self._backend.exists(tx, name):
                raise PostgresSinkError(f"target {name} was dropped since run {row.run_id} started")
            self._same_shape(tx, name, sname)
        self._direct[sname.name] = False
        self._check_staging(tx, sname, schema)
        return self._staging(name, row.run_id, bool(row.target_existed), row.base_rows)

    def _same_shape(self, tx: _Tx, name: _Name, sname: _Name) -> None:
        """Staging must have the target's columns (names, types, nullability) in its order."""
        target = [(c.name, c.type, c.notnull) for c in self._backend.columns(tx, name)]
        staged = [(c.name, c.type, c.notnull) for c in self._backend.columns(tx, sname)]
        if target != staged:
            diff = next(
                (f"{t} vs {s}" for t, s in zip(target, staged, strict=False) if t != s),
                f"{len(target)} vs {len(staged)} columns",
            )
            raise PostgresSinkError(
                f"staging {sname} no longer has the columns of {name} ({diff}); the target was altered "
                "since the run started: start a new run"
            )

    def _check_staging(self, tx: _Tx, sname: _Name, schema: pa.Schema) -> list[_Col]:
        cols = self._backend.columns(tx, sname)
        by_name = {c.name: c for c in cols}
        compatible = _sqlite_compatible if self.is_sqlite else _pg_compatible
        for f in schema:
            col = by_name.get(f.name)
            if col is None or not compatible(f.type, col.type):
                got = "missing" if col is None else col.type
                raise PostgresSinkError(
                    f"staging {sname} column {f.name} is {got}, the output's is {f.type}; nothing was written"
                )
        return cols

    def staging_from_dict(self, data: dict[str, Any]) -> PostgresStaging:
        return PostgresStaging.from_dict(data)

    def data_folder(self, staging: PostgresStaging) -> str:
        """A local spool folder: tasks write Parquet there, :meth:`commit` loads and deletes it.

        It must be reachable by the executors and the driver (``local[*]``, or a shared mount).
        """
        Path(_uri_path(staging.spool)).mkdir(parents=True, exist_ok=True)
        return staging.spool

    # -- unit commits ---------------------------------------------------------------------

    def committed_units(self, staging: PostgresStaging, run_id: str) -> set[str]:
        return set(self.committed_counts(staging, run_id))

    def committed_counts(self, staging: PostgresStaging, run_id: str) -> dict[str, dict[str, Any]]:
        from sqlalchemy import select

        with self._tx() as tx:
            book = self._tables(tx)
            if not self._backend.exists(tx, _Name(self._name(tx).schema, UNITS_TABLE)):
                return {}
            rows = tx.conn.execute(
                select(book.units.c.unit_id, book.units.c.counts).where(book.units.c.run_id == run_id)
            ).all()
        return {r.unit_id: json.loads(r.counts) if r.counts else {} for r in rows}

    def commit(
        self,
        staging: PostgresStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Load ``files`` into staging and record ``unit_ids`` with their counts, in ONE transaction.

        Steps: (1) lock the staging's bookkeeping row (one committer at a time) and check the
        staging is still ``staged``; (2) units all recorded already: nothing to do (a
        re-commit after a crash is a no-op); (3) check staging's columns against the files'
        schema before writing anything; (4) load the rows: ``COPY`` straight into staging
        under a savepoint while staging has shown no conflict, else ``COPY`` into a temporary
        table and ``INSERT ... ON CONFLICT`` (SQLite: ``executemany`` upserts); (5) insert the
        unit rows; (6) commit; then (7) delete the spooled files.
        """
        from sqlalchemy import select

        counts = json.loads((extra or {}).get(COUNTS_KEY, "{}"))
        sname = _Name.parse(staging.table)
        started = time.monotonic()
        with self._tx() as tx:
            book = self._tables(tx)
            # 1. one committer at a time, and only into a live staging
            state = tx.conn.execute(
                select(book.stagings.c.state).where(book.stagings.c.staging == sname.name).with_for_update()
            ).scalar()
            if state is None:
                raise PostgresSinkError(f"staging {sname} is not recorded; run prepare first")
            if state != "staged":
                raise PostgresSinkError(
                    f"staging {sname} is {state}; a {state} staging is not written any more"
                )
            # 2. idempotence: units recorded already are not loaded again
            done = set(
                tx.conn.execute(
                    select(book.units.c.unit_id).where(
                        book.units.c.run_id == run_id, book.units.c.unit_id.in_(unit_ids)
                    )
                ).scalars()
            )
            repeat = bool(unit_ids) and done == set(unit_ids)
            if repeat:
                log.info("commit of %d units into %s: already committed", len(unit_ids), sname)
            else:
                rows, path, new = self._write(tx, sname, run_id, unit_ids, done, files, counts)
        # 6. committed; 7. the spool is not needed any more
        self._unspool(staging, files)
        if repeat:
            return {"rows": 0, "path": "already-committed", "units": 0, "seconds": 0.0}
        seconds = time.monotonic() - started
        log.info("committed %d rows of %d units into %s (%s) in %.2fs", rows, len(new), sname, path, seconds)
        return {"rows": rows, "path": path, "units": len(new), "seconds": round(seconds, 3)}

    def _write(
        self,
        tx: _Tx,
        sname: _Name,
        run_id: str,
        unit_ids: list[str],
        done: set[str],
        files: list[str],
        counts: dict[str, Any],
    ) -> tuple[int, str, list[str]]:
        """Steps 3 to 5 of :meth:`commit`, inside its transaction."""
        from sqlalchemy import insert

        if done:
            log.warning(
                "units %s were committed already; their rows are re-applied idempotently", sorted(done)
            )
        # 3. staging's columns before anything is written
        columns = self._file_columns(files)
        self._check_staging(tx, sname, _files_schema(files, columns))
        # 4. the rows
        rows, path = self._load(tx, sname, columns, files)
        # 5. the units, with their counts
        now = datetime.now(UTC)
        new = [u for u in unit_ids if u not in done]
        if new:
            tx.conn.execute(
                insert(self._tables(tx).units),
                [
                    {
                        "run_id": run_id,
                        "unit_id": uid,
                        "staging": sname.name,
                        "counts": json.dumps(counts.get(uid, {}), sort_keys=True),
                        "rows_out": int(counts.get(uid, {}).get("rows_out", 0) or 0),
                        "committed_at": now,
                    }
                    for uid in new
                ],
            )
        return rows, path, new

    def _file_columns(self, files: list[str]) -> list[str]:
        if not files:
            return []
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq

        fs, path = pafs.FileSystem.from_uri(files[0])
        with fs.open_input_file(path) as handle:
            return list(pq.ParquetFile(handle).schema_arrow.names)

    def _load(self, tx: _Tx, sname: _Name, columns: list[str], files: list[str]) -> tuple[int, str]:
        if not files:
            return 0, "none"
        conflict = self.conflict_columns
        if self.is_sqlite:
            return self._backend.upsert_rows(tx, sname, columns, files, conflict, self.mode), "upsert"
        pg = self._backend
        assert isinstance(pg, _Postgres)
        direct = self._direct[sname.name] if sname.name in self._direct else self._starts_empty(tx, sname)
        if direct:
            rows = pg.copy_direct(tx, sname, columns, files)
            if rows is not None:
                return rows, "copy"
            self._direct[sname.name] = False
            log.info("staging %s has conflicts: loading through a temporary table from now on", sname)
        dedupe = self.mode == "upsert" and _files_have_duplicates(files, conflict)
        return pg.copy_upsert(tx, sname, columns, files, conflict, self.mode, dedupe), "upsert"

    def _starts_empty(self, tx: _Tx, sname: _Name) -> bool:
        from sqlalchemy import select

        book = self._tables(tx)
        existed = tx.conn.execute(
            select(book.stagings.c.target_existed).where(book.stagings.c.staging == sname.name)
        ).scalar()
        direct = not existed
        self._direct[sname.name] = direct
        return direct

    def _unspool(self, staging: PostgresStaging, files: list[str]) -> None:
        root = Path(_uri_path(staging.spool))
        for f in files:
            if not f.startswith("file:"):
                continue
            path = Path(_uri_path(f))
            if root in path.parents:
                with contextlib.suppress(OSError):
                    path.unlink()

    # -- publishing -----------------------------------------------------------------------

    def promote(self, staging: PostgresStaging) -> Swap:
        """Swap staging in for the target in one transaction of renames; idempotent.

        Steps: (1) lock the staging's bookkeeping row; a promoted staging is reported as done;
        (2) hash staging's rows (recorded, so a rollback can tell whether the promoted table
        moved); (3) target existed: lock it ``SHARE`` (writers wait, readers do not), check it
        still has the copied rows and staging's shape, then rename it to the previous-table
        name; (4) rename staging to the target and swap the index names; (5) record
        ``promoted``; commit. Lock waits are bounded (``lock_timeout``) and retried.
        """
        return self._with_lock_retry(lambda: self._promote_once(staging))

    def _promote_once(self, staging: PostgresStaging) -> Swap:
        from sqlalchemy import select, update

        target, sname, prev = (
            _Name.parse(n) for n in (staging.target_table, staging.table, staging.prev_table)
        )
        with self._tx() as tx:
            self._backend.lock_timeout(tx, self.lock_timeout_s)
            book = self._tables(tx)
            # 1.
            row = tx.conn.execute(
                select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
            ).first()
            if row is None:
                raise PostgresSinkError(
                    f"staging {sname} is not recorded in {STAGINGS_TABLE}; nothing to promote"
                )
            before = {"table": str(target), "rows": row.base_rows, "fingerprint": row.base_fingerprint}
            after: dict[str, Any] = {
                "table": str(target),
                "from": str(sname),
                "previous": str(prev) if row.target_existed else None,
            }
            if row.state in ("promoted", "final"):
                return Swap(
                    self.target, "promote", before, {**after, "fingerprint": row.promoted_fingerprint}, True
                )
            if row.state != "staged" or not self._backend.exists(tx, sname):
                raise PostgresSinkError(
                    f"staging {sname} is {row.state}, not there to promote; start a new run"
                )
            # 2.
            rows, fingerprint = self._backend.fingerprint(tx, sname)
            after.update(rows=rows, fingerprint=fingerprint)
            # 3.
            if row.target_existed:
                if not self._backend.exists(tx, target):
                    raise PostgresSinkError(
                        f"target {target} was dropped since the run started; nothing to swap"
                    )
                self._backend.lock_share(tx, target)
                self._unmoved(tx, target, row.base_rows, row.base_fingerprint, "staging was copied from it")
                self._same_shape(tx, target, sname)
                if self._backend.exists(tx, prev):
                    raise PostgresSinkError(f"{prev} exists already; drop it or run `rewind cleanup`")
                # 4.
                ddl = [
                    self._backend.rename_sql(target, prev.name),
                    self._backend.rename_sql(sname, target.name),
                ]
                ddl += self._backend.index_swap_sql(tx, target, sname, _run_tag(row.run_id))
                locks = [target, sname]
            else:
                if self._backend.exists(tx, target):
                    raise PostgresSinkError(
                        f"{target} was created by someone else after run {row.run_id} started; "
                        "promotion would replace it: drop it, or start a new run (staging will copy it)"
                    )
                ddl = [self._backend.rename_sql(sname, target.name)]
                ddl += self._backend.key_index_sql(tx, target, sname.name, target.name)
                locks = [sname]
            # 5. recorded first: the same transaction, and the locks are then held for the DDL alone
            tx.conn.execute(
                update(book.stagings)
                .where(book.stagings.c.staging == sname.name)
                .values(state="promoted", promoted_fingerprint=fingerprint, updated_at=datetime.now(UTC))
            )
            asked, granted = self._backend.lock_exclusive(tx, *locks)  # readers wait from here to the commit
            self._backend.run_all(tx, ddl)
            swap = Swap(self.target, "promote", before, after, False)
            faults.point("postgres-promote-before-commit")
        faults.point("postgres-promote-after-commit")
        after.update(_lock_times(asked, granted))
        return swap

    def rollback(self, staging: PostgresStaging, promoted: dict[str, Any]) -> Swap:
        """Undo a promotion: the promoted table becomes the staging again, the previous one the target.

        Refused when the promoted table changed since the promotion (those writes would be
        lost) and after ``rewind cleanup`` dropped the previous table. Idempotent.
        """
        return self._with_lock_retry(lambda: self._rollback_once(staging))

    def _rollback_once(self, staging: PostgresStaging) -> Swap:
        from sqlalchemy import select, update

        target, sname, prev = (
            _Name.parse(n) for n in (staging.target_table, staging.table, staging.prev_table)
        )
        with self._tx() as tx:
            self._backend.lock_timeout(tx, self.lock_timeout_s)
            book = self._tables(tx)
            row = tx.conn.execute(
                select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
            ).first()
            if row is None:
                raise PostgresSinkError(
                    f"staging {sname} is not recorded in {STAGINGS_TABLE}; nothing to roll back"
                )
            before = {"table": str(target), "fingerprint": row.promoted_fingerprint}
            after: dict[str, Any] = {
                "table": str(target),
                "from": str(prev) if row.target_existed else None,
                "staging": str(sname),
            }
            if row.state == "staged":
                return Swap(self.target, "rollback", before, after, True)
            if row.state == "final":
                raise PostgresSinkError(
                    f"the previous {target} ({prev}) was dropped by `rewind cleanup`; nothing to go back to"
                )
            if row.state != "promoted":
                raise PostgresSinkError(f"staging {sname} is {row.state}; nothing to roll back")
            if not self._backend.exists(tx, target):
                raise PostgresSinkError(f"target {target} does not exist; nothing to roll back")
            self._backend.lock_share(tx, target)
            rows, fingerprint = self._backend.fingerprint(tx, target)
            if fingerprint != row.promoted_fingerprint:
                raise TargetMoved(
                    f"{target} changed after run {row.run_id} was promoted ({rows} rows now); "
                    "a rollback would drop those writes: stop the writers; repair by hand or promote anew"
                )
            if row.target_existed:
                if not self._backend.exists(tx, prev):
                    raise PostgresSinkError(f"previous table {prev} is gone; nothing to roll back to")
                ddl = [
                    self._backend.rename_sql(target, sname.name),
                    self._backend.rename_sql(prev, target.name),
                ]
                ddl += self._backend.index_swap_sql(tx, target, prev, _run_tag(row.run_id))
                locks = [target, prev]
            else:
                ddl = [self._backend.rename_sql(target, sname.name)]
                ddl += self._backend.key_index_sql(tx, target, target.name, sname.name)
                locks = [target]
            tx.conn.execute(
                update(book.stagings)
                .where(book.stagings.c.staging == sname.name)
                .values(state="staged", updated_at=datetime.now(UTC))
            )
            asked, granted = self._backend.lock_exclusive(tx, *locks)  # readers wait from here to the commit
            self._backend.run_all(tx, ddl)
            swap = Swap(self.target, "rollback", before, after, False)
            faults.point("postgres-rollback-before-commit")
        faults.point("postgres-rollback-after-commit")
        after.update(_lock_times(asked, granted))
        return swap

    def _unmoved(self, tx: _Tx, name: _Name, rows: int | None, fingerprint: str | None, since: str) -> None:
        now_rows, now_fp = self._backend.fingerprint(tx, name)
        if now_fp != fingerprint:
            raise TargetMoved(
                f"{name} changed since {since} ({rows} rows then, {now_rows} now); a swap would drop those "
                "writes: pause the writers for the whole backfill and start a new run"
            )

    def _with_lock_retry(self, action: Callable[[], Swap]) -> Swap:
        """Retry an action whose lock wait hit ``lock_timeout`` (readers queue behind a waiting swap)."""
        deadline = time.monotonic() + self.lock_wait_s
        delay = 0.05
        while True:
            try:
                return action()
            except Exception as exc:
                if not self._backend.is_lock_timeout(exc) or time.monotonic() > deadline:
                    if self._backend.is_lock_timeout(exc):
                        raise PostgresSinkError(
                            f"could not lock {self.table_name} in {self.lock_wait_s:.0f}s: long transactions "
                            "hold it; retry when they end"
                        ) from exc
                    raise
                log.info(
                    "lock on %s not granted within %.1fs; retrying", self.table_name, self.lock_timeout_s
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    # -- cleanup --------------------------------------------------------------------------

    def cleanup(self, staging: PostgresStaging) -> dict[str, Any]:
        """``rewind cleanup RUN``: drop what of the run is not the live target.

        Promoted: the previous table is dropped (rollback is impossible afterwards); not
        promoted: staging is dropped and the run's unit commits deleted (the run can be
        neither resumed nor promoted afterwards). The spool folder goes in both cases.
        The caller must make sure no process is still running the run (its lease).
        """
        import shutil

        from sqlalchemy import delete, select, update

        target, sname, prev = (
            _Name.parse(n) for n in (staging.target_table, staging.table, staging.prev_table)
        )
        dropped: list[str] = []
        with self._tx() as tx:
            book = self._tables(tx)
            row = tx.conn.execute(
                select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
            ).first()
            if row is None:
                raise PostgresSinkError(
                    f"staging {sname} is not recorded in {STAGINGS_TABLE}; nothing to clean up"
                )
            state = row.state
            if state == "promoted":
                if row.target_existed and self._backend.exists(tx, prev):
                    self._backend.drop(tx, prev)
                    dropped.append(str(prev))
                new_state = "final"
            elif state == "staged":
                if self._backend.exists(tx, sname):
                    self._backend.drop(tx, sname)
                    dropped.append(str(sname))
                tx.conn.execute(delete(book.units).where(book.units.c.run_id == row.run_id))
                new_state = "dropped"
            else:
                new_state = state
            if new_state != state:
                tx.conn.execute(
                    update(book.stagings)
                    .where(book.stagings.c.staging == sname.name)
                    .values(state=new_state, updated_at=datetime.now(UTC))
                )
        spool = Path(_uri_path(staging.spool))
        spool_removed = spool.exists()
        shutil.rmtree(spool, ignore_errors=True)
        return {
            "target": str(target),
            "state_before": state,
            "state": new_state,
            "dropped": dropped,
            "spool_removed": spool_removed,
            "already_done": not dropped and state == new_state,
            "can_roll_back": False if new_state in ("final", "dropped") else state == "promoted",
        }

    # -- reading --------------------------------------------------------------------------

    def read_arrow(self, staging: PostgresStaging) -> pa.Table:
        """Staging's rows (all its columns) as one Arrow table, read through the driver."""
        sname = _Name.parse(staging.table)
        with self._tx() as tx:
            state = self._state(tx, sname)
            # after promotion the staged rows live under the target's name
            name = _Name.parse(staging.target_table) if state in ("promoted", "final") else sname
            if not self._backend.exists(tx, name):
                raise PostgresSinkError(f"staging table {name} does not exist")
            return self._backend.read_arrow(tx, name)

    def read(self, spark: SparkSession, staging: PostgresStaging) -> DataFrame:
        """Staging as a Spark DataFrame (through the driver's memory; see the module docstring)."""
        from pyspark.sql.pandas.types import from_arrow_schema

        table = self.read_arrow(staging)
        if table.num_rows == 0:
            return spark.createDataFrame([], from_arrow_schema(table.schema))
        return spark.createDataFrame(table)

    def _state(self, tx: _Tx, sname: _Name) -> str | None:
        from sqlalchemy import select

        book = self._tables(tx)
        if not self._backend.exists(tx, _Name(sname.schema, STAGINGS_TABLE)):
            return None
        return tx.conn.execute(
            select(book.stagings.c.state).where(book.stagings.c.staging == sname.name)
        ).scalar()


def _lock_times(asked: float, granted: float) -> dict[str, float]:
    """How long the swap waited for its exclusive locks (new readers queue meanwhile) and held them."""
    return {
        "lock_wait_ms": round((granted - asked) * 1000, 1),
        "exclusive_ms": round((time.perf_counter() - granted) * 1000, 1),
    }


def _sqlalchemy_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` → psycopg 3 (COPY needs it); SQLite as given."""
    if url.startswith("sqlite"):
        return url
    m = re.match(r"postgres(?:ql)?(?:\+\w+)?://", url)
    if not m:
        raise PostgresSinkError(f"{mask_url(url)} is not a PostgreSQL or SQLite URL")
    return "postgresql+psycopg://" + url[m.end() :]


def _uri_path(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def _files_schema(files: list[str], columns: list[str]) -> pa.Schema:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    if not files:
        return pa.schema([])
    fs, path = pafs.FileSystem.from_uri(files[0])
    with fs.open_input_file(path) as handle:
        schema = pq.ParquetFile(handle).schema_arrow
    return pa.schema([schema.field(c) for c in columns])


def _files_have_duplicates(files: list[str], keys: list[str]) -> bool:
    return _has_duplicates(list(_batches(files, keys)))


# -- bookkeeping (SQLAlchemy Core: the same on both databases) ------------------------------


class _Book:
    """``rewind_stagings`` and ``rewind_unit_commits`` in the target's schema."""

    def __init__(self, schema: str | None) -> None:
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

    def create(self, tx: _Tx) -> None:
        self.metadata.create_all(tx.conn, checkfirst=True)


# -- the two databases ----------------------------------------------------------------------


@dataclass
class _Tx:
    conn: Connection
    cur: Any
    raw: Any


class _Backend:
    """What differs between PostgreSQL and SQLite: catalog queries, DDL, loading, reading."""

    def session(self, tx: _Tx) -> None: ...

    def resolve(self, tx: _Tx, table: str) -> _Name:
        raise NotImplementedError

    def exists(self, tx: _Tx, name: _Name) -> bool:
        raise NotImplementedError

    def columns(self, tx: _Tx, name: _Name) -> list[_Col]:
        raise NotImplementedError

    def unique_keys(self, tx: _Tx, name: _Name) -> list[frozenset[str]]:
        raise NotImplementedError

    def blockers(self, tx: _Tx, name: _Name) -> list[str]:
        raise NotImplementedError

    def create_like(self, tx: _Tx, target: _Name, staging: _Name) -> None:
        raise NotImplementedError

    def create_new(
        self, tx: _Tx, staging: _Name, schema: pa.Schema, conflict: list[str], index_name: str
    ) -> None:
        raise NotImplementedError

    def fingerprint(self, tx: _Tx, name: _Name) -> tuple[int, str]:
        raise NotImplementedError

    def lock_share(self, tx: _Tx, name: _Name) -> None: ...

    def lock_timeout(self, tx: _Tx, seconds: float) -> None: ...

    def lock_exclusive(self, tx: _Tx, *names: _Name) -> tuple[float, float]:
        """Take the swap's exclusive locks; returns when they were asked for and granted."""
        now = time.perf_counter()
        return now, now

    def rename_sql(self, name: _Name, new: str) -> str:
        return f"ALTER TABLE {name.sql} RENAME TO {_q(new)}"

    def index_swap_sql(self, tx: _Tx, a: _Name, b: _Name, tag: str) -> list[str]:
        """Statements that exchange the names of ``a``'s and ``b``'s matching indexes."""
        return []

    def key_index_sql(self, tx: _Tx, where: _Name, old_table: str, new_table: str) -> list[str]:
        """Statements that rename a new table's key index along with the table."""
        return []

    def run_all(self, tx: _Tx, statements: list[str]) -> None:
        for statement in statements:
            tx.cur.execute(statement)

    def drop(self, tx: _Tx, name: _Name) -> None:
        tx.cur.execute(f"DROP TABLE {name.sql}")

    def is_lock_timeout(self, exc: BaseException) -> bool:
        return False

    def read_arrow(self, tx: _Tx, name: _Name) -> pa.Table:
        raise NotImplementedError

    def upsert_rows(
        self, tx: _Tx, staging: _Name, columns: list[str], files: list[str], conflict: list[str], mode: Mode
    ) -> int:
        raise NotImplementedError


def _event_row(alias: str, minus_infinity: str, with_id: bool) -> str:
    """The event order of a row as a SQL row value: (source time, partition, offset[, event id])."""
    ts, part, off, eid = (_q(c) for c in ORDER_COLS)
    tail = f", {alias}.{eid}" if with_id else ""
    return f"(COALESCE({alias}.{ts}, {minus_infinity}), {alias}.{part}, {alias}.{off}{tail})"


def _conflict_sql(ref: str, columns: list[str], conflict: list[str], mode: Mode, sqlite: bool) -> str:
    """The ON CONFLICT clause: ``append`` skips, ``upsert`` replaces unless the row there is later.

    ``ref`` names the staging table in the statement. The row of the latest event wins:

    * a row of this run is replaced by a row of a later event (ties broken by event id), so
      the order in which units commit does not matter and a re-applied row changes nothing;
    * a row not of this run (a copied target row, an earlier backfill) is replaced unless it
      comes from a later source record: a window's replay never regresses a key that live
      traffic (with lineage) moved past the window; a tie on the source record goes to this
      run (a re-run with a fixed transform wins); rows without lineage are always replaced.
    """
    keys = ", ".join(_q(c) for c in conflict)
    sets = ", ".join(f"{_q(c)} = EXCLUDED.{_q(c)}" for c in columns if c not in conflict)
    if mode == "append" or not sets:
        return f"ON CONFLICT ({keys}) DO NOTHING"
    inf = "''" if sqlite else "'-infinity'"
    distinct = "IS NOT" if sqlite else "IS DISTINCT FROM"
    run, off = _q(RUN_COL), _q(ORDER_COLS[2])
    other_run = (
        f"({ref}.{run} {distinct} EXCLUDED.{run} AND ({ref}.{off} IS NULL "
        f"OR {_event_row(ref, inf, False)} <= {_event_row('EXCLUDED', inf, False)}))"
    )
    later = f"{_event_row(ref, inf, True)} < {_event_row('EXCLUDED', inf, True)}"
    same_run = f"({ref}.{run} = EXCLUDED.{run} AND {later})"
    return f"ON CONFLICT ({keys}) DO UPDATE SET {sets} WHERE {other_run} OR {same_run}"


class _Postgres(_Backend):
    def session(self, tx: _Tx) -> None:
        # a fixed text form of every value: COPY input, row hashes and CSV output depend on it
        tx.cur.execute(
            "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL extra_float_digits = 3; "
            "SET LOCAL IntervalStyle = 'postgres'; SET LOCAL bytea_output = 'hex'"
        )

    def resolve(self, tx: _Tx, table: str) -> _Name:
        parts = table.lower().split(".")
        if len(parts) == 2:
            return _Name(parts[0], parts[1])
        tx.cur.execute("SELECT current_schema()")
        return _Name(tx.cur.fetchone()[0], parts[0])

    def _oid(self, tx: _Tx, name: _Name) -> int | None:
        tx.cur.execute("SELECT to_regclass(%s)::oid", (name.sql,))
        found = tx.cur.fetchone()
        return found[0] if found else None

    def exists(self, tx: _Tx, name: _Name) -> bool:
        return self._oid(tx, name) is not None

    def columns(self, tx: _Tx, name: _Name) -> list[_Col]:
        tx.cur.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "a.atthasdef OR a.attidentity <> '' , a.attgenerated <> '' "
            "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum",
            (name.sql,),
        )
        return [_Col(*r) for r in tx.cur.fetchall()]

    def unique_keys(self, tx: _Tx, name: _Name) -> list[frozenset[str]]:
        tx.cur.execute(
            "SELECT array_agg(a.attname::text) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY((i.indkey::int2[])[0:i.indnkeyatts - 1]) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indimmediate "
            "AND i.indpred IS NULL AND i.indexprs IS NULL GROUP BY i.indexrelid",
            (name.sql,),
        )
        return [frozenset(r[0]) for r in tx.cur.fetchall()]

    def blockers(self, tx: _Tx, name: _Name) -> list[str]:
        out: list[str] = []
        q = name.sql
        tx.cur.execute("SELECT relkind, relrowsecurity FROM pg_class WHERE oid = to_regclass(%s)", (q,))
        kind, rls = tx.cur.fetchone()
        if kind != "r":
            out.append(f"it is not a plain table (relkind {kind!r}; partitioned tables are not supported)")
        if rls:
            out.append("it has row-level security (policies are not copied)")
        checks = [
            (
                "SELECT DISTINCT v.oid::regclass::text FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid "
                "JOIN pg_class v ON v.oid = r.ev_class WHERE d.classid = 'pg_rewrite'::regclass "
                "AND d.refobjid = to_regclass(%s) AND v.oid <> to_regclass(%s)",
                "view {} depends on it",
                2,
            ),
            (
                "SELECT conname || ' of ' || conrelid::regclass::text FROM pg_constraint "
                "WHERE contype = 'f' AND confrelid = to_regclass(%s)",
                "foreign key {} references it",
                1,
            ),
            (
                "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND NOT tgisinternal",
                "trigger {} is on it",
                1,
            ),
            (
                "SELECT p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid "
                "WHERE pr.prrelid = to_regclass(%s)",
                "publication {} names it",
                1,
            ),
            (
                "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = to_regclass(%s) "
                "UNION ALL SELECT inhparent::regclass::text FROM pg_inherits "
                "WHERE inhrelid = to_regclass(%s)",
                "it is in an inheritance tree with {}",
                2,
            ),
        ]
        for sql, text, n in checks:
            tx.cur.execute(sql, (q,) * n)
            out += [text.format(r[0]) for r in tx.cur.fetchall()]
        return out

    def create_like(self, tx: _Tx, target: _Name, staging: _Name) -> None:
        """Staging = target's DDL (LIKE ... INCLUDING ALL, FKs, owner, grants, options) and rows."""
        cur, t, s = tx.cur, target.sql, staging.sql
        cur.execute(f"CREATE TABLE {s} (LIKE {t} INCLUDING ALL)")
        cur.execute(
            "SELECT pg_get_userbyid(relowner), current_user, reloptions FROM pg_class "
            "WHERE oid = to_regclass(%s)",
            (t,),
        )
        owner, me, options = cur.fetchone()
        if options:
            cur.execute(f"ALTER TABLE {s} SET ({', '.join(options)})")
        if owner != me:
            cur.execute(f"ALTER TABLE {s} OWNER TO {_q(owner)}")
        cur.execute(
            "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END, "
            "a.privilege_type, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a "
            "WHERE c.oid = to_regclass(%s) AND a.grantee <> c.relowner",
            (t,),
        )
        for grantee, privilege, grantable in cur.fetchall():
            option = " WITH GRANT OPTION" if grantable else ""
            cur.execute(f"GRANT {privilege} ON {s} TO {grantee}{option}")
        cols = [c for c in self.columns(tx, target) if not c.generated]
        names = ", ".join(_q(c.name) for c in cols)
        cur.execute(f"INSERT INTO {s} ({names}) OVERRIDING SYSTEM VALUE SELECT {names} FROM {t}")
        cur.execute(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attidentity <> '' "
            "AND NOT a.attisdropped",
            (t,),
        )
        for (col,) in cur.fetchall():
            cur.execute(
                "SELECT pg_get_serial_sequence(%s, %s), pg_get_serial_sequence(%s, %s)", (t, col, s, col)
            )
            theirs, ours = cur.fetchone()
            cur.execute(f"SELECT last_value, is_called FROM {theirs}")
            last, called = cur.fetchone()
            cur.execute("SELECT setval(%s, %s, %s)", (ours, last, called))
        cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = to_regclass(%s) "
            "AND contype = 'f' ORDER BY conname",
            (t,),
        )
        for conname, definition in cur.fetchall():
            cur.execute(f"ALTER TABLE {s} ADD CONSTRAINT {_q(conname)} {definition}")

    def create_new(
        self, tx: _Tx, staging: _Name, schema: pa.Schema, conflict: list[str], index_name: str
    ) -> None:
        cols = ", ".join(
            f"{_q(f.name)} {_pg_type(f.type)}{'' if f.nullable else ' NOT NULL'}" for f in schema
        )
        tx.cur.execute(f"CREATE TABLE {staging.sql} ({cols})")
        keys = ", ".join(_q(c) for c in conflict)
        tx.cur.execute(f"CREATE UNIQUE INDEX {_q(index_name)} ON {staging.sql} ({keys})")

    def fingerprint(self, tx: _Tx, name: _Name) -> tuple[int, str]:
        """Row count and the sum of a 64-bit hash of every row's text: equal iff (almost surely) same rows."""
        tx.cur.execute(
            f"SELECT count(*), coalesce(sum(hashtextextended(rewind_fp::text, 0)), 0)::text "
            f"FROM {name.sql} AS rewind_fp"
        )
        rows, total = tx.cur.fetchone()
        return int(rows), f"{rows}:{total}"

    def lock_share(self, tx: _Tx, name: _Name) -> None:
        tx.cur.execute(f"LOCK TABLE {name.sql} IN SHARE MODE")

    def lock_timeout(self, tx: _Tx, seconds: float) -> None:
        tx.cur.execute(f"SET LOCAL lock_timeout = '{max(1, int(seconds * 1000))}ms'")

    def lock_exclusive(self, tx: _Tx, *names: _Name) -> tuple[float, float]:
        asked = time.perf_counter()
        tx.cur.execute(f"LOCK TABLE {', '.join(n.sql for n in names)} IN ACCESS EXCLUSIVE MODE")
        return asked, time.perf_counter()

    def _indexes(self, tx: _Tx, name: _Name) -> dict[tuple[bool, str], list[str]]:
        tx.cur.execute(
            "SELECT c.relname, i.indisunique, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = to_regclass(%s) ORDER BY c.relname",
            (name.sql,),
        )
        out: dict[tuple[bool, str], list[str]] = {}
        for relname, unique, definition in tx.cur.fetchall():
            out.setdefault((bool(unique), definition.split(" USING ", 1)[-1]), []).append(relname)
        return out

    def run_all(self, tx: _Tx, statements: list[str]) -> None:
        if statements:
            tx.cur.execute("; ".join(statements))  # one round trip while readers wait

    def index_swap_sql(self, tx: _Tx, a: _Name, b: _Name, tag: str) -> list[str]:
        """Exchange the names of matching indexes of ``a`` and ``b`` (and so of their constraints)."""
        ia, ib = self._indexes(tx, a), self._indexes(tx, b)
        if set(ia) != set(ib) or any(len(ia[k]) != len(ib[k]) for k in ia):
            raise PostgresSinkError(
                f"the indexes of {a} and {b} differ (an index was added or dropped since the run started); "
                "make them equal or start a new run"
            )
        out: list[str] = []
        for key in sorted(ia):
            for name_a, name_b in zip(ia[key], ib[key], strict=True):
                if name_a == name_b:
                    continue
                tmp = _ident(f"rewind_swap_{tag}", f"_{len(out)}")
                out += [
                    f"ALTER INDEX {a.sibling(name_a).sql} RENAME TO {_q(tmp)}",
                    f"ALTER INDEX {b.sibling(name_b).sql} RENAME TO {_q(name_a)}",
                    f"ALTER INDEX {a.sibling(tmp).sql} RENAME TO {_q(name_b)}",
                ]
        return out

    def key_index_sql(self, tx: _Tx, where: _Name, old_table: str, new_table: str) -> list[str]:
        old = where.sibling(_key_index_name(old_table))
        if not self.exists(tx, old):
            return []
        return [f"ALTER INDEX {old.sql} RENAME TO {_q(_key_index_name(new_table))}"]

    def drop(self, tx: _Tx, name: _Name) -> None:
        """Drop ``name``; sequences it owns that other tables still use are handed over first."""
        tx.cur.execute(
            "SELECT s.oid::regclass::text, d.adrelid::regclass::text, a.attname "
            "FROM pg_depend o JOIN pg_class s ON s.oid = o.objid AND s.relkind = 'S' "
            "JOIN pg_depend u ON u.refobjid = s.oid AND u.classid = 'pg_attrdef'::regclass "
            "JOIN pg_attrdef d ON d.oid = u.objid "
            "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
            "WHERE o.refobjid = to_regclass(%s) AND o.deptype = 'a' AND d.adrelid <> to_regclass(%s)",
            (name.sql, name.sql),
        )
        for seq, table, column in tx.cur.fetchall():
            tx.cur.execute(f"ALTER SEQUENCE {seq} OWNED BY {table}.{_q(column)}")
        tx.cur.execute(f"DROP TABLE {name.sql}")

    def is_lock_timeout(self, exc: BaseException) -> bool:
        import psycopg.errors

        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, psycopg.errors.LockNotAvailable):
                return True
            seen = seen.__cause__ or getattr(seen, "orig", None)
        return False

    def _copy_in(self, tx: _Tx, table: str, columns: list[str], files: list[str]) -> int:
        names = ", ".join(_q(c) for c in columns)
        rows = 0

        def chunks() -> Iterator[tuple[int, bytes]]:
            for batch in _batches(files, columns):
                yield batch.num_rows, _csv(batch)

        with tx.cur.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT csv)") as copy:
            for n, data in _prefetch(chunks()):
                copy.write(data)
                rows += n
        return rows

    def copy_direct(self, tx: _Tx, staging: _Name, columns: list[str], files: list[str]) -> int | None:
        """COPY straight into staging; None (and nothing written) when a row conflicts."""
        import psycopg.errors

        tx.cur.execute("SAVEPOINT rewind_direct")
        try:
            rows = self._copy_in(tx, staging.sql, columns, files)
        except psycopg.errors.UniqueViolation:
            tx.cur.execute("ROLLBACK TO SAVEPOINT rewind_direct")
            return None
        tx.cur.execute("RELEASE SAVEPOINT rewind_direct")
        return rows

    def copy_upsert(
        self,
        tx: _Tx,
        staging: _Name,
        columns: list[str],
        files: list[str],
        conflict: list[str],
        mode: Mode,
        dedupe: bool,
    ) -> int:
        """COPY into a temporary table, then one INSERT ... SELECT ... ON CONFLICT into staging."""
        names = ", ".join(_q(c) for c in columns)
        load = _q("rewind_load")
        tx.cur.execute(
            f"CREATE TEMP TABLE {load} ON COMMIT DROP AS SELECT {names} FROM {staging.sql} WITH NO DATA"
        )
        rows = self._copy_in(tx, load, columns, files)
        if dedupe:
            keys = ", ".join(_q(c) for c in conflict)
            ts, part, off, eid = (_q(c) for c in ORDER_COLS)
            select = (
                f"SELECT DISTINCT ON ({keys}) {names} FROM {load} ORDER BY {keys}, "
                f"COALESCE({ts}, '-infinity') DESC, {part} DESC, {off} DESC, {eid} DESC"
            )
        else:
            select = f"SELECT {names} FROM {load}"
        on_conflict = _conflict_sql("rewind_t", columns, conflict, mode, sqlite=False)
        tx.cur.execute(f"INSERT INTO {staging.sql} AS rewind_t ({names}) {select} {on_conflict}")
        tx.cur.execute(f"DROP TABLE {load}")
        return rows

    def read_arrow(self, tx: _Tx, name: _Name) -> pa.Table:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        cols = self.columns(tx, name)
        exprs, read_types, final_types = [], {}, []
        for c in cols:
            t = _arrow_of(c.type)
            final_types.append(pa.field(c.name, t))
            if pa.types.is_timestamp(t):
                exprs.append(f"(extract(epoch FROM {_q(c.name)}) * 1000000)::bigint")
                read_types[c.name] = pa.int64()
            elif pa.types.is_binary(t):
                exprs.append(f"encode({_q(c.name)}, 'hex')")
                read_types[c.name] = pa.string()
            else:
                exprs.append(_q(c.name))
                read_types[c.name] = t
        buf = io.BytesIO()
        with tx.cur.copy(f"COPY (SELECT {', '.join(exprs)} FROM {name.sql}) TO STDOUT (FORMAT csv)") as copy:
            for data in copy:
                buf.write(data)
        names = [c.name for c in cols]
        if buf.tell() == 0:
            return pa.schema(final_types).empty_table()
        buf.seek(0)
        table = pcsv.read_csv(
            buf,
            read_options=pcsv.ReadOptions(column_names=names, block_size=1 << 24),
            convert_options=pcsv.ConvertOptions(
                column_types=read_types,
                true_values=["t"],
                false_values=["f"],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
        arrays = []
        for field in final_types:
            col = table.column(field.name)
            if pa.types.is_binary(field.type):
                col = pa.array(
                    [None if v is None else bytes.fromhex(v) for v in col.to_pylist()], pa.binary()
                )
            else:
                col = col.cast(field.type)
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=pa.schema(final_types))


class _Sqlite(_Backend):
    def resolve(self, tx: _Tx, table: str) -> _Name:
        return _Name(None, table.split(".")[-1])

    def exists(self, tx: _Tx, name: _Name) -> bool:
        tx.cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name.name,))
        return tx.cur.fetchone() is not None

    def columns(self, tx: _Tx, name: _Name) -> list[_Col]:
        tx.cur.execute(f"PRAGMA table_xinfo({_q(name.name)})")
        out = []
        for _cid, col, declared, notnull, default, pk, hidden in tx.cur.fetchall():
            generated = hidden in (2, 3)
            rowid = bool(pk) and declared.upper() == "INTEGER"
            out.append(
                _Col(col, declared, bool(notnull), default is not None or generated or rowid, generated)
            )
        return out

    def unique_keys(self, tx: _Tx, name: _Name) -> list[frozenset[str]]:
        keys: list[frozenset[str]] = []
        tx.cur.execute(f"PRAGMA table_info({_q(name.name)})")
        pk = [r[1] for r in sorted(tx.cur.fetchall(), key=lambda r: r[5]) if r[5]]
        if pk:
            keys.append(frozenset(pk))
        tx.cur.execute(f"PRAGMA index_list({_q(name.name)})")
        for _seq, index, unique, _origin, partial in tx.cur.fetchall():
            if not unique or partial:
                continue
            tx.cur.execute(f"PRAGMA index_info({_q(index)})")
            cols = [r[2] for r in tx.cur.fetchall()]
            if cols and None not in cols:
                keys.append(frozenset(cols))
        return keys

    def blockers(self, tx: _Tx, name: _Name) -> list[str]:
        out = []
        tx.cur.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE type IN ('view', 'trigger') AND sql IS NOT NULL"
        )
        pattern = re.compile(rf"\b{re.escape(name.name)}\b", re.IGNORECASE)
        out += [f"{kind} {obj} mentions it" for kind, obj, sql in tx.cur.fetchall() if pattern.search(sql)]
        tx.cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        for (other,) in tx.cur.fetchall():
            tx.cur.execute(f"PRAGMA foreign_key_list({_q(other)})")
            if any(r[2] == name.name for r in tx.cur.fetchall()):
                out.append(f"a foreign key of {other} references it")
        return out

    def create_like(self, tx: _Tx, target: _Name, staging: _Name) -> None:
        tx.cur.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (target.name,))
        ddl = tx.cur.fetchone()[0]
        head = re.match(r'\s*CREATE\s+TABLE\s+(?:"(?:[^"]|"")+"|\[[^\]]+\]|`[^`]+`|[^\s(]+)\s*', ddl, re.I)
        if head is None:
            raise PostgresSinkError(f"cannot read the DDL of {target}: {ddl[:80]}")
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
                raise PostgresSinkError(f"cannot read an index of {target}: {sql[:80]}")
            unique = "UNIQUE " if m.group(1) else ""
            tx.cur.execute(
                f"CREATE {unique}INDEX {_q(f'{staging.name}_{n}')} ON {staging.sql} (" + sql[m.end() :]
            )
        cols = [c for c in self.columns(tx, target) if not c.generated]
        names = ", ".join(_q(c.name) for c in cols)
        tx.cur.execute(f"INSERT INTO {staging.sql} ({names}) SELECT {names} FROM {target.sql}")

    def create_new(
        self, tx: _Tx, staging: _Name, schema: pa.Schema, conflict: list[str], index_name: str
    ) -> None:
        cols = ", ".join(
            f"{_q(f.name)} {sqlite_type(f.type)}{'' if f.nullable else ' NOT NULL'}" for f in schema
        )
        tx.cur.execute(f"CREATE TABLE {staging.sql} ({cols})")
        keys = ", ".join(_q(c) for c in conflict)
        tx.cur.execute(f"CREATE UNIQUE INDEX {_q(index_name)} ON {staging.sql} ({keys})")

    def fingerprint(self, tx: _Tx, name: _Name) -> tuple[int, str]:
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
        self, tx: _Tx, staging: _Name, columns: list[str], files: list[str], conflict: list[str], mode: Mode
    ) -> int:
        names = ", ".join(_q(c) for c in columns)
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {staging.sql} ({names}) VALUES ({marks}) " + _conflict_sql(
            staging.sql, columns, conflict, mode, sqlite=True
        )
        rows = 0
        for batch in _batches(files, columns):
            prepared = _prepare_columns(batch, sqlite=True)
            values = list(zip(*(c.to_pylist() for c in prepared.columns), strict=True))
            tx.cur.executemany(sql, values)
            rows += batch.num_rows
        return rows

    def read_arrow(self, tx: _Tx, name: _Name) -> pa.Table:
        import pyarrow as pa

        cols = self.columns(tx, name)
        fields = [pa.field(c.name, _arrow_of(c.type)) for c in cols]
        tx.cur.execute(f"SELECT {', '.join(_q(c.name) for c in cols)} FROM {name.sql}")
        data: list[list[Any]] = [[] for _ in cols]
        for row in tx.cur.fetchall():
            for i, v in enumerate(row):
                data[i].append(v)
        arrays = []
        for f, values in zip(fields, data, strict=True):
            if pa.types.is_temporal(f.type) or pa.types.is_decimal(f.type):
                arrays.append(
                    _from_text(pa.array([None if v is None else str(v) for v in values], pa.string()), f.type)
                )
            elif pa.types.is_boolean(f.type):
                arrays.append(pa.array([None if v is None else bool(v) for v in values], pa.bool_()))
            else:
                arrays.append(pa.array(values, f.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
