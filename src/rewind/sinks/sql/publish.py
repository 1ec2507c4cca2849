"""Promotion, rollback and cleanup of the SQL sink: renames in one transaction, checked, retried.

The steps are in :meth:`SqlSink.promote <rewind.sinks.sql.sink.SqlSink.promote>` and
:meth:`~rewind.sinks.sql.sink.SqlSink.rollback`; a lock wait that hits ``lock_timeout`` is retried
until ``lock_wait_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from rewind import faults
from rewind.core.store import remove_tree
from rewind.sinks.base import Swap
from rewind.sinks.sql.backend import (
    STAGINGS_TABLE,
    Tx,
    lock_times,
)
from rewind.sinks.sql.checks import check_same_shape
from rewind.sinks.sql.exceptions import SqlSinkError, TargetMoved
from rewind.sinks.sql.names import TableName, run_tag

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.sinks.sql.sink_internals import SqlSinkInternals
    from rewind.sinks.sql.staging import SqlStaging

log = logging.getLogger(__name__)


@dataclass
class _Renames:
    """What a promotion or rollback will do, once its checks passed."""

    before: dict[str, Any]
    after: dict[str, Any]
    ddl: list[str]
    locks: list[TableName]
    record: dict[str, Any]
    """The new values of the staging's row in ``rewind_stagings``."""


def promote_once(sink: SqlSinkInternals, staging: SqlStaging) -> Swap:
    return _swap(sink, staging, "promote", _promotion)


def rollback_once(sink: SqlSinkInternals, staging: SqlStaging) -> Swap:
    return _swap(sink, staging, "rollback", _rollback)


def _swap(
    sink: SqlSinkInternals,
    staging: SqlStaging,
    action: Literal["promote", "rollback"],
    plan: Callable[[SqlSinkInternals, Tx, Any, TableName, TableName, TableName], _Renames | Swap],
) -> Swap:
    """The one skeleton of a promotion and a rollback, in one transaction:

    1. lock the staging's row in ``rewind_stagings`` (``FOR UPDATE``: one swap at a time);
    2. ``plan`` checks the tables and returns the renames, or the Swap of one already done;
    3. record the new state first (the same transaction; the locks are then held for the DDL
       alone), take the ``ACCESS EXCLUSIVE`` locks (readers wait from here to the commit),
       run the renames; fault point ``postgres-<action>-before-commit``; commit;
       ``-after-commit``.
    """
    # lazy: avoids sqlalchemy at import
    from sqlalchemy import select, update

    target, sname, prev = (
        TableName.parse(n) for n in (staging.target_table, staging.table, staging.prev_table)
    )
    with sink._tx() as tx:
        sink._backend.lock_timeout(tx, sink.lock_timeout_s)
        book = sink._tables(tx)
        row = tx.conn.execute(
            select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
        ).first()
        if row is None:
            what = "promote" if action == "promote" else "roll back"
            raise SqlSinkError(f"staging {sname} is not recorded in {STAGINGS_TABLE}; nothing to {what}")
        planned = plan(sink, tx, row, target, sname, prev)
        if isinstance(planned, Swap):
            return planned
        tx.conn.execute(
            update(book.stagings)
            .where(book.stagings.c.staging == sname.name)
            .values(**planned.record, updated_at=datetime.now(UTC))
        )
        asked, granted = sink._backend.lock_exclusive(tx, *planned.locks)
        sink._backend.run_all(tx, planned.ddl)
        swap = Swap(sink.target, action, planned.before, planned.after, False)
        faults.point(f"postgres-{action}-before-commit")
    faults.point(f"postgres-{action}-after-commit")
    planned.after.update(lock_times(asked, granted))
    return swap


def _promotion(
    sink: SqlSinkInternals, tx: Tx, row: Any, target: TableName, sname: TableName, prev: TableName
) -> _Renames | Swap:
    """Steps 2-4 of :meth:`SqlSink.promote <rewind.sinks.sql.sink.SqlSink.promote>`."""
    before = {"table": str(target), "rows": row.base_rows, "fingerprint": row.base_fingerprint}
    after: dict[str, Any] = {
        "table": str(target),
        "from": str(sname),
        "previous": str(prev) if row.target_existed else None,
    }
    if row.state in ("promoted", "final"):
        return Swap(sink.target, "promote", before, {**after, "fingerprint": row.promoted_fingerprint}, True)
    if row.state != "staged" or not sink._backend.exists(tx, sname):
        raise SqlSinkError(f"staging {sname} is {row.state}, not there to promote; start a new run")
    # 2. staging's rows hashed: a rollback can tell whether the promoted table moved
    rows, fingerprint = sink._backend.fingerprint(tx, sname)
    after.update(rows=rows, fingerprint=fingerprint)
    record = {"state": "promoted", "promoted_fingerprint": fingerprint}
    # 3. an existing target must still hold the rows staging copied, in staging's shape
    if row.target_existed:
        if not sink._backend.exists(tx, target):
            raise SqlSinkError(f"target {target} was dropped since the run started; nothing to swap")
        sink._backend.lock_share(tx, target)
        check_unmoved(sink, tx, target, row.base_rows, row.base_fingerprint, "staging was copied from it")
        check_same_shape(sink, tx, target, sname)
        if sink._backend.exists(tx, prev):
            raise SqlSinkError(f"{prev} exists already; drop it or run `rewind cleanup`")
        # 4. target → previous, staging → target, index names swapped
        ddl = [sink._backend.rename_sql(target, prev.name), sink._backend.rename_sql(sname, target.name)]
        ddl += sink._backend.index_swap_sql(tx, target, sname, run_tag(row.run_id))
        return _Renames(before, after, ddl, [target, sname], record)
    if sink._backend.exists(tx, target):
        raise SqlSinkError(
            f"{target} was created by someone else after run {row.run_id} started; "
            "promotion would replace it: drop it, or start a new run (staging will copy it)"
        )
    ddl = [sink._backend.rename_sql(sname, target.name)]
    ddl += sink._backend.key_index_sql(tx, target, sname.name, target.name)
    return _Renames(before, after, ddl, [sname], record)


def _rollback(
    sink: SqlSinkInternals, tx: Tx, row: Any, target: TableName, sname: TableName, prev: TableName
) -> _Renames | Swap:
    """The reverse renames, refused when the promoted table changed since the promotion."""
    before = {"table": str(target), "fingerprint": row.promoted_fingerprint}
    after: dict[str, Any] = {
        "table": str(target),
        "from": str(prev) if row.target_existed else None,
        "staging": str(sname),
    }
    if row.state == "staged":
        return Swap(sink.target, "rollback", before, after, True)
    if row.state == "final":
        raise SqlSinkError(
            f"the previous {target} ({prev}) was dropped by `rewind cleanup`; nothing to go back to"
        )
    if row.state != "promoted":
        raise SqlSinkError(f"staging {sname} is {row.state}; nothing to roll back")
    if not sink._backend.exists(tx, target):
        raise SqlSinkError(f"target {target} does not exist; nothing to roll back")
    sink._backend.lock_share(tx, target)
    rows, fingerprint = sink._backend.fingerprint(tx, target)
    if fingerprint != row.promoted_fingerprint:
        raise TargetMoved(
            f"{target} changed after run {row.run_id} was promoted ({rows} rows now); "
            "a rollback would drop those writes: stop the writers; repair by hand or promote anew"
        )
    record = {"state": "staged"}
    if row.target_existed:
        if not sink._backend.exists(tx, prev):
            raise SqlSinkError(f"previous table {prev} is gone; nothing to roll back to")
        ddl = [sink._backend.rename_sql(target, sname.name), sink._backend.rename_sql(prev, target.name)]
        ddl += sink._backend.index_swap_sql(tx, target, prev, run_tag(row.run_id))
        return _Renames(before, after, ddl, [target, prev], record)
    ddl = [sink._backend.rename_sql(target, sname.name)]
    ddl += sink._backend.key_index_sql(tx, target, target.name, sname.name)
    return _Renames(before, after, ddl, [target], record)


def check_unmoved(
    sink: SqlSinkInternals, tx: Tx, name: TableName, rows: int | None, fingerprint: str | None, since: str
) -> None:
    now_rows, now_fp = sink._backend.fingerprint(tx, name)
    if now_fp != fingerprint:
        raise TargetMoved(
            f"{name} changed since {since} ({rows} rows then, {now_rows} now); a swap would drop those "
            "writes: pause the writers for the whole backfill and start a new run"
        )


def with_lock_retry(sink: SqlSinkInternals, action: Callable[[], Swap]) -> Swap:
    """Retry an action whose lock wait hit ``lock_timeout`` (readers queue behind a waiting swap)."""
    deadline = time.monotonic() + sink.lock_wait_s
    delay = 0.05
    while True:
        try:
            return action()
        except Exception as exc:
            if not sink._backend.is_lock_timeout(exc) or time.monotonic() > deadline:
                if sink._backend.is_lock_timeout(exc):
                    raise SqlSinkError(
                        f"could not lock {sink.table_name} in {sink.lock_wait_s:.0f}s: long transactions "
                        "hold it; retry when they end"
                    ) from exc
                raise
            log.info("lock on %s not granted within %.1fs; retrying", sink.table_name, sink.lock_timeout_s)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def cleanup_run(sink: SqlSinkInternals, staging: SqlStaging) -> dict[str, Any]:
    """``rewind cleanup RUN``: drop what of the run is not the live target.

    Promoted: the previous table is dropped (rollback is impossible afterwards); not
    promoted: staging is dropped and the run's unit commits deleted (the run can be
    neither resumed nor promoted afterwards). The spool folder goes in both cases.
    The caller must make sure no process is still running the run (its lease).
    """

    # lazy: avoids sqlalchemy at import
    from sqlalchemy import delete, select, update

    target, sname, prev = (
        TableName.parse(n) for n in (staging.target_table, staging.table, staging.prev_table)
    )
    dropped: list[str] = []
    with sink._tx() as tx:
        book = sink._tables(tx)
        row = tx.conn.execute(
            select(book.stagings).where(book.stagings.c.staging == sname.name).with_for_update()
        ).first()
        if row is None:
            raise SqlSinkError(f"staging {sname} is not recorded in {STAGINGS_TABLE}; nothing to clean up")
        state = row.state
        if state == "promoted":
            if row.target_existed and sink._backend.exists(tx, prev):
                sink._backend.drop(tx, prev)
                dropped.append(str(prev))
            new_state = "final"
        elif state == "staged":
            if sink._backend.exists(tx, sname):
                sink._backend.drop(tx, sname)
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
    spool_removed = remove_tree(staging.spool)
    return {
        "target": str(target),
        "state_before": state,
        "state": new_state,
        "dropped": dropped,
        "spool_removed": spool_removed,
        "already_done": not dropped and state == new_state,
        "can_roll_back": False if new_state in ("final", "dropped") else state == "promoted",
    }


def read_sides(sink: SqlSinkInternals, staging: SqlStaging) -> tuple[pa.Table | None, pa.Table]:
    """Production's rows (the target table as consumers read it, None when there is none) and
    the staged rows, in one transaction so both are of the same moment (``rewind compensate``).
    After promotion the staged rows are the target's, so both sides are the same."""
    target, sname = TableName.parse(staging.target_table), TableName.parse(staging.table)
    with sink._tx() as tx:
        old = sink._backend.read_arrow(tx, target) if sink._backend.exists(tx, target) else None
        state = sink._state(tx, sname)
        name = target if state in ("promoted", "final") else sname
        if not sink._backend.exists(tx, name):
            raise SqlSinkError(f"staging table {name} does not exist")
        return old, sink._backend.read_arrow(tx, name)


def table_fingerprint(sink: SqlSinkInternals, table: str) -> tuple[int, str] | None:
    """Row count and content digest of ``table`` (None when it does not exist)."""
    with sink._tx() as tx:
        name = sink._backend.resolve(tx, table)
        return sink._backend.fingerprint(tx, name) if sink._backend.exists(tx, name) else None


def read_table(sink: SqlSinkInternals, table: str) -> pa.Table | None:
    """All rows of ``table`` through the driver (None when it does not exist)."""
    with sink._tx() as tx:
        name = sink._backend.resolve(tx, table)
        return sink._backend.read_arrow(tx, name) if sink._backend.exists(tx, name) else None
