"""Row-level deletes on a staging ref, file by file, without a row filter expression.

A merge (:mod:`rewind.job.merge`) knows exactly which rows go: it read every data file of the
branch, decided per row, and holds a keep-mask per file. pyiceberg's ``delete`` would need
those rows as an ``In`` expression over thousands of keys, bound and evaluated again per
manifest and file (measured: most of a merge's time). Here the files are read once
(:func:`read_files`, only the columns asked for), and :func:`rewrite` replaces only the files
that lose rows, copy-on-write, in ONE overwrite snapshot of the transaction given: a file
that loses every row is dropped, one that loses some is rewritten with the rest.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewind.sinks.iceberg.staging import IcebergSinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import FileScanTask, Table, Transaction

FILE_COLUMN = "_rewind_file"
"""Index (into the task list) of the data file a row was read from."""


def read_files(table: Table, ref: str, columns: Sequence[str] | None) -> tuple[list[FileScanTask], pa.Table]:
    """Every data file of ``ref`` read (``columns`` only, or all), with :data:`FILE_COLUMN`."""
    # lazy: avoids pyarrow, pyiceberg at import
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan

    head = table.snapshot_by_name(ref)
    schema = table.schema() if columns is None else table.schema().select(*columns)
    if head is None:
        empty = schema.as_arrow().empty_table()
        return [], empty.append_column(FILE_COLUMN, pa.array([], pa.int32()))
    tasks = list(table.scan(snapshot_id=head.snapshot_id).plan_files())
    if any(t.delete_files for t in tasks):
        raise IcebergSinkError(
            f"{table.name()} at {ref} has row-level delete files; a merge rewrites data files only: "
            "compact the table first"
        )
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    parts = []
    for index, task in enumerate(tasks):
        part = scan.to_table([task])
        parts.append(part.append_column(FILE_COLUMN, pa.array([index] * part.num_rows, pa.int32())))
    if not parts:
        return tasks, schema.as_arrow().empty_table().append_column(FILE_COLUMN, pa.array([], pa.int32()))
    return tasks, pa.concat_tables(parts)


def rewrite(
    tx: Transaction,
    table: Table,
    branch: str,
    tasks: Sequence[FileScanTask],
    keep: Mapping[int, Any],
    properties: dict[str, str],
    tables: Mapping[int, pa.Table] | None = None,
) -> int:
    """Replace each file ``keep`` names (task index → boolean mask over its rows) by its kept
    rows, in one overwrite snapshot; returns the rows deleted. ``tables``: files the caller
    read already, whole (task index → all its rows), not read again."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    if not keep:
        return 0
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    commit_uuid, counter = uuid.uuid4(), itertools.count(0)
    deleted = 0
    with tx.update_snapshot(snapshot_properties=properties, branch=branch).overwrite() as overwrite:
        for index, mask in sorted(keep.items()):
            task = tasks[index]
            rows = tables[index] if tables and index in tables else scan.to_table([task])
            kept = rows.filter(mask)
            deleted += rows.num_rows - kept.num_rows
            overwrite.delete_data_file(task.file)
            if kept.num_rows:
                files = _dataframe_to_data_files(
                    table_metadata=table.metadata,
                    df=kept,
                    io=table.io,
                    write_uuid=commit_uuid,
                    counter=counter,
                )
                for data_file in files:
                    overwrite.append_data_file(data_file)
    return deleted


def replace_rows(
    tx: Transaction,
    table: Table,
    branch: str,
    tasks: Sequence[FileScanTask],
    keep: Mapping[int, Any],
    rows: pa.Table,
    properties: dict[str, str],
) -> int:
    """Like :func:`rewrite`, but the kept rows of every file that loses rows and ``rows`` are
    written together as new files, in ONE overwrite snapshot: an upsert that keeps the number
    of files from growing with every commit (each one merges the files it touches)."""
    # lazy: avoids pyarrow, pyiceberg at import
    import pyarrow as pa
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    parts, deleted = [], 0
    with tx.update_snapshot(snapshot_properties=properties, branch=branch).overwrite() as overwrite:
        for index, mask in sorted(keep.items()):
            task = tasks[index]
            found = scan.to_table([task])
            kept = found.filter(mask)
            deleted += found.num_rows - kept.num_rows
            overwrite.delete_data_file(task.file)
            parts.append(kept)
        merged = pa.concat_tables([*parts, rows.cast(parts[0].schema) if parts else rows])
        if merged.num_rows:
            files = _dataframe_to_data_files(
                table_metadata=table.metadata,
                df=merged,
                io=table.io,
                write_uuid=uuid.uuid4(),
                counter=itertools.count(0),
            )
            for data_file in files:
                overwrite.append_data_file(data_file)
    return deleted
