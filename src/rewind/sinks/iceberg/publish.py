"""Promotion and rollback of an Iceberg staging, each one atomic catalog operation.

Branch staging (the target existed): promotion points the target's ``main`` at the
branch head in one commit that asserts ``main`` is still at the snapshot the branch was cut
from (the catalog refuses it otherwise, so a concurrent writer is never overwritten);
rollback points ``main`` back at the snapshot it had before, asserting ``main`` is still
the promoted one. Staging-table staging (a new read model): promotion renames the staging
table to the target name; rollback renames it back, so the data stays for a re-promote.

Rebase (``rewind promote RUN --rebase``, branch staging only): when ``main`` moved since the
branch was cut, the run's output is re-applied on the new ``main`` in ONE catalog commit
instead: replace-window deletes the window's rows of the new ``main`` and adds the data files
the run wrote; append only adds them. Whatever the new ``main`` holds outside the window
stays. The commit's snapshots are marked with the staging branch (``rewind.rebase-of``) and
the swap records the snapshot it was rebased onto, which rollback restores.

All are idempotent: run again after a crash (kill -9 anywhere), they see that the catalog
already holds the wanted state (``main`` at the branch head, at a rebase of the branch, or the
table renamed) and only record it. Every catalog operation sits between the fault points
``iceberg-<promote|rollback>-before-commit`` and ``-after-commit`` (:mod:`rewind.faults`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from rewind import faults
from rewind.sinks.base import Swap
from rewind.sinks.iceberg.staging import (
    FINALIZED_PROPERTY,
    UNITS_PROPERTY,
    IcebergSinkError,
    IcebergStaging,
    load_table,
)

if TYPE_CHECKING:
    from datetime import datetime

    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

REBASE_PROPERTY = "rewind.rebase-of"
"""Snapshot summary key on the snapshots of a rebase commit: the staging branch re-applied."""


class PublishingSink(Protocol):
    """What promotion and rollback need of the sink (an
    :class:`~rewind.sinks.iceberg.sink.IcebergSink`): the sink calls this module, so this module
    names only what it reads and never imports the sink back."""

    catalog: Catalog
    table_name: str
    mode: str
    window_column: str | None
    window: tuple[datetime, datetime] | None

    @property
    def target(self) -> str: ...

    def window_filter(self) -> str: ...


@dataclass(frozen=True)
class RebasedSwap(Swap):
    """A promotion re-applied on a moved ``main``; ``rebase`` says what went where (audited)."""

    rebase: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "rebase": self.rebase}


def _main_id(table: Table) -> int | None:
    ref = table.metadata.refs.get("main")
    return ref.snapshot_id if ref is not None else None


def _props(snapshot: Snapshot) -> dict[str, str]:
    return snapshot.summary.additional_properties if snapshot.summary else {}


def _commit(action: str, operation: Callable[[], object]) -> None:
    """Run the one catalog operation of a promotion or rollback between its two fault points."""
    faults.point(f"iceberg-{action}-before-commit")
    operation()
    faults.point(f"iceberg-{action}-after-commit")


def promote(sink: PublishingSink, staging: IcebergStaging, rebase: bool = False) -> Swap:
    """Make the staged output what the target's readers see, atomically.

    Steps: (1) a staging table is renamed to the target (under ``rebase`` refused if the target
    appeared meanwhile); (2) load the target and the branch head; (3) ``main`` already at the
    head, or at a rebase of this branch: done before (a re-run after a crash), only report it;
    (4) ``main`` moved since the cut: refuse, or with ``rebase`` re-apply the run on it
    (:func:`_rebase`); (5) else point ``main`` at the head in one commit that asserts ``main``
    is still at the base.
    """
    if staging.created_table:
        if rebase:
            _refuse_new_table_rebase(sink, staging)
        return _rename(sink, staging.table, sink.table_name, "promote")
    table = _target(sink, staging, "promote")
    head = _staged_head(table, staging)
    main = _main_id(table)
    if main == head.snapshot_id:
        return Swap(sink.target, "promote", staging.base_snapshot_id, main, True)
    found = _found_rebase(sink, table, staging, head)
    if found is not None:
        return found
    if main != staging.base_snapshot_id:
        if not rebase:
            raise IcebergSinkError(
                f"{staging.table} main moved since the staging branch was cut (was "
                f"{staging.base_snapshot_id}, now {main}): promoting would drop those writes; promote with "
                "--rebase to re-apply the run's output on the new main, or re-run the backfill"
            )
        return _rebase(sink, table, staging, head)
    manage = table.manage_snapshots().set_current_snapshot(snapshot_id=head.snapshot_id)
    _commit("promote", manage.commit)
    return Swap(sink.target, "promote", main, head.snapshot_id, False)


def rollback(sink: PublishingSink, staging: IcebergStaging, promoted: dict[str, Any]) -> Swap:
    """Undo a promotion recorded as ``promoted`` (a :meth:`Swap.to_dict`), rebased or not."""
    if staging.created_table:
        return _rename(sink, sink.table_name, staging.table, "rollback")
    table = _target(sink, staging, "roll back")
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
    manage = table.manage_snapshots().set_current_snapshot(snapshot_id=int(before))
    _commit("rollback", manage.commit)
    return Swap(sink.target, "rollback", after, before, False)


def _target(sink: PublishingSink, staging: IcebergStaging, doing: str) -> Table:
    table = load_table(sink.catalog, staging.table)
    if table is None:
        raise IcebergSinkError(f"target {staging.table} does not exist any more; nothing to {doing}")
    return table


def _staged_head(table: Table, staging: IcebergStaging) -> Snapshot:
    head = table.snapshot_by_name(staging.ref)
    if head is None:
        raise IcebergSinkError(
            f"staging branch {staging.branch} of {staging.table} is gone; re-run the backfill"
        )
    return head


# -- rebase -----------------------------------------------------------------------------------


def _rebase(sink: PublishingSink, table: Table, staging: IcebergStaging, head: Snapshot) -> Swap:
    """Re-apply the run's output on the moved ``main`` in ONE catalog commit.

    Steps: (1) collect the data files the run's unit commits added, still live at the branch
    head: not the files the branch's window delete rewrote, which hold rows of the OLD main;
    (2) one transaction on ``main``: replace-window deletes the window's rows (copy-on-write),
    then the run's files are appended; every snapshot is marked with the branch; (3) commit;
    the catalog refuses it if the table moved meanwhile, and that is a one-line error (run
    again); (4) read back which snapshot the commit landed on: that is what rollback restores.
    """
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    if sink.mode == "replace-window" and sink.window is None:
        raise IcebergSinkError(
            f"cannot rebase run output on {staging.table}: replace-window needs the run's time window "
            "(source.kafka.from and .to as times) and the spec has none; re-run the backfill"
        )
    files = _run_files(table, staging, head)
    marks = {REBASE_PROPERTY: staging.ref}
    txn = table.transaction()
    if sink.mode == "replace-window":
        txn.delete(sink.window_filter(), snapshot_properties=marks, branch="main")
    with txn.update_snapshot(snapshot_properties=marks, branch="main").fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    try:
        _commit("promote", txn.commit_transaction)
    except (CommitFailedException, ValidationException) as exc:
        raise IcebergSinkError(
            f"{staging.table} changed while the run was being rebased onto it ({exc}); nothing was "
            "promoted: run `rewind promote RUN --rebase` again"
        ) from exc
    found = _found_rebase(sink, _target(sink, staging, "promote"), staging, head)
    if found is None:  # the commit went through, so main must be at its last snapshot
        raise IcebergSinkError(f"{staging.table} main is not at the rebase just committed; see `rewind show`")
    return replace(found, already_done=False)


def _run_files(table: Table, staging: IcebergStaging, head: Snapshot) -> list[DataFile]:
    """The data files the run added and that are live at ``head``: those of its unit commits
    (naming units) and of its finalize commit (the folded rows that replaced the units' partial
    rows, :mod:`rewind.job.finalize`); not the window delete's rewrites of old main's files."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.table.snapshots import ancestors_of

    unit_commits = set()
    for snap in ancestors_of(head, table.metadata):
        if snap.snapshot_id == staging.base_snapshot_id:
            break
        if _props(snap).get(UNITS_PROPERTY) or _props(snap).get(FINALIZED_PROPERTY):
            unit_commits.add(snap.snapshot_id)
    files = []
    for manifest in head.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            raise IcebergSinkError(
                f"staging branch {staging.branch} of {staging.table} has row-level delete files; "
                "cannot rebase it: re-run the backfill on the new main"
            )
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.snapshot_id in unit_commits:
                files.append(entry.data_file)
    spec_id = table.spec().spec_id
    if any(f.spec_id != spec_id for f in files):
        raise IcebergSinkError(
            f"the partitioning of {staging.table} changed since the run wrote its files; cannot rebase "
            "them: re-run the backfill on the new main"
        )
    return files


def _found_rebase(
    sink: PublishingSink, table: Table, staging: IcebergStaging, head: Snapshot
) -> RebasedSwap | None:
    """The rebase of this branch that ``main`` is at, if it is at one (a commit found done)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.table.snapshots import ancestors_of

    main = table.snapshot_by_name("main")
    if main is None or _props(main).get(REBASE_PROPERTY) != staging.ref:
        return None
    ancestors = ancestors_of(main, table.metadata)
    onto = next((s.snapshot_id for s in ancestors if _props(s).get(REBASE_PROPERTY) != staging.ref), None)
    details = {
        "onto": onto,
        "cut_from": staging.base_snapshot_id,
        "staged": head.snapshot_id,
        "mode": sink.mode,
        "window": _window(sink),
        **_counts(table, main, onto),
    }
    return RebasedSwap(sink.target, "promote", onto, main.snapshot_id, True, details)


def _window(sink: PublishingSink) -> dict[str, str] | None:
    if sink.mode != "replace-window" or sink.window is None:
        return None
    lo, hi = sink.window
    return {"column": sink.window_column or "", "from": lo.isoformat(), "to": hi.isoformat()}


def _counts(table: Table, main: Snapshot, onto: int | None) -> dict[str, int]:
    """What the rebase did, from snapshot summaries: the run's files and rows it added (its last
    snapshot is the append), and how many rows of the window it replaced (net of the rewrite
    that copy-on-write does of files only partly in the window)."""

    def summary(snap: Snapshot | None, key: str) -> int:
        return int(_props(snap).get(key, 0)) if snap is not None else 0

    added = summary(main, "added-records")
    before = summary(table.snapshot_by_id(onto) if onto is not None else None, "total-records")
    return {
        "run_files": summary(main, "added-data-files"),
        "run_rows": added,
        "rows_replaced": before + added - summary(main, "total-records"),
    }


def _refuse_new_table_rebase(sink: PublishingSink, staging: IcebergStaging) -> None:
    """A new read model staged as its own table cannot be merged into a target created since."""
    catalog = sink.catalog
    if load_table(catalog, sink.table_name) is not None and load_table(catalog, staging.table) is not None:
        raise IcebergSinkError(
            f"cannot rebase {staging.table}: the run staged a new table because {sink.table_name} did not "
            f"exist, and {sink.table_name} was created since; re-run the backfill, which then stages on a "
            "branch of the existing table"
        )


def _rename(sink: PublishingSink, source: str, dest: str, action: str) -> Swap:
    catalog = sink.catalog
    have_source, have_dest = load_table(catalog, source) is not None, load_table(catalog, dest) is not None
    if have_dest and not have_source:
        return Swap(sink.target, action, source, dest, True)
    if have_dest:
        raise IcebergSinkError(f"{dest} already exists (created by someone else?); {action} would replace it")
    if not have_source:
        raise IcebergSinkError(f"neither {source} nor {dest} exists; nothing to {action}")
    _commit(action, lambda: sink.catalog.rename_table(source, dest))
    return Swap(sink.target, action, source, dest, False)
