"""Kafka topic sink: a run's output goes to a topic of its own, then is published to consumers.

Staging is a dedicated backfill topic, ``<source topic>.backfill.<run id>`` (the first source
topic) unless the spec names one. Rewind creates it with the source topic's partition count
and replication factor (or ``sink.kafka.partitions``) and with the source's topic configs,
over which the spec's ``sink.kafka.configs`` win. Two configs are NOT copied: ``retention.ms``
defaults to ``-1`` and ``message.timestamp.type`` to ``CreateTime``, because the records carry
their SOURCE timestamps (event time, often months old): a time-based retention would find
them expired at once, and LogAppendTime would overwrite them. ``rewind cleanup RUN`` deletes the topic.

Records: see :mod:`rewind.sinks.kafka.records` (value = JSON of the user columns, or Avro
with ``sink.kafka.encode: avro`` in the schema pinned at prepare (:mod:`.avro_target`), key =
the business key, lineage in headers, timestamp = the source timestamp). A record keeps its
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

Large volumes: with ``transactional`` on a broker whose ``read_committed`` works, the Spark
tasks produce their units themselves, one transaction per unit with its marker
(:mod:`rewind.sinks.kafka.task_load`, the re-produce's unit writer), and the driver handles
only metadata. Otherwise the runner hands Parquet files to the driver, and
:meth:`KafkaTopicSink.commit` produces from one process (librdkafka batching, ``linger.ms=20``,
lz4 unless configured, one poll per 20k rows, JSON built inside the produce loop, Python's
garbage collector paused in it): a bottleneck of one core. ``bench/sink_kafka.py`` measures it against a
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

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.arrow import schema_from_b64, schema_to_b64
from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.core.store import folder_uri, make_dirs
from rewind.kafka.clients import admin as make_admin
from rewind.kafka.clients import cluster_metadata
from rewind.sinks.base import StagingSink, Swap
from rewind.sinks.kafka.avro_target import AvroTarget, avro_target_of
from rewind.sinks.kafka.bookkeeping import (
    BOOKKEEPING_TOPIC,
    KafkaStaging,
    RunLog,
    ensure_bookkeeping_topic,
    now_iso,
    probe_read_committed,
    read_run_log,
    staged_run_log,
    units_digest,
    write_bookkeeping,
)
from rewind.sinks.kafka.commit_writer import CommitWriter, DecodeRecords, event_ids_in, remove_file
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.held import check_held
from rewind.sinks.kafka.publish import cleanup_topic, promote_topic, withdraw_topic
from rewind.sinks.kafka.records import RecordEncoder
from rewind.sinks.kafka.topics import (
    DEFAULT_TOPIC_CONFIGS,
    TOPIC_NAME,
    create_topic,
    high_watermarks,
    partition_watermarks,
    record_count,
    replication_of,
    source_configs,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)


class KafkaTopicSink(StagingSink[KafkaStaging]):
    """Writes a run's output into a backfill topic of its own, one commit per batch of units."""

    kind = "kafka"
    SUPPORTS_CLEANUP = True

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
        existing_ok: bool = False,
        avro: AvroTarget | None = None,
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
        self.spool_dir = folder_uri(spool_dir)
        self.bookkeeping = bookkeeping
        # a re-produce (table source) writes into the live topic or a dedicated one that may
        # already hold records; a backfill of Kafka records writes to a topic of its own
        self.existing_ok = existing_ok
        self.avro = avro  # None: JSON values
        self._clean: dict[str, bool] = {}  # run id → the log holds nothing of it past its last marker
        self._known: dict[str, RunLog] = {}  # run id → its bookkeeping, as of this sink's last commit

    @classmethod
    def from_spec(cls, settings: Settings, spec: JobSpec) -> KafkaTopicSink:
        kafka = spec.sink.kafka
        if kafka is None:
            raise KafkaSinkError(f"job {spec.name}: sink is {spec.sink.kind}, not kafka")
        return cls(
            settings.kafka_config(),
            source_topics=list(spec.source.window.topics) if spec.source.kafka_window else [],
            topic=kafka.topic,
            partitions=kafka.partitions,
            transactional=kafka.transactional,
            configs=dict(kafka.configs),
            key=list(spec.key),
            spool_dir=f"{settings.spool_root()}/kafka",
            existing_ok=spec.source.table is not None,
            avro=avro_target_of(spec),
        )

    @property
    def target(self) -> str:
        """``kafka:<topic>``; with the default name, ``kafka:<source>.backfill.<run>`` for every run
        of that source (the lease then lets one such backfill run at a time)."""
        return f"kafka:{self.topic or self.source_topics[0] + '.backfill.<run>'}"

    def topic_for(self, run_id: str) -> str:
        name = self.topic or f"{self.source_topics[0]}.backfill.{run_id}"
        if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise KafkaSinkError(
                f"topic name {name!r} is not valid (1-249 letters, digits, '.', '_', '-'); "
                "set sink.kafka.topic"
            )
        return name

    # -- gates --------------------------------------------------------------------------------

    def check(self, schema: pa.Schema) -> str:
        """Raise when the output cannot go to the topic; else say where it goes. Changes nothing."""
        try:
            RecordEncoder(schema, self.key)
        except ValueError as exc:
            raise KafkaSinkError(f"sink.kafka: {exc}; key columns must be output columns") from None
        values = "" if self.avro is None else f"; {self.avro.check(self.topic, schema)}"
        md = cluster_metadata(self.conf)
        missing = [t for t in self.source_topics if t not in md.topics]
        if missing:
            raise KafkaSinkError(f"source topic {missing[0]} does not exist; nothing to copy partitions from")
        source = self.source_topics[0] if self.source_topics else None
        wanted = self.partitions or (len(md.topics[source].partitions) if source else None)
        if self.topic is not None and self.topic in md.topics:
            have = len(md.topics[self.topic].partitions)
            held = record_count(self.conf, self.topic)
            if held and self.existing_ok:
                return f"{self.topic} exists ({have} partitions, {held} records): the output is added to it"
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
            return f"{self.topic} exists and is empty ({have} partitions): the output goes there{values}"
        if wanted is None:
            raise KafkaSinkError("sink.kafka.partitions is required when the source is not a Kafka topic")
        name = self.topic or f"{source}.backfill.<run id>"
        keeps = source is not None and len(md.topics[source].partitions) == wanted
        placement = "records keep their source partition" if keeps else "records are placed by key"
        return f"a new topic {name} with {wanted} partitions is created: {placement}{values}"

    # -- staging ------------------------------------------------------------------------------

    def prepare(self, run_id: str, schema: pa.Schema, *, new_run: bool = False) -> KafkaStaging:
        """Create the run's topic, or find it again on resume.

        Steps: (1) create ``rewind.commits`` if missing; (2) read the run's bookkeeping, but not
        for a ``new_run``, which has none (the read took 30-240 ms of a 200k-row re-produce's
        ~0.3 s of fixed cost, and grows with the topic): a ``prepared`` record means resume —
        return its staging, re-creating the topic only if preparation was cut short before any
        commit; (3) a topic of that name that already holds records is refused (it is not this
        run's); an empty one is used as it is; (4) write the ``prepared`` record, whose offset
        becomes the staging's ``log_start`` (the run's later reads of its bookkeeping start
        there); (5) create the topic and wait until metadata shows every partition.
        """
        topic = self.topic_for(run_id)
        admin = make_admin(self.conf)
        ensure_bookkeeping_topic(self.conf, admin, self.bookkeeping)
        runlog = RunLog() if new_run else read_run_log(self.conf, self.bookkeeping, run_id)
        if runlog.state == "deleted":
            raise KafkaSinkError(
                f"run {run_id}'s topic {topic} was deleted by `rewind cleanup`; start a new run"
            )
        md = cluster_metadata(self.conf)
        if runlog.prepared is not None:
            found = KafkaStaging.from_dict(runlog.prepared["staging"])
            staging = replace(found, log_start=runlog.prepared_offset)
            meta = md.topics.get(staging.topic)
            if meta is None:
                if runlog.commits or not staging.created:
                    raise KafkaSinkError(
                        f"topic {staging.topic} of run {run_id} is gone (deleted outside Rewind?); its "
                        "output is lost: start a new run"
                    )
                create_topic(
                    self.conf,
                    admin,
                    staging.topic,
                    staging.partitions,
                    replication_of(md, self.source_topics),
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
            marks = partition_watermarks(self.conf, topic)  # what it holds, and where this run starts
            held = sum(high - low for low, high in marks.values())
            if held and not self.existing_ok:
                raise KafkaSinkError(
                    f"topic {topic} already exists and holds {held} records; a backfill writes to a topic "
                    "of its own: choose another sink.kafka.topic or delete that topic"
                )
            partitions = len(meta.partitions)
            configs: dict[str, str] = {}
            start = {p: high for p, (_low, high) in marks.items()}
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
                **source_configs(admin, self.source_topics),
                **DEFAULT_TOPIC_CONFIGS,
                **self.configs,
            }
            start = dict.fromkeys(range(partitions), 0)
            created = True
        # the Avro schema: resolved (registered when allowed) and fitted before anything is written
        value_format = None if self.avro is None else self.avro.pin(topic, schema)
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
            read_committed=probe_read_committed(self.conf) if self.transactional else "not-probed",
            bookkeeping=self.bookkeeping,
            value_format=value_format,
        )
        at = write_bookkeeping(
            self.conf,
            self.bookkeeping,
            f"{run_id}/prepared",
            {
                "kind": "prepared",
                "run_id": run_id,
                "topic": topic,
                "at": now_iso(),
                "staging": staging.to_dict(),
            },
        )
        if created:
            create_topic(self.conf, admin, topic, partitions, replication_of(md, self.source_topics), configs)
        log.info("run %s stages to %s (%s)", run_id, staging.describe(), staging.guarantee())
        return replace(staging, log_start=at)

    def staging_from_dict(self, data: dict[str, Any]) -> KafkaStaging:
        return KafkaStaging.from_dict(data)

    def data_folder(self, staging: KafkaStaging) -> str:
        """The run's spool folder: the tasks write the units' files there and the driver reads
        and produces them (unless the tasks produce their units themselves). The driver and
        every executor reach it: ``<state_dir>/spool/kafka`` locally, a folder of the
        object-store warehouse on a cluster (:meth:`rewind.config.Settings.spool_root`)."""
        folder = f"{self.spool_dir}/{staging.run_id}"
        make_dirs(folder)
        return folder

    def committed_units(self, staging: KafkaStaging, run_id: str) -> set[str]:
        return staged_run_log(self.conf, staging, run_id).units()

    def committed_counts(self, staging: KafkaStaging, run_id: str) -> dict[str, dict[str, Any]]:
        """The per-unit counts of the run's commit markers (``extra["rewind.unit-counts"]``)."""
        return staged_run_log(self.conf, staging, run_id).counts()

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
           log clean after its own last commit (or the commit is transactional on a broker whose
           read_committed hides aborted records), read the topic from where the run's last
           commit started and collect the event ids of this run already there: those rows are
           not produced again (an interrupted commit on a broker that shows its records);
        4. (transactional) begin the transaction; produce every remaining row, files in source
           order, serving deliveries between batches; flush and fail on any refused record;
        5. produce the marker (units, counts, rows, the high watermarks before and after the
           data) to ``rewind.commits`` and flush it — only now, so a visible marker always
           means all its data is in the log;
        6. (transactional) commit the transaction;
        7. remember the log is clean; delete the committed files from the spool.

        On failure: abort the transaction (best effort), forget that the log was clean, raise.
        """
        started = time.monotonic()
        was_clean = self._clean.pop(run_id, False)  # a failure below leaves the log unknown
        known = self._known.pop(run_id, None)
        writer = CommitWriter(self.conf, self.key, staging, run_id)
        try:
            # 1. producer (and fencing)
            writer.open()
            # 2. what is done already (this sink's own record of it while the log stays clean)
            runlog = (
                known
                if (was_clean and known is not None)
                else staged_run_log(self.conf, staging, run_id)
            )
            done = runlog.units()
            todo = sorted(u for u in unit_ids if u not in done)
            if not todo:
                self._clean[run_id] = was_clean
                self._known[run_id] = runlog
                return {"topic": staging.topic, "units": 0, "rows": 0, "produced": 0, "repeat": True}
            # 3. where this commit starts, and what an interrupted commit left
            highs = high_watermarks(self.conf, staging.topic)
            present: set[str] = set()
            # nothing to find: no file (units without records; tasks produced the rest), or an
            # interrupted commit's records aborted by open() and hidden from read_committed
            hidden = staging.transactional and staging.read_committed == "supported"
            if not was_clean and files and not hidden:
                scan_from = runlog.scan_from() or staging.start_offsets
                present = event_ids_in(self.conf, staging.topic, run_id, scan_from, highs)
            # 4. the data
            writer.begin()
            rows, produced = writer.produce_files(files, sorted(done & set(unit_ids)), present)
            writer.flush()
            faults.point("kafka-commit-before-marker")
            # 5. the marker, after every data record is acknowledged, with where they end
            ends = high_watermarks(self.conf, staging.topic) if produced else highs
            counts = json.loads((extra or {}).get(UNIT_COUNTS_KEY, "{}"))
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
                "to_offsets": {str(p): o for p, o in sorted(ends.items())},
                "extra": {k: v for k, v in (extra or {}).items() if k != UNIT_COUNTS_KEY},
                "at": now_iso(),
            }
            key = f"{run_id}/commit/{units_digest(todo)}"
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
            remove_file(path)
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

    def check_held(self, staging: KafkaStaging, run_id: str, done: set[str] | None = None) -> None:
        """The bookkeeping still has the marker of every unit in ``done`` and the topic every
        record the run's commits wrote (:mod:`.held`), or
        :class:`~rewind.sinks.kafka.held.StagingLost` in one line."""
        check_held(self.conf, staging, staged_run_log(self.conf, staging, run_id), done)

    # -- reading ------------------------------------------------------------------------------

    def read(self, spark: SparkSession, staging: KafkaStaging) -> DataFrame:
        """The topic's records of this run decoded back into the output columns.

        Read ``read_committed`` with the ``rewind-kafka`` reader from the offsets the topic had
        when the run prepared it, up to the true end; the JSON values and lineage headers are
        decoded by :func:`rewind.sinks.kafka.records.decode_records` in the tasks.
        """
        # lazy: avoids pyspark at import
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
        decode = DecodeRecords(staging.schema_b64, staging.run_id, staging.value_format)
        return df.mapInArrow(decode, from_arrow_schema(schema))

    # -- publishing ---------------------------------------------------------------------------

    def promote(self, staging: KafkaStaging, rebase: bool = False) -> Swap:
        """Record the topic with its end offsets as ``published``; idempotent.

        Steps: (1) read the run's bookkeeping; already published → nothing to do; (2) the true
        high watermarks of the topic (a fetch, not ListOffsets ``latest``, which some brokers
        under-report); (3) check the topic still holds every committed record (:mod:`.held`);
        (4) write the ``published`` record.
        """
        if rebase:  # SUPPORTS_REBASE is False: the job refuses --rebase before calling
            raise ValueError(f"the {self.kind} sink cannot rebase a promotion")
        return promote_topic(self, staging)

    def rollback(self, staging: KafkaStaging, promoted: dict[str, Any]) -> Swap:
        """Record the topic as ``withdrawn``; idempotent. The topic stays until ``rewind cleanup``."""
        return withdraw_topic(self, staging, promoted)

    def cleanup(self, staging: KafkaStaging) -> dict[str, Any]:
        """Delete the run's topic and spool files; refused while the topic is published.

        Only a topic Rewind created for the run is deleted (one that existed before, empty, is
        left to its owner). The run's bookkeeping stays, marked ``deleted``, so the run cannot
        be resumed or promoted into a missing topic. Idempotent.
        """
        return cleanup_topic(self, staging)

    # -- bookkeeping --------------------------------------------------------------------------

    def publication(self, run_id: str) -> dict[str, Any] | None:
        """The run's latest publication record (``published``, ``withdrawn``, ``deleted``) or None."""
        return read_run_log(self.conf, self.bookkeeping, run_id).publication

