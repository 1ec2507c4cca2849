"""Snapshots: a read model's state as of recorded offsets, and the replay of what came after.

A read model folded from all history (``translate.fold``) can be rebuilt from a snapshot of
itself instead: the snapshot's rows hold the state as of a per-partition offset map (the first
offset of each partition NOT folded into it), so a run reads only ``[those offsets, to)`` and
the fold folds the snapshot's rows together with the new events' partial rows. For a fold that
accepts its own output (sums, last non-null, min/max) the result equals a full replay.

* :func:`resolve_snapshot` (plan time): the table, ref and offsets of ``source.kafka.snapshot``,
  checked (a fold, an Iceberg sink, offsets given or recorded); stored in the read plan under
  :data:`SNAPSHOT_KEY`, so the run uses what the plan showed. A SQL table (``snapshot.url``)
  needs its offsets given; the plan pins its row count and digest, and
  :func:`read_sql_state` (the fold step) refuses a table changed since.
* :func:`rewind.job.snapshot_create.create_snapshot` (``rewind snapshot create RUN``): tags a
  promoted run's Iceberg target as ``rewind-snapshot-<run>`` and records the run's end offsets
  in the table's properties under :data:`OFFSETS_PROPERTY` + the tag.

The fold step (:mod:`rewind.job.finalize`) adds the snapshot's rows; lineage of a key the
replay did not touch stays the snapshot row's, that of a touched key its last event's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.errors import RewindError
from rewind.sinks.sql.publish import read_table, table_fingerprint
from rewind.sinks.sql.sink import SqlSink

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.spec import JobSpec

SNAPSHOT_KEY = "snapshot"
"""Where the read plan keeps ``{table, ref, snapshot_id, offsets}`` of the snapshot."""
OFFSETS_PROPERTY = "rewind.snapshot-offsets."
"""Table property prefix: ``rewind.snapshot-offsets.<ref>`` = the ref's offsets as JSON."""
TAG_PREFIX = "rewind-snapshot-"


class SnapshotError(RewindError):
    """A snapshot cannot be used or made; nothing was written."""


def resolve_snapshot(settings: Settings, spec: JobSpec) -> dict[str, Any]:
    """The snapshot of ``spec`` as plain data, or a one-line :class:`SnapshotError`."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import NoSuchTableError

    window = spec.source.window
    part = window.snapshot
    assert part is not None
    where = "source.kafka.snapshot"
    if spec.translate.fold is None:
        raise SnapshotError(
            f"{where}: needs translate.fold (the snapshot's rows are folded with the new events)"
        )
    if spec.sink.iceberg is None:
        raise SnapshotError(f"{where}: only an Iceberg sink folds into a snapshot; use sink.iceberg")
    if part.url is not None:
        return _resolve_sql(part.url, part.table, part.offsets)
    try:
        table = load_catalog(settings).load_table(part.table)
    except NoSuchTableError:
        raise SnapshotError(f"{where}.table: no Iceberg table {part.table}; name an existing table") from None
    snap = table.snapshot_by_name(part.ref)
    if snap is None:
        raise SnapshotError(
            f"{where}.ref: {part.table} has no ref {part.ref!r} with data; name a branch or tag"
        )
    if part.offsets is not None:
        offsets = {t: {str(p): o for p, o in parts.items()} for t, parts in part.offsets.items()}
    else:
        recorded = table.properties.get(OFFSETS_PROPERTY + part.ref)
        if not recorded:
            raise SnapshotError(
                f"{where}.offsets: {part.table}@{part.ref} records no offsets; give the offsets the state "
                "is as of, or make the snapshot with `rewind snapshot create RUN`"
            )
        offsets = json.loads(recorded)
    return {"table": part.table, "ref": part.ref, "snapshot_id": snap.snapshot_id, "offsets": offsets}


def _resolve_sql(url: str, table: str, given: Any) -> dict[str, Any]:
    """A SQL state table: it must exist, and the offsets must be given (it records none). Its
    row count and digest are pinned (:func:`read_sql_state` refuses a table changed since)."""
    where = "source.kafka.snapshot"
    if given is None:
        raise SnapshotError(
            f"{where}.offsets: the SQL table {table} records no offsets; give the offsets its state is as of"
        )
    sink = SqlSink(url, table)
    try:
        found = table_fingerprint(sink, table)
    finally:
        sink.close()
    if found is None:
        raise SnapshotError(
            f"{where}.table: no table {table} in the SQL database of {where}.url; name an existing table"
        )
    offsets = {t: {str(p): o for p, o in parts.items()} for t, parts in given.items()}
    digest = found[1]
    return {
        "sql": url,
        "table": table,
        "rows": found[0],
        "digest": digest,
        "snapshot_id": digest,
        "offsets": offsets,
    }


def read_sql_state(snapshot: dict[str, Any]) -> Any:
    """The SQL state table's rows (Arrow), as the plan pinned them."""
    sink = SqlSink(snapshot["sql"], snapshot["table"])
    try:
        now = table_fingerprint(sink, snapshot["table"])
        if now != (snapshot["rows"], snapshot["digest"]):
            raise SnapshotError(
                f"source.kafka.snapshot: the SQL table {snapshot['table']} changed since the plan "
                "(its rows are not the state as of the plan's offsets); plan again"
            )
        rows = read_table(sink, snapshot["table"])
    finally:
        sink.close()
    assert rows is not None
    return rows


def snapshot_offsets(snapshot: dict[str, Any]) -> dict[str, dict[int, int]]:
    """The read plan's snapshot offsets as the spec's ``Offsets``."""
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in snapshot["offsets"].items()}
