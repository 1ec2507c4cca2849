"""Materialise a Spark DataFrame as an Iceberg table: a reference computed once and kept.

Spark writes Parquet files into the table's data folder (timestamps as INT64 microseconds,
which Iceberg reads; never INT96), or the Python tasks do through pyarrow when the warehouse is
an object store Spark cannot reach; then pyiceberg adds them in one commit. For tables
verified against, tests and benchmarks; the job's own sink writes through
:class:`rewind.sinks.iceberg.IcebergSink`.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from rewind.core.store import WarehouseStore, is_local_uri
from rewind.spark.parquet_files import write_parquet_files

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession


def dataframe_to_iceberg(spark: SparkSession, df: DataFrame, catalog: Catalog, table: str) -> Table:
    """Write ``df`` as a new Iceberg table ``table`` (namespace.table) in one commit.

    Steps: (1) create the namespace and the table from the DataFrame's Arrow schema;
    (2) Spark writes Parquet under the table's ``data/`` folder; (3) one ``add_files`` commit.
    """
    # lazy: avoids pyarrow, pyspark at import
    import pyarrow.fs as pafs
    from pyspark.sql.pandas.types import to_arrow_schema


    namespace = table.rpartition(".")[0]
    catalog.create_namespace_if_not_exists(namespace)
    schema = to_arrow_schema(df.schema)
    created = catalog.create_table(table, schema=schema)
    folder = f"{created.location().rstrip('/')}/data/{uuid.uuid4().hex}"
    if not is_local_uri(folder):
        store = WarehouseStore.from_catalog_properties(created.io.properties)
        files = write_parquet_files(df, folder, "part", store=store)
        if files:
            created.add_files(files)
        return catalog.load_table(table)
    previous = spark.conf.get("spark.sql.parquet.outputTimestampType", None)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        df.write.mode("errorifexists").parquet(folder)
    finally:
        if previous is None:
            spark.conf.unset("spark.sql.parquet.outputTimestampType")
        else:
            spark.conf.set("spark.sql.parquet.outputTimestampType", previous)
    fs, root = pafs.FileSystem.from_uri(folder)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    files = sorted(
        f"{folder}/{info.path[len(root) :].lstrip('/')}" for info in infos if info.path.endswith(".parquet")
    )
    if files:
        created.add_files(files)
    return catalog.load_table(table)
