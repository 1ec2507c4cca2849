"""The ``rewind-kafka`` PySpark data source: batch reader, stream reader and writer.

Options and columns follow Spark's own Kafka source, so a job written for Spark's JVM
connector runs by changing only the format name (see README, "Kafka in Spark").

Planning (which offsets to read) happens on the driver in :meth:`KafkaBatchReader.partitions`
through :mod:`rewind.kafka.resolve`, which checks every broker answer; tasks then read exactly
their planned :class:`~rewind.core.ranges.OffsetRange` with :func:`~rewind.spark.kafka_fetch.fetch_ranges`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rewind.core.ranges import OffsetRange, group_for_tasks
from rewind.kafka.read_plan import ReadPlan
from rewind.kafka.resolve import resolve
from rewind.kafka.spark_options import parse_spark_options
from rewind.spark.kafka_fetch import BATCH_MESSAGES, fetch_ranges, partition_counts
from rewind.spark.kafka_options import client_conf, flag, lower_keys, positive_float, positive_int
from rewind.spark.kafka_stream import KafkaStreamReader
from rewind.spark.kafka_writer import make_writer
from rewind.spark.pace_server import PaceAddress, RemotePacer
from rewind.spark.progress_channel import PROGRESS_OPTION, ProgressAddress, TaskReporter
from rewind.spark.ratelimit import RateLimit, SharedFilePacer, default_state_dir, shared_state_path

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.spark.ratelimit import Pacer


def spark_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (headers only when ``includeHeaders`` is true)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class RangesPartition(InputPartition):
    """One Spark task: chunks of distinct Kafka partitions, read together by one consumer."""

    def __init__(self, ranges: list[OffsetRange]) -> None:
        super().__init__([r.to_dict() for r in ranges])
        self.ranges = ranges


class KafkaDataSource(DataSource):
    """``spark.read.format("rewind-kafka")``, ``readStream`` and ``write`` on confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return "rewind-kafka"

    def schema(self) -> StructType:
        return spark_schema(flag(self.options, "includeHeaders"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return make_writer(schema, overwrite, dict(self.options))


class KafkaBatchReader(DataSourceReader):
    """Plans on the driver, reads ranges in tasks; never joins or commits a consumer group."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.conf = client_conf(options)
        self.include_headers = flag(options, "includeHeaders")
        self.max_records = positive_int(options, "maxRecordsPerPartition")
        self.min_partitions = positive_int(options, "minPartitions")
        self.ranges_per_task = positive_int(options, "rangesPerTask") or 4
        self.poll_timeout_s = (positive_float(options, "kafkaConsumer.pollTimeoutMs") or 120_000) / 1000
        self.plan: ReadPlan | None = None
        self.max_records_per_second = positive_float(options, "maxRecordsPerSecond")
        self.max_bytes_per_second = positive_float(options, "maxBytesPerSecond")
        self.rate_limit_id = lower_keys(options).get("ratelimitid") or uuid.uuid4().hex
        self.rate_limit_dir = lower_keys(options).get("ratelimitdir")

    def _plan(self) -> ReadPlan:
        given = lower_keys(self.options).get("plan")
        if given:
            return ReadPlan.from_json(given)
        return resolve(self.conf, parse_spark_options(self.options))

    def partitions(self) -> Sequence[InputPartition]:
        given = lower_keys(self.options).get("ranges")
        if given:
            # exact chunks from a caller that planned already (a backfill's work units): each
            # one is read whole by one task, never re-split
            chunks = [OffsetRange.from_dict(d) for d in json.loads(given)]
        else:
            self.plan = self._plan()
            chunks = self.plan.chunks(self.max_records, self.min_partitions)
        tasks = group_for_tasks(chunks, self.ranges_per_task, self.min_partitions)
        return [RangesPartition(t) for t in tasks]

    def read(self, partition: InputPartition | None) -> Iterator[pa.RecordBatch]:
        if partition is None:  # Spark's one placeholder task when the plan has nothing to read
            return
        ranges = getattr(partition, "ranges", None) or [OffsetRange.from_dict(d) for d in partition.value]
        batches = fetch_ranges(
            self.conf,
            ranges,
            self.include_headers,
            self.poll_timeout_s,
            batch_messages=self._batch_size(),
            pacer=self._pacer(),
        )
        report_to = lower_keys(self.options).get(PROGRESS_OPTION.lower())
        if report_to is None:
            yield from batches
            return
        yield from _reported(batches, ranges, ProgressAddress.from_json(report_to))

    def _pacer(self) -> Pacer | None:
        """A job-wide read limit: the driver's budget when it serves one (a cluster, see
        ``pace_server``), else shared by every task on this host (see ``ratelimit``)."""
        if self.max_records_per_second is None and self.max_bytes_per_second is None:
            return None
        served = lower_keys(self.options).get("ratelimitserver")
        if served:
            return RemotePacer(PaceAddress.from_json(served))

        limit = RateLimit(self.max_records_per_second, self.max_bytes_per_second)
        folder = Path(self.rate_limit_dir) if self.rate_limit_dir else default_state_dir()
        return SharedFilePacer(limit, shared_state_path(folder, f"read-{self.rate_limit_id}"))

    def _batch_size(self) -> int:
        if self.max_records_per_second is None:
            return BATCH_MESSAGES
        # a response is paid for as a whole: keep it to a small slice of a second's quota
        return max(1, min(BATCH_MESSAGES, int(self.max_records_per_second / 20)))


def _reported(
    batches: Iterator[pa.RecordBatch], ranges: Sequence[OffsetRange], address: ProgressAddress
) -> Iterator[pa.RecordBatch]:
    """``batches`` as they are, while the records read of each range (a backfill's work unit,
    keyed by its id ``topic/partition/start-end``) go to the driver (``progressTo``)."""
    ids = {(r.topic, r.partition): f"{r.topic}/{r.partition}/{r.start}-{r.end}" for r in ranges}
    only = next(iter(ids.values())) if len(ids) == 1 else None
    with TaskReporter(address) as reporter:
        for batch in batches:
            if only is not None:
                reporter.add(only, batch.num_rows)
            else:
                for tp, n in partition_counts(batch).items():
                    if tp in ids:
                        reporter.add(ids[tp], n)
            yield batch
