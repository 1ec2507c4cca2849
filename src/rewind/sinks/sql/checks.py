"""Checks of the SQL sink before it writes: the output, an existing target and a resumed staging.

Each refusal names what is wrong and the DDL or step that fixes it; nothing is changed on a
service's table to make it fit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from rewind.core.columns import (
    LINEAGE_PREFIX,
)
from rewind.sinks.sql.backend import (
    ORDER_COLS,
    RUN_COL,
    Tx,
)
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.names import TableName, quote_ident
from rewind.sinks.sql.types import SqlColumn, is_nested, pg_compatible, sqlite_arrow_of, sqlite_compatible

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.sinks.sql.sink_internals import SqlSinkInternals

log = logging.getLogger(__name__)


def check_output(sink: SqlSinkInternals, schema: pa.Schema) -> None:
    names = set(schema.names)
    for f in schema:
        if is_nested(f.type):
            raise SqlSinkError(
                f"output column {f.name} is {f.type}: the SQL sink takes scalar columns; "
                "serialize it to JSON text in the translate"
            )
    missing = [c for c in (*sink.conflict_columns, *ORDER_COLS, RUN_COL) if c not in names]
    if missing:
        raise SqlSinkError(
            f"output has no column {missing[0]}; the SQL sink needs the key and lineage columns"
        )


def check_target(sink: SqlSinkInternals, tx: Tx, name: TableName, schema: pa.Schema) -> None:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    cols = {c.name: c for c in sink._backend.columns(tx, name)}
    lineage = [f.name for f in schema if f.name.startswith(LINEAGE_PREFIX) and f.name not in cols]
    if lineage:
        raise SqlSinkError(
            f"{name} has no lineage columns {lineage[:3]}{'...' if len(lineage) > 3 else ''}: a backfill "
            f"writes them on every row; add them to {name} (ALTER TABLE ... ADD COLUMN) first"
        )
    compatible = sqlite_compatible if sink.is_sqlite else pg_compatible
    for f in schema:
        col = cols.get(f.name)
        if col is None and not sink.copy_target and not f.name.startswith(LINEAGE_PREFIX):
            continue  # a shadow's v2 adds it (see SqlSink.prepare): a new field of the read model
        if col is None:
            raise SqlSinkError(
                f"output column {f.name} is not in {name}; add it to the table or drop it from the output"
            )
        if col.generated:
            raise SqlSinkError(f"output column {f.name} is a generated column of {name}; drop it")
        if not compatible(f.type, col.type):
            if sink.is_sqlite and pa.types.is_temporal(f.type):
                raise SqlSinkError(sqlite_temporal_refusal(name, f, col.type))
            raise SqlSinkError(
                f"output column {f.name} is {f.type}, {name}.{f.name} is {col.type}; "
                "cast it in the translate or alter the column"
            )
    for col in cols.values():
        if col.name not in schema.names and col.notnull and not col.has_default:
            raise SqlSinkError(
                f"{name}.{col.name} is NOT NULL without a default and the output has no such column; "
                "add it to the translate's output"
            )
    conflict = frozenset(sink.conflict_columns)
    if conflict not in sink._backend.unique_keys(tx, name):
        cols_sql = ", ".join(quote_ident(c) for c in sink.conflict_columns)
        raise SqlSinkError(
            f"{name} has no unique index on ({', '.join(sink.conflict_columns)}) for {sink.mode}; "
            f"create it: CREATE UNIQUE INDEX ON {name.sql} ({cols_sql})"
        )
    blockers = sink._backend.blockers(tx, name)
    if blockers:
        raise SqlSinkError(
            f"{name} cannot be swapped by renames: {blockers[0]}; a swap would leave it on the old table"
        )


def sqlite_temporal_refusal(name: TableName, f: pa.Field, declared: str) -> str:
    """Why a timestamp, date or time cannot go to a SQLite column of type ``declared``: the sink
    writes ISO-8601 text whatever the declaration, and only a column declared as a time type
    reads back as one (``rewind verify`` windows and buckets by it, ``compensate`` compares it)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    kind = "timestamp" if pa.types.is_timestamp(f.type) else "date" if pa.types.is_date(f.type) else "time"
    want = {"timestamp": "TIMESTAMP", "date": "DATE or TIMESTAMP", "time": "TIME"}[kind]
    back = sqlite_arrow_of(declared)
    shown = (
        "each value as it is stored" if back is None else "text" if pa.types.is_string(back) else str(back)
    )
    return (
        f"output column {f.name} is a {kind} and {name}.{f.name} is declared {declared or 'without a type'}, "
        f"which SQLite reads back as {shown}; declare it {want} (SQLite cannot alter a column's type: "
        "recreate the table with it and copy the rows)"
    )


def check_same_shape(sink: SqlSinkInternals, tx: Tx, name: TableName, sname: TableName) -> None:
    """Staging must have the target's columns (names, types, nullability) in its order (a
    shadow's v2 may have new ones after them)."""
    target = [(c.name, c.type, c.notnull) for c in sink._backend.columns(tx, name)]
    staged = [(c.name, c.type, c.notnull) for c in sink._backend.columns(tx, sname)]
    if not sink.copy_target:
        staged = staged[: len(target)]
    if target != staged:
        diff = next(
            (f"{t} vs {s}" for t, s in zip(target, staged, strict=False) if t != s),
            f"{len(target)} vs {len(staged)} columns",
        )
        raise SqlSinkError(
            f"staging {sname} no longer has the columns of {name} ({diff}); the target was altered "
            "since the run started: start a new run"
        )


def check_staging(sink: SqlSinkInternals, tx: Tx, sname: TableName, schema: pa.Schema) -> list[SqlColumn]:
    cols = sink._backend.columns(tx, sname)
    by_name = {c.name: c for c in cols}
    compatible = sqlite_compatible if sink.is_sqlite else pg_compatible
    for f in schema:
        col = by_name.get(f.name)
        if col is None or not compatible(f.type, col.type):
            got = "missing" if col is None else col.type
            raise SqlSinkError(
                f"staging {sname} column {f.name} is {got}, the output's is {f.type}; nothing was written"
            )
    return cols
