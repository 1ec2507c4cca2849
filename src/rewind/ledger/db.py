"""Connecting to the ledger and creating its tables.

On SQLite the driver's own transaction handling is switched off so that every SQLAlchemy
transaction is a real SQLite transaction (reads included), and a transaction that reads
before it writes can ask for the write lock up front with the execution option
``rewind_sqlite_begin="IMMEDIATE"`` (see :data:`WRITE`). Without that, two processes that
both read and then write get ``database is locked`` instead of waiting their turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url, select, text
from sqlalchemy.exc import SQLAlchemyError

from rewind.errors import ConfigError, RewindError
from rewind.ledger.schema import metadata, schema_info
from rewind.secrets import mask_url

SCHEMA_VERSION = 1
"""Version of the tables this code writes. History:

1. schema, plans, runs, units, leases, audit. (Ledgers made before the repository existed
   hold only ``rewind_schema``; ``create_all`` adds the other tables to them.)

A change that ``create_all`` cannot make (a new column, a new constraint) bumps this and
adds its step to :func:`ensure_schema`.
"""

WRITE: dict[str, Any] = {"rewind_sqlite_begin": "IMMEDIATE"}
"""Execution options of a read-then-write transaction (``engine.execution_options(**WRITE)``)."""


def connect(url: str) -> Engine:
    """An engine for ``url``; ``postgresql://`` is served by psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        # pre-ping: a connection a restart or a cut left dead is replaced before use
        engine = create_engine(url, pool_pre_ping=True, connect_args=_pg_timeouts(url))
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"ledger_url {mask_url(url)!r} is not a usable database URL ({exc.__class__.__name__}); "
            "expected sqlite:///path or postgresql://user@host/db"
        ) from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
    return engine


PG_TIMEOUTS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 15,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq parameters a PostgreSQL ledger gets unless its URL sets them: a server that stops
answering without closing the connection (a cut network) fails the transaction within about
30 s, which the retries then ride out, instead of hanging until the kernel gives up."""


def _pg_timeouts(url: str) -> dict[str, Any]:
    if not url.startswith("postgresql"):
        return {}
    given = set(make_url(url).query)
    return {k: v for k, v in PG_TIMEOUTS.items() if k not in given}


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy emits BEGIN itself (_sqlite_begin); the driver must not open transactions
    dbapi_conn.isolation_level = None
    # WAL lets a reader (rewind show) look while a run writes; busy_timeout waits, not fails
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get("rewind_sqlite_begin", "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {'IMMEDIATE' if mode == 'IMMEDIATE' else 'DEFERRED'}")


def ensure_schema(engine: Engine) -> int:
    """Create missing tables, bring an older ledger up to date, and return its schema version.

    A ledger written by a newer Rewind is refused rather than half-understood.
    """
    try:
        with engine.execution_options(**WRITE).begin() as conn:
            if engine.dialect.name == "postgresql":
                # two processes creating a fresh ledger at once must not race on CREATE TABLE
                conn.execute(text("SELECT pg_advisory_xact_lock(7465626)"))
            metadata.create_all(conn)
            version = conn.execute(select(schema_info.c.version)).scalar()
            if version is None:
                conn.execute(schema_info.insert().values(id=1, version=SCHEMA_VERSION))
                version = SCHEMA_VERSION
            elif version < SCHEMA_VERSION:
                # no step yet needs more than the tables create_all has just added
                conn.execute(schema_info.update().where(schema_info.c.id == 1).values(version=SCHEMA_VERSION))
                version = SCHEMA_VERSION
            elif version > SCHEMA_VERSION:
                raise RewindError(
                    f"ledger at {mask_url(str(engine.url))} has schema v{version}, newer than this "
                    f"Rewind understands (v{SCHEMA_VERSION}); upgrade Rewind"
                )
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None)
        raise RewindError(
            f"ledger at {mask_url(str(engine.url))} is not usable: {exc.__class__.__name__}: "
            f"{mask_url(str(orig) if orig else str(exc)).splitlines()[0]}"
        ) from exc
    return int(version)
