"""Parquet output of the tasks read back and encoded for COPY (CSV) or executemany, in bounded batches."""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from rewind.core.store import filesystem
from rewind.sinks.sql.exceptions import SqlSinkError

if TYPE_CHECKING:
    import pyarrow as pa

CHUNK_ROWS = 65_536


def prepare_columns(table: pa.Table, sqlite: bool = False) -> pa.Table:
    """Columns in a form that CSV (PostgreSQL COPY) or sqlite3 takes fast and exactly.

    Timestamps become naive UTC text (``2026-10-01 00:00:00.000000``; the session is in UTC):
    casting a zoned timestamp to text is 35x slower in Arrow than a naive one.
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    arrays = []
    for col in table.columns:
        t = col.type
        if pa.types.is_timestamp(t):
            col = col.cast(pa.timestamp(t.unit)).cast(pa.string())
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            if not sqlite:
                col = pa.array([None if v is None else "\\x" + v.hex() for v in col.to_pylist()], pa.string())
        elif sqlite and (pa.types.is_date(t) or pa.types.is_decimal(t) or pa.types.is_time(t)):
            col = col.cast(pa.string())
        elif sqlite and pa.types.is_boolean(t):
            col = col.cast(pa.int8())
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names)


def to_csv(table: pa.Table) -> bytes:
    # lazy: avoids pyarrow at import
    import pyarrow.csv as pcsv

    buf = io.BytesIO()
    pcsv.write_csv(prepare_columns(table), buf, pcsv.WriteOptions(include_header=False))
    return buf.getvalue()


def read_batches(files: list[str], columns: list[str]) -> Iterator[pa.Table]:
    """The rows of ``files`` in chunks, only ``columns``, in that order."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.parquet as pq

    for uri in files:
        fs, path = filesystem(uri)
        with fs.open_input_file(path) as handle:
            reader = pq.ParquetFile(handle)
            missing = [c for c in columns if c not in reader.schema_arrow.names]
            if missing:
                raise SqlSinkError(f"{uri} lacks output columns {missing}; the run's files do not match")
            for batch in reader.iter_batches(batch_size=CHUNK_ROWS, columns=columns):
                if batch.num_rows:
                    yield pa.Table.from_batches([batch]).select(columns)


def prefetched(items: Iterable[Any], depth: int = 3) -> Iterator[Any]:
    """Produce ``items`` on a thread, ``depth`` ahead: encoding overlaps the COPY stream."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                q.put(item)
            q.put(done)
        except BaseException as exc:
            q.put(exc)

    thread = threading.Thread(target=run, name="rewind-pg-encode", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                q.get_nowait()
        thread.join(timeout=10)


def has_duplicates(keys: list[pa.Table]) -> bool:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if not keys:
        return False
    table = pa.concat_tables(keys)
    if table.num_rows < 2:
        return False
    if table.num_columns == 1:
        return bool(len(table.column(0).unique()) < table.num_rows)
    return bool(table.group_by(table.column_names).aggregate([]).num_rows < table.num_rows)


def uri_path(uri: str) -> str:
    return unquote(urlparse(uri).path) if uri.startswith("file:") else uri


def files_schema(files: list[str], columns: list[str]) -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not files:
        return pa.schema([])
    fs, path = filesystem(files[0])
    with fs.open_input_file(path) as handle:
        schema = pq.ParquetFile(handle).schema_arrow
    return pa.schema([schema.field(c) for c in columns])


def files_have_duplicates(files: list[str], keys: list[str]) -> bool:
    return has_duplicates(list(read_batches(files, keys)))
