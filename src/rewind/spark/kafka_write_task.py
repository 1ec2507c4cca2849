"""One task of the ``rewind-kafka`` writer: produce an Arrow partition, transactionally or not."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import WriterCommitMessage

from rewind.errors import ConfigError
from rewind.kafka.producer import TransactionalProducer
from rewind.spark.kafka_write_options import KafkaWriteError, RecordLayout, TimestampKind, WriterOptions
from rewind.spark.ratelimit import (
    Pacer,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Producer

log = logging.getLogger(__name__)

_SLICE_ROWS = 10_000  # rows produced between two polls of the delivery queue
_TRANSACTION_CALL_TIMEOUT_S = 60.0  # a broker that cannot init/commit in a minute fails the task


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


class WriteTask:
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
        self.txn = TransactionalProducer(
            dict(options.producer_conf),
            transactional_id=transactional_id,
            error=KafkaWriteError,
            call_timeout_s=_TRANSACTION_CALL_TIMEOUT_S,
        )
        self.records = 0
        self.bytes = 0
        self.throttled = 0.0

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

    @property
    def producer(self) -> Producer | None:
        return self.txn.client

    def _open(self) -> Producer:
        """Steps 1-2 (see the class docstring): the producer, and the task's transaction."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaException

        try:
            producer = self.txn.open()
        except KafkaException as exc:
            raise ConfigError(f"bad kafka.* option for the producer: {exc.args[0].str()}") from None
        self.txn.begin()
        return producer

    def _finish(self) -> None:
        if self.txn.client is None:
            return  # nothing to write: no producer was ever needed
        self.txn.flush()
        self.txn.commit()

    def _fail(self) -> None:
        self.txn.abort()

    def _close(self, ok: bool) -> None:
        if self.txn.client is not None and not ok:
            self.txn.client.purge()
        self.txn.close(flush_s=5.0 if ok else 0.0)

    def _raise_failures(self) -> None:
        self.txn.raise_failures()

    # -- producing ---------------------------------------------------------------------

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        # lazy: avoids pyarrow at import
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
        # lazy: avoids confluent_kafka at import
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
        # lazy: avoids confluent_kafka at import
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
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    sizes = pc.fill_null(pc.binary_length(batch.column("value")), 0).cast(pa.int64())
    if layout.key:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(batch.column("key")), 0))
    if layout.headers:
        # lazy: avoids numpy at import
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
    # lazy: avoids pyarrow at import
    import pyarrow.compute as pc

    return _pylist(pc.fill_null(batch.column("partition"), -1))


def _timestamps(batch: pa.RecordBatch, kind: TimestampKind) -> list[int]:
    """Record timestamps in epoch ms; 0 (librdkafka: "now") where the column is null."""
    # lazy: avoids pyarrow at import
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
