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
  creates it for a new table, and refuses (in :meth:`SqlSink.check`, with the DDL to
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
  SQLite: ``executemany`` upserts in one ``BEGIN IMMEDIATE`` transaction. A Kafka-source
  run into PostgreSQL loads each unit from its Spark task instead, likewise in one transaction
  with its unit row (:mod:`rewind.sinks.sql.task_load`); the driver then records only metadata.
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
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.core.columns import (
    EVENT_ID,
)
from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.core.store import folder_uri, make_dirs
from rewind.secrets import mask_url
from rewind.sinks.base import RowFold, StagingSink, Swap
from rewind.sinks.sql.backend import (
    STAGINGS_TABLE,
    UNITS_TABLE,
    Backend,
    Bookkeeping,
    Mode,
    Tx,
    sqlalchemy_url,
)
from rewind.sinks.sql.checks import check_output, check_same_shape, check_staging, check_target
from rewind.sinks.sql.exceptions import SqlSinkError, first_line
from rewind.sinks.sql.fold import commit_folded
from rewind.sinks.sql.load import unspool, write_files
from rewind.sinks.sql.names import TableName, key_index_name, prev_name, quote_ident, run_tag, staging_name
from rewind.sinks.sql.postgres import PostgresBackend
from rewind.sinks.sql.publish import cleanup_run, promote_once, rollback_once, with_lock_retry
from rewind.sinks.sql.sqlite import SqliteBackend
from rewind.sinks.sql.staging import SqlStaging
from rewind.sinks.sql.types import pg_type, sqlite_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from sqlalchemy.engine import Engine

    from rewind.config import Settings
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)


class SqlSink(StagingSink[SqlStaging]):
    """Writes a run's output into a staging table beside a PostgreSQL (or SQLite) table."""

    kind = "postgres"
    SUPPORTS_CLEANUP = True
    SUPPORTS_FOLDED_COMMIT = True

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
        copy_target: bool = True,
    ) -> None:
        """No I/O here: the engine is made on first use.

        ``copy_target=False`` (a shadow's v2, rebuilt from all history): staging is created like
        the target but empty; its recorded base is the target as it was then, so a promotion
        still refuses a target that moved since that base (a shadow re-records it at its cut line).
        """
        self.copy_target = copy_target
        self.url = sqlalchemy_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        self.table_name = table
        self.mode: Mode = mode
        self.key = list(key)
        self.spool_dir = folder_uri(spool_dir)  # a local folder, or an object store's
        self.lock_timeout_s = lock_timeout_s
        self.lock_wait_s = lock_wait_s
        self._engine_: Engine | None = None
        self._backend: Backend = SqliteBackend() if self.is_sqlite else PostgresBackend()
        self._resolved: TableName | None = None
        self._direct: dict[str, bool] = {}
        if self.is_sqlite and "." in table and table.split(".")[0] != "main":
            raise SqlSinkError(
                f"sink.postgres.table {table}: SQLite has no schemas; name the table alone"
            )

    @classmethod
    def from_spec(cls, settings: Settings, spec: JobSpec) -> SqlSink:
        """The sink of ``spec.sink.postgres``; the URL defaults to the ledger's when that is PostgreSQL."""
        cfg = spec.sink.postgres
        if cfg is None:
            raise SqlSinkError("the spec has no sink.postgres section")
        url = cfg.url
        if url is None:
            ledger = settings.ledger
            if not re.match(r"postgres(ql)?(\+\w+)?://", ledger):
                raise SqlSinkError(
                    f"sink.postgres.url is not set and the ledger ({mask_url(ledger)}) is not PostgreSQL; "
                    "set sink.postgres.url: postgresql://user@host:5432/db"
                )
            url = ledger
        return cls(
            url,
            cfg.table,
            mode=cfg.mode,
            key=spec.key,
            spool_dir=settings.spool_root(),
            copy_target=spec.shadow is None,
        )

    @property
    def target(self) -> str:
        return f"postgres:{self.table_name}"

    @property
    def where(self) -> str:
        """The masked URL, for messages."""
        return mask_url(self.url.replace("+psycopg", ""))

    @property
    def conflict_columns(self) -> list[str]:
        return list(self.key) if self.mode in ("upsert", "replace") and self.key else [EVENT_ID]

    # -- connections ----------------------------------------------------------------------

    def _engine(self) -> Engine:
        if self._engine_ is None:
            # lazy: avoids sqlalchemy at import
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
    def _tx(self) -> Iterator[Tx]:
        """One transaction: a SQLAlchemy connection and the driver's cursor on it."""
        # lazy: avoids sqlalchemy at import
        from sqlalchemy.exc import OperationalError

        try:
            ctx = self._engine().begin()
            conn = ctx.__enter__()
        except OperationalError as exc:
            raise SqlSinkError(
                f"database at {self.where} is not reachable: {mask_url(first_line(exc.orig or exc))}"
            ) from exc
        try:
            raw = conn.connection.driver_connection
            cur = raw.cursor()  # type: ignore[union-attr]
            tx = Tx(conn, cur, raw)
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

    def _name(self, tx: Tx) -> TableName:
        if self._resolved is None:
            self._resolved = self._backend.resolve(tx, self.table_name)
        return self._resolved

    def _tables(self, tx: Tx) -> Bookkeeping:
        return Bookkeeping(self._name(tx).schema)

    # -- gates ----------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        """Raise a one-line error when the output cannot go to the target; else say where it goes."""
        check_output(self, schema)
        with self._tx() as tx:
            name = self._name(tx)
            if not self._backend.exists(tx, name):
                return (
                    f"{name} does not exist at {self.where}: a staging table is created from the output "
                    "schema and becomes the target on promotion"
                )
            check_target(self, tx, name, schema)
        return (
            f"{name} exists at {self.where}: staging is a copy of it, {self.mode} on "
            f"({', '.join(self.conflict_columns)}), swapped in by renames"
        )

    # -- staging --------------------------------------------------------------------------

    def _staging(self, name: TableName, run_id: str, existed: bool, base_rows: int | None) -> SqlStaging:
        return SqlStaging(
            self.target,
            str(name.sibling(staging_name(name.name, run_id))),
            str(name),
            str(name.sibling(prev_name(name.name, run_id))),
            run_id,
            existed,
            f"{self.spool_dir}/{run_tag(run_id)}",
            base_rows,
        )

    def prepare(self, run_id: str, schema: pa.Schema, *, new_run: bool = False) -> SqlStaging:
        """Create staging (a copy of the target, or a new table), or find it again on resume.

        Steps, in one transaction: (1) the bookkeeping tables exist; (2) a staging already
        recorded for the run is checked against the target's columns and returned; (3) else
        staging is created LIKE the target and filled with its rows (or created from the output
        schema with its unique index); (4) its base (row count and hash of the copied rows) is
        recorded in ``rewind_stagings`` so promotion can tell whether the target moved since.
        """
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import insert, select

        check_output(self, schema)
        book_ready = False
        for attempt in range(3):  # two runs creating the bookkeeping tables at once: retry
            try:
                with self._tx() as tx:
                    Bookkeeping(self._name(tx).schema).create(tx)
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
                check_target(self, tx, name, schema)
            if self._backend.exists(tx, sname):
                raise SqlSinkError(
                    f"{sname} exists but is not run {run_id}'s recorded staging; "
                    "drop it or use another run id"
                )
            if existed:
                self._backend.create_like(tx, name, sname)
                if self.copy_target:
                    rows, fingerprint = self._backend.fingerprint(tx, sname)
                else:
                    tx.cur.execute(f"DELETE FROM {sname.sql}")
                    self._add_new_columns(tx, name, sname, schema)
                    rows, fingerprint = self._backend.fingerprint(tx, name)
            else:
                self._backend.create_new(
                    tx, sname, schema, self.conflict_columns, key_index_name(sname.name)
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
            how = "copied" if self.copy_target else "in the target, none copied"
            log.info("prepared %s for run %s (%s rows %s)", sname, run_id, rows, how)
            return self._staging(name, run_id, existed, rows if existed else None)

    def _add_new_columns(self, tx: Tx, name: TableName, sname: TableName, schema: pa.Schema) -> None:
        """A shadow's v2 gets the output's columns the target lacks (a new field of the read
        model), nullable, after the target's: v1's rows never had them."""
        have = {c.name for c in self._backend.columns(tx, name)}
        for f in schema:
            if f.name not in have:
                sql_type = sqlite_type(f.type) if self.is_sqlite else pg_type(f.type)
                tx.cur.execute(f"ALTER TABLE {sname.sql} ADD COLUMN {quote_ident(f.name)} {sql_type}")

    def _resume(self, tx: Tx, name: TableName, sname: TableName, row: Any, schema: pa.Schema) -> SqlStaging:
        if row.state != "staged":
            what = "promoted" if row.state in ("promoted", "final") else "dropped by `rewind cleanup`"
            raise SqlSinkError(f"staging {sname} of run {row.run_id} was {what}; start a new run")
        if not self._backend.exists(tx, sname):
            raise SqlSinkError(f"staging {sname} of run {row.run_id} disappeared; start a new run")
        if row.target_existed:
            if not self._backend.exists(tx, name):
                raise SqlSinkError(f"target {name} was dropped since run {row.run_id} started")
            check_same_shape(self, tx, name, sname)
        self._direct[sname.name] = False
        check_staging(self, tx, sname, schema)
        return self._staging(name, row.run_id, bool(row.target_existed), row.base_rows)

    def staging_from_dict(self, data: dict[str, Any]) -> SqlStaging:
        return SqlStaging.from_dict(data)

    def data_folder(self, staging: SqlStaging) -> str:
        """The run's spool folder: tasks write Parquet there, :meth:`commit` (or the task
        itself, :mod:`rewind.sinks.sql.task_load`) loads and deletes it. The driver and every
        executor reach it: ``<state_dir>/spool`` locally, a folder of the object-store
        warehouse on a cluster (:meth:`rewind.config.Settings.spool_root`)."""
        make_dirs(staging.spool)
        return staging.spool

    # -- unit commits ---------------------------------------------------------------------

    def committed_units(self, staging: SqlStaging, run_id: str) -> set[str]:
        return set(self.committed_counts(staging, run_id))

    def committed_counts(self, staging: SqlStaging, run_id: str) -> dict[str, dict[str, Any]]:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import select

        with self._tx() as tx:
            book = self._tables(tx)
            if not self._backend.exists(tx, TableName(self._name(tx).schema, UNITS_TABLE)):
                return {}
            rows = tx.conn.execute(
                select(book.units.c.unit_id, book.units.c.counts).where(book.units.c.run_id == run_id)
            ).all()
        return {r.unit_id: json.loads(r.counts) if r.counts else {} for r in rows}

    def commit(
        self,
        staging: SqlStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
        fold: RowFold | None = None,
    ) -> dict[str, Any]:
        """Load ``files`` into staging and record ``unit_ids`` with their counts, in ONE transaction.

        Steps: (1) lock the staging's bookkeeping row (one committer at a time) and check the
        staging is still ``staged``; (2) units all recorded already: nothing to do (a
        re-commit after a crash is a no-op); (3) check staging's columns against the files'
        schema before writing anything; (4) load the rows: ``COPY`` straight into staging
        under a savepoint while staging has shown no conflict, else ``COPY`` into a temporary
        table and ``INSERT ... ON CONFLICT`` (SQLite: ``executemany`` upserts); (5) insert the
        unit rows; (6) commit; then (7) delete the spooled files. ``fold``: step 4 folds the
        rows with staging's rows of their keys instead (:mod:`rewind.sinks.sql.fold`).
        """
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import select

        counts = json.loads((extra or {}).get(UNIT_COUNTS_KEY, "{}"))
        sname = TableName.parse(staging.table)
        started = time.monotonic()
        with self._tx() as tx:
            book = self._tables(tx)
            # 1. one committer at a time, and only into a live staging
            state = tx.conn.execute(
                select(book.stagings.c.state).where(book.stagings.c.staging == sname.name).with_for_update()
            ).scalar()
            if state is None:
                raise SqlSinkError(f"staging {sname} is not recorded; run prepare first")
            if state != "staged":
                raise SqlSinkError(
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
                rows, path, new = write_files(self, tx, sname, run_id, unit_ids, done, files, counts, fold)
        # 6. committed; 7. the spool is not needed any more
        unspool(self, staging, files)
        if repeat:
            return {"rows": 0, "path": "already-committed", "units": 0, "seconds": 0.0}
        seconds = time.monotonic() - started
        log.info("committed %d rows of %d units into %s (%s) in %.2fs", rows, len(new), sname, path, seconds)
        return {"rows": rows, "path": path, "units": len(new), "seconds": round(seconds, 3)}

    commit_folded = commit_folded  # :meth:`commit` with a fold (:mod:`rewind.sinks.sql.fold`)

    # -- publishing -----------------------------------------------------------------------

    def promote(self, staging: SqlStaging, rebase: bool = False) -> Swap:
        """Swap staging in for the target in one transaction of renames; idempotent.

        Steps: (1) lock the staging's bookkeeping row; a promoted staging is reported as done;
        (2) hash staging's rows (recorded, so a rollback can tell whether the promoted table
        moved); (3) target existed: lock it ``SHARE`` (writers wait, readers do not), check it
        still has the copied rows and staging's shape, then rename it to the previous-table
        name; (4) rename staging to the target and swap the index names; (5) record
        ``promoted``; commit. Lock waits are bounded (``lock_timeout``) and retried.
        """
        if rebase:  # SUPPORTS_REBASE is False: the job refuses --rebase before calling
            raise ValueError(f"the {self.kind} sink cannot rebase a promotion")
        return with_lock_retry(self, lambda: promote_once(self, staging))

    def rebase_target(self, staging: SqlStaging) -> dict[str, Any]:
        """Record the target as it is now as staging's base (a shadow's cut line, its writers
        stopped): the promotion then refuses a target that moved after this, not before."""
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import select, update

        sname = TableName.parse(staging.table)
        with self._tx() as tx:
            book = self._tables(tx)
            state = tx.conn.execute(
                select(book.stagings.c.state).where(book.stagings.c.staging == sname.name).with_for_update()
            ).scalar()
            if state != "staged":
                raise SqlSinkError(f"staging {sname} is {state}, not staged; its base cannot move")
            target = self._name(tx)
            self._backend.lock_share(tx, target)
            rows, fingerprint = self._backend.fingerprint(tx, target)
            tx.conn.execute(
                update(book.stagings)
                .where(book.stagings.c.staging == sname.name)
                .values(base_rows=rows, base_fingerprint=fingerprint, updated_at=datetime.now(UTC))
            )
        return {"table": str(target), "rows": rows, "fingerprint": fingerprint}

    def rollback(self, staging: SqlStaging, promoted: dict[str, Any]) -> Swap:
        """Undo a promotion: the promoted table becomes the staging again, the previous one the target.

        Refused when the promoted table changed since the promotion (those writes would be
        lost) and after ``rewind cleanup`` dropped the previous table. Idempotent.
        """
        return with_lock_retry(self, lambda: rollback_once(self, staging))

    def cleanup(self, staging: SqlStaging) -> dict[str, Any]:
        """``rewind cleanup RUN``: drop what of the run is not the live target.

        Promoted: the previous table is dropped (rollback is impossible afterwards); not
        promoted: staging is dropped and the run's unit commits deleted (the run can be
        neither resumed nor promoted afterwards). The spool folder goes in both cases.
        The caller must make sure no process is still running the run (its lease).
        """
        return cleanup_run(self, staging)

    # -- cleanup --------------------------------------------------------------------------

    # -- reading --------------------------------------------------------------------------

    def read_arrow(self, staging: SqlStaging) -> pa.Table:
        """Staging's rows (all its columns) as one Arrow table, read through the driver."""
        sname = TableName.parse(staging.table)
        with self._tx() as tx:
            state = self._state(tx, sname)
            # after promotion the staged rows live under the target's name
            name = TableName.parse(staging.target_table) if state in ("promoted", "final") else sname
            if not self._backend.exists(tx, name):
                raise SqlSinkError(f"staging table {name} does not exist")
            return self._backend.read_arrow(tx, name)

    def read(self, spark: SparkSession, staging: SqlStaging) -> DataFrame:
        """Staging as a Spark DataFrame (through the driver's memory; see the module docstring)."""
        # lazy: avoids pyspark at import
        from pyspark.sql.pandas.types import from_arrow_schema

        table = self.read_arrow(staging)
        if table.num_rows == 0:
            return spark.createDataFrame([], from_arrow_schema(table.schema))
        return spark.createDataFrame(table)

    def _state(self, tx: Tx, sname: TableName) -> str | None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import select

        book = self._tables(tx)
        if not self._backend.exists(tx, TableName(sname.schema, STAGINGS_TABLE)):
            return None
        return tx.conn.execute(
            select(book.stagings.c.state).where(book.stagings.c.staging == sname.name)
        ).scalar()
