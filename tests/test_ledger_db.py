"""The run ledger's database: SQLite by default, PostgreSQL for a team (real server, fresh DB)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, inspect, text

from rewind.config import load_settings
from rewind.errors import RewindError
from rewind.ledger import SCHEMA_VERSION, connect, ensure_schema

try:
    from tests.conftest import PG_DSN, free_port
except ImportError:  # tests/ run as a plain folder, not a package
    from conftest import PG_DSN, free_port  # type: ignore[no-redef]


def schema_rows(engine: Engine) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT id, version FROM rewind_schema"))]


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for engine in made:
        engine.dispose()


# -- SQLite ----------------------------------------------------------------------------------


def test_sqlite_schema_is_created_once(tmp_path: Path, engines: list[Engine]) -> None:
    path = tmp_path / "not" / "yet" / "ledger.db"  # connect makes the folder
    engine = connect(f"sqlite:///{path}")
    engines.append(engine)

    assert ensure_schema(engine) == SCHEMA_VERSION
    assert ensure_schema(engine) == SCHEMA_VERSION
    assert path.exists()
    assert "rewind_schema" in inspect(engine).get_table_names()
    assert schema_rows(engine) == [(1, SCHEMA_VERSION)]


def test_sqlite_survives_a_new_engine(tmp_path: Path, engines: list[Engine]) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    first = connect(url)
    engines.append(first)
    ensure_schema(first)
    first.dispose()
    again = connect(url)
    engines.append(again)
    assert ensure_schema(again) == SCHEMA_VERSION
    assert schema_rows(again) == [(1, SCHEMA_VERSION)]


def test_sqlite_uses_wal_and_waits_for_locks(tmp_path: Path, engines: list[Engine]) -> None:
    engine = connect(f"sqlite:///{tmp_path / 'ledger.db'}")
    engines.append(engine)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 10000


def test_default_ledger_lives_in_the_state_folder(tmp_path: Path, engines: list[Engine]) -> None:
    settings = load_settings(env={}, cwd=tmp_path)
    engine = connect(settings.ledger)
    engines.append(engine)
    assert ensure_schema(engine) == SCHEMA_VERSION
    assert (tmp_path / ".rewind" / "ledger.db").exists()


# -- PostgreSQL ------------------------------------------------------------------------------


def test_postgresql_schema_is_created_once(pg_url: str, engines: list[Engine]) -> None:
    engine = connect(pg_url)
    engines.append(engine)
    assert (engine.dialect.name, engine.dialect.driver) == ("postgresql", "psycopg")

    assert ensure_schema(engine) == SCHEMA_VERSION
    assert ensure_schema(engine) == SCHEMA_VERSION
    assert "rewind_schema" in inspect(engine).get_table_names()
    assert schema_rows(engine) == [(1, SCHEMA_VERSION)]

    other = connect(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    engines.append(other)
    assert ensure_schema(other) == SCHEMA_VERSION
    assert schema_rows(other) == [(1, SCHEMA_VERSION)]


def test_an_unreachable_postgresql_is_a_masked_rewind_error(engines: list[Engine]) -> None:
    port = free_port()
    password = "Pg/Secret-42"
    engine = connect(f"postgresql://rewind:{password}@127.0.0.1:{port}/ledger")
    engines.append(engine)
    with pytest.raises(RewindError) as err:
        ensure_schema(engine)
    message = str(err.value)
    assert message.startswith("ledger at postgresql+psycopg://rewind:***@127.0.0.1:")
    assert str(port) in message
    assert "not usable" in message
    assert password not in message
    assert "Secret-42" not in message
    assert "\n" not in message


def test_a_missing_postgresql_database_is_a_rewind_error(engines: list[Engine]) -> None:
    engine = connect(f"{PG_DSN}/rewind_no_such_db_{uuid.uuid4().hex[:6]}")
    engines.append(engine)
    with pytest.raises(RewindError, match="does not exist"):
        ensure_schema(engine)


def test_a_malformed_ledger_url_is_a_rewind_error() -> None:
    with pytest.raises(RewindError, match="ledger"):
        connect("not a database url")


@pytest.fixture
def fresh_pg_db() -> Iterator[str]:
    name = f"rewind_race_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG_DSN}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_DSN}/{name}"
    with psycopg.connect(f"{PG_DSN}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_concurrent_first_use_of_a_postgresql_ledger(fresh_pg_db: str, engines: list[Engine]) -> None:
    workers = 4
    barrier = threading.Barrier(workers)
    errors: list[str] = []
    versions: list[int] = []

    def first_use() -> None:
        engine = connect(fresh_pg_db)
        engines.append(engine)
        barrier.wait()
        try:
            versions.append(ensure_schema(engine))
        except RewindError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=first_use) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert versions == [SCHEMA_VERSION] * workers
