"""The write path of a commit: Parquet files loaded into staging (COPY or upsert).

All of it runs inside the commit's transaction (see :meth:`~rewind.sinks.sql.sink.SqlSink.commit`).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.core.store import filesystem, remove_files_under
from rewind.sinks.sql.backend import (
    Tx,
)
from rewind.sinks.sql.checks import check_staging
from rewind.sinks.sql.encoding import files_have_duplicates, files_schema
from rewind.sinks.sql.fold import load_folded
from rewind.sinks.sql.names import TableName
from rewind.sinks.sql.postgres import PostgresBackend

if TYPE_CHECKING:
    from rewind.sinks.base import RowFold
    from rewind.sinks.sql.sink_internals import SqlSinkInternals
    from rewind.sinks.sql.staging import SqlStaging

log = logging.getLogger(__name__)


def write_files(sink: SqlSinkInternals,
    tx: Tx,
    sname: TableName,
    run_id: str,
    unit_ids: list[str],
    done: set[str],
    files: list[str],
    counts: dict[str, Any],
    fold: RowFold | None = None,
) -> tuple[int, str, list[str]]:
    """Steps 3 to 5 of :meth:`commit`, inside its transaction."""
    # lazy: avoids sqlalchemy at import
    from sqlalchemy import insert

    if done:
        log.warning(
            "units %s were committed already; their rows are re-applied idempotently", sorted(done)
        )
    # 3. staging's columns before anything is written
    columns = file_columns(sink, files)
    if fold is not None:  # 3. and 4. folded with staging's rows of the files' keys
        rows, path = load_folded(sink, tx, sname, columns, files, fold)
    else:
        check_staging(sink, tx, sname, files_schema(files, columns))
        # 4. the rows
        rows, path = load_files(sink, tx, sname, columns, files)
    # 5. the units, with their counts
    now = datetime.now(UTC)
    new = [u for u in unit_ids if u not in done]
    if new:
        tx.conn.execute(
            insert(sink._tables(tx).units),
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


def file_columns(sink: SqlSinkInternals, files: list[str]) -> list[str]:
    if not files:
        return []
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq

    fs, path = filesystem(files[0])
    with fs.open_input_file(path) as handle:
        return list(pq.ParquetFile(handle).schema_arrow.names)


def load_files(
    sink: SqlSinkInternals, tx: Tx, sname: TableName, columns: list[str], files: list[str]
) -> tuple[int, str]:
    if not files:
        return 0, "none"
    conflict = sink.conflict_columns
    if sink.is_sqlite:
        return sink._backend.upsert_rows(tx, sname, columns, files, conflict, sink.mode), "upsert"
    pg = sink._backend
    assert isinstance(pg, PostgresBackend)
    direct = sink._direct[sname.name] if sname.name in sink._direct else starts_empty(sink, tx, sname)
    if direct:
        rows = pg.copy_direct(tx, sname, columns, files)
        if rows is not None:
            return rows, "copy"
        sink._direct[sname.name] = False
        log.info("staging %s has conflicts: loading through a temporary table from now on", sname)
    dedupe = sink.mode == "upsert" and files_have_duplicates(files, conflict)
    return pg.copy_upsert(tx, sname, columns, files, conflict, sink.mode, dedupe), "upsert"


def starts_empty(sink: SqlSinkInternals, tx: Tx, sname: TableName) -> bool:
    # lazy: avoids sqlalchemy at import
    from sqlalchemy import select

    book = sink._tables(tx)
    existed = tx.conn.execute(
        select(book.stagings.c.target_existed).where(book.stagings.c.staging == sname.name)
    ).scalar()
    direct = not existed
    sink._direct[sname.name] = direct
    return direct


def unspool(sink: SqlSinkInternals, staging: SqlStaging, files: list[str]) -> None:
    remove_files_under(staging.spool, files)
