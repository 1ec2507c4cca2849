"""Compaction of an archive: small files rewritten into bigger ones, coordinates and state kept.

Continuous archiving writes a few files per micro-batch; reads pay per file. Compaction, in
order (:func:`compact_archive`):

1. load the table and remember its current snapshot and archive state (high-water, start);
2. group the live data files by day partition and by their topic/partition statistics
   (files of one Kafka partition and day, as the archive writes them); a group with at least
   ``min_files`` files, some smaller than half of ``target_file_bytes``, is rewritten;
3. stream each group's files in offset order into new files, one writer per Kafka partition,
   rolled at ``target_file_rows``: every column is copied as is (no re-encoding of keys,
   values or headers, no change of offsets or timestamps), rows stay sorted by offset;
4. check that the new files hold exactly the rows of the old ones, per group;
5. ONE overwrite commit on the snapshot of step 1 (no retry: an archive pass committing
   meanwhile makes it fail with :class:`ArchiveConflictError`, and it can simply run again),
   removing the old files and adding the new, with the archive state of step 1 copied into
   its snapshot summary so the high-water survives (``rewind.archive.mode = compaction``).

Old files stay on storage for older snapshots (time travel) until snapshots are expired.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.core.parquet import open_writer
from rewind.history.exceptions import ArchiveConflictError, CoverageError
from rewind.history.schema import MODE_PROPERTY, archive_state, arrow_schema, open_archive

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table

    from rewind.config import Settings

TARGET_FILE_BYTES = 128 * 1024 * 1024
TARGET_FILE_ROWS = 2_000_000


@dataclass
class CompactionResult:
    table: str
    committed: bool
    snapshot_id: int | None
    files_before: int
    files_after: int
    rows: int
    groups: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "committed": self.committed,
            "snapshot_id": self.snapshot_id,
            "files_rewritten": self.files_before,
            "files_written": self.files_after,
            "rows": self.rows,
            "groups": self.groups,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


def _bound(data_file: DataFile, field_id: int, kind: str) -> bytes | None:
    """A column bound as stored (serialized bytes: equal bytes, equal values)."""
    bounds = data_file.lower_bounds if kind == "lower" else data_file.upper_bounds
    return (bounds or {}).get(field_id)


def _group_key(table: Table, data_file: DataFile) -> tuple[Any, ...]:
    schema = table.schema()
    topic = schema.find_field("topic").field_id
    partition = schema.find_field("partition").field_id
    return (
        str(data_file.partition),
        _bound(data_file, topic, "lower"),
        _bound(data_file, topic, "upper"),
        _bound(data_file, partition, "lower"),
        _bound(data_file, partition, "upper"),
    )


def _offset_min(table: Table, data_file: DataFile) -> int:
    # lazy: avoids pyiceberg at import
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    raw = (data_file.lower_bounds or {}).get(table.schema().find_field("offset").field_id)
    return int(from_bytes(LongType(), raw)) if raw is not None else -1


def _rewrite(table: Table, files: list[DataFile], folder: str, target_rows: int) -> list[tuple[str, int]]:
    """Stream ``files`` (offset order) into new files, one writer per Kafka partition."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = arrow_schema()
    writers: dict[tuple[str, int], list[Any]] = {}  # tp -> [writer, uri, rows]
    written: list[tuple[str, int]] = []

    def close(tp: tuple[str, int]) -> None:
        writer, uri, rows = writers.pop(tp)
        writer.close()
        written.append((uri, rows))

    for data_file in sorted(files, key=lambda f: (_offset_min(table, f), f.file_path)):
        with table.io.new_input(data_file.file_path).open() as stream:
            for batch in pq.ParquetFile(stream).iter_batches(batch_size=262_144):
                part = pa.Table.from_batches([batch]).cast(schema)
                pairs = part.select(["topic", "partition"]).group_by(["topic", "partition"]).aggregate([])
                for topic, partition in zip(
                    pairs["topic"].to_pylist(), pairs["partition"].to_pylist(), strict=True
                ):
                    rows = part.filter(
                        pc.and_(pc.equal(part["topic"], topic), pc.equal(part["partition"], partition))
                    )
                    tp = (topic, partition)
                    if tp not in writers:
                        writer, uri = open_writer(folder, "compact", schema)
                        writers[tp] = [writer, uri, 0]
                    writers[tp][0].write_table(rows, row_group_size=262_144)
                    writers[tp][2] += rows.num_rows
                    if writers[tp][2] >= target_rows:
                        close(tp)
    for tp in list(writers):
        close(tp)
    return written


def compact_archive(
    settings: Settings,
    table: str,
    *,
    target_file_bytes: int = TARGET_FILE_BYTES,
    target_file_rows: int = TARGET_FILE_ROWS,
    min_files: int = 2,
    catalog: Catalog | None = None,
) -> CompactionResult:
    """Rewrite the archive's small files (steps 1-5 of the module docstring)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    started = time.monotonic()
    catalog = catalog or load_catalog(settings)
    iceberg = open_archive(catalog, table)
    head = iceberg.current_snapshot()
    if head is None:
        return CompactionResult(
            table, False, None, 0, 0, 0, 0, time.monotonic() - started, ["the archive is empty"]
        )
    state = archive_state(iceberg)
    groups: dict[tuple[Any, ...], list[DataFile]] = {}
    for task in iceberg.scan(snapshot_id=head.snapshot_id).plan_files():
        if task.delete_files:
            raise CoverageError(f"{table} has row-level delete files; an archive is append-only")
        groups.setdefault(_group_key(iceberg, task.file), []).append(task.file)
    chosen = [
        files
        for files in groups.values()
        if len(files) >= min_files and sum(f.file_size_in_bytes < target_file_bytes // 2 for f in files) >= 2
    ]
    if not chosen:
        return CompactionResult(
            table, False, head.snapshot_id, 0, 0, 0, 0, time.monotonic() - started, ["nothing to compact"]
        )
    folder = f"{iceberg.location().rstrip('/')}/data"
    old: list[DataFile] = []
    new_paths: list[str] = []
    rows = 0
    for files in chosen:
        written = _rewrite(iceberg, files, folder, target_file_rows)
        before = sum(f.record_count for f in files)
        after = sum(n for _p, n in written)
        if before != after:
            raise CoverageError(
                f"compaction of {len(files)} files of {table} wrote {after} rows for {before}; "
                "nothing was committed"
            )
        old.extend(files)
        new_paths.extend(p for p, _n in written)
        rows += before
    props = {**state.properties(), MODE_PROPERTY: "compaction"} if state.hw else {MODE_PROPERTY: "compaction"}
    tx = iceberg.transaction()
    try:
        with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for path in new_paths:
                overwrite.append_data_file(parquet_file_to_data_file(iceberg.io, iceberg.metadata, path))
        tx.commit_transaction()
    except CommitFailedException as exc:
        raise ArchiveConflictError(
            f"{table} changed during compaction (an archive pass committed); nothing was committed, "
            "run it again"
        ) from exc
    current = catalog.load_table(table).current_snapshot()
    return CompactionResult(
        table,
        True,
        current.snapshot_id if current else None,
        len(old),
        len(new_paths),
        rows,
        len(chosen),
        time.monotonic() - started,
    )
