"""The bookkeeping topic ``rewind.commits``: a run's prepared record, commit markers and publication.

See :mod:`rewind.sinks.kafka.sink` for the protocol; this module reads a run's log from it,
fences a run's zombie transaction and probes whether the broker's ``read_committed`` works.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.kafka.capabilities import _Probe
from rewind.kafka.clients import cluster_metadata, private_consumer, ready_messages
from rewind.kafka.clients import producer as make_producer
from rewind.sinks.kafka.exceptions import KafkaSinkError, short_error
from rewind.sinks.kafka.topics import (
    TIMEOUT_S,
    create_topics,
    partition_watermarks,
    topic_is_there,
    wait_for_topic,
)

if TYPE_CHECKING:
    from confluent_kafka import Message
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

_BLOCKED_GRACE_S = 3.0
_STALL_TIMEOUT_S = 90.0


BOOKKEEPING_TOPIC = "rewind.commits"
"""The compacted topic of prepared records, commit markers and publications of every run."""
BOOKKEEPING_PARTITIONS = 16
"""Fixed: a run's partition is ``crc32(run id) % 16``; more partitions would move runs."""
TXN_CALL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class KafkaStaging:
    """A run's backfill topic and what it was created with; JSON-able for the ledger."""

    target: str
    topic: str
    run_id: str
    partitions: int
    start_offsets: dict[int, int]
    source_partitions: dict[str, int]
    transactional: bool
    schema_b64: str
    created: bool
    configs: dict[str, str] = field(default_factory=dict)
    read_committed: str = "not-probed"
    bookkeeping: str = BOOKKEEPING_TOPIC
    value_format: dict[str, Any] | None = None
    """None: JSON values; else the pinned Avro writer schema (``avro_target.pinned``)."""
    log_start: int = 0
    """Offset of the run's ``prepared`` record in its partition of the bookkeeping topic: every
    record of the run comes after it, so the run's log is read from here (0: from the
    partition's start, as for a staging recorded before Rewind kept this)."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start_offsets"] = {str(p): o for p, o in self.start_offsets.items()}
        return {"kind": "kafka", **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KafkaStaging:
        return cls(
            target=str(data["target"]),
            topic=str(data["topic"]),
            run_id=str(data["run_id"]),
            partitions=int(data["partitions"]),
            start_offsets={int(p): int(o) for p, o in (data.get("start_offsets") or {}).items()},
            source_partitions={str(t): int(n) for t, n in (data.get("source_partitions") or {}).items()},
            transactional=bool(data.get("transactional")),
            schema_b64=str(data.get("schema_b64") or ""),
            created=bool(data.get("created")),
            configs={str(k): str(v) for k, v in (data.get("configs") or {}).items()},
            read_committed=str(data.get("read_committed") or "not-probed"),
            bookkeeping=str(data.get("bookkeeping") or BOOKKEEPING_TOPIC),
            value_format=data.get("value_format") or None,
            log_start=int(data.get("log_start") or 0),
        )

    @property
    def same_partition_topics(self) -> frozenset[str]:
        """Source topics whose records keep their partition (equal partition counts)."""
        return frozenset(t for t, n in self.source_partitions.items() if n == self.partitions)

    def describe(self) -> str:
        return f"topic {self.topic} ({self.partitions} partitions)"

    def guarantee(self) -> str:
        """What consumers get, for this broker and mode, in one sentence."""
        if self.transactional and self.read_committed == "supported":
            return (
                "exactly once per work unit; each commit is one Kafka transaction: read_committed "
                "consumers see all of it or none of it"
            )
        why = (
            "the broker shows aborted transactions to read_committed consumers"
            if self.transactional and self.read_committed == "wrong-answer"
            else "commits are not transactional"
            if not self.transactional
            else f"read_committed is {self.read_committed} on this broker"
        )
        return (
            f"exactly once per work unit when the run ends; {why}, so an interrupted commit's "
            "records are visible until resume completes it (without writing them again)"
        )


@dataclass
class RunLog:
    """Everything ``rewind.commits`` holds about one run, in log order."""

    prepared: dict[str, Any] | None = None
    prepared_offset: int = 0
    """Where the (first) ``prepared`` record is: a resumed run's :attr:`KafkaStaging.log_start`."""
    commits: list[dict[str, Any]] = field(default_factory=list)
    publication: dict[str, Any] | None = None

    def units(self) -> set[str]:
        return {u for c in self.commits for u in c.get("units", [])}

    def counts(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for c in self.commits:
            out.update(c.get("counts") or {})
        return out

    def scan_from(self) -> dict[int, int] | None:
        """Per partition, where the run's last commit started (None: no commit yet)."""
        if not self.commits:
            return None
        merged: dict[int, int] = {}
        for c in self.commits:
            for p, o in (c.get("from_offsets") or {}).items():
                merged[int(p)] = max(merged.get(int(p), 0), int(o))
        return merged

    @property
    def rows(self) -> int:
        return sum(int(c.get("rows", 0)) for c in self.commits)

    @property
    def state(self) -> str | None:
        return None if self.publication is None else str(self.publication.get("state"))


def bookkeeping_partition(run_id: str) -> int:
    """The partition of ``rewind.commits`` holding every record of ``run_id``."""
    return zlib.crc32(run_id.encode()) % BOOKKEEPING_PARTITIONS


def transactional_id(run_id: str) -> str:
    """The commit producer's transactional id: stable across resumes, unique per run."""
    return f"rewind-{run_id}-commit"


def read_log(
    conf: dict[str, Any],
    topic: str,
    starts: dict[int, int],
    ends: dict[int, int],
    *,
    on_blocked: Callable[[], None] | None = None,
    stall_timeout_s: float = _STALL_TIMEOUT_S,
) -> Iterator[Message]:
    """Records of ``[starts[p], ends[p])`` read ``read_committed``, waiting out open transactions.

    ``read_committed`` stops at the last stable offset: an open transaction hides everything
    after its first record, so "end of partition" below ``ends`` means "wait". After
    :data:`_BLOCKED_GRACE_S` without progress ``on_blocked`` is called once; after
    ``stall_timeout_s`` the read fails rather than return a partial answer.
    """
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, TopicPartition

    pending = {p for p, s in starts.items() if s < ends.get(p, 0)}
    if not pending:
        return
    settings: dict[str, Any] = {
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 50,
        "enable.partition.eof": True,
    }
    consumer = private_consumer(conf, "sink", route_logs=False, **settings)
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        last_progress = time.monotonic()
        called = False
        while pending:
            progressed = False
            for msg in ready_messages(consumer, 0.2, 5000):
                p = msg.partition()
                if p not in pending:
                    continue
                err = msg.error()
                offset = msg.offset()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if offset is not None and offset >= ends[p]:
                            pending.discard(p)
                            progressed = True
                        continue
                    raise KafkaSinkError(f"reading {topic}/{p} failed: {err.str()}")
                progressed = True
                if offset is None or offset >= ends[p]:
                    pending.discard(p)
                    continue
                yield msg
                if offset + 1 >= ends[p]:
                    pending.discard(p)
            now = time.monotonic()
            if progressed:
                last_progress = now
            elif pending:
                if on_blocked is not None and not called and now - last_progress > _BLOCKED_GRACE_S:
                    called = True
                    on_blocked()
                if now - last_progress > stall_timeout_s:
                    where = ", ".join(f"{topic}/{p}" for p in sorted(pending))
                    raise KafkaSinkError(
                        f"{where} did not reach its end within {stall_timeout_s:.0f}s "
                        "reading read_committed: "
                        "an open transaction (a commit still running, or a crashed one that the broker "
                        "aborts after transaction.timeout.ms) holds it back; retry later"
                    )
    finally:
        consumer.close()


def fence_run(conf: dict[str, Any], run_id: str) -> None:
    """Fence the run's commit producer: a zombie's open transaction is aborted."""
    log.warning("an open transaction holds rewind.commits back; fencing %s", transactional_id(run_id))
    producer = make_producer(conf, **{"transactional.id": transactional_id(run_id)})
    try:
        producer.init_transactions(TXN_CALL_TIMEOUT_S)
    except Exception as exc:
        log.warning("could not fence %s: %s", transactional_id(run_id), short_error(exc))
    finally:
        with contextlib.suppress(Exception):
            producer.close()


_PROBED: dict[str, str] = {}


def probe_read_committed(conf: dict[str, Any]) -> str:
    """``supported`` / ``wrong-answer`` / ``missing``: does read_committed hide aborted records?

    The same probe as ``rewind doctor`` (on a scratch topic, deleted afterwards), once per
    cluster and process.
    """
    cluster = str(conf.get("bootstrap.servers"))
    if cluster in _PROBED:
        return _PROBED[cluster]
    probe = _Probe(conf, 0.0)
    try:
        probe.create_topic()
        try:
            _txn, rc = probe.transactions()
        finally:
            probe.delete_topic()
    except Exception as exc:
        log.warning("could not probe read_committed: %s", short_error(exc))
        return "missing"
    _PROBED[cluster] = rc.status
    return rc.status


def published_view(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keys = ("state", "topic", "start_offsets", "end_offsets", "records", "at")
    return {k: record[k] for k in keys if k in record}


def units_digest(unit_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(unit_ids).encode()).hexdigest()[:16]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_run_log(conf: dict[str, Any], topic: str, run_id: str, start: int = 0) -> RunLog:
    """The run's records in ``rewind.commits``, read ``read_committed`` to the true end.

    Read from ``start`` in the run's partition (:attr:`KafkaStaging.log_start` once the run is
    prepared; see :func:`staged_run_log`): the partition holds the records of every run that
    hashes to it, a sixteenth of the cluster's whole history. If an open transaction holds the
    read back for a few seconds, the run's own transactional id is fenced (aborting a zombie
    commit of the run: a live commit holds the partition for milliseconds) and the read keeps
    waiting.
    """
    if not topic_is_there(conf, topic):
        return RunLog()
    marks = partition_watermarks(conf, topic, partitions=(bookkeeping_partition(run_id),))
    lows = {p: max(low, start) for p, (low, _high) in marks.items()}
    highs = {p: high for p, (_low, high) in marks.items()}
    prefix = f"{run_id}/".encode()
    out = RunLog()
    fence = functools.partial(fence_run, conf, run_id)
    for msg in read_log(conf, topic, lows, highs, on_blocked=fence):
        key = msg.key() or b""
        if not key.startswith(prefix) or msg.value() is None:
            continue
        try:
            record = json.loads(msg.value() or b"")
        except ValueError:
            log.warning("ignoring a bookkeeping record that is not JSON at offset %s", msg.offset())
            continue
        if record.get("run_id") != run_id:
            continue
        kind = record.get("kind")
        if kind == "prepared" and out.prepared is None:
            out.prepared, out.prepared_offset = record, int(msg.offset() or 0)
        elif kind == "commit":
            out.commits.append(record)
        elif kind == "publication":
            out.publication = record
    return out


def staged_run_log(conf: dict[str, Any], staging: KafkaStaging, run_id: str | None = None) -> RunLog:
    """:func:`read_run_log` of the run ``staging`` was prepared for, from its ``prepared`` record."""
    rid = staging.run_id if run_id is None else run_id
    return read_run_log(conf, staging.bookkeeping, rid, staging.log_start if rid == staging.run_id else 0)


def ensure_bookkeeping_topic(conf: dict[str, Any], admin: AdminClient, topic: str) -> None:
    """Create the bookkeeping topic on first use; refuse one with another partition count."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import NewTopic

    meta = cluster_metadata(conf).topics.get(topic)
    if meta is None:
        new = NewTopic(
            topic,
            BOOKKEEPING_PARTITIONS,
            replication_factor=-1,
            config={"cleanup.policy": "compact"},
        )
        create_topics(admin, [new])
        wait_for_topic(conf, topic, BOOKKEEPING_PARTITIONS)
    elif len(meta.partitions) != BOOKKEEPING_PARTITIONS:
        n = BOOKKEEPING_PARTITIONS
        raise KafkaSinkError(
            f"{topic} has {len(meta.partitions)} partitions; Rewind creates it with "
            f"{n} and finds a run's records at crc32(run id) % {n}, so it was created or changed "
            f"by something else: recreate it with {n} partitions (cleanup.policy=compact)"
        )


def write_bookkeeping(conf: dict[str, Any], topic: str, key: str, value: dict[str, Any]) -> int:
    """One record to ``rewind.commits``, flushed and checked; returns its offset.

    Not an idempotent producer: librdkafka's starts by waiting ~0.5 s for a broker to give it a
    producer id (its PID timer, measured on every such client), which was half a re-produce's
    staging preparation. One record per producer cannot be reordered, and a retried duplicate
    is harmless: every record written here is keyed and read by its kind (the first
    ``prepared`` wins; ``publication`` and ``deleted`` say the same thing twice).
    """
    errors: list[str] = []
    offsets: list[int] = []

    def delivered(err: Any, msg: Any) -> None:
        if err:
            errors.append(err.str())
        else:
            offsets.append(int(msg.offset()))

    producer = make_producer(
        conf, **{"enable.idempotence": False, "acks": "all", "linger.ms": 0, "on_delivery": delivered}
    )
    try:
        producer.produce(
            topic,
            json.dumps(value, sort_keys=True).encode(),
            key.encode(),
            partition=bookkeeping_partition(str(value["run_id"])),
        )
        left = producer.flush(TIMEOUT_S)
    finally:
        with contextlib.suppress(Exception):
            producer.close()
    if left or errors or not offsets:
        raise KafkaSinkError(f"could not write {key} to {topic}: {errors[0] if errors else 'not delivered'}")
    return offsets[0]
