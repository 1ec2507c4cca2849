"""Archive Kafka topics into an Iceberg table, incrementally and exactly once.

A pass copies, per partition, the offsets ``[hw, high)`` where ``hw`` is the archived
high-water recorded in the table and ``high`` the log's true end (from a fetch response, see
:mod:`rewind.kafka.resolve`). The table is the only durable position: the new high-water is
written in the snapshot summary of the same Iceberg commit as the data, so a process killed
at any point either committed both or neither, and the next pass starts where the last
commit ended. See :mod:`rewind.history.schema` for the table and its properties.

A pass, in order (:func:`archive_once`):

1. open (or create) the table and read its state: the high-water and start of every
   partition from the newest archive commit, and the current snapshot id;
2. resolve ``[hw, high)`` per partition with :func:`rewind.kafka.resolve.resolve` (a new
   partition starts at its log start); a high-water below the log start is data lost before
   it was archived: an error, or with ``allow_loss`` a ``lost`` range recorded and skipped;
   a high-water above the log end (topic recreated) is always an error;
3. read the ranges in Spark tasks and write Parquet files into the table's data folder from
   the tasks (:mod:`rewind.history.archive_files`): by default each task runs the
   ``rewind-kafka`` reader's fetch loop itself (``read_committed``), so records do not cross
   into the JVM and back; ``via="reader"`` uses ``spark.read.format("rewind-kafka")`` with the
   ``ranges`` option and ``mapInArrow`` instead (the same tasks, about half the throughput,
   measured in ``bench/history.py``); each task also reports the runs of offsets it saw;
4. turn runs into gaps (offsets inside the ranges that the broker skipped: transaction
   markers, aborted records, compaction) and append them to ``<table>__gaps``; then fault
   point ``archive-before-commit``;
5. ONE commit to the table, built on the snapshot read in step 1 (the table refuses commit
   retries, so a concurrent writer makes it fail with :class:`ArchiveConflictError` rather
   than rebase and duplicate): the files plus the new high-water, start, pass id, ranges and
   counts in the snapshot summary; a pass whose ranges held only gaps commits no file but
   still moves the high-water; a pass with nothing new commits nothing; then fault point
   ``archive-after-commit``.

Fault points (``REWIND_FAULT=<point>[:<n>]``, see :mod:`rewind.faults`) kill the process
with SIGKILL at steps 4 and 5, for crash tests.

Continuous archiving (:func:`start_continuous`) first runs one pass (the backlog, with
the batch reader), then a Spark streaming query with the ``rewind-kafka`` stream reader
starting at the table's high-water; ``foreachBatch`` commits every micro-batch with steps 3-5.
The batch's end offsets come from the query's offset log (written by Spark before the batch
runs), so the committed high-water is exact even when a batch ends on transaction markers.
A replayed batch (killed after the commit, before Spark's own commit) keeps only records at
or above the table's high-water. The checkpoint is scratch: every start begins from the table.

Under Spark Connect ``foreachBatch`` runs in a Python process of the server, not in the
client: the runner is pickled there without its session and catalog (the batch's own session
and a catalog loaded from the settings take their place), and the client learns what it
committed from the table, whose snapshots of this stream's micro-batches it reads
(:meth:`ContinuousArchive.refresh`).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.catalog import load_catalog
from rewind.core.ranges import OffsetRange
from rewind.history.archive_pass import (
    CHUNK_RECORDS,
    ArchivePass,
    PassResult,
    ReadVia,
    Written,
    commit_pass,
    data_folder,
    plan_pass,
    write_ranges,
)
from rewind.history.exceptions import (
    ArchivePositionError,
    HistoryError,
)
from rewind.history.schema import (
    GAPS_SUFFIX,
    LOST_PROPERTY,
    PASS_PROPERTY,
    RANGES_PROPERTY,
    RECORDS_PROPERTY,
    SKIPPED_PROPERTY,
    TP,
    archive_state,
    open_archive,
    summary_properties,
)
from rewind.kafka.clients import private_consumer
from rewind.spark import session
from rewind.spark.stream_restarts import RestartPolicy, StreamSupervisor
from rewind.spark.topology import is_connect

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from rewind.config import Settings

log = logging.getLogger(__name__)


def archive_once(
    settings: Settings,
    topics: Sequence[str],
    table: str,
    *,
    spark: SparkSession | None = None,
    allow_loss: bool = False,
    declared_log_start: Mapping[TP, int] | None = None,
    max_offsets: int | None = None,
    chunk_records: int = CHUNK_RECORDS,
    via: ReadVia = "tasks",
    catalog: Catalog | None = None,
) -> PassResult:
    """One archive pass (steps 1-5 of the module docstring); see :class:`PassResult`."""
    started = time.monotonic()
    catalog = catalog or load_catalog(settings)
    iceberg = open_archive(catalog, table, create=True)
    archive_pass = plan_pass(
        settings,
        topics,
        iceberg,
        table,
        allow_loss=allow_loss,
        declared_log_start=declared_log_start,
        max_offsets=max_offsets,
    )
    written = Written()
    if archive_pass.offsets:
        if spark is None:
            spark = session(settings)
        written = write_ranges(
            spark, settings, archive_pass, data_folder(iceberg), chunk_records=chunk_records, via=via
        )
    return commit_pass(catalog, iceberg, archive_pass, written, started=started)


def _offset_log(checkpoint: Path, batch_id: int) -> dict[TP, int] | None:
    """The end offsets Spark wrote for ``batch_id`` in the query's offset log (written before the batch)."""
    path = checkpoint / "offsets" / str(batch_id)
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    data = json.loads(lines[2])
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


class ContinuousArchive:
    """A running continuous archive: a streaming query committing every micro-batch.

    ``results`` holds one :class:`PassResult` per committed micro-batch (the catch-up pass
    first). Stop it with :meth:`stop`; its scratch checkpoint is removed.
    """

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        catalog: Catalog,
        topics: Sequence[str],
        table: str,
        checkpoint: Path,
        initial: dict[TP, int],
    ) -> None:
        self.spark: SparkSession | None = spark
        self.settings = settings
        self._catalog: Catalog | None = catalog
        self.topics, self.table = list(topics), table
        self.checkpoint = checkpoint
        self.initial = initial
        self.results: list[PassResult] = []
        self.supervisor: StreamSupervisor | None = None
        self.stream_id = uuid.uuid4().hex[:8]
        self.remote = is_connect(spark)
        self.trigger_seconds = 5.0

    def __getstate__(self) -> dict[str, object]:
        """What ``foreachBatch`` needs on a Spark Connect server: plain data, no session, no
        catalog connection, no query."""
        state = dict(self.__dict__)
        state.update(spark=None, _catalog=None, supervisor=None, results=[])
        return state

    @property
    def query(self) -> StreamingQuery | None:
        """The streaming query running now (a new one after each restart)."""
        return self.supervisor.query if self.supervisor is not None else None

    @property
    def restarts(self) -> int:
        return self.supervisor.count if self.supervisor is not None else 0

    def error(self) -> Exception | None:
        """Why the archive stopped for good (its restarts used up), else None."""
        return self.supervisor.error() if self.supervisor is not None else None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = load_catalog(self.settings)
        return self._catalog

    def _batch_bounds(self, batch_id: int) -> tuple[dict[TP, int], dict[TP, int]]:
        end = _offset_log(self.checkpoint, batch_id)
        if end is None:
            raise ArchivePositionError(f"no offsets logged for micro-batch {batch_id} in {self.checkpoint}")
        previous = _offset_log(self.checkpoint, batch_id - 1) if batch_id > 0 else None
        start = dict(self.initial if previous is None else previous)
        for tp in end:
            if tp not in start:  # a partition the stream found after it started: from its log start
                start[tp] = self._log_start(tp)
        return start, end

    def _log_start(self, tp: TP) -> int:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        consumer = private_consumer(self.settings.kafka_config(), "archive-stream")
        try:
            low, _high = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)
            return int(low)
        finally:
            consumer.close()

    def on_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: commit the micro-batch with its exact end offsets, once."""
        faults.fail("archive-batch")
        started = time.monotonic()
        start, end = self._batch_bounds(batch_id)
        table = open_archive(self.catalog, self.table)
        state = archive_state(table)
        ranges: list[OffsetRange] = []
        floors: dict[TP, int] = {}
        for tp, stop in sorted(end.items()):
            begin = start.get(tp, stop)
            hw = state.hw.get(tp, begin)
            if hw < begin:
                raise ArchivePositionError(
                    f"micro-batch {batch_id} starts {tp[0]}/{tp[1]} at {begin}, after the archive's "
                    f"high-water {hw}: offsets [{hw}, {begin}) would be skipped; restart the continuous "
                    "archive"
                )
            floors[tp] = hw
            ranges.append(OffsetRange(tp[0], tp[1], min(hw, stop), stop))
        archive_pass = ArchivePass(
            pass_id=f"{self.stream_id}-b{batch_id}",
            table=self.table,
            mode="continuous",
            base=state,
            ranges=tuple(ranges),
            new_partitions=tuple(tp for tp in end if tp not in state.hw),
            started_at_us=int(time.time() * 1_000_000),
        )
        written = Written()
        if archive_pass.offsets:
            written = write_ranges(
                df.sparkSession, self.settings, archive_pass, data_folder(table), source=df, floors=floors
            )
        result = commit_pass(self.catalog, table, archive_pass, written, started=started)
        if result.committed:
            self.results.append(result)

    def refresh(self) -> list[PassResult]:
        """:attr:`results`, brought up to date. Under Spark Connect the micro-batches are
        committed in the server, so their results are read from the table: its snapshots of
        this stream, with the gap rows each recorded (the seconds a batch took stay unknown)."""
        if not self.remote:
            return self.results
        # lazy: avoids pyiceberg at import
        from pyiceberg.table.snapshots import ancestors_of

        table = open_archive(self.catalog, self.table)
        seen = {r.pass_id for r in self.results}
        found = []
        for snap in ancestors_of(table.current_snapshot(), table.metadata):
            props = summary_properties(snap)
            pass_id = props.get(PASS_PROPERTY, "")
            if pass_id in seen:
                break  # older snapshots were read before
            if pass_id.startswith(f"{self.stream_id}-b"):
                found.append(self._committed(snap.snapshot_id, pass_id, props))
        self.results.extend(reversed(found))
        return self.results

    def _committed(self, snapshot_id: int, pass_id: str, props: dict[str, str]) -> PassResult:
        # lazy: avoids pyiceberg at import
        import pyiceberg.expressions as ex

        e: Any = ex  # pyiceberg's predicates are pydantic models that mypy cannot call positionally

        gaps: list[dict[str, object]] = []
        if self.catalog.table_exists(self.table + GAPS_SUFFIX):
            recorded = self.catalog.load_table(self.table + GAPS_SUFFIX)
            gaps = recorded.scan(row_filter=e.EqualTo("pass_id", pass_id)).to_arrow().to_pylist()
        ranges = json.loads(props.get(RANGES_PROPERTY) or "{}")
        partitions = {}
        for key, (start, end) in ranges.items():
            skipped = sum(
                int(g["end_offset"]) - int(g["start_offset"])  # type: ignore[call-overload]
                for g in gaps
                if g["kind"] == "skipped" and f"{g['topic']}/{g['partition']}" == key
            )
            partitions[key] = {"from": start, "to": end, "records": end - start - skipped, "skipped": skipped}
        return PassResult(
            pass_id,
            self.table,
            "continuous",
            True,
            snapshot_id,
            int(props.get(RECORDS_PROPERTY, "0")),
            int(props.get(SKIPPED_PROPERTY, "0")),
            len(gaps),
            json.loads(props.get(LOST_PROPERTY) or "[]"),
            int(props.get("added-data-files", "0")),
            partitions,
            0.0,
            ["committed by the Spark Connect server; its seconds are not known to the client"],
        )

    def hw(self) -> dict[TP, int]:
        return dict(archive_state(open_archive(self.catalog, self.table)).hw)

    def wait_for(self, offsets: Mapping[TP, int], timeout_s: float = 60.0) -> bool:
        """Wait until the archived high-water reaches ``offsets``; False on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.error() is not None:
                return False
            hw = self.hw()
            if all(hw.get(tp, -1) >= o for tp, o in offsets.items()):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def await_termination(self, timeout_s: float | None = None) -> None:
        """Wait until the archive gives up (or ``timeout_s``); raise its one-line error then."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.error() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
        error = self.error()
        if error is not None:
            raise HistoryError(str(error))

    def start_query(self, options: Mapping[str, str]) -> StreamingQuery:
        """The streaming query from the archive's checkpoint (where a restart resumes it)."""
        assert self.spark is not None
        reader = self.spark.readStream.format("rewind-kafka").options(**options)
        return (
            reader.load()
            .writeStream.foreachBatch(self.on_batch)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime=f"{self.trigger_seconds} seconds")
            .queryName(f"rewind-archive-{self.stream_id}")
            .start()
        )


def start_continuous(
    spark: SparkSession,
    settings: Settings,
    topics: Sequence[str],
    table: str,
    *,
    trigger_seconds: float = 5.0,
    max_offsets_per_trigger: int | None = None,
    allow_loss: bool = False,
    catalog: Catalog | None = None,
) -> ContinuousArchive:
    """Catch up with one pass, then archive every micro-batch of a stream from the table's high-water."""
    catalog = catalog or load_catalog(settings)
    first = archive_once(settings, topics, table, spark=spark, allow_loss=allow_loss, catalog=catalog)
    iceberg = open_archive(catalog, table)
    state = archive_state(iceberg)
    initial = {tp: o for tp, o in state.hw.items() if tp[0] in set(topics)}
    checkpoint = settings.state_path / "archive" / table / f"checkpoint-{uuid.uuid4().hex[:12]}"
    checkpoint.mkdir(parents=True, exist_ok=True)
    runner = ContinuousArchive(spark, settings, catalog, topics, table, checkpoint, initial)
    if first.committed:
        runner.results.append(first)
    starting: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(initial.items()):
        starting.setdefault(topic, {})[str(partition)] = offset
    options = {"subscribe": ",".join(topics), "includeHeaders": "true", "failOnDataLoss": "true"}
    if starting:  # the first pass recorded every partition of every topic (a restart: the checkpoint's)
        options["startingOffsets"] = json.dumps(starting)
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    options.update({f"kafka.{key}": str(value) for key, value in settings.kafka_config().items()})
    runner.trigger_seconds = max(0.1, trigger_seconds)
    runner.supervisor = StreamSupervisor(
        f"continuous archive of {table}",
        lambda: runner.start_query(options),
        RestartPolicy.from_settings(settings),
    )
    return runner
