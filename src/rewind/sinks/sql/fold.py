"""The write path of a folded commit: partial rows folded with staging's rows of their keys.

A shadow's tail into a folded read model (``translate.fold``) commits each micro-batch's
partial rows with :meth:`~rewind.sinks.sql.sink.SqlSink.commit_folded`. Inside the commit's
transaction (its bookkeeping row locked, so no other committer runs), :func:`load_folded`:

1. reads the partial rows of the files and checks staging's columns against them;
2. reads staging's current rows of exactly those keys: the keys go to a temporary table, and
   staging's rows whose key is ``IN`` it are read through staging's unique key index, so the
   read costs the batch's keys, not the size of staging;
3. folds the current rows and the partial rows together (the fold accepts its own rows: a
   current row is the fold of every earlier event of its key);
4. writes the folded rows over their keys (``replace``: the fold decided), in the same
   transaction that then records the units.

A kill before the commit leaves staging and its bookkeeping as they were, and the batch is
folded again from the same current rows; after it, the units are recorded and the batch is
skipped: no key is folded twice and none is missed.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from rewind.core.parquet import write_parquet
from rewind.core.store import filesystem
from rewind.sinks.sql.checks import check_staging
from rewind.sinks.sql.encoding import prepare_columns, read_batches
from rewind.sinks.sql.names import TableName, quote_ident
from rewind.sinks.sql.postgres import PostgresBackend

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.sinks.base import RowFold
    from rewind.sinks.sql.backend import Tx
    from rewind.sinks.sql.sink_internals import SqlSinkInternals
    from rewind.sinks.sql.staging import SqlStaging

KEYS_TABLE = "rewind_fold_keys"


def commit_folded(
    sink: SqlSinkInternals,
    staging: SqlStaging,
    run_id: str,
    unit_ids: list[str],
    files: list[str],
    fold: RowFold,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``SqlSink.commit_folded``: its :meth:`~rewind.sinks.sql.sink.SqlSink.commit` with ``fold``."""
    return sink.commit(staging, run_id, unit_ids, files, extra, fold=fold)


def load_folded(
    sink: SqlSinkInternals, tx: Tx, sname: TableName, columns: list[str], files: list[str], fold: RowFold
) -> tuple[int, str]:
    """Steps 1-4 (module docstring) inside the commit's transaction; the rows written."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if not files:
        return 0, "none"
    # 1. the partial rows
    partial = pa.concat_tables(list(read_batches(files, columns)))
    check_staging(sink, tx, sname, partial.schema)
    # 2. staging's rows of those keys
    current = read_current(sink, tx, sname, partial.select(sink.key))
    # 3. folded together
    rows = pa.concat_tables([current.select(columns).cast(partial.schema), partial])
    folded = fold(rows)
    if not folded.num_rows:
        return 0, "fold"
    # 4. written over their keys
    path = write_parquet(files[0].rsplit("/", 1)[0], folded, "fold")  # beside the batch's files
    try:
        if sink.is_sqlite:
            written = sink._backend.upsert_rows(tx, sname, folded.schema.names, [path], sink.key, "replace")
        else:
            pg = sink._backend
            assert isinstance(pg, PostgresBackend)
            written = pg.copy_upsert(tx, sname, folded.schema.names, [path], sink.key, "replace", False)
    finally:
        fs, where = filesystem(path)
        with contextlib.suppress(OSError):
            fs.delete_file(where)
    return written, "fold"


def read_current(sink: SqlSinkInternals, tx: Tx, sname: TableName, keys: pa.Table) -> pa.Table:
    """Staging's rows whose key is one of ``keys``, through a temporary table of the keys."""
    names = ", ".join(quote_ident(k) for k in sink.key)
    temp = quote_ident(KEYS_TABLE)
    distinct = prepare_columns(keys.group_by(sink.key).aggregate([]).select(sink.key), sqlite=sink.is_sqlite)
    values = list(zip(*(c.to_pylist() for c in distinct.columns), strict=True))
    tx.cur.execute(f"DROP TABLE IF EXISTS {temp}")
    tx.cur.execute(f"CREATE TEMP TABLE {temp} AS SELECT {names} FROM {sname.sql} WHERE 1 = 0")
    if sink.is_sqlite:
        marks = ", ".join("?" for _ in sink.key)
        tx.cur.executemany(f"INSERT INTO {temp} ({names}) VALUES ({marks})", values)
    else:
        with tx.cur.copy(f"COPY {temp} ({names}) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)
        tx.cur.execute(f"ANALYZE {temp}")  # so the planner probes staging's key index per key
    # IN (subquery): each key looked up in staging's unique index, never a scan of staging
    current = sink._backend.read_arrow(tx, sname, f" WHERE ({names}) IN (SELECT {names} FROM {temp})")
    tx.cur.execute(f"DROP TABLE {temp}")
    return current
