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
host shares with working locks.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from rewind.errors import ConfigError, RewindError
from rewind.spark.ratelimit import (
    LocalPacer,
    Pacer,
    RateLimit,
    SharedFilePacer,
    default_state_dir,
    remove_shared_state,
    shared_state_path,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message, Producer
    from pyspark.sql.types import DataType, StructType

log = logging.getLogger(__name__)

FORMAT_NAME = "rewind-kafka"
WRITE_ONLY_FORMAT_NAME = "rewind-kafka-w"

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "linger.ms": 20,
    "queue.buffering.max.messages": 200_000,
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
}
"""Producer settings Rewind picks over librdkafka's; any ``kafka.*`` option overrides them."""

TRANSACTIONAL_DEFAULTS: dict[str, Any] = {"transaction.timeout.ms": 600_000}

_SLICE_ROWS = 10_000  # rows produced between two polls of the delivery queue
_TRANSACTION_CALL_TIMEOUT_S = 60.0  # a broker that cannot init/commit in a minute fails the task
_KNOWN_COLUMNS = ("topic", "key", "value", "headers", "partition", "timestamp")


class KafkaWriteError(RewindError):
    """Kafka refused records, or the producer failed; the task (and so the job) fails."""


# ---------------------------------------------------------------------------------------
# options and schema, checked on the driver before any task starts


@dataclass(frozen=True)
class WriterOptions:
    """The writer's options, parsed and checked once on the driver."""

    producer_conf: dict[str, Any]
    topic: str | None = None
    transactional: bool = False
    transactional_id_prefix: str | None = None
    limit: RateLimit = field(default_factory=RateLimit)
    num_tasks: int | None = None
    rate_limit_dir: str | None = None
    summary_path: str | None = None
    ignore_extra_columns: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriterOptions:
        """Parse Spark's (case-insensitive) options; a bad one is a :class:`ConfigError`."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        kafka = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        if not kafka.get("bootstrap.servers", "").strip():
            raise ConfigError(
                "option kafka.bootstrap.servers is required for format "
                f"{FORMAT_NAME!r}: .option('kafka.bootstrap.servers', 'host:9092')"
            )
        transactional = _bool_option(opts, "transactional", False)
        prefix = opts.get("transactionalidprefix") or None
        run_id = opts.get("runid") or None
        if transactional and prefix is None:
            if run_id is None:
                raise ConfigError(
                    "option transactional=true needs option runId or transactionalIdPrefix: "
                    "transactional ids must be stable across task retries and differ between runs"
                )
            prefix = f"rewind-{run_id}"
        producer_conf: dict[str, Any] = {**PRODUCER_DEFAULTS}
        if transactional:
            producer_conf.update(TRANSACTIONAL_DEFAULTS)
        producer_conf.update(kafka)
        if "transactional.id" in kafka:
            raise ConfigError(
                "option kafka.transactional.id is set per task by Rewind; use transactional=true "
                "with runId or transactionalIdPrefix instead"
            )
        try:
            limit = RateLimit(
                _float_option(opts, "maxrecordspersecond"), _float_option(opts, "maxbytespersecond")
            )
        except ValueError as exc:
            raise ConfigError(f"bad rate limit option: {exc}") from None
        num_tasks = _float_option(opts, "numtasks")
        if num_tasks is not None and (num_tasks < 1 or num_tasks != int(num_tasks)):
            raise ConfigError(f"option numTasks must be a positive integer, got {opts['numtasks']!r}")
        return cls(
            producer_conf=producer_conf,
            topic=opts.get("topic") or None,
            transactional=transactional,
            transactional_id_prefix=prefix,
            limit=limit,
            num_tasks=None if num_tasks is None else int(num_tasks),
            rate_limit_dir=opts.get("ratelimitdir") or None,
            summary_path=opts.get("summarypath") or None,
            ignore_extra_columns=_bool_option(opts, "ignoreextracolumns", False),
        )


def _bool_option(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, got {raw!r}")


def _float_option(opts: Mapping[str, str], name: str) -> float | None:
    raw = opts.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"option {name} must be a number, got {raw!r}") from None


TimestampKind = Literal["none", "timestamp", "seconds"]


@dataclass(frozen=True)
class RecordLayout:
    """Which of Spark's Kafka sink columns the DataFrame has (checked on the driver)."""

    topic_column: bool
    key: bool
    headers: bool
    partition: bool
    timestamp: TimestampKind

    @classmethod
    def from_schema(cls, schema: StructType, options: WriterOptions) -> RecordLayout:
        """Check the DataFrame's columns against Spark's Kafka sink rules."""
        from pyspark.sql.types import (
            ArrayType,
            BinaryType,
            ByteType,
            DoubleType,
            IntegerType,
            ShortType,
            StringType,
            StructType,
            TimestampType,
        )

        fields = {f.name: f.dataType for f in schema.fields}
        extra = [name for name in fields if name not in _KNOWN_COLUMNS]
        if extra and not options.ignore_extra_columns:
            raise ConfigError(
                f"column(s) {', '.join(map(repr, extra))} cannot be written to Kafka; the writer "
                f"takes only {', '.join(_KNOWN_COLUMNS)} (select those columns, or set option "
                "ignoreExtraColumns=true)"
            )

        def check(name: str, allowed: tuple[type, ...], wanted: str) -> DataType | None:
            dtype = fields.get(name)
            if dtype is not None and not isinstance(dtype, allowed):
                raise ConfigError(f"column {name!r} has type {dtype.simpleString()}; it must be {wanted}")
            return dtype

        if "value" not in fields:
            raise ConfigError("required column 'value' (binary or string) not found")
        check("value", (BinaryType, StringType), "binary or string")
        check("key", (BinaryType, StringType), "binary or string")
        check("partition", (IntegerType, ShortType, ByteType), "int")
        ts = check("timestamp", (TimestampType, DoubleType), "timestamp or double (seconds)")
        topic = check("topic", (StringType,), "string")
        if options.topic is None and topic is None:
            raise ConfigError("no topic: set option topic, or give the DataFrame a string column 'topic'")
        headers = fields.get("headers")
        if headers is not None:
            element = headers.elementType if isinstance(headers, ArrayType) else None
            names = [f.name for f in element.fields] if isinstance(element, StructType) else []
            ok = (
                isinstance(element, StructType)
                and names == ["key", "value"]
                and isinstance(element["key"].dataType, StringType)
                and isinstance(element["value"].dataType, (BinaryType, StringType))
            )
            if not ok:
                raise ConfigError(
                    f"column 'headers' has type {headers.simpleString()}; it must be "
                    "array<struct<key: string, value: binary>>"
                )
        timestamp: TimestampKind = "none"
        if ts is not None:
            timestamp = "seconds" if isinstance(ts, DoubleType) else "timestamp"
        return cls(
            topic_column=topic is not None and options.topic is None,
            key="key" in fields,
            headers=headers is not None,
            partition="partition" in fields,
            timestamp=timestamp,
        )


# ---------------------------------------------------------------------------------------
# commit messages and the job summary


@dataclass
class KafkaWriteCommitMessage(WriterCommitMessage):
    """What one task wrote; sent to the driver's ``commit``."""

    partition_id: int
    attempt: int
    records: int
    bytes: int
    seconds: float
    transactional_id: str | None = None
    throttled_seconds: float = 0.0


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


# ---------------------------------------------------------------------------------------
# the writer


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
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        attempt = context.attemptNumber() if context is not None else 0
        transactional_id = None
        if self.options.transactional:
            transactional_id = f"{self.options.transactional_id_prefix}-{partition_id}"
        task = _WriteTask(self.options, self.layout, self._pacer(), transactional_id)
        return task.run(iterator, partition_id, attempt)

    def _pacer(self) -> Pacer | None:
        limit = self.options.limit
        if limit.unlimited:
            return None
        if self.options.num_tasks is not None:
            return LocalPacer(limit.share(self.options.num_tasks))
        if self.options.rate_limit_dir is None and socket.gethostname() != self.planner_host:
            raise ConfigError(
                f"maxRecordsPerSecond/maxBytesPerSecond are shared through files on host "
                f"{self.planner_host}, but this task runs on {socket.gethostname()}; set option "
                "numTasks (the cap is split evenly) or rateLimitDir (a directory all hosts share)"
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


# ---------------------------------------------------------------------------------------
# one task


class _WriteTask:
    """One task's producer and its bookkeeping.

    Steps of :meth:`run`, in order:

    1. On the first non-empty batch create the producer; in transactional mode
       ``init_transactions`` (fencing a zombie with the same id) and ``begin_transaction``.
    2. Produce every row, pacing chunks through the rate limiter if there is one, polling
       the delivery queue between slices; stop at the first refused record.
    3. Flush until the queue is empty; fail if any record was refused or is left over.
    4. In transactional mode ``commit_transaction``.
    On any failure: purge what is queued, abort the transaction, raise. Finally: close.
    """

    def __init__(
        self,
        options: WriterOptions,
        layout: RecordLayout,
        pacer: Pacer | None,
        transactional_id: str | None,
    ) -> None:
        self.options = options
        self.layout = layout
        self.pacer = pacer
        self.transactional_id = transactional_id
        self.producer: Producer | None = None
        self.failures: list[tuple[KafkaError, str, int]] = []
        self.failed_count = 0
        self.fatal: KafkaError | None = None
        self.records = 0
        self.bytes = 0
        self.throttled = 0.0
        self.in_transaction = False

    def run(
        self, iterator: Iterator[pa.RecordBatch], partition_id: int, attempt: int
    ) -> KafkaWriteCommitMessage:
        started = time.monotonic()
        ok = False
        try:
            for batch in iterator:
                if batch.num_rows:
                    self._write_batch(batch)
            self._finish()
            ok = True
        except BaseException:
            self._fail()
            raise
        finally:
            self._close(ok)
        return KafkaWriteCommitMessage(
            partition_id=partition_id,
            attempt=attempt,
            records=self.records,
            bytes=self.bytes,
            seconds=round(time.monotonic() - started, 3),
            transactional_id=self.transactional_id,
            throttled_seconds=round(self.throttled, 3),
        )

    # -- producer life -----------------------------------------------------------------

    def _open(self) -> Producer:
        from confluent_kafka import KafkaException

        from rewind.kafka.clients import producer

        conf: dict[str, Any] = {
            **self.options.producer_conf,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
        }
        if self.transactional_id is not None:
            conf["transactional.id"] = self.transactional_id
        try:
            self.producer = producer(conf)
        except KafkaException as exc:
            raise ConfigError(f"bad kafka.* option for the producer: {exc.args[0].str()}") from None
        if self.transactional_id is not None:
            init = self.producer.init_transactions
            self._transaction_step("init_transactions", lambda: init(_TRANSACTION_CALL_TIMEOUT_S))
            self._transaction_step("begin_transaction", self.producer.begin_transaction)
            self.in_transaction = True
        return self.producer

    def _transaction_step(self, name: str, step: Callable[[], None]) -> None:
        from confluent_kafka import KafkaException

        try:
            step()
        except KafkaException as exc:
            raise KafkaWriteError(
                f"{name} failed for transactional id {self.transactional_id}: {exc.args[0].str()}"
            ) from exc

    def _finish(self) -> None:
        producer = self.producer
        if producer is None:
            return  # nothing to write: no producer was ever needed
        while len(producer) > 0:
            producer.flush(1.0)
            self._raise_failures()
        self._raise_failures()
        if self.in_transaction:
            self._transaction_step(
                "commit_transaction", lambda: producer.commit_transaction(_TRANSACTION_CALL_TIMEOUT_S)
            )
            self.in_transaction = False

    def _fail(self) -> None:
        producer = self.producer
        if producer is None:
            return
        try:
            producer.purge()
            producer.poll(0)
            if self.in_transaction:
                producer.abort_transaction(_TRANSACTION_CALL_TIMEOUT_S)
                self.in_transaction = False
        except Exception as exc:  # the original error matters more; the broker times it out
            log.warning("could not abort transaction %s: %s", self.transactional_id, exc)

    def _close(self, ok: bool) -> None:
        producer, self.producer = self.producer, None
        if producer is None:
            return
        if not ok:
            producer.purge()
        producer.flush(0 if not ok else 5.0)
        producer.close()

    # -- callbacks (served from poll/flush in this thread) ------------------------------

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed_count += 1
            if len(self.failures) < 5:
                partition = msg.partition()
                self.failures.append((err, msg.topic() or "?", -1 if partition is None else partition))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        else:
            log.debug("producer: %s", err.str())

    def _raise_failures(self) -> None:
        if self.fatal is not None:
            raise KafkaWriteError(f"Kafka producer failed: {self.fatal.str()} ({self.fatal.name()})")
        if not self.failures:
            return
        err, topic, partition = self.failures[0]
        where = f"topic {topic} partition {partition if partition >= 0 else '(any)'}"
        raise KafkaWriteError(
            f"Kafka refused {self.failed_count} record(s); first: {where}: {err.str()} ({err.name()})"
        )

    # -- producing ---------------------------------------------------------------------

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        producer = self.producer or self._open()
        sizes = _row_sizes(batch, self.layout)
        if self.pacer is None:
            chunk = _SLICE_ROWS
        else:
            chunk = min(_SLICE_ROWS, self.options.limit.chunk_rows(pc.sum(sizes).as_py() / batch.num_rows))
        for offset in range(0, batch.num_rows, chunk):
            part = batch.slice(offset, chunk)
            nbytes = pc.sum(sizes.slice(offset, chunk)).as_py() or 0
            if self.pacer is not None:
                self.throttled += self.pacer.acquire(part.num_rows, nbytes, self._wait)
            self._produce_rows(producer, part)
            self.records += part.num_rows
            self.bytes += nbytes
            producer.poll(0)
            self._raise_failures()

    def _wait(self, seconds: float) -> None:
        assert self.producer is not None
        self.producer.poll(min(seconds, 0.1))
        self._raise_failures()

    def _produce_rows(self, producer: Producer, batch: pa.RecordBatch) -> None:
        """The hot loop: one ``produce`` per row over per-column Python lists."""
        from confluent_kafka import KafkaException

        layout = self.layout
        values = _pylist(batch.column("value"))
        keys: Iterable[Any] = _pylist(batch.column("key")) if layout.key else repeat(None)
        topics: Iterable[Any] = (
            _pylist(batch.column("topic")) if layout.topic_column else repeat(self.options.topic)
        )
        if layout.topic_column and batch.column("topic").null_count:
            raise KafkaWriteError(
                "null topic present in the data; use the topic option for setting a default topic"
            )
        produce = producer.produce
        call: Callable[..., None]
        if not (layout.partition or layout.timestamp != "none" or layout.headers):
            rows: Iterable[tuple[Any, ...]] = zip(topics, values, keys, strict=False)
            call = produce
        else:
            rows = zip(
                topics,
                values,
                keys,
                _partitions(batch) if layout.partition else repeat(-1),
                _timestamps(batch, layout.timestamp) if layout.timestamp != "none" else repeat(0),
                _headers(batch) if layout.headers else repeat(None),
                strict=False,
            )

            def call(topic: str, value: Any, key: Any, partition: int, ts: int, headers: Any) -> None:
                produce(topic, value, key, partition, timestamp=ts, headers=headers)

        for args in rows:
            try:
                call(*args)
            except BufferError:
                self._produce_when_room(call, args)
            except KafkaException as exc:
                raise self._refused(args, exc) from exc

    def _produce_when_room(self, call: Callable[..., None], args: tuple[Any, ...]) -> None:
        """The local queue is full: serve deliveries until the record fits."""
        from confluent_kafka import KafkaException

        assert self.producer is not None
        while True:
            self.producer.poll(0.05)
            self._raise_failures()
            try:
                call(*args)
                return
            except BufferError:
                continue
            except KafkaException as exc:
                raise self._refused(args, exc) from exc

    def _refused(self, args: tuple[Any, ...], exc: Exception) -> KafkaWriteError:
        err = exc.args[0] if exc.args else exc
        text = err.str() if hasattr(err, "str") else str(err)
        partition = args[3] if len(args) > 3 and args[3] >= 0 else "(any)"
        return KafkaWriteError(f"Kafka refused a record for topic {args[0]} partition {partition}: {text}")


def _pylist(column: pa.Array) -> list[Any]:
    """A column as a Python list, 5-20x faster than ``to_pylist`` (which builds a scalar per value).

    Only for columns whose nulls should become ``None`` (strings, binaries) or that have none.
    """
    return column.to_numpy(zero_copy_only=False).tolist()


def _row_sizes(batch: pa.RecordBatch, layout: RecordLayout) -> pa.Array:
    """Bytes of each row as Kafka counts payload: key + value + header keys and values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = pc.fill_null(pc.binary_length(batch.column("value")), 0).cast(pa.int64())
    if layout.key:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(batch.column("key")), 0))
    if layout.headers:
        import numpy as np

        # per-row sums of a list column: differences of a running total at the list offsets
        headers = batch.column("headers")
        offsets = headers.offsets.to_numpy()
        entries = headers.values.slice(offsets[0], offsets[-1] - offsets[0])
        per_header = pc.add(
            pc.fill_null(pc.binary_length(entries.field("key")), 0),
            pc.fill_null(pc.binary_length(entries.field("value")), 0),
        ).to_numpy(zero_copy_only=False)
        running = np.concatenate(([0], np.cumsum(per_header, dtype=np.int64)))
        rebased = offsets - offsets[0]
        sizes = pc.add(sizes, pa.array(running[rebased[1:]] - running[rebased[:-1]]))
    return sizes


def _partitions(batch: pa.RecordBatch) -> list[int]:
    import pyarrow.compute as pc

    return _pylist(pc.fill_null(batch.column("partition"), -1))


def _timestamps(batch: pa.RecordBatch, kind: TimestampKind) -> list[int]:
    """Record timestamps in epoch ms; 0 (librdkafka: "now") where the column is null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = batch.column("timestamp")
    if kind == "seconds":
        millis = pc.floor(pc.multiply(column, 1000.0)).cast(pa.int64())
    else:
        millis = column.cast(pa.timestamp("ms", column.type.tz), safe=False).cast(pa.int64())
    low = pc.min(millis).as_py()
    if low is not None and low < 0:
        raise KafkaWriteError(f"timestamp before 1970 ({low} ms) cannot be a Kafka record timestamp")
    return _pylist(pc.fill_null(millis, 0))


def _headers(batch: pa.RecordBatch) -> list[list[tuple[str, Any]] | None]:
    return [
        None if row is None else [(h["key"], h["value"]) for h in row]
        for row in batch.column("headers").to_pylist()
    ]
