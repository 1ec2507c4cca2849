"""Reading an Iceberg table (or one of its branches) into Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.core.store import WarehouseStore
from rewind.sinks.iceberg.staging import IcebergSinkError
from rewind.spark.parquet_files import read_parquet_files

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession


def read_iceberg(spark: SparkSession, table: Table, ref: str = "main") -> DataFrame:
    """Read an Iceberg table (at a ref) into Spark: pyiceberg plans the files, Spark reads them
    (local files) or the Python tasks do (an object store: :mod:`rewind.spark.parquet_files`).

    Refuses what this simple path cannot read correctly: row-level delete files.
    """
    snapshot = table.snapshot_by_name(ref)
    schema = table.schema().as_arrow()
    if snapshot is None:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        return spark.createDataFrame(
            pa.Table.from_batches([], schema=schema).to_pandas(), _spark_schema(schema)
        )
    tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    with_deletes = [t.file.file_path for t in tasks if t.delete_files]
    if with_deletes:
        raise IcebergSinkError(
            f"{'.'.join(table.name())} has row-level delete files (e.g. on {with_deletes[0]}); "
            "Rewind reads only copy-on-write tables here: compact the table first"
        )
    paths = [t.file.file_path for t in tasks]
    if not paths:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        return spark.createDataFrame(
            pa.Table.from_batches([], schema=schema).to_pandas(), _spark_schema(schema)
        )

    store = WarehouseStore.from_catalog_properties(table.io.properties)
    return read_parquet_files(spark, paths, _spark_schema(schema), store=store)


def _spark_schema(schema: pa.Schema) -> Any:
    # lazy: avoids pyspark at import
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)
