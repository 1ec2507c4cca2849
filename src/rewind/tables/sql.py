"""A table or query of PostgreSQL (psycopg 3) or SQLite, read through SQLAlchemy, read-only.

Every statement reads ``FROM <table>`` (quoted by the dialect) or ``FROM (<query>) AS src``;
the selection is ``key = ANY(:ids)`` (PostgreSQL: one array parameter) or ``key IN (SELECT
value FROM json_each(:ids))`` (SQLite: one JSON parameter), or the user's ``where`` predicate;
a range adds ``key >= :lo AND key < :hi``. PostgreSQL sessions are ``READ ONLY``; SQLite files
are opened ``mode=ro`` (a missing file is an error, never a new empty database). The user's SQL
text has its colons escaped, so ``'10:00'`` in a predicate is not taken for a parameter.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Generator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from rewind.secrets import mask_url
from rewind.tables.exceptions import SourceUnreachable, TableSourceError
from rewind.tables.readers import Key, KeyType, Rows, Selection, TableReader

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine


def _engine_url(kind: str, url: str) -> str:
    if kind == "postgres":
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    path = url[len("sqlite:///") :]
    return f"sqlite:///file:{path}?mode=ro&uri=true"


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


def _user_sql(text: str) -> str:
    return text.replace(":", "\\:")


class SqlReader(TableReader):
    """See the module docstring; plain data until :meth:`_connect`."""

    def __init__(
        self, kind: str, url: str, table: str | None, query: str | None, key: str, label: str
    ) -> None:
        self.kind = kind
        self.url = url
        self.table = table
        self.query = query
        self.key = key
        self.label = label
        self._engine: Engine | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_engine": None}

    @property
    def _field(self) -> str:
        return f"source.table.{self.kind}"

    @property
    def _database(self) -> str:
        return "PostgreSQL" if self.kind == "postgres" else "SQLite"

    def _connect(self) -> Connection:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import create_engine
        from sqlalchemy.exc import SQLAlchemyError
        from sqlalchemy.pool import NullPool

        if self.kind == "sqlite" and not os.path.isfile(self.url[len("sqlite:///") :]):
            raise SourceUnreachable(
                f"{self._field}.url", f"no SQLite file at {self.url[len('sqlite:///') :]}"
            )
        if self._engine is None:
            args: dict[str, Any] = {"connect_timeout": 5} if self.kind == "postgres" else {}
            self._engine = create_engine(
                _engine_url(self.kind, self.url), poolclass=NullPool, connect_args=args
            )
        try:
            conn = self._engine.connect()
        except SQLAlchemyError as exc:
            raise SourceUnreachable(
                f"{self._field}.url",
                f"cannot connect to {mask_url(self.url)}: {_first_line(exc)}; check that the database is up "
                "and the URL",
            ) from None
        return conn.execution_options(postgresql_readonly=True) if self.kind == "postgres" else conn

    def _quote(self, conn: Connection, name: str) -> str:
        return str(conn.dialect.identifier_preparer.quote(name))

    def _from(self, conn: Connection) -> str:
        if self.query is not None:
            return f"({_user_sql(self.query)}) AS src"
        assert self.table is not None
        return ".".join(self._quote(conn, part) for part in self.table.split("."))

    def _where(self, conn: Connection, selection: Selection, params: dict[str, Any]) -> str:
        key = self._quote(conn, self.key)
        clauses = [f"{key} IS NOT NULL"]
        if selection.ids is not None:
            if self.kind == "postgres":
                clauses.append(f"{key} = ANY(:ids)")
                params["ids"] = list(selection.ids)
            else:
                clauses.append(f"{key} IN (SELECT value FROM json_each(:ids))")
                params["ids"] = json.dumps(list(selection.ids))
        if selection.where is not None:
            clauses.append(f"({_user_sql(selection.where)})")
        return " AND ".join(clauses)

    def _check_source(self, conn: Connection) -> None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import inspect

        if self.table is None:
            return
        schema, _, name = self.table.rpartition(".")
        if not inspect(conn).has_table(name, schema=schema or None):
            raise TableSourceError(
                f"{self._field}.table",
                f"no table {self.table} in {mask_url(self.url)}; check the name (schema.table)",
            )

    def key_type(self) -> KeyType | None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        with self._connect() as conn:
            self._check_source(conn)
            key = self._quote(conn, self.key)
            try:
                result = conn.execute(text(f"SELECT * FROM {self._from(conn)} LIMIT 1"))
                columns = list(result.keys())
                result.close()
            except SQLAlchemyError as exc:
                field = f"{self._field}.query" if self.query is not None else f"{self._field}.table"
                raise TableSourceError(
                    field, f"cannot be read from {self._database}: {_first_line(exc)}"
                ) from None
            if self.key not in columns:
                raise TableSourceError(
                    "source.table.key",
                    f"no column {self.key!r} in {self.table or 'the query'} (columns: {', '.join(columns)})",
                )
            row = conn.execute(
                text(f"SELECT {key} FROM {self._from(conn)} WHERE {key} IS NOT NULL LIMIT 1")
            ).first()
        if row is None:
            return None
        value = row[0]
        if isinstance(value, int) and not isinstance(value, bool):
            return "integer"
        if isinstance(value, str):
            return "text"
        raise TableSourceError(
            "source.table.key",
            f"column {self.key!r} holds {type(value).__name__} values; an entity id is an integer or text: "
            f"cast it in a query (SELECT CAST({self.key} AS TEXT) AS {self.key}, ...)",
        )

    def _select(self, conn: Connection, sql: str, params: dict[str, Any], selection: Selection) -> Any:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return conn.execute(text(sql), params)
        except SQLAlchemyError as exc:
            if selection.where is not None:
                raise TableSourceError(
                    "source.table.where",
                    f"not a valid predicate for {self._database}: {_first_line(exc)}; write a SQL "
                    "condition over the table's columns, like status = 'blocked'",
                ) from None
            field = f"{self._field}.query" if self.query is not None else "source.table"
            raise TableSourceError(
                field, f"{self._database} refused the selection: {_first_line(exc)}"
            ) from None

    def count(self, selection: Selection) -> int:
        with self._connect() as conn:
            params: dict[str, Any] = {}
            where = self._where(conn, selection, params)
            sql = f"SELECT COUNT(*) FROM {self._from(conn)} WHERE {where}"
            return int(self._select(conn, sql, params, selection).scalar_one())

    def keys(self, selection: Selection) -> list[Key]:
        with self._connect() as conn:
            params: dict[str, Any] = {}
            key = self._quote(conn, self.key)
            where = self._where(conn, selection, params)
            sql = f"SELECT {key} FROM {self._from(conn)} WHERE {where} ORDER BY {key}"
            return [row[0] for row in self._select(conn, sql, params, selection)]

    def null_keys(self, selection: Selection) -> int:
        with self._connect() as conn:
            params: dict[str, Any] = {}
            where = f"{self._quote(conn, self.key)} IS NULL"
            if selection.where is not None:
                where += f" AND ({_user_sql(selection.where)})"
            sql = f"SELECT COUNT(*) FROM {self._from(conn)} WHERE {where}"
            return int(self._select(conn, sql, params, selection).scalar_one())

    def distinct(self, selection: Selection, column: str) -> list[Any]:
        with self._connect() as conn:
            params: dict[str, Any] = {}
            where = self._where(conn, selection, params)
            sql = f"SELECT DISTINCT {self._quote(conn, column)} FROM {self._from(conn)} WHERE {where}"
            return [row[0] for row in self._select(conn, sql, params, selection)]

    def read(
        self, selection: Selection, lo: Key | None, hi: Key | None, batch_rows: int = 10_000
    ) -> Generator[Rows, None, None]:
        with self._connect() as conn:
            params: dict[str, Any] = {}
            key = self._quote(conn, self.key)
            where = self._where(conn, selection, params)
            if lo is not None:
                where += f" AND {key} >= :lo"
                params["lo"] = lo
            if hi is not None:
                where += f" AND {key} < :hi"
                params["hi"] = hi
            sql = f"SELECT * FROM {self._from(conn)} WHERE {where} ORDER BY {key}"
            if self.kind == "sqlite":  # sqlite3 takes the same :name parameters, at C speed
                yield from self._read_sqlite(conn, sql, params, batch_rows)
                return
            conn = conn.execution_options(stream_results=True, yield_per=batch_rows)
            result = self._select(conn, sql, params, selection)
            columns = tuple(result.keys())
            for part in result.partitions(batch_rows):
                yield Rows(columns, part)  # Row objects are sequences: no copy

    def _read_sqlite(
        self, conn: Connection, sql: str, params: dict[str, Any], batch_rows: int
    ) -> Generator[Rows, None, None]:
        """The rows as Arrow batches, read by SQLite's ADBC driver (no Python object per value:
        ~4x cheaper per row than tuples from sqlite3), in one read transaction.

        The driver types each column from the first batch of a statement and fails on a later
        value of another type (SQLite's columns are dynamically typed); the statement is then run
        again in the same transaction (the same snapshot, the same order) from the first row not
        yet handed out, typed anew from there. Without the driver: :meth:`_read_sqlite_rows`.
        """
        try:
            # lazy: avoids adbc_driver_sqlite (and its pyarrow) at import; a trimmed install may lack it
            from adbc_driver_sqlite import dbapi
        except ImportError:  # pragma: no cover - a dependency; kept for a trimmed install
            yield from self._read_sqlite_rows(conn, sql, params, batch_rows)
            return

        text = sql.replace("\\:", ":")
        path = os.path.abspath(self.url[len("sqlite:///") :])
        names = list(dict.fromkeys(re.findall(r"(?<![\\:]):(\w+)", sql)))  # numbered by first use
        values = [params[name] for name in names]
        db = dbapi.connect(f"file:{quote(path)}?mode=ro", autocommit=False)
        try:
            done = 0
            while True:
                cursor = db.cursor()
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
                statement = text if not done else f"{text} LIMIT -1 OFFSET {done}"
                try:
                    cursor.execute(statement, values or None)
                    reader = cursor.fetch_record_batch()
                except Exception as exc:
                    raise TableSourceError(
                        "source.table", f"SQLite refused the read: {_first_line(exc)}"
                    ) from None
                try:
                    for batch in reader:
                        if _numbers_as_lossy_text(batch):
                            # these rows again as tuples: exact numbers (see the function)
                            again = f"{sql} LIMIT {batch.num_rows} OFFSET {done}"
                            yield from self._read_sqlite_rows(conn, again, params, batch_rows)
                        else:
                            yield Rows(tuple(batch.schema.names), batch=batch)
                        done += batch.num_rows
                    return
                except Exception as exc:
                    if "type mismatch" not in str(exc).lower():
                        raise
                finally:
                    cursor.close()
        finally:
            db.close()

    def _read_sqlite_rows(
        self, conn: Connection, sql: str, params: dict[str, Any], batch_rows: int
    ) -> Generator[Rows, None, None]:
        """The rows through the sqlite3 cursor itself (tuples, without SQLAlchemy's rows); the
        statement is the one :meth:`count` ran, with the escaped colons of user SQL put back."""
        raw: Any = conn.connection.driver_connection
        try:
            cursor = raw.execute(sql.replace("\\:", ":"), params)
        except sqlite3.Error as exc:
            raise TableSourceError("source.table", f"SQLite refused the read: {_first_line(exc)}") from None
        columns = tuple(d[0] for d in cursor.description)
        while True:
            part = cursor.fetchmany(batch_rows)
            if not part:
                break
            yield Rows(columns, part)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


_ADBC_NUMBER_TEXT = r"^-?[0-9]\.[0-9]{6}e[+-][0-9]{2,3}$"


def _numbers_as_lossy_text(batch: Any) -> bool:
    """Whether ADBC may have turned numbers into text with 7 significant digits.

    A column whose batch mixes numbers and text comes as strings, and the driver prints a real
    number (or an integer it had already widened to one) as ``%e``: 10000001 becomes
    ``1.000000e+07``. A string value of that shape sends the batch through the tuple reader,
    which keeps every number exact (a text value of that shape costs a slower batch only).
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    text = [c for c in batch.columns if pa.types.is_string(c.type) or pa.types.is_large_string(c.type)]
    for column in text:
        shaped = _number_shaped(column)
        if (
            shaped is not None
            and len(shaped)
            and pc.any(pc.match_substring_regex(shaped, _ADBC_NUMBER_TEXT)).as_py()
        ):
            return True
    return False


def _number_shaped(column: Any) -> Any:
    """The values of a text column that may match :data:`_ADBC_NUMBER_TEXT`: 12 to 14 bytes
    with a ``.`` after the first digit (numpy over the offsets and bytes; the regex over every
    value cost ~0.5 µs a row of 4 text columns, more than reading the row). None: no value."""
    # lazy: avoids pyarrow / numpy at import
    import numpy as np
    import pyarrow as pa

    _validity, offsets, data = column.buffers()
    if data is None or len(column) == 0:
        return None
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    ends = np.frombuffer(offsets, dtype=width)[column.offset : column.offset + len(column) + 1].astype(
        np.int64
    )
    starts, lengths = ends[:-1], np.diff(ends)
    maybe = np.flatnonzero((lengths >= 12) & (lengths <= 14))
    if not len(maybe):
        return None
    text = np.frombuffer(data, dtype=np.uint8)
    first = starts[maybe]
    dot = first + 1 + (text[first] == ord("-"))
    maybe = maybe[text[dot] == ord(".")]
    return column.take(pa.array(maybe)) if len(maybe) else None
