"""Writing Parquet files into a table's data folder on any pyarrow filesystem, in one way.

Spark tasks (job, fold, archive), compaction and tests write the files a driver later
commits. Every file gets a name unique per call: a retried task writes a new file, and only
files the driver commits become visible, so a failed attempt's files are orphans, never data.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from rewind.core.store import WarehouseStore, filesystem

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

COMPRESSION = "zstd"


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}.parquet"


def open_writer(
    folder_uri: str, prefix: str, schema: pa.Schema, store: WarehouseStore | None = None
) -> tuple[pq.ParquetWriter, str]:
    """A writer of a new file under ``folder_uri`` (created if missing) and the file's URI.

    ``store``: the warehouse's filesystem properties (a task passes its context's; the driver's
    default is the catalog's)."""
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq  # pyarrow only in the processes that write

    fs, root = filesystem(folder_uri, store)
    fs.create_dir(root, recursive=True)
    name = unique_name(prefix)
    writer = pq.ParquetWriter(f"{root.rstrip('/')}/{name}", schema, filesystem=fs, compression=COMPRESSION)
    return writer, f"{folder_uri.rstrip('/')}/{name}"


def write_parquet(folder_uri: str, table: pa.Table, prefix: str, store: WarehouseStore | None = None) -> str:
    """Write ``table`` as one new Parquet file under ``folder_uri``; returns the file's URI."""
    writer, uri = open_writer(folder_uri, prefix, table.schema, store)
    with writer:
        writer.write_table(table)
    return uri
