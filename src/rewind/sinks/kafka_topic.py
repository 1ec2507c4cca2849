"""Kafka topic sink: a run's output goes to a topic of its own, then is published to consumers.

Staging is a dedicated backfill topic, ``<source topic>.backfill.<run id>`` (the first source
topic) unless the spec names one. Rewind creates it with the source topic's partition count
and replication factor (or ``sink.kafka.partitions``) and with the source's topic configs,
over which the spec's ``sink.kafka.configs`` win. Two configs are NOT copied: ``retention.ms``
defaults to ``-1`` and ``message.timestamp.type`` to ``CreateTime``, because the records carry
their SOURCE timestamps (event time, often months old): a time-based retention would find
them expired at once, and LogAppendTime would overwrite them. ``rewind cleanup RUN`` deletes the topic.

Records: see :mod:`rewind.sinks.kafka_records` (value = JSON of the user columns, key = the
business key, lineage in headers, timestamp = the source timestamp). A record keeps its
source partition when the topic has as many partitions as its source topic (so per-key order
of the source is kept); otherwise the producer's murmur2 partitioner places it by key, as the
Java client would.

Bookkeeping: the compacted topic ``rewind.commits`` (16 partitions, created on first use; a
run's records all go to partition ``crc32(run id) % 16``, so they are in order) holds, per
run, keyed ``<run id>/...``: the ``prepared`` record (the topic and what it was
created with), one ``commit`` marker per commit (unit ids, their counts, rows, the offsets
the commit started from) and the ``publication`` state (``published`` with the end offsets,
``withdrawn``, ``deleted``). A marker record was chosen over ``send_offsets_to_transaction``
to a synthetic group: offsets cannot carry unit ids and counts, a topic can, and consumers can
read publications from it.

Exactly once per work unit. :meth:`KafkaTopicSink.commit` makes a batch of units part of the
topic together with their marker, and the sink, not the ledger, knows which units are done:

* ``sink.kafka.transactional: true`` — the data and the marker of a commit (one wave of
  units) are ONE Kafka transaction of the transactional id ``rewind-<run id>-commit``, the
  same on every resume, so the next commit's ``init_transactions`` fences a zombie of the run
  and aborts what it left open. On a broker whose ``read_committed`` works (Apache Kafka,
  Redpanda) a consumer reading ``read_committed`` sees each commit all at once or not at all,
  and never an aborted one (a ``read_uncommitted`` consumer does see aborted attempts: the
  topic's consumers must use ``read_committed``).
* on a broker whose ``read_committed`` returns aborted records (the embedded tansu 0.6;
  ``rewind doctor`` reports ``read_committed: wrong-answer``), and without ``transactional``
  on any broker, every record that reached the log stays visible. Two rules keep the topic
  exactly-once anyway: (1) the marker is produced only after every data record of the commit
  is acknowledged, so a visible marker always means all its data is in the log; (2) before
  the first commit of a process (and after any failed commit) the sink reads the topic from
  the offsets the run's last marker started from, collects the event ids of the run that are
  already there (an interrupted commit's records), and does not produce them again. So the
  topic holds each output row once when the run ends; what is weaker is atomicity: while a
  commit is interrupted, consumers can see part of it (until resume completes it). The
  check costs one read of the topic from the last commit's start (at most a wave of rows)
  per process; on a working broker it finds nothing, because aborted records stay hidden.

Both rules rest on one writer per run: the run's lease makes a second live driver impossible,
and with ``transactional`` the broker fences a zombie driver; without it, a driver that lost
its lease but still produces is not fenced (the lease's keeper stops it at the next wave).

Readers of the bookkeeping read ``read_committed`` up to the partition's true high watermark,
waiting for open transactions to end (an open one hides later records); a run's own zombie
transaction is fenced after a few seconds of waiting. A crashed commit of ANOTHER run that
shares the partition holds it back until the broker aborts it (``transaction.timeout.ms``);
the 16 partitions make that rare, and a read that waits too long fails with that reason.

Large volumes: the runner hands Parquet files to the driver, so :meth:`KafkaTopicSink.commit`
produces from one process (librdkafka batching, ``linger.ms=20``, lz4 unless configured, one
poll per 20k rows, JSON built inside the produce loop, Python's garbage collector paused in
it): a bottleneck of one core, accepted for now. ``bench/sink_kafka.py`` measures it against a
bare produce loop of the same records (0.6-0.8 of its rate on the 2-core test machine). The
bookkeeping partition is read from its start by prepare, resume, promote and rollback (a
sink remembers its own commits in between), which stays cheap while it is compacted.

Crash points for fault tests (``REWIND_FAULT``, see :mod:`rewind.faults`):
``kafka-commit-mid-produce`` (after each batch of 20k rows), ``kafka-commit-before-marker``
(data acknowledged, no marker yet), ``kafka-commit-before-end`` (marker acknowledged, the
transaction not committed yet); ``kafka-promote-before-commit`` / ``-after-commit`` and
``kafka-rollback-before-commit`` / ``-after-commit`` around the publication record's write
(before it is produced; after it is acknowledged).

Publication: :meth:`~KafkaTopicSink.promote` records the topic with its end offsets (the true
high watermarks from a fetch, not ListOffsets ``latest``) and the record count as
``published``; :meth:`~KafkaTopicSink.rollback` records it ``withdrawn``; consumers follow the
``<run id>/publication`` records of ``rewind.commits``. :meth:`~KafkaTopicSink.cleanup`
deletes the topic, and refuses while it is published (roll back first).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import logging
import re
import shutil
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.arrow import schema_from_b64, schema_to_b64
from rewind.errors import RewindError
from rewind.sinks.base import Swap

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message, Producer
    from confluent_kafka.admin import AdminClient, ClusterMetadata
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.sinks.kafka_records import EncodedBatch
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

BOOKKEEPING_TOPIC = "rewind.commits"
"""The compacted topic of prepared records, commit markers and publications of every run."""
BOOKKEEPING_PARTITIONS = 16
"""Fixed: a run's partition is ``crc32(run id) % 16``; more partitions would move runs."""

COUNTS_EXTRA = "rewind.unit-counts"
DEFAULT_TOPIC_CONFIGS = {"retention.ms": "-1", "message.timestamp.type": "CreateTime"}
"""Set on a created topic unless ``sink.kafka.configs`` says otherwise (see the module docstring)."""

NOT_COPIED = frozenset(
    {
        "retention.ms",
        "retention.bytes",
        "message.timestamp.type",
        "message.timestamp.difference.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms",
        "local.retention.ms",
        "local.retention.bytes",
    }
)
COPIED_ANY_SOURCE = frozenset(
    {"cleanup.policy", "max.message.bytes", "compression.type", "min.insync.replicas"}
)
"""Copied even when the broker calls them defaults (tansu labels every config it returns so)."""

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

_TIMEOUT_S = 30.0
_TXN_CALL_TIMEOUT_S = 120.0
_BATCH_ROWS = 20_000
_BLOCKED_GRACE_S = 3.0
_STALL_TIMEOUT_S = 90.0
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaSinkError(RewindError):
    """The Kafka topic sink cannot do what was asked; the message says what to do."""


# -- staging ----------------------------------------------------------------------------------


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
class _RunLog:
    """Everything ``rewind.commits`` holds about one run, in log order."""

    prepared: dict[str, Any] | None = None
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


# -- the sink ---------------------------------------------------------------------------------


class KafkaTopicSink:
    """Writes a run's output into a backfill topic of its own, one commit per batch of units."""

    kind = "kafka"

    def __init__(
        self,
        conf: dict[str, Any],
        *,
        source_topics: list[str],
        topic: str | None = None,
        partitions: int | None = None,
        transactional: bool = False,
        configs: dict[str, str] | None = None,
        key: list[str] | None = None,
        spool_dir: Path | str = Path(".rewind/spool/kafka"),
        bookkeeping: str = BOOKKEEPING_TOPIC,
    ) -> None:
        if topic is None and not source_topics:
            raise KafkaSinkError("sink.kafka.topic is required when the source is not a Kafka topic")
        self.conf = dict(conf)
        self.source_topics = list(source_topics)
        self.topic = topic
        self.partitions = partitions
        self.transactional = transactional
        self.configs = dict(configs or {})
        self.key = list(key or [])
        self.spool_dir = Path(spool_dir)
        self.bookkeeping = bookkeeping
        self._clean: dict[str, bool] = {}  # run id → the log holds nothing of it past its last marker
        self._known: dict[str, _RunLog] = {}  # run id → its bookkeeping, as of this sink's last commit

    @classmethod
    def from_spec(cls, settings: Settings, spec: JobSpec) -> KafkaTopicSink:
        kafka = spec.sink.kafka
        if kafka is None:
            raise KafkaSinkError(f"job {spec.name}: sink is {spec.sink.kind}, not kafka")
        return cls(
            settings.kafka_config(),
            source_topics=list(spec.source.window.topics),
            topic=kafka.topic,
            partitions=kafka.partitions,
            transactional=kafka.transactional,
            configs=dict(kafka.configs),
            key=list(spec.key),
            spool_dir=settings.state_path / "spool" / "kafka",
        )

    @property
    def target(self) -> str:
        """``kafka:<topic>``; with the default name, ``kafka:<source>.backfill.<run>`` for every run
        of that source (the lease then lets one such backfill run at a time)."""
        return f"kafka:{self.topic or self.source_topics[0] + '.backfill.<run>'}"

    def topic_for(self, run_id: str) -> str:
        name = self.topic or f"{self.source_topics[0]}.backfill.{run_id}"
        if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise KafkaSinkError(
                f"topic name {name!r} is not valid (1-249 letters, digits, '.', '_', '-'); "
                "set sink.kafka.topic"
            )
        return name

    # -- gates --------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        """Raise when the output cannot go to the topic; else say where it goes. Changes nothing."""
        from rewind.kafka.clients import cluster_metadata
        from rewind.sinks.kafka_records import RecordEncoder

        try:
            RecordEncoder(schema, self.key)
        except ValueError as exc:
            raise KafkaSinkError(f"sink.kafka: {exc}; key columns must be output columns") from None
        md = cluster_metadata(self.conf)
        missing = [t for t in self.source_topics if t not in md.topics]
        if missing:
            raise KafkaSinkError(f"source topic {missing[0]} does not exist; nothing to copy partitions from")
        source = self.source_topics[0] if self.source_topics else None
        wanted = self.partitions or (len(md.topics[source].partitions) if source else None)
        if self.topic is not None and self.topic in md.topics:
            have = len(md.topics[self.topic].partitions)
            held = _record_count(self.conf, self.topic)
            if held:
                raise KafkaSinkError(
                    f"topic {self.topic} already exists and holds {held} records; a backfill writes to a "
                    "topic of its own: choose another sink.kafka.topic, resume the run that wrote it, or "
                    "delete it (`rewind cleanup RUN`)"
                )
            if self.partitions and have != self.partitions:
                raise KafkaSinkError(
                    f"topic {self.topic} exists with {have} partitions, sink.kafka.partitions is "
                    f"{self.partitions}; delete it or drop sink.kafka.partitions"
                )
            return f"{self.topic} exists and is empty ({have} partitions): the output goes there"
        if wanted is None:
            raise KafkaSinkError("sink.kafka.partitions is required when the source is not a Kafka topic")
        name = self.topic or f"{source}.backfill.<run id>"
        keeps = source is not None and len(md.topics[source].partitions) == wanted
        placement = "records keep their source partition" if keeps else "records are placed by key"
        return f"a new topic {name} with {wanted} partitions is created: {placement}"

    # -- staging ------------------------------------------------------------------------------

    def prepare(self, run_id: str, schema: pa.Schema) -> KafkaStaging:
        """Create the run's topic, or find it again on resume.

        Steps: (1) create ``rewind.commits`` if missing; (2) read the run's bookkeeping: a
        ``prepared`` record means resume — return its staging, re-creating the topic only if
        preparation was cut short before any commit; (3) a topic of that name that already
        holds records is refused (it is not this run's); an empty one is used as it is;
        (4) write the ``prepared`` record; (5) create the topic and wait until metadata shows
        every partition.
        """
        from rewind.kafka.clients import admin as make_admin
        from rewind.kafka.clients import cluster_metadata

        topic = self.topic_for(run_id)
        admin = make_admin(self.conf)
        self._ensure_bookkeeping(admin)
        runlog = self._runlog(run_id)
        if runlog.state == "deleted":
            raise KafkaSinkError(
                f"run {run_id}'s topic {topic} was deleted by `rewind cleanup`; start a new run"
            )
        md = cluster_metadata(self.conf)
        if runlog.prepared is not None:
            staging = KafkaStaging.from_dict(runlog.prepared["staging"])
            meta = md.topics.get(staging.topic)
            if meta is None:
                if runlog.commits or not staging.created:
                    raise KafkaSinkError(
                        f"topic {staging.topic} of run {run_id} is gone (deleted outside Rewind?); its "
                        "output is lost: start a new run"
                    )
                self._create(
                    admin,
                    staging.topic,
                    staging.partitions,
                    _replication(md, self.source_topics),
                    staging.configs,
                )
            elif len(meta.partitions) != staging.partitions:
                raise KafkaSinkError(
                    f"topic {staging.topic} now has {len(meta.partitions)} partitions, run {run_id} created "
                    f"it with {staging.partitions}; partitions must not change during a backfill"
                )
            return staging
        source_partitions = {t: len(md.topics[t].partitions) for t in self.source_topics if t in md.topics}
        meta = md.topics.get(topic)
        if meta is not None:
            held = _record_count(self.conf, topic)
            if held:
                raise KafkaSinkError(
                    f"topic {topic} already exists and holds {held} records; a backfill writes to a topic "
                    "of its own: choose another sink.kafka.topic or delete that topic"
                )
            partitions = len(meta.partitions)
            configs: dict[str, str] = {}
            start = _high_watermarks(self.conf, topic)
            created = False
        else:
            partitions = (
                self.partitions
                or (source_partitions.get(self.source_topics[0]) if self.source_topics else None)
                or 0
            )
            if partitions <= 0:
                raise KafkaSinkError("sink.kafka.partitions is required when the source topic is unknown")
            configs = {
                **self._source_configs(admin),
                **DEFAULT_TOPIC_CONFIGS,
                **self.configs,
            }
            start = dict.fromkeys(range(partitions), 0)
            created = True
        staging = KafkaStaging(
            target=self.target,
            topic=topic,
            run_id=run_id,
            partitions=partitions,
            start_offsets=start,
            source_partitions=source_partitions,
            transactional=self.transactional,
            schema_b64=schema_to_b64(schema),
            created=created,
            configs=configs,
            read_committed=_probe_read_committed(self.conf) if self.transactional else "not-probed",
            bookkeeping=self.bookkeeping,
        )
        self._write_bookkeeping(
            f"{run_id}/prepared",
            {
                "kind": "prepared",
                "run_id": run_id,
                "topic": topic,
                "at": _now(),
                "staging": staging.to_dict(),
            },
        )
        if created:
            self._create(admin, topic, partitions, _replication(md, self.source_topics), configs)
        log.info("run %s stages to %s (%s)", run_id, staging.describe(), staging.guarantee())
        return staging

    def staging_from_dict(self, data: dict[str, Any]) -> KafkaStaging:
        return KafkaStaging.from_dict(data)

    def data_folder(self, staging: KafkaStaging) -> str:
        """A spool folder under the state directory: the driver reads the files and produces them.

        On a cluster whose executors do not share the driver's disk, point ``state_dir`` at a
        shared file system.
        """
        folder = (self.spool_dir / staging.run_id).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return folder.as_uri()

    def committed_units(self, staging: KafkaStaging, run_id: str) -> set[str]:
        return self._runlog(run_id, staging.bookkeeping).units()

    def committed_counts(self, staging: KafkaStaging, run_id: str) -> dict[str, dict[str, Any]]:
        """The per-unit counts of the run's commit markers (``extra["rewind.unit-counts"]``)."""
        return self._runlog(run_id, staging.bookkeeping).counts()

    # -- commit -------------------------------------------------------------------------------

    def commit(
        self,
        staging: KafkaStaging,
        run_id: str,
        unit_ids: list[str],
        files: list[str],
        extra: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Produce the files' rows and the units' marker, exactly once per unit.

        Steps, in order:

        1. open the producer; with ``transactional``, ``init_transactions`` on
           ``rewind-<run id>-commit`` fences a zombie of this run and aborts what it left open;
        2. read the run's bookkeeping: units already committed are left out (all of them: the
           call is a repeat, nothing is produced);
        3. find the topic's high watermarks (where this commit starts); unless this sink saw the
           log clean after its own last commit, read the topic from where the run's last commit
           started and collect the event ids of this run already there: those rows are not
           produced again (an interrupted commit on a broker that shows its records);
        4. (transactional) begin the transaction; produce every remaining row, files in source
           order, serving deliveries between batches; flush and fail on any refused record;
        5. produce the marker (units, counts, rows, start offsets) to ``rewind.commits`` and
           flush it — only now, so a visible marker always means all its data is in the log;
        6. (transactional) commit the transaction;
        7. remember the log is clean; delete the committed files from the spool.

        On failure: abort the transaction (best effort), forget that the log was clean, raise.
        """
        started = time.monotonic()
        was_clean = self._clean.pop(run_id, False)  # a failure below leaves the log unknown
        known = self._known.pop(run_id, None)
        writer = _CommitWriter(self, staging, run_id)
        try:
            # 1. producer (and fencing)
            writer.open()
            # 2. what is done already (this sink's own record of it while the log stays clean)
            runlog = known if (was_clean and known is not None) else self._runlog(run_id, staging.bookkeeping)
            done = runlog.units()
            todo = sorted(u for u in unit_ids if u not in done)
            if not todo:
                self._clean[run_id] = was_clean
                self._known[run_id] = runlog
                return {"topic": staging.topic, "units": 0, "rows": 0, "produced": 0, "repeat": True}
            # 3. where this commit starts, and what an interrupted commit left
            highs = _high_watermarks(self.conf, staging.topic)
            present: set[str] = set()
            if not was_clean:
                scan_from = runlog.scan_from() or staging.start_offsets
                present = _event_ids_in(self.conf, staging.topic, run_id, scan_from, highs)
            # 4. the data
            writer.begin()
            rows, produced = writer.produce_files(files, sorted(done & set(unit_ids)), present)
            writer.flush()
            faults.point("kafka-commit-before-marker")
            # 5. the marker, after every data record is acknowledged
            counts = json.loads((extra or {}).get(COUNTS_EXTRA, "{}"))
            marker = {
                "kind": "commit",
                "run_id": run_id,
                "topic": staging.topic,
                "units": todo,
                "counts": {u: counts[u] for u in todo if u in counts},
                "rows": rows,
                "produced": produced,
                "already_present": rows - produced,
                "from_offsets": {str(p): o for p, o in sorted(highs.items())},
                "extra": {k: v for k, v in (extra or {}).items() if k != COUNTS_EXTRA},
                "at": _now(),
            }
            key = f"{run_id}/commit/{_digest(todo)}"
            writer.produce_marker(key, marker)
            writer.flush()
            faults.point("kafka-commit-before-end")
            # 6. one atomic step (transactional)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        finally:
            writer.close()
        # 7. clean log, spool
        self._clean[run_id] = True
        runlog.commits.append(marker)
        self._known[run_id] = runlog
        for path in files:
            _remove_file(path)
        seconds = time.monotonic() - started
        log.info(
            "commit of %d units to %s: %d rows (%d already present) in %.1fs",
            len(todo),
            staging.topic,
            rows,
            rows - produced,
            seconds,
        )
        return {
            "topic": staging.topic,
            "marker": key,
            "units": len(todo),
            "rows": rows,
            "produced": produced,
            "already_present": rows - produced,
            "seconds": round(seconds, 3),
        }

    # -- reading ------------------------------------------------------------------------------

    def read(self, spark: SparkSession, staging: KafkaStaging) -> DataFrame:
        """The topic's records of this run decoded back into the output columns.

        Read ``read_committed`` with the ``rewind-kafka`` reader from the offsets the topic had
        when the run prepared it, up to the true end; the JSON values and lineage headers are
        decoded by :func:`rewind.sinks.kafka_records.decode_records` in the tasks.
        """
        from pyspark.sql.pandas.types import from_arrow_schema


        schema = schema_from_b64(staging.schema_b64)
        starting = json.dumps({staging.topic: {str(p): o for p, o in staging.start_offsets.items()}})
        reader = spark.read.format("rewind-kafka")
        for k, v in self.conf.items():
            reader = reader.option(f"kafka.{k}", str(v))
        df = (
            reader.option("subscribe", staging.topic)
            .option("includeHeaders", "true")
            .option("startingOffsets", starting)
            .option("endingOffsets", "latest")
            .load()
        )
        return df.mapInArrow(_Decode(staging.schema_b64, staging.run_id), from_arrow_schema(schema))

    # -- publishing ---------------------------------------------------------------------------

    def promote(self, staging: KafkaStaging) -> Swap:
        """Record the topic with its end offsets as ``published``; idempotent.

        Steps: (1) read the run's bookkeeping; already published → nothing to do; (2) the true
        high watermarks of the topic (a fetch, not ListOffsets ``latest``, which some brokers
        under-report); (3) check the offsets can hold the rows the commits recorded; (4) write
        the ``published`` record.
        """
        runlog = self._runlog(staging.run_id, staging.bookkeeping)
        before = runlog.publication
        if runlog.state == "published":
            return Swap(self.target, "promote", None, _published_view(before), True)
        if runlog.state == "deleted":
            raise KafkaSinkError(f"topic {staging.topic} was deleted by `rewind cleanup`; nothing to promote")
        if not _topic_exists(self.conf, staging.topic):
            raise KafkaSinkError(f"topic {staging.topic} does not exist; nothing to promote")
        ends = _high_watermarks(self.conf, staging.topic)
        span = sum(ends[p] - staging.start_offsets.get(p, 0) for p in ends)
        if span < runlog.rows:
            raise KafkaSinkError(
                f"topic {staging.topic} spans {span} offsets but the run committed {runlog.rows} rows: "
                "records were removed (retention? DeleteRecords?); re-run the backfill"
            )
        publication = {
            "kind": "publication",
            "state": "published",
            "run_id": staging.run_id,
            "topic": staging.topic,
            "partitions": staging.partitions,
            "start_offsets": {str(p): o for p, o in sorted(staging.start_offsets.items())},
            "end_offsets": {str(p): o for p, o in sorted(ends.items())},
            "records": runlog.rows,
            "commits": len(runlog.commits),
            "read_committed": staging.read_committed,
            "transactional": staging.transactional,
            "at": _now(),
        }
        self._publish(staging, publication, "promote")
        return Swap(self.target, "promote", _published_view(before), _published_view(publication), False)

    def rollback(self, staging: KafkaStaging, promoted: dict[str, Any]) -> Swap:
        """Record the topic as ``withdrawn``; idempotent. The topic stays until ``rewind cleanup``."""
        runlog = self._runlog(staging.run_id, staging.bookkeeping)
        after = {"topic": staging.topic, "state": "withdrawn"}
        if runlog.state in ("withdrawn", "deleted"):
            return Swap(self.target, "rollback", promoted.get("after"), after, True)
        withdrawn = {
            "kind": "publication",
            "state": "withdrawn",
            "run_id": staging.run_id,
            "topic": staging.topic,
            "withdrawn": runlog.publication,
            "at": _now(),
        }
        self._publish(staging, withdrawn, "rollback")
        return Swap(self.target, "rollback", promoted.get("after"), after, False)

    def _publish(self, staging: KafkaStaging, record: dict[str, Any], action: str) -> None:
        """Write the run's publication record (the one durable step of a promote or rollback)
        between the fault points ``kafka-<action>-before-commit`` and ``-after-commit``."""
        faults.point(f"kafka-{action}-before-commit")
        self._write_bookkeeping(f"{staging.run_id}/publication", record, staging.bookkeeping)
        faults.point(f"kafka-{action}-after-commit")

    def cleanup(self, staging: KafkaStaging) -> dict[str, Any]:
        """Delete the run's topic and spool files; refused while the topic is published.

        Only a topic Rewind created for the run is deleted (one that existed before, empty, is
        left to its owner). The run's bookkeeping stays, marked ``deleted``, so the run cannot
        be resumed or promoted into a missing topic. Idempotent.
        """
        from rewind.kafka.clients import admin as make_admin

        runlog = self._runlog(staging.run_id, staging.bookkeeping)
        if runlog.state == "published":
            raise KafkaSinkError(
                f"topic {staging.topic} is published (consumers may be reading it); "
                f"`rewind rollback {staging.run_id}` first, then clean up"
            )
        exists = _topic_exists(self.conf, staging.topic)
        deleted = False
        if exists and staging.created:
            admin = make_admin(self.conf)
            try:
                for fut in admin.delete_topics([staging.topic], operation_timeout=_TIMEOUT_S).values():
                    fut.result(timeout=_TIMEOUT_S)
            except Exception as exc:
                raise KafkaSinkError(f"could not delete topic {staging.topic}: {_short(exc)}") from exc
            _wait_until(lambda: not _topic_exists(self.conf, staging.topic), f"topic {staging.topic} deleted")
            deleted = True
        spool = self.spool_dir / staging.run_id
        spool_removed = spool.exists()
        shutil.rmtree(spool, ignore_errors=True)
        if runlog.state != "deleted":
            self._write_bookkeeping(
                f"{staging.run_id}/publication",
                {
                    "kind": "publication",
                    "state": "deleted",
                    "run_id": staging.run_id,
                    "topic": staging.topic,
                    "topic_deleted": deleted,
                    "at": _now(),
                },
                staging.bookkeeping,
            )
        return {
            "run_id": staging.run_id,
            "topic": staging.topic,
            "deleted": deleted,
            "already_gone": not exists,
            "kept": exists and not staging.created,
            "spool_removed": spool_removed,
        }

    # -- bookkeeping --------------------------------------------------------------------------

    def publication(self, run_id: str) -> dict[str, Any] | None:
        """The run's latest publication record (``published``, ``withdrawn``, ``deleted``) or None."""
        return self._runlog(run_id).publication

    def _runlog(self, run_id: str, topic: str | None = None) -> _RunLog:
        """The run's records in ``rewind.commits``, read ``read_committed`` to the true end.

        If an open transaction holds the read back for a few seconds, the run's own
        transactional id is fenced (aborting a zombie commit of the run: a live commit holds
        the partition for milliseconds) and the read keeps waiting.
        """
        topic = topic or self.bookkeeping
        if not _topic_exists(self.conf, topic):
            return _RunLog()
        marks = _watermarks(self.conf, topic, partitions=(bookkeeping_partition(run_id),))
        lows = {p: low for p, (low, _high) in marks.items()}
        highs = {p: high for p, (_low, high) in marks.items()}
        prefix = f"{run_id}/".encode()
        out = _RunLog()
        fence = functools.partial(_fence, self.conf, run_id)
        for msg in _read_log(self.conf, topic, lows, highs, on_blocked=fence):
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
                out.prepared = record
            elif kind == "commit":
                out.commits.append(record)
            elif kind == "publication":
                out.publication = record
        return out

    def _ensure_bookkeeping(self, admin: AdminClient) -> None:
        from confluent_kafka.admin import NewTopic

        from rewind.kafka.clients import cluster_metadata

        meta = cluster_metadata(self.conf).topics.get(self.bookkeeping)
        if meta is None:
            new = NewTopic(
                self.bookkeeping,
                BOOKKEEPING_PARTITIONS,
                replication_factor=-1,
                config={"cleanup.policy": "compact"},
            )
            _create_topics(admin, [new])
            _wait_for_topic(self.conf, self.bookkeeping, BOOKKEEPING_PARTITIONS)
        elif len(meta.partitions) != BOOKKEEPING_PARTITIONS:
            n = BOOKKEEPING_PARTITIONS
            raise KafkaSinkError(
                f"{self.bookkeeping} has {len(meta.partitions)} partitions; Rewind creates it with "
                f"{n} and finds a run's records at crc32(run id) % {n}, so it was created or changed "
                f"by something else: recreate it with {n} partitions (cleanup.policy=compact)"
            )

    def _write_bookkeeping(self, key: str, value: dict[str, Any], topic: str | None = None) -> None:
        """One record to ``rewind.commits`` with an idempotent producer, flushed and checked."""
        from rewind.kafka.clients import producer as make_producer

        topic = topic or self.bookkeeping
        errors: list[str] = []
        producer = make_producer(
            self.conf,
            **{
                "enable.idempotence": True,
                "linger.ms": 0,
                "on_delivery": lambda err, _m: errors.append(err.str()) if err else None,
            },
        )
        try:
            producer.produce(
                topic,
                json.dumps(value, sort_keys=True).encode(),
                key.encode(),
                partition=bookkeeping_partition(str(value["run_id"])),
            )
            left = producer.flush(_TIMEOUT_S)
        finally:
            with contextlib.suppress(Exception):
                producer.close()
        if left or errors:
            raise KafkaSinkError(
                f"could not write {key} to {topic}: {errors[0] if errors else 'not delivered'}"
            )

    def _source_configs(self, admin: AdminClient) -> dict[str, str]:
        """The source topic's own configs worth copying (see the module docstring)."""
        from confluent_kafka.admin import ConfigResource, ConfigSource

        if not self.source_topics:
            return {}
        try:
            futures = admin.describe_configs([ConfigResource("topic", self.source_topics[0])])
            entries = next(iter(futures.values())).result(timeout=_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "could not read the configs of %s (%s); the topic gets broker defaults",
                self.source_topics[0],
                _short(exc),
            )
            return {}
        out: dict[str, str] = {}
        for name, entry in entries.items():
            if name in NOT_COPIED or entry.value is None or entry.is_read_only or entry.is_sensitive:
                continue
            if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value or name in COPIED_ANY_SOURCE:
                out[name] = str(entry.value)
        return out

    def _create(
        self, admin: AdminClient, topic: str, partitions: int, replication: int, configs: dict[str, str]
    ) -> None:
        from confluent_kafka.admin import NewTopic

        _create_topics(admin, [NewTopic(topic, partitions, replication_factor=replication, config=configs)])
        _wait_for_topic(self.conf, topic, partitions)


# -- the commit's producer --------------------------------------------------------------------


class _CommitWriter:
    """The producer of one commit and its bookkeeping (see :meth:`KafkaTopicSink.commit`)."""

    def __init__(self, sink: KafkaTopicSink, staging: KafkaStaging, run_id: str) -> None:
        self.sink = sink
        self.staging = staging
        self.run_id = run_id
        self.schema = schema_from_b64(staging.schema_b64)
        self.producer: Producer | None = None
        self.in_transaction = False
        self.failures: list[KafkaError] = []
        self.failed = 0
        self.fatal: KafkaError | None = None

    @property
    def transactional_id(self) -> str:
        return transactional_id(self.run_id)

    def open(self) -> None:
        from rewind.kafka.clients import producer as make_producer

        conf: dict[str, Any] = {
            **PRODUCER_DEFAULTS,
            **self.sink.conf,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
        }
        if self.staging.transactional:
            conf["transactional.id"] = self.transactional_id
        else:
            conf.pop("transaction.timeout.ms", None)
        self.producer = make_producer(conf)
        if self.staging.transactional:
            self._step("init_transactions", lambda p: p.init_transactions(_TXN_CALL_TIMEOUT_S))

    def begin(self) -> None:
        if self.staging.transactional:
            self._step("begin_transaction", lambda p: p.begin_transaction())
            self.in_transaction = True

    def commit(self) -> None:
        if self.in_transaction:
            self._step("commit_transaction", lambda p: p.commit_transaction(_TXN_CALL_TIMEOUT_S))
            self.in_transaction = False

    def abort(self) -> None:
        producer = self.producer
        if producer is None:
            return
        try:
            producer.purge()
            producer.poll(0)
            if self.in_transaction:
                producer.abort_transaction(_TXN_CALL_TIMEOUT_S)
                self.in_transaction = False
        except Exception as exc:  # the original error matters more; init_transactions cleans up later
            log.warning("could not abort transaction %s: %s", self.transactional_id, _short(exc))

    def close(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.flush(0)
            with contextlib.suppress(Exception):
                producer.close()

    def _step(self, name: str, call: Callable[[Producer], None]) -> None:
        from confluent_kafka import KafkaException

        assert self.producer is not None
        try:
            call(self.producer)
        except KafkaException as exc:
            raise KafkaSinkError(
                f"{name} failed for transactional id {self.transactional_id}: {exc.args[0].str()}"
            ) from exc

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if len(self.failures) < 3:
                self.failures.append(err)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        else:
            log.debug("commit producer: %s", err.str())

    def raise_failures(self) -> None:
        if self.fatal is not None:
            raise KafkaSinkError(f"the Kafka producer failed: {self.fatal.str()} ({self.fatal.name()})")
        if self.failures:
            err = self.failures[0]
            raise KafkaSinkError(
                f"Kafka refused {self.failed} record(s) for {self.staging.topic}; "
                f"first: {err.str()} ({err.name()})"
            )

    def _when_full(self, topic: str, value: Any, key: Any, partition: int, **kwargs: Any) -> None:
        assert self.producer is not None
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
        from confluent_kafka import KafkaException

        from rewind.sinks.kafka_records import RecordEncoder

        assert self.producer is not None
        producer = self.producer
        encoder = RecordEncoder(self.schema, self.sink.key)
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
                    partitions = _target_partitions(batch, encoded, same)
                    keep = [e not in present for e in encoded.event_ids] if present else None
                    try:
                        produced += encoder.produce(
                            encoded, producer.produce, self._when_full, self.staging.topic, partitions, keep
                        )
                    except KafkaException as exc:  # refused before sending: too large, unknown partition
                        raise KafkaSinkError(
                            f"Kafka refused a record of {path} for {self.staging.topic}: {_short(exc)}"
                        ) from exc
                    del encoded
                rows += batch.num_rows
                producer.poll(0)
                self.raise_failures()
                faults.point("kafka-commit-mid-produce")
        return rows, produced

    def produce_marker(self, key: str, marker: dict[str, Any]) -> None:
        assert self.producer is not None
        self.producer.produce(
            self.staging.bookkeeping,
            json.dumps(marker, sort_keys=True).encode(),
            key.encode(),
            partition=bookkeeping_partition(self.run_id),
        )

    def flush(self) -> None:
        assert self.producer is not None
        while len(self.producer) > 0:
            self.producer.flush(1.0)
            self.raise_failures()
        self.raise_failures()


def _target_partitions(batch: pa.RecordBatch, encoded: EncodedBatch, same: frozenset[str]) -> list[int]:
    """The source partition for rows of a topic with as many partitions; -1 (by key) otherwise."""
    import pyarrow.compute as pc

    topics = set(pc.unique(batch.column("_rewind_source_topic")).to_pylist())
    if topics <= same:
        return encoded.source_partitions
    if not topics & same:
        return [-1] * len(encoded)
    return [
        p if t in same else -1 for t, p in zip(encoded.source_topics, encoded.source_partitions, strict=True)
    ]


def bookkeeping_partition(run_id: str) -> int:
    """The partition of ``rewind.commits`` holding every record of ``run_id``."""
    return zlib.crc32(run_id.encode()) % BOOKKEEPING_PARTITIONS


def transactional_id(run_id: str) -> str:
    """The commit producer's transactional id: stable across resumes, unique per run."""
    return f"rewind-{run_id}-commit"


# -- reading a partition range ------------------------------------------------------------------


def _read_log(
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
    from confluent_kafka import KafkaError, TopicPartition

    from rewind.kafka.clients import private_consumer

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
            for msg in consumer.consume(num_messages=5000, timeout=0.2):
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


def _event_ids_in(
    conf: dict[str, Any], topic: str, run_id: str, starts: dict[int, int], ends: dict[int, int]
) -> set[str]:
    """Event ids of ``run_id``'s records in the given ranges of the topic."""
    from rewind.sinks.kafka_records import H_EVENT_ID, H_RUN_ID

    wanted = run_id.encode()
    found: set[str] = set()
    begin = {p: min(starts.get(p, 0), ends[p]) for p in ends}
    for msg in _read_log(conf, topic, begin, ends):
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


def _fence(conf: dict[str, Any], run_id: str) -> None:
    """Fence the run's commit producer: a zombie's open transaction is aborted."""
    from rewind.kafka.clients import producer as make_producer

    log.warning("an open transaction holds rewind.commits back; fencing %s", transactional_id(run_id))
    producer = make_producer(conf, **{"transactional.id": transactional_id(run_id)})
    try:
        producer.init_transactions(_TXN_CALL_TIMEOUT_S)
    except Exception as exc:
        log.warning("could not fence %s: %s", transactional_id(run_id), _short(exc))
    finally:
        with contextlib.suppress(Exception):
            producer.close()


# -- small helpers ----------------------------------------------------------------------------


class _Decode:
    """The ``mapInArrow`` function of :meth:`KafkaTopicSink.read` (plain data: it is pickled)."""

    def __init__(self, schema_b64: str, run_id: str) -> None:
        self.schema_b64 = schema_b64
        self.run_id = run_id

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from rewind.sinks.kafka_records import decode_records

        schema = schema_from_b64(self.schema_b64)
        for batch in batches:
            yield decode_records(batch, schema, self.run_id)


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
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, inner = pafs.FileSystem.from_uri(path)
    with fs.open_input_file(inner) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=_BATCH_ROWS):
            yield batch.select(schema.names).cast(schema) if batch.schema != schema else batch


def _source_order(path: str) -> tuple[str, int, int]:
    """(topic, partition, first offset) of a unit's file, from the Parquet statistics."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    fs, inner = pafs.FileSystem.from_uri(path)
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


def _watermarks(
    conf: dict[str, Any], topic: str, partitions: tuple[int, ...] | None = None
) -> dict[int, tuple[int, int]]:
    """(low, true high) watermarks; the high one from a fetch (ListOffsets ``latest`` is a hint)."""
    from rewind.core.windows import WindowRequest
    from rewind.kafka.offsets import resolve

    request = (
        WindowRequest(assign=tuple((topic, p) for p in partitions))
        if partitions is not None
        else WindowRequest(subscribe=(topic,))
    )
    plan = resolve(conf, request, timeout_s=_TIMEOUT_S)
    return {p.partition: (p.low, p.high) for p in plan.partitions}


def _high_watermarks(conf: dict[str, Any], topic: str) -> dict[int, int]:
    return {p: high for p, (_low, high) in _watermarks(conf, topic).items()}


def _record_count(conf: dict[str, Any], topic: str) -> int:
    """Offsets between the low and the true high watermark of every partition (0: empty)."""
    return sum(high - low for low, high in _watermarks(conf, topic).values())


def _topic_exists(conf: dict[str, Any], topic: str) -> bool:
    from rewind.kafka.clients import cluster_metadata

    md = cluster_metadata(conf)
    meta = md.topics.get(topic)
    return meta is not None and meta.error is None


def _replication(md: ClusterMetadata, source_topics: list[str]) -> int:
    """The source topic's replication factor (-1, the broker's default, when unknown)."""
    for topic in source_topics:
        meta = md.topics.get(topic)
        if meta is not None and meta.partitions:
            replicas = next(iter(meta.partitions.values())).replicas
            if replicas:
                return len(replicas)
    return -1


def _create_topics(admin: AdminClient, topics: list[Any]) -> None:
    from confluent_kafka import KafkaError, KafkaException

    for name, fut in admin.create_topics(topics, operation_timeout=_TIMEOUT_S).items():
        try:
            fut.result(timeout=_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # a concurrent prepare (or a retried one) created it
            raise KafkaSinkError(f"could not create topic {name}: {exc.args[0].str()}") from exc


def _wait_for_topic(conf: dict[str, Any], topic: str, partitions: int) -> None:
    from rewind.kafka.clients import cluster_metadata

    def ready() -> bool:
        meta = cluster_metadata(conf).topics.get(topic)
        return (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        )

    _wait_until(ready, f"topic {topic} with {partitions} partitions in metadata")


def _wait_until(ready: Callable[[], bool], what: str, timeout_s: float = _TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise KafkaSinkError(f"timed out after {timeout_s:.0f}s waiting for {what}")


_PROBED: dict[str, str] = {}


def _probe_read_committed(conf: dict[str, Any]) -> str:
    """``supported`` / ``wrong-answer`` / ``missing``: does read_committed hide aborted records?

    The same probe as ``rewind doctor`` (on a scratch topic, deleted afterwards), once per
    cluster and process.
    """
    from rewind.kafka.capabilities import _Probe

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
        log.warning("could not probe read_committed: %s", _short(exc))
        return "missing"
    _PROBED[cluster] = rc.status
    return rc.status


def _published_view(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keys = ("state", "topic", "start_offsets", "end_offsets", "records", "at")
    return {k: record[k] for k in keys if k in record}


def _remove_file(uri: str) -> None:
    import pyarrow.fs as pafs

    try:
        fs, inner = pafs.FileSystem.from_uri(uri)
        fs.delete_file(inner)
    except Exception as exc:  # a leftover spool file is harmless; cleanup removes the folder
        log.debug("could not remove %s: %s", uri, exc)


def _digest(unit_ids: list[str]) -> str:
    return hashlib.sha256("\n".join(unit_ids).encode()).hexdigest()[:16]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _short(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str"):
        return str(args[0].str())
    return str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
