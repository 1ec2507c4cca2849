"""Exactly once per work unit from Spark tasks: one Kafka transaction per unit, with its marker.

A re-produce (a table source, :mod:`rewind.tables`) produces from the tasks that read the rows,
in parallel, instead of handing Parquet files to the driver: each unit is one transaction of
its own transactional id, holding the unit's records and its commit marker in
``rewind.commits`` (the same marker :meth:`KafkaTopicSink.commit
<rewind.sinks.kafka.sink.KafkaTopicSink.commit>` writes, so reconcile, promotion and
``rewind show`` read both alike). Steps of one unit, in order:

1. open a producer with the unit's transactional id ``rewind-<run id>-u-<digest of the unit>``
   (the same on every attempt): ``init_transactions`` fences an earlier attempt of the unit
   (a retried task, the task of a killed driver) and aborts what it left open;
2. unless this is the unit's very first attempt (never attempted in the ledger, the Spark
   task's attempt 0), read the run's bookkeeping: a marker naming the unit means an earlier
   attempt committed it; nothing is produced and the marker's counts and quarantine files are
   handed back;
3. begin the transaction; produce the rows as they come, in key order, each with an explicit
   partition: the one the live producer picks for the record's key bytes
   (:mod:`rewind.kafka.partitioner`, ``sink.kafka.partitioner``), or, for a Kafka source
   (:mod:`rewind.sinks.kafka.task_load`), its source partition when the topic has as many
   partitions as its source topic, as the driver's commit places it;
4. flush, failing on any refused record; produce the marker (the unit, its counts, rows per
   partition, its quarantine files) and flush it;
5. commit the transaction: a ``read_committed`` consumer sees the unit's records and its marker
   together or not at all.

On any failure: abort (purging what is queued), close, raise. Per-key order holds because one
key is in one unit, read ``ORDER BY key`` and produced by one idempotent producer. A transaction
during which the producer lost every broker is aborted as soon as the writer sees it (producing
or flushing; nothing queued goes out to the broker once it is back), and one whose commit
failed is left to the next attempt (both :class:`~rewind.kafka.unit_redo.UnitInterrupted`):
the task writes the unit again, or finds its marker if that commit did land
(:mod:`rewind.kafka.unit_redo` says why).

On a broker whose ``read_committed`` shows aborted records (tansu 0.6, see ``rewind doctor``)
the records of an aborted attempt stay visible beside the committed retry; the run's marker
count is still exact.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.arrow import schema_from_b64
from rewind.kafka.clients import producer as make_producer
from rewind.kafka.partitioner import partitions_for
from rewind.kafka.producer import TransactionalProducer
from rewind.kafka.unit_redo import UnitInterrupted
from rewind.sinks.kafka.avro_fit import AvroSchemaMismatch
from rewind.sinks.kafka.avro_target import values_of
from rewind.sinks.kafka.bookkeeping import (
    TXN_CALL_TIMEOUT_S,
    KafkaStaging,
    bookkeeping_partition,
    now_iso,
    staged_run_log,
    units_digest,
)
from rewind.sinks.kafka.commit_writer import PRODUCER_DEFAULTS, target_partitions
from rewind.sinks.kafka.exceptions import KafkaSinkError, short_error
from rewind.sinks.kafka.records import RecordEncoder

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

QUARANTINE_FILES = "quarantine_files"
"""Key of a unit marker's ``extra``: the unit's quarantine Parquet files."""


def unit_transactional_id(run_id: str, unit_id: str) -> str:
    """The transactional id of one unit: stable across attempts, unique per run and unit."""
    return f"rewind-{run_id}-u-{hashlib.sha256(unit_id.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class CommittedUnit:
    """What an earlier attempt's marker says about a unit it committed."""

    unit_id: str
    counts: dict[str, Any]
    quarantine_files: list[str]
    rows: int


@dataclass(frozen=True)
class UnitWriter:
    """Plain data pickled to every task; :meth:`open` starts one unit there."""

    conf: dict[str, Any]
    staging: dict[str, Any]
    key: tuple[str, ...]
    partitioner: str = "murmur2"
    skip_partitions: tuple[int, ...] = ()

    def open(self, unit_id: str, first_attempt: bool = False) -> UnitSession:
        """Steps 1-3 of the module docstring; the session's ``done`` is set when the unit was
        committed already (and nothing may be produced). ``first_attempt``: no attempt of the
        unit can have committed, so the bookkeeping is not read."""
        session = UnitSession(self, KafkaStaging.from_dict(self.staging), unit_id)
        session.start(first_attempt)
        return session


@dataclass
class UnitSession:
    """One unit's transaction inside a task."""

    writer: UnitWriter
    staging: KafkaStaging
    unit_id: str
    done: CommittedUnit | None = None
    rows: int = 0
    per_partition: Counter[int] = field(default_factory=Counter)
    _txn: TransactionalProducer | None = None
    _encoder: RecordEncoder | None = None
    _avro: Any = None
    _started: float = 0.0

    def start(self, first_attempt: bool = False) -> None:
        self._started = time.monotonic()
        run_id = self.staging.run_id
        self._txn = TransactionalProducer(
            {**PRODUCER_DEFAULTS, **self.writer.conf},
            transactional_id=unit_transactional_id(run_id, self.unit_id),
            error=KafkaSinkError,
            call_timeout_s=TXN_CALL_TIMEOUT_S,
            keep_failures=3,
            topic=self.staging.topic,
        )
        try:
            self._txn.open()  # 1. fences an earlier attempt of this unit
            runlog = (
                None if first_attempt else staged_run_log(self.writer.conf, self.staging, run_id)
            )
            for marker in runlog.commits if runlog is not None else ():  # 2.
                if self.unit_id in marker.get("units", []):
                    extra = marker.get("extra") or {}
                    self.done = CommittedUnit(
                        self.unit_id,
                        dict((marker.get("counts") or {}).get(self.unit_id) or {}),
                        list((extra.get(QUARANTINE_FILES) or {}).get(self.unit_id) or []),
                        int(marker.get("rows", 0)),
                    )
                    self.close()
                    return
            self._txn.begin()  # 3.
        except BaseException:
            self.abort()
            raise

    @property
    def _producer(self) -> Any:
        assert self._txn is not None and self._txn.client is not None, "start() first"
        return self._txn.client

    def produce(self, rows: pa.Table) -> None:
        """Produce output rows (user columns + lineage, in key order) with explicit partitions."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaException

        if rows.num_rows == 0:
            return
        assert self.done is None, "a committed unit produces nothing"
        schema = schema_from_b64(self.staging.schema_b64)
        if self._encoder is None:  # JSON values, or Avro in the schema pinned at prepare
            self._avro = values_of(self.staging.value_format, schema)
            values = self._avro.encode if self._avro is not None else None
            self._encoder = RecordEncoder(schema, list(self.writer.key), values)
        producer = self._producer
        for batch in rows.select(schema.names).cast(schema).to_batches():
            if self._avro is not None:
                try:  # nothing of the unit becomes visible: its transaction is aborted
                    self._avro.check(batch)
                except AvroSchemaMismatch as exc:
                    raise KafkaSinkError(f"unit {self.unit_id}: {exc}") from None
            encoded = self._encoder.encode(batch)
            keys = [
                k if type(k) is bytes else k.encode() if isinstance(k, str) else bytes(k)
                for k in encoded.keys
            ]
            partitions = self._placed(batch, encoded, keys)
            blocked = set(partitions) & set(self.writer.skip_partitions)
            if blocked:
                index = next(i for i, p in enumerate(partitions) if p in blocked)
                raise KafkaSinkError(
                    f"the record of key {keys[index]!r} lands on skipped partition {partitions[index]} of "
                    f"{self.staging.topic}, but its entity id does not: the translate must keep the "
                    "entity id as the key"
                )
            try:
                self._encoder.produce(
                    encoded, producer.produce, self._when_full, self.staging.topic, partitions
                )
            except KafkaException as exc:  # refused before sending: too large, unknown partition
                raise KafkaSinkError(
                    f"Kafka refused a record of unit {self.unit_id} for {self.staging.topic}: "
                    f"{short_error(exc)}"
                ) from exc
            self.per_partition.update(partitions)
            self.rows += batch.num_rows
            producer.poll(0)
            assert self._txn is not None
            self._txn.raise_failures(what=f" for {self.staging.topic}")
            self._stop_if_broker_lost()

    def _placed(self, batch: pa.RecordBatch, encoded: Any, keys: list[bytes]) -> list[int]:
        """The partition of each record: its source partition when its source topic has as many
        partitions as the target (a Kafka source, as the driver's commit places it), else the
        one the live producer picks for its key."""
        same = self.staging.same_partition_topics
        placed = target_partitions(batch, encoded, same) if same else None
        if placed is not None and min(placed, default=0) >= 0:
            return placed
        by_key = partitions_for(keys, self.staging.partitions, self.writer.partitioner)  # type: ignore[arg-type]
        return by_key if placed is None else [k if p < 0 else p for p, k in zip(placed, by_key, strict=True)]

    def _when_full(self, topic: str, value: Any, key: Any, partition: int, **kwargs: Any) -> None:
        assert self._txn is not None
        while True:
            self._producer.poll(0.05)
            self._txn.raise_failures(what=f" for {topic}")
            self._stop_if_broker_lost()
            try:
                self._producer.produce(topic, value, key, partition, **kwargs)
                return
            except BufferError:
                continue

    def commit(self, counts: dict[str, Any], quarantine_files: list[str]) -> dict[str, Any]:
        """Steps 4-5: flush the data, produce the marker, commit. Returns what was written."""
        assert self._txn is not None and self.done is None
        run_id = self.staging.run_id
        try:
            self._txn.flush(until_broker_lost=True)
            self._stop_if_broker_lost()
            faults.point("reproduce-before-marker")
            marker = {
                "kind": "commit",
                "run_id": run_id,
                "topic": self.staging.topic,
                "units": [self.unit_id],
                "counts": {self.unit_id: counts},
                "rows": self.rows,
                "produced": self.rows,
                "already_present": 0,
                "from_offsets": {},
                "partitions": {str(p): n for p, n in sorted(self.per_partition.items())},
                "extra": {QUARANTINE_FILES: {self.unit_id: list(quarantine_files)}},
                "at": now_iso(),
            }
            self._producer.produce(
                self.staging.bookkeeping,
                json.dumps(marker, sort_keys=True).encode(),
                f"{run_id}/commit/{units_digest([self.unit_id])}".encode(),
                partition=bookkeeping_partition(run_id),
            )
            self._txn.flush(until_broker_lost=True)
            faults.point("reproduce-before-end")
            faults.pause("reproduce-before-end")
            self._stop_if_broker_lost()
            try:
                self._txn.commit()
            except KafkaSinkError as exc:
                # the commit's outcome is unknown (a broker restarted during it, or one that lost
                # the transaction, answers INVALID_TXN_STATE): the next attempt fences this one,
                # then finds the unit's marker if the commit did land, else writes the unit again
                raise UnitInterrupted(f"unit {self.unit_id}: its transaction did not commit ({exc})") from exc
        except BaseException:
            self.abort()
            raise
        self.close()
        return {
            "unit_id": self.unit_id,
            "rows": self.rows,
            "partitions": dict(self.per_partition),
            "seconds": round(time.monotonic() - self._started, 3),
        }

    def _stop_if_broker_lost(self) -> None:
        """No record goes on into a transaction during which the client lost every broker: the
        unit is aborted (what is still queued purged) and written again (see
        :meth:`TransactionalProducer.flush <rewind.kafka.producer.TransactionalProducer.flush>`)."""
        assert self._txn is not None
        if self._txn.broker_lost:
            raise UnitInterrupted(
                f"unit {self.unit_id}: the broker went away while its transaction was open; "
                "the transaction was aborted"
            )

    def abort(self) -> None:
        if self._txn is not None:
            with contextlib.suppress(Exception):
                self._txn.abort()
        self.close()

    def close(self) -> None:
        if self._txn is not None:
            with contextlib.suppress(Exception):
                self._txn.close()
            self._txn = None


def committed_quarantine_files(
    conf: dict[str, Any], staging: KafkaStaging, run_id: str
) -> dict[str, list[str]]:
    """Per unit committed by a unit transaction, the quarantine files its marker names."""
    out: dict[str, list[str]] = {}
    for marker in staged_run_log(conf, staging, run_id).commits:
        files = (marker.get("extra") or {}).get(QUARANTINE_FILES) or {}
        for unit_id, paths in files.items():
            out[str(unit_id)] = [str(p) for p in paths]
    return out


def fence_units(conf: dict[str, Any], run_id: str, unit_ids: list[str]) -> None:
    """Fence the transactions of units an earlier attempt may have left open (a killed driver's
    tasks): their open transactions would hold ``rewind.commits`` back until the broker's
    transaction timeout, and every read of the run's bookkeeping with it."""
    for unit_id in unit_ids:
        producer = make_producer(conf, **{"transactional.id": unit_transactional_id(run_id, unit_id)})
        try:
            producer.init_transactions(TXN_CALL_TIMEOUT_S)
        except Exception as exc:
            raise KafkaSinkError(
                f"could not fence the transaction of unit {unit_id} of run {run_id}: {short_error(exc)}"
            ) from exc
        finally:
            with contextlib.suppress(Exception):
                producer.close()
