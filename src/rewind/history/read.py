"""Reading history with Spark: archive ranges from Iceberg, Kafka ranges from ``rewind-kafka``.

Both sides come out in Spark's Kafka source schema (``key, value, topic, partition, offset,
timestamp, timestampType`` and, with ``include_headers``, ``headers``), so a job reads history
exactly as it reads Kafka. The archive side reads only the files pyiceberg plans for the
ranges (at the plan's pinned snapshot) and keeps only the rows inside the ranges.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rewind.catalog import load_catalog
from rewind.core.ranges import OffsetRange
from rewind.core.store import WarehouseStore
from rewind.history.exceptions import CoverageError
from rewind.history.files import merged_by_partition, plan_files
from rewind.history.schema import open_archive
from rewind.spark.parquet_files import read_parquet_files

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import Column, DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.history.plan import HistoryPlan


def _archive_spark_schema() -> str:
    return (
        "key binary, value binary, headers array<struct<key:string,value:binary>>, topic string, "
        "partition int, offset bigint, timestamp timestamp, timestamp_type int, event_date date, "
        "archived_at timestamp"
    )


def _kafka_columns(include_headers: bool) -> list[str]:
    cols = ["key", "value", "topic", "partition", "offset", "timestamp", "timestamp_type AS timestampType"]
    return [*cols, "headers"] if include_headers else cols


def _range_condition(ranges: Sequence[OffsetRange]) -> Column:
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    condition = F.lit(False)
    for (topic, partition), found in merged_by_partition(ranges).items():
        offsets = F.lit(False)
        for start, end in found:
            offsets = offsets | ((F.col("offset") >= start) & (F.col("offset") < end))
        condition = condition | ((F.col("topic") == topic) & (F.col("partition") == partition) & offsets)
    return condition


def read_ranges_from_archive(
    spark: SparkSession,
    settings: Settings,
    archive_table: str,
    ranges: Sequence[OffsetRange],
    *,
    snapshot_id: int | None = None,
    include_headers: bool = False,
    catalog: Catalog | None = None,
) -> DataFrame:
    """The archived records of ``ranges`` as a DataFrame in Spark's Kafka schema.

    Only the files pyiceberg plans for the ranges are read (``snapshot_id``: the plan's pinned
    snapshot; default the current one), and only rows inside the ranges are kept.
    """
    # lazy: avoids pyspark at import
    from pyspark.sql.types import StructType

    # lazy: avoids pyspark at import
    from rewind.spark.kafka_source import spark_schema

    catalog = catalog or load_catalog(settings)
    table = open_archive(catalog, archive_table)
    files = plan_files(table, ranges, snapshot_id)
    if not files:
        schema: StructType = spark_schema(include_headers)
        return spark.createDataFrame([], schema)
    archive_schema = StructType.fromDDL(_archive_spark_schema())
    assert isinstance(archive_schema, StructType)
    store = WarehouseStore.from_catalog_properties(table.io.properties)
    df = read_parquet_files(spark, [f.path for f in files], archive_schema, store=store)
    return df.where(_range_condition(ranges)).selectExpr(*_kafka_columns(include_headers))


def read_kafka_ranges(
    spark: SparkSession, settings: Settings, ranges: Sequence[OffsetRange], *, include_headers: bool = False
) -> DataFrame:
    """Kafka ranges read exactly with ``rewind-kafka`` (``ranges`` option, ``read_committed``)."""
    reader = spark.read.format("rewind-kafka").option(
        "ranges", json.dumps([r.to_dict() for r in ranges if r.size])
    )
    reader = reader.option("includeHeaders", "true" if include_headers else "false")
    for key, value in settings.kafka_config().items():
        reader = reader.option(f"kafka.{key}", str(value))
    return reader.load()


def read_history(
    spark: SparkSession,
    settings: Settings,
    plan: HistoryPlan,
    *,
    include_headers: bool = False,
    verify: bool = False,
    catalog: Catalog | None = None,
) -> DataFrame:
    """The plan's window as one DataFrame in Spark's Kafka schema: archive part, then Kafka part.

    Each offset has one source in the plan, so the union holds every record once. ``verify``
    counts the archive part per partition first (one extra pass over its offset column) and
    raises :class:`CoverageError` if it differs from what the plan expects (a file missing or
    altered since the archive wrote it).
    """
    # lazy: avoids pyspark at import
    from rewind.spark.kafka_source import spark_schema

    catalog = catalog or load_catalog(settings)
    parts: list[DataFrame] = []
    archive_ranges = plan.archive_ranges()
    if archive_ranges:
        archive_df = read_ranges_from_archive(
            spark,
            settings,
            plan.archive_table,
            archive_ranges,
            snapshot_id=plan.archive_snapshot_id,
            include_headers=include_headers,
            catalog=catalog,
        )
        if verify:
            check_archive_counts(plan, archive_df)
        parts.append(archive_df)
    kafka_ranges = [r for r in plan.kafka_ranges() if r.size]
    if kafka_ranges:
        parts.append(read_kafka_ranges(spark, settings, kafka_ranges, include_headers=include_headers))
    if not parts:
        return spark.createDataFrame([], spark_schema(include_headers))
    df = parts[0]
    for other in parts[1:]:
        df = df.unionByName(other)
    return df


def check_archive_counts(plan: HistoryPlan, archive_df: DataFrame) -> None:
    """Raise :class:`CoverageError` unless the archive part holds each expected record once."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    got = {
        (r["topic"], r["partition"]): (r["n"], r["d"])
        for r in archive_df.groupBy("topic", "partition")
        .agg(F.count(F.lit(1)).alias("n"), F.countDistinct("offset").alias("d"))
        .collect()
    }
    for p in plan.partitions:
        if not p.archive_ranges:
            continue
        n, d = got.get((p.topic, p.partition), (0, 0))
        if n != p.expected_archive_records or d != n:
            raise CoverageError(
                f"the archive holds {n} records ({d} distinct offsets) of {p.topic}/{p.partition} in "
                f"{[(r.start, r.end) for r in p.archive_ranges]}, the plan expects "
                f"{p.expected_archive_records} "
                "(every offset not skipped or lost, once): an archive file is missing or was altered"
            )
