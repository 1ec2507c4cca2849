"""Promotion and rollback of an Iceberg staging, each one atomic catalog operation.

Branch staging (the target existed): promotion points the target's ``main`` at the
branch head in one commit that asserts ``main`` is still at the snapshot the branch was cut
from (the catalog refuses it otherwise, so a concurrent writer is never overwritten);
rollback points ``main`` back at the snapshot it had before, asserting ``main`` is still
the promoted one. Staging-table staging (a new read model): promotion renames the staging
table to the target name; rollback renames it back, so the data stays for a re-promote.

Both are idempotent: run again after a crash (kill -9 anywhere), they see that the catalog
already holds the wanted state and only record it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.sinks.base import Swap
from rewind.sinks.iceberg import IcebergSink, IcebergSinkError, IcebergStaging

if TYPE_CHECKING:
    from pyiceberg.table import Table


def _main_id(table: Table) -> int | None:
    ref = table.metadata.refs.get("main")
    return ref.snapshot_id if ref is not None else None


def promote(sink: IcebergSink, staging: IcebergStaging) -> Swap:
    """Make the staged output what the target's readers see, atomically."""
    if staging.created_table:
        return _rename(sink, staging.table, sink.table_name, "promote")
    table = sink._load(staging.table)
    if table is None:
        raise IcebergSinkError(f"target {staging.table} does not exist any more; nothing to promote")
    head = table.snapshot_by_name(staging.ref)
    if head is None:
        raise IcebergSinkError(
            f"staging branch {staging.branch} of {staging.table} is gone; re-run the backfill"
        )
    main = _main_id(table)
    if main == head.snapshot_id:
        return Swap(sink.target, "promote", staging.base_snapshot_id, main, True)
    if main != staging.base_snapshot_id:
        raise IcebergSinkError(
            f"{staging.table} main moved since the staging branch was cut (was {staging.base_snapshot_id}, "
            f"now {main}): promoting would drop those writes; re-run the backfill on the new main"
        )
    table.manage_snapshots().set_current_snapshot(snapshot_id=head.snapshot_id).commit()
    return Swap(sink.target, "promote", main, head.snapshot_id, False)


def rollback(sink: IcebergSink, staging: IcebergStaging, promoted: dict[str, Any]) -> Swap:
    """Undo a promotion recorded as ``promoted`` (a :meth:`Swap.to_dict`)."""
    if staging.created_table:
        return _rename(sink, sink.table_name, staging.table, "rollback")
    table = sink._load(staging.table)
    if table is None:
        raise IcebergSinkError(f"target {staging.table} does not exist; nothing to roll back")
    before, after = promoted.get("before"), promoted.get("after")
    main = _main_id(table)
    if main == before:
        return Swap(sink.target, "rollback", after, before, True)
    if main != after:
        raise IcebergSinkError(
            f"{staging.table} main moved since the promotion (promoted {after}, now {main}); rolling back "
            "would drop those writes; roll back by hand with the snapshot ids in `rewind show`"
        )
    if before is None:
        raise IcebergSinkError(f"{staging.table} had no snapshot before the promotion; nothing to go back to")
    table.manage_snapshots().set_current_snapshot(snapshot_id=int(before)).commit()
    return Swap(sink.target, "rollback", after, before, False)


def _rename(sink: IcebergSink, source: str, dest: str, action: str) -> Swap:
    have_source, have_dest = sink._load(source) is not None, sink._load(dest) is not None
    if have_dest and not have_source:
        return Swap(sink.target, action, source, dest, True)
    if have_dest:
        raise IcebergSinkError(f"{dest} already exists (created by someone else?); {action} would replace it")
    if not have_source:
        raise IcebergSinkError(f"neither {source} nor {dest} exists; nothing to {action}")
    sink.catalog.rename_table(source, dest)
    return Swap(sink.target, action, source, dest, False)
