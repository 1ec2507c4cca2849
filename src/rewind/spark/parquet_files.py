"""Warehouse Parquet files into a DataFrame, read by pyarrow in the Python tasks.

Spark's JVM reads only the filesystems Hadoop has connectors for, and hadoop-aws is not
available: an ``s3://`` warehouse (or any object store pyiceberg's FileIO reaches) must be
read by the Python workers instead, through the same :class:`~rewind.core.store.WarehouseStore`
the catalog uses. Local files keep Spark's own vectorized reader (no Arrow hop through Python).

Like Spark's reader given a schema, columns are matched by name: a column missing from a file
(written before a schema change) reads as nulls, and extra columns are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewind.core.parquet import open_writer
from rewind.core.store import WarehouseStore, active_store, is_local_uri

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

_BATCH_ROWS = 131_072
_MAX_TASKS = 64


def read_parquet_files(
    spark: SparkSession,
    paths: Sequence[str],
    schema: StructType,
    *,
    store: WarehouseStore | None = None,
    python: bool | None = None,
) -> DataFrame:
    """The rows of ``paths`` in ``schema``. ``python``: force (True) or forbid (False) the
    pyarrow path; by default it is taken when any file is not local."""
    paths = list(paths)
    if python is None:
        python = not all(is_local_uri(p) for p in paths)
    if not python or not paths:
        return spark.read.schema(schema).parquet(*paths) if paths else spark.createDataFrame([], schema)
    # lazy: avoids pyspark at import
    from pyspark.sql.pandas.types import to_arrow_schema

    reader = _ReadFiles(tuple(paths), to_arrow_schema(schema), store or active_store())
    tasks = min(len(paths), _MAX_TASKS)
    return spark.range(0, len(paths), 1, tasks).mapInArrow(reader, schema)


@dataclass(frozen=True)
class _ReadFiles:
    """The ``mapInArrow`` function: file numbers in, the files' rows out (pickled to tasks)."""

    paths: tuple[str, ...]
    schema: pa.Schema
    store: WarehouseStore

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ids in batches:
            for i in ids.column(0).to_pylist():
                yield from self._read(self.paths[i])

    def _read(self, uri: str) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.parquet as pq

        fs, path = self.store.filesystem(uri)
        with fs.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            present = set(parquet.schema_arrow.names)
            columns = [n for n in self.schema.names if n in present]
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                arrays = [
                    batch.column(f.name).cast(f.type)
                    if f.name in present
                    else pa.nulls(batch.num_rows, f.type)
                    for f in self.schema
                ]
                yield pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def write_parquet_files(
    df: DataFrame, folder_uri: str, prefix: str, *, store: WarehouseStore | None = None
) -> list[str]:
    """Write ``df`` as Parquet files under ``folder_uri`` from the Python tasks (one file per
    non-empty partition, through pyarrow: Spark's own writer cannot reach an object store) and
    return the files' URIs. Files of a failed attempt are orphans: only the returned ones count."""
    # lazy: avoids pyspark at import
    from pyspark.sql.pandas.types import to_arrow_schema

    writer = _WriteFiles(folder_uri, prefix, to_arrow_schema(df.schema), store or active_store())
    return sorted(row[0] for row in df.mapInArrow(writer, "path string").collect())


@dataclass(frozen=True)
class _WriteFiles:
    folder_uri: str
    prefix: str
    schema: pa.Schema
    store: WarehouseStore

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        writer, uri = None, ""
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                if writer is None:
                    writer, uri = open_writer(self.folder_uri, self.prefix, self.schema, self.store)
                writer.write_batch(batch.cast(self.schema))
        finally:
            if writer is not None:
                writer.close()
        if writer is not None:
            yield pa.RecordBatch.from_pydict({"path": [uri]})
