"""Writing Parquet files from Spark tasks into a table's data folder (any pyarrow filesystem)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def write_parquet(folder_uri: str, table: pa.Table, prefix: str) -> str:
    """Write ``table`` as one Parquet file under ``folder_uri``; returns the file's URI.

    The name is unique per call (a retried task writes a new file; only files that the
    driver commits become visible, so a failed attempt's files are orphans, never data).
    """
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, root = pafs.FileSystem.from_uri(folder_uri)
    fs.create_dir(root, recursive=True)
    name = f"{prefix}-{uuid.uuid4().hex}.parquet"
    path = f"{root.rstrip('/')}/{name}"
    pq.write_table(table, path, filesystem=fs, compression="zstd")
    return f"{folder_uri.rstrip('/')}/{name}"
