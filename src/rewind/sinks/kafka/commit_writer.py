"""One commit of the Kafka topic sink: produce a wave's Parquet files and its marker.

The order of the steps and why they make the topic exactly-once per unit is in
:mod:`rewind.sinks.kafka.sink`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.arrow import schema_from_b64
from rewind.core.store import filesystem
from rewind.kafka.producer import TransactionalProducer
from rewind.sinks.kafka.avro_target import values_of
from rewind.sinks.kafka.avro_values import SOURCE_COLUMNS
from rewind.sinks.kafka.bookkeeping import (
    TXN_CALL_TIMEOUT_S,
    KafkaStaging,
    bookkeeping_partition,
    read_log,
    short_error,
    transactional_id,
)
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.records import H_EVENT_ID, H_RUN_ID, RecordEncoder, decode_records

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Producer

    from rewind.sinks.kafka.avro_values import AvroValues
    from rewind.sinks.kafka.records import EncodedBatch

log = logging.getLogger(__name__)


PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "linger.ms": 20,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
    "transaction.timeout.ms": 600_000,
}
"""The commit producer's settings; any ``kafka.properties`` of the settings override them."""
_BATCH_ROWS = 20_000


class CommitWriter:
    """The producer of one commit and its bookkeeping (see :meth:`KafkaTopicSink.commit`)."""

    def __init__(self, conf: dict[str, Any], key: list[str], staging: KafkaStaging, run_id: str) -> None:
        """``conf`` and ``key`` are the sink's (its client settings and the output's key columns)."""
        self.key = key
        self.staging = staging
        self.run_id = run_id
        self.schema = schema_from_b64(staging.schema_b64)
        self.txn = TransactionalProducer(
            {**PRODUCER_DEFAULTS, **conf},
            transactional_id=transactional_id(run_id) if staging.transactional else None,
            error=KafkaSinkError,
            call_timeout_s=TXN_CALL_TIMEOUT_S,
            keep_failures=3,
            topic=staging.topic,
        )

    @property
    def producer(self) -> Producer:
        assert self.txn.client is not None, "open() first"
        return self.txn.client

    def open(self) -> None:
        self.txn.open()

    def begin(self) -> None:
        self.txn.begin()

    def commit(self) -> None:
        self.txn.commit()

    def abort(self) -> None:
        self.txn.abort()

    def close(self) -> None:
        self.txn.close()

    def raise_failures(self) -> None:
        self.txn.raise_failures(what=f" for {self.staging.topic}")

    def _when_full(self, topic: str, value: Any, key: Any, partition: int, **kwargs: Any) -> None:
        while True:
            self.producer.poll(0.05)
            self.raise_failures()
            try:
                self.producer.produce(topic, value, key, partition, **kwargs)
                return
            except BufferError:
                continue

    def produce_files(self, files: list[str], skipped_units: list[str], present: set[str]) -> tuple[int, int]:
        """Produce every row not of ``skipped_units`` and not ``present``; (rows, produced)."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaException


        producer = self.producer
        avro = values_of(self.staging.value_format, self.schema)
        if avro is not None:
            check_files(files, avro)  # a value the schema cannot hold: refused before anything is produced
        encoder = RecordEncoder(self.schema, self.key, avro.encode if avro is not None else None)
        same = self.staging.same_partition_topics
        rows = produced = 0
        for path in sorted(files, key=_source_order):
            for batch in _batches(path, self.schema):
                mask = _outside_units(batch, skipped_units)
                if mask is not None:
                    batch = batch.filter(mask)
                if batch.num_rows == 0:
                    continue
                with _gc_paused():
                    encoded = encoder.encode(batch)
                    partitions = target_partitions(batch, encoded, same)
                    keep = [e not in present for e in encoded.event_ids] if present else None
                    try:
                        produced += encoder.produce(
                            encoded, producer.produce, self._when_full, self.staging.topic, partitions, keep
                        )
                    except KafkaException as exc:  # refused before sending: too large, unknown partition
                        raise KafkaSinkError(
                            f"Kafka refused a record of {path} for {self.staging.topic}: {short_error(exc)}"
                        ) from exc
                    del encoded
                rows += batch.num_rows
                producer.poll(0)
                self.raise_failures()
                faults.point("kafka-commit-mid-produce")
        return rows, produced

    def produce_marker(self, key: str, marker: dict[str, Any]) -> None:
        self.producer.produce(
            self.staging.bookkeeping,
            json.dumps(marker, sort_keys=True).encode(),
            key.encode(),
            partition=bookkeeping_partition(self.run_id),
        )

    def flush(self) -> None:
        self.txn.flush()


def target_partitions(batch: pa.RecordBatch, encoded: EncodedBatch, same: frozenset[str]) -> list[int]:
    """The source partition for rows of a topic with as many partitions; -1 (by key) otherwise."""
    # lazy: avoids pyarrow at import
    import pyarrow.compute as pc

    topics = set(pc.unique(batch.column("_rewind_source_topic")).to_pylist())
    if topics <= same:
        return encoded.source_partitions
    if not topics & same:
        return [-1] * len(encoded)
    return [
        p if t in same else -1 for t, p in zip(encoded.source_topics, encoded.source_partitions, strict=True)
    ]


def event_ids_in(
    conf: dict[str, Any], topic: str, run_id: str, starts: dict[int, int], ends: dict[int, int]
) -> set[str]:
    """Event ids of ``run_id``'s records in the given ranges of the topic."""
    wanted = run_id.encode()
    found: set[str] = set()
    begin = {p: min(starts.get(p, 0), ends[p]) for p in ends}
    for msg in read_log(conf, topic, begin, ends):
        run: Any = None
        eid: Any = None
        for header in msg.headers() or ():
            if header[0] == H_RUN_ID:
                run = header[1]
            elif header[0] == H_EVENT_ID:
                eid = header[1]
        if run == wanted and eid is not None:
            found.add(eid.decode() if isinstance(eid, bytes) else str(eid))
    if found:
        log.info("%d records of run %s are already in %s (an interrupted commit)", len(found), run_id, topic)
    return found


class DecodeRecords:
    """The ``mapInArrow`` function of :meth:`KafkaTopicSink.read` (plain data: it is pickled)."""

    def __init__(self, schema_b64: str, run_id: str, value_format: dict[str, Any] | None = None) -> None:
        self.schema_b64 = schema_b64
        self.run_id = run_id
        self.value_format = value_format

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        schema = schema_from_b64(self.schema_b64)
        avro = values_of(self.value_format, schema)
        for batch in batches:
            yield decode_records(batch, schema, self.run_id, avro.decode if avro is not None else None)


def check_files(files: list[str], avro: AvroValues) -> None:
    """Check every value of the files the Avro schema must check one by one (nulls where the
    field has none, enum symbols, fixed sizes, nested values); Parquet statistics spare reading
    a column whose null count is known to be 0."""
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq

    nullable_not, by_value = avro.checked_columns()
    for path in files:
        fs, inner = filesystem(path)
        with fs.open_input_file(inner) as handle:
            parquet = pq.ParquetFile(handle)
            names = parquet.schema_arrow.names
            read = [c for c in by_value if c in names]
            read += [c for c in nullable_not if c in names and c not in read and _nulls_possible(parquet, c)]
            if not read:
                continue
            columns = read + [c for c in SOURCE_COLUMNS if c in names]
            for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
                avro.check(batch)


def _nulls_possible(parquet: Any, column: str) -> bool:
    """False when every row group's statistics say the column has no null."""
    meta = parquet.metadata
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if column not in names:
        return True  # a nested column: several leaves, read it
    index = names.index(column)
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            return True
    return False


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the produce loop allocates millions of header lists
    that are freed by reference counting anyway, and collections over them cost about a third
    of the loop (measured)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _batches(path: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq

    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=_BATCH_ROWS):
            yield batch.select(schema.names).cast(schema) if batch.schema != schema else batch


def _source_order(path: str) -> tuple[str, int, int]:
    """(topic, partition, first offset) of a unit's file, from the Parquet statistics."""
    # lazy: avoids pyarrow at import
    import pyarrow.parquet as pq

    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        meta = pq.ParquetFile(handle).metadata
        if meta.num_row_groups == 0:
            return ("", -1, -1)
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        group = meta.row_group(0)

        def low(name: str) -> Any:
            stats = group.column(names.index(name)).statistics if name in names else None
            return stats.min if stats is not None and stats.has_min_max else None

        topic = low("_rewind_source_topic")
        partition = low("_rewind_source_partition")
        offset = low("_rewind_source_offset")
    topic_text = topic.decode() if isinstance(topic, bytes) else str(topic or "")
    return (
        topic_text,
        int(partition if partition is not None else -1),
        int(offset if offset is not None else -1),
    )


def _outside_units(batch: pa.RecordBatch, unit_ids: list[str]) -> pa.Array | None:
    """Mask of rows whose source offset is in none of ``unit_ids`` (None: no unit to leave out)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    if not unit_ids:
        return None
    inside = pa.array([False] * batch.num_rows)
    for uid in unit_ids:
        topic, partition, start, end = _parse_unit(uid)
        hit = pc.and_(
            pc.and_(
                pc.equal(batch.column("_rewind_source_topic"), topic),
                pc.equal(batch.column("_rewind_source_partition"), partition),
            ),
            pc.and_(
                pc.greater_equal(batch.column("_rewind_source_offset"), start),
                pc.less(batch.column("_rewind_source_offset"), end),
            ),
        )
        inside = pc.or_(inside, hit)
    return pc.invert(inside)


def _parse_unit(unit_id: str) -> tuple[str, int, int, int]:
    """``"<topic>/<partition>/<start>-<end>"`` (a topic name has no ``/``)."""
    topic, partition, span = unit_id.rsplit("/", 2)
    start, end = span.split("-", 1)
    return topic, int(partition), int(start), int(end)


def remove_file(uri: str) -> None:
    try:
        fs, inner = filesystem(uri)
        fs.delete_file(inner)
    except Exception as exc:  # a leftover spool file is harmless; cleanup removes the folder
        log.debug("could not remove %s: %s", uri, exc)
