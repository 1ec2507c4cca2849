"""A Kafka-source run's units loaded into PostgreSQL by the Spark tasks that produced them.

The driver path (:meth:`~rewind.sinks.sql.sink.SqlSink.commit`) moves every row of a wave
through the driver: one process reads the tasks' Parquet files and ``COPY``-s them. Here each
task loads each unit it finished, in **one transaction per unit**:

1. ``rewind_stagings``' row of the staging, ``FOR SHARE``: it must still be ``staged``; a
   promotion or cleanup (``FOR UPDATE``) waits for the unit, and the unit for them;
2. the unit's row in ``rewind_unit_commits`` (ids and counts), ``ON CONFLICT DO NOTHING``
   first: a unit recorded already is skipped (a retried task, a resumed run), and a second
   attempt of a unit still loading waits on the first's key and then skips, so no unit is
   ever loaded twice;
3. the rows: ``COPY`` straight into a new read model's staging under a savepoint (the first
   unique violation switches the process to the next path), else ``COPY`` into a temporary
   table and ``INSERT ... ON CONFLICT`` in key order;
4. commit. A task killed before it leaves nothing (the transaction rolls back with the
   connection); after it, the retry finds the unit recorded and returns what was recorded.

Two tasks upserting overlapping keys may deadlock; PostgreSQL aborts one, which retries its
unit. The unit's row also names its quarantine files (``quarantine_files`` in the counts):
the driver commits them after the wave, and a resume after a driver killed in between
finds them there (:func:`rewind.job.task_loads.reconcile_quarantine`).

The loader is plain data pickled to the tasks, like a table source's reader: the URL with
its password travels in the task's closure, never in Spark's conf, and is masked in every
message. SQLite keeps the driver path: one writer at a time per database file, so tasks
would only queue on its lock (or fail with ``database is locked``) and gain nothing.
``REWIND_SQL_LOAD=driver`` keeps the driver path for PostgreSQL too (the benchmark's peer).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.counts import QUARANTINE_FILES_KEY as QUARANTINE_FILES
from rewind.core.store import filesystem, remove_files_under
from rewind.secrets import mask_url
from rewind.sinks.sql.backend import STAGINGS_TABLE, UNITS_TABLE, Mode, Tx
from rewind.sinks.sql.checks import check_staging
from rewind.sinks.sql.encoding import files_have_duplicates
from rewind.sinks.sql.exceptions import SqlSinkError, first_line
from rewind.sinks.sql.names import TableName
from rewind.sinks.sql.postgres import PostgresBackend

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.sinks.sql.sink import SqlSink, SqlStaging

log = logging.getLogger(__name__)


_ATTEMPTS = 5
_NO_DIRECT: set[str] = set()
"""Stagings this worker process saw a conflict in: their units go through the temporary table."""


@dataclass(frozen=True)
class TaskLoader:
    """What a task needs to load its units into one staging (see the module docstring)."""

    url: str = field(repr=False)
    staging: str
    run_id: str
    conflict: tuple[str, ...]
    mode: Mode
    direct: bool
    spool: str

    def load(
        self, unit_id: str, files: list[str], quarantine_files: list[str], counts: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Load one unit; returns its counts as recorded (with its quarantine files) and
        whether this call loaded it (False: an earlier attempt had)."""
        # lazy: avoids psycopg at import
        import psycopg.errors

        recorded = {**counts, QUARANTINE_FILES: list(quarantine_files)}
        try:
            for attempt in range(_ATTEMPTS):
                try:
                    return self._load_once(unit_id, files, recorded)
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
                    if attempt == _ATTEMPTS - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))
        except psycopg.Error as exc:
            raise SqlSinkError(
                f"unit {unit_id} into {self.staging}: {mask_url(first_line(exc))}"
            ) from None  # the driver's exception would carry the connection's parameters
        finally:
            _unspool(self.spool, files)
        raise AssertionError("unreachable")

    def _load_once(
        self, unit_id: str, files: list[str], recorded: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        # lazy: avoids psycopg at import
        import psycopg

        sname = TableName.parse(self.staging)
        book = TableName(sname.schema, STAGINGS_TABLE).sql
        units = TableName(sname.schema, UNITS_TABLE).sql
        backend = PostgresBackend()
        with psycopg.connect(self.url) as conn, conn.cursor() as cur:
            tx = Tx(None, cur, conn)  # type: ignore[arg-type]  # the backend uses the cursor only
            backend.session(tx)
            cur.execute(f"SELECT state FROM {book} WHERE staging = %s FOR SHARE", (sname.name,))
            state = cur.fetchone()
            if state is None or state[0] != "staged":
                what = "not recorded" if state is None else state[0]
                raise SqlSinkError(f"staging {sname} is {what}; unit {unit_id} was not loaded")
            cur.execute(
                f"INSERT INTO {units} (run_id, unit_id, staging, counts, rows_out, committed_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING unit_id",
                (
                    self.run_id,
                    unit_id,
                    sname.name,
                    json.dumps(recorded, sort_keys=True),
                    int(recorded.get("rows_out", 0) or 0),
                    datetime.now(UTC),
                ),
            )
            if cur.fetchone() is None:
                conn.rollback()
                cur.execute(
                    f"SELECT counts FROM {units} WHERE run_id = %s AND unit_id = %s", (self.run_id, unit_id)
                )
                row = cur.fetchone()
                log.info("unit %s is in %s already: not loaded again", unit_id, sname)
                return (json.loads(row[0]) if row and row[0] else {}), False
            rows = self._rows(backend, tx, sname, files)
            faults.point("postgres-unit-before-commit")
            conn.commit()
        faults.point("postgres-unit-after-commit")
        log.info("unit %s: %d rows into %s", unit_id, rows, sname)
        return recorded, True

    def _rows(self, backend: PostgresBackend, tx: Tx, sname: TableName, files: list[str]) -> int:

        if not files:
            return 0
        columns = list(files_schema_names(files[0]))
        if self.direct and sname.name not in _NO_DIRECT:
            rows = backend.copy_direct(tx, sname, columns, files)
            if rows is not None:
                return rows
            _NO_DIRECT.add(sname.name)
        conflict = list(self.conflict)
        dedupe = self.mode == "upsert" and files_have_duplicates(files, conflict)
        return backend.copy_upsert(tx, sname, columns, files, conflict, self.mode, dedupe, ordered=True)


def _unspool(spool: str, files: list[str]) -> None:
    remove_files_under(spool, files)


def task_loader(sink: SqlSink, staging: SqlStaging, schema: pa.Schema) -> TaskLoader | None:
    """The loader of a wave's tasks, or None: the driver commits (SQLite, or ``REWIND_SQL_LOAD=driver``).

    Staging's columns are checked here, once per wave, as the driver path checks them per commit."""
    if sink.is_sqlite or os.environ.get("REWIND_SQL_LOAD", "task") == "driver":
        return None
    sname = TableName.parse(staging.table)
    with sink._tx() as tx:
        check_staging(sink, tx, sname, schema)
    return TaskLoader(
        url=sink.url.replace("+psycopg", "", 1),
        staging=staging.table,
        run_id=staging.run_id,
        conflict=tuple(sink.conflict_columns),
        mode=sink.mode,
        direct=not staging.target_existed,
        spool=staging.spool,
    )


def files_schema_names(uri: str) -> list[str]:
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq

    fs, path = filesystem(uri)
    with fs.open_input_file(path) as handle:
        return list(pq.ParquetFile(handle).schema_arrow.names)
