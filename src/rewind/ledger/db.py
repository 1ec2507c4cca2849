"""Connecting to the ledger and creating its tables."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy.exc import SQLAlchemyError

from rewind.errors import ConfigError, RewindError
from rewind.ledger.schema import metadata, schema_info
from rewind.secrets import mask_url

SCHEMA_VERSION = 1


def connect(url: str) -> Engine:
    """An engine for ``url``; ``postgresql://`` is served by psycopg 3."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        engine = create_engine(url, pool_pre_ping=True)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"ledger_url {mask_url(url)!r} is not a usable database URL ({exc.__class__.__name__}); "
            "expected sqlite:///path or postgresql://user@host/db"
        ) from None
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    # WAL lets a reader (rewind show) look while a run writes; busy_timeout waits, not fails
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def ensure_schema(engine: Engine) -> int:
    """Create missing tables and return the schema version recorded in the ledger."""
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                # two processes creating a fresh ledger at once must not race on CREATE TABLE
                conn.execute(text("SELECT pg_advisory_xact_lock(7465626)"))
            metadata.create_all(conn)
            version = conn.execute(select(schema_info.c.version)).scalar()
            if version is None:
                conn.execute(schema_info.insert().values(id=1, version=SCHEMA_VERSION))
                version = SCHEMA_VERSION
    except SQLAlchemyError as exc:
        raise RewindError(
            f"ledger at {mask_url(str(engine.url))} is not usable: {exc.__class__.__name__}: "
            f"{mask_url(str(exc.orig) if getattr(exc, 'orig', None) else str(exc)).splitlines()[0]}"
        ) from exc
    return int(version)
