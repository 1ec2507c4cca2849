"""The Kafka writer of the ``rewind-kafka`` data source: Spark DataFrames into Kafka topics.

It follows Spark's own Kafka sink so that a job written for Spark's connector runs by
changing only the format name::

    df.write.format("rewind-kafka") \\
        .option("kafka.bootstrap.servers", "host:9092") \\
        .option("topic", "orders-backfill") \\
        .mode("append").save()

Columns (as in Spark's sink): ``value`` (binary or string, required, null = tombstone),
``key`` (binary or string), ``topic`` (string; the ``topic`` option wins over it),
``headers`` (``array<struct<key: string, value: binary>>``), ``partition`` (int; null lets
the partitioner choose), ``timestamp`` (timestamp, or double seconds; null = produce time).
Any other column is an error naming it, because a misspelt ``heders`` would otherwise be
dropped silently (Spark's sink ignores extra columns; option ``ignoreExtraColumns=true``
restores that).

Options (case-insensitive):

* ``kafka.bootstrap.servers`` (required) and any ``kafka.<librdkafka property>``: passed to
  the producer without the prefix, e.g. ``kafka.compression.type=lz4``,
  ``kafka.security.protocol``. Rewind's producer defaults: ``enable.idempotence=true``,
  ``linger.ms=20``, ``partitioner=murmur2_random`` (the Java client's key hashing, so a
  key lands in the same partition as in live traffic produced by JVM clients),
  ``delivery.report.only.error=true``.
* ``topic``: the topic of every record.
* ``transactional`` (``false``): each task writes its whole output in one Kafka
  transaction, committed only when every record is acknowledged. Needs ``runId`` or
  ``transactionalIdPrefix``; the transactional id is ``<prefix>-<partition id>``, so a
  retried task (same partition id) fences its zombie with ``init_transactions`` and a run
  with another id can never interleave with this one. ``kafka.transaction.timeout.ms``
  defaults to 600000 (a task's output must be committed within it).
* ``maxRecordsPerSecond``, ``maxBytesPerSecond``: a cap for the whole job (bytes are key
  + value + header bytes), see below.
* ``numTasks``: split the cap evenly over this many tasks instead of sharing it on one host.
* ``rateLimitDir``: directory of the shared pacing state (default: a temp directory).
* ``rateLimitServer``: where the driver serves the job's budget on a cluster (the JSON of
  :class:`~rewind.spark.pace_server.PaceAddress`); wins over the two above.
* ``summaryPath``: on success the driver writes the job's totals there as JSON.
* ``ignoreExtraColumns`` (``false``): ignore unknown columns like Spark's sink does.

Delivery: a record that Kafka refuses fails its task with the broker's error, the topic
and the partition; nothing is retried silently beyond librdkafka's own retries (which the
idempotent producer makes duplicate-free). Without ``transactional`` the records of failed
or retried tasks that did reach Kafka stay there (at least once, like Spark's sink); with
it, consumers reading ``read_committed`` see each task's output once or not at all. The
job as a whole is never atomic: tasks that finished stay committed when another fails.

Rate limit: Spark gives a writer no count of its tasks and runs each in its own Python
process, so by default the cap is a pacing state shared through a file under ``flock``
(see :mod:`rewind.spark.ratelimit`). That is exact for ``local[*]``, where every task runs
on the driver's host; a task on another host refuses to run rather than silently exceed
the cap, unless ``numTasks`` is given (each task then gets cap / numTasks: never above the
cap, below it when fewer tasks run at once) or ``rateLimitDir`` names a directory every
host shares with working locks. On a cluster the exact way is the driver's budget, the one a
backfill's reads use: every task asks it before each chunk it sends, whatever host it runs on
(Spark gives a data source no driver-side hook to open it, so the caller does)::

    from rewind.spark.pace_server import PACE_OPTION, pace_server_for
    from rewind.spark.ratelimit import RateLimit

    with pace_server_for(spark, RateLimit(50_000)) as pace:  # None on local[*]
        w = df.write.format("rewind-kafka").option("maxRecordsPerSecond", "50000")  # ...
        (w.option(PACE_OPTION, pace.to_json()) if pace else w).mode("append").save()
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from rewind.errors import ConfigError
from rewind.spark.kafka_write_options import FORMAT_NAME, RecordLayout, WriterOptions
from rewind.spark.kafka_write_task import KafkaWriteCommitMessage, WriteTask
from rewind.spark.pace_server import PaceAddress, RemotePacer
from rewind.spark.ratelimit import (
    LocalPacer,
    Pacer,
    SharedFilePacer,
    default_state_dir,
    remove_shared_state,
    shared_state_path,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)
WRITE_ONLY_FORMAT_NAME = "rewind-kafka-w"


@dataclass(frozen=True)
class KafkaWriteSummary:
    """Totals of a whole write job, aggregated on the driver."""

    tasks: int
    records: int
    bytes: int
    task_seconds: float
    throttled_seconds: float

    @classmethod
    def of(cls, messages: Iterable[WriterCommitMessage | None]) -> KafkaWriteSummary:
        done = [m for m in messages if isinstance(m, KafkaWriteCommitMessage)]
        return cls(
            tasks=len(done),
            records=sum(m.records for m in done),
            bytes=sum(m.bytes for m in done),
            task_seconds=round(sum(m.seconds for m in done), 3),
            throttled_seconds=round(sum(m.throttled_seconds for m in done), 3),
        )


class KafkaArrowWriter(DataSourceArrowWriter):
    """Writes Arrow record batches to Kafka, one idempotent (or transactional) producer per task.

    Built on the driver (where options and schema are checked), pickled to every task.
    Holds only plain data: the producer is created inside :meth:`write`, in the task's own
    Python worker, because Spark forks workers and librdkafka threads do not survive a fork.
    """

    def __init__(self, options: WriterOptions, layout: RecordLayout) -> None:
        self.options = options
        self.layout = layout
        self.job_id = uuid.uuid4().hex
        self.planner_host = socket.gethostname()

    # -- in each task ------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaWriteCommitMessage:
        """Produce every row of this task's batches; return counts once all are acknowledged."""
        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        attempt = context.attemptNumber() if context is not None else 0
        transactional_id = None
        if self.options.transactional:
            transactional_id = f"{self.options.transactional_id_prefix}-{partition_id}"
        task = WriteTask(self.options, self.layout, self._pacer(), transactional_id)
        return task.run(iterator, partition_id, attempt)

    def _pacer(self) -> Pacer | None:
        limit = self.options.limit
        if limit.unlimited:
            return None
        if self.options.rate_limit_server:
            return RemotePacer(PaceAddress.from_json(self.options.rate_limit_server))
        if self.options.num_tasks is not None:
            return LocalPacer(limit.share(self.options.num_tasks))
        if self.options.rate_limit_dir is None and socket.gethostname() != self.planner_host:
            raise ConfigError(
                f"maxRecordsPerSecond/maxBytesPerSecond are shared through files on host "
                f"{self.planner_host}, but this task runs on {socket.gethostname()}; set option "
                "rateLimitServer (the driver's budget, see rewind.spark.pace_server), numTasks (the cap "
                "is split evenly) or rateLimitDir (a directory all hosts share)"
            )
        directory = Path(self.options.rate_limit_dir) if self.options.rate_limit_dir else default_state_dir()
        return SharedFilePacer(limit, shared_state_path(directory, self.job_id))

    # -- on the driver -----------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: log the totals and write them to ``summaryPath`` if set."""
        summary = KafkaWriteSummary.of(messages)
        log.info(
            "kafka write done: %d records, %d bytes in %d tasks",
            summary.records,
            summary.bytes,
            summary.tasks,
        )
        self._forget_pacing()
        if self.options.summary_path:
            path = Path(self.options.summary_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(asdict(summary)))
            os.replace(tmp, path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed: say what the tasks that did finish left in Kafka."""
        summary = KafkaWriteSummary.of(messages)
        log.warning(
            "kafka write failed; %d finished tasks had already written %d records (%s)",
            summary.tasks,
            summary.records,
            "committed transactions" if self.options.transactional else "visible to consumers",
        )
        self._forget_pacing()

    def _forget_pacing(self) -> None:
        if not self.options.limit.unlimited and self.options.num_tasks is None:
            directory = (
                Path(self.options.rate_limit_dir) if self.options.rate_limit_dir else default_state_dir()
            )
            remove_shared_state(directory, self.job_id)


def make_writer(schema: StructType, overwrite: bool, options: Mapping[str, str]) -> KafkaArrowWriter:
    """The writer for ``DataSource.writer()``: options and columns are checked here, on the driver.

    Kafka topics are append-only, so ``mode("overwrite")`` is refused like Spark's sink does.
    """
    if overwrite:
        raise ConfigError(f"format {FORMAT_NAME!r} only appends to Kafka topics; use mode('append')")
    parsed = WriterOptions.parse(options)
    return KafkaArrowWriter(parsed, RecordLayout.from_schema(schema, parsed))


class KafkaWriteOnlySource(DataSource):
    """The writer alone as a data source (``rewind-kafka-w``), until the reader joins it."""

    @classmethod
    def name(cls) -> str:
        return WRITE_ONLY_FORMAT_NAME

    def writer(self, schema: StructType, overwrite: bool) -> KafkaArrowWriter:
        return make_writer(schema, overwrite, self.options)
