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
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rewind.core.ranges import OffsetRange, group_for_tasks
from rewind.history import spans
from rewind.history.archive_files import RESULT_SCHEMA, ArchiveFiles, FetchAndArchive, TaskContext
from rewind.history.exceptions import (
    ArchiveConflictError,
    ArchiveLossError,
    ArchivePositionError,
    HistoryError,
)
from rewind.history.schema import (
    LOST_PROPERTY,
    MODE_PROPERTY,
    PASS_PROPERTY,
    RANGES_PROPERTY,
    RECORDS_PROPERTY,
    SKIPPED_PROPERTY,
    TP,
    ArchiveState,
    archive_state,
    gaps_arrow_schema,
    open_archive,
    open_gaps,
    tp_key,
)
from rewind.spark.session import default_parallelism

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from rewind.config import Settings

log = logging.getLogger(__name__)

Mode = Literal["once", "continuous"]
ReadVia = Literal["tasks", "reader"]
CHUNK_RECORDS = 500_000
RANGES_PER_TASK = 4  # as the rewind-kafka reader: one consumer fetches several partitions at once
POLL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ArchivePass:
    """A planned pass: what to read, on top of which state. Plain data, JSON-friendly."""

    pass_id: str
    table: str
    mode: Mode
    base: ArchiveState
    ranges: tuple[OffsetRange, ...]
    lost: tuple[OffsetRange, ...] = ()
    new_partitions: tuple[TP, ...] = ()
    started_at_us: int = 0
    notes: tuple[str, ...] = ()

    @property
    def offsets(self) -> int:
        return sum(r.size for r in self.ranges)


@dataclass
class Written:
    """What the tasks of a pass wrote: files with their row counts, and runs of offsets seen."""

    files: list[tuple[str, int]] = field(default_factory=list)
    runs: dict[TP, list[tuple[int, int]]] = field(default_factory=dict)
    rows: dict[TP, int] = field(default_factory=dict)


@dataclass
class PassResult:
    """The outcome of one pass (or one micro-batch of a continuous archive)."""

    pass_id: str
    table: str
    mode: Mode
    committed: bool
    snapshot_id: int | None
    records: int
    skipped_offsets: int
    gaps: int
    lost: list[dict[str, Any]]
    files: int
    partitions: dict[str, dict[str, int]]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass_id": self.pass_id,
            "table": self.table,
            "mode": self.mode,
            "committed": self.committed,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "skipped_offsets": self.skipped_offsets,
            "gaps": self.gaps,
            "lost": self.lost,
            "files": self.files,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / self.seconds) if self.seconds > 0 else None,
            "notes": self.notes,
        }


# -- planning -------------------------------------------------------------------------------


def plan_pass(
    settings: Settings,
    topics: Sequence[str],
    table: Table,
    identifier: str,
    *,
    mode: Mode = "once",
    allow_loss: bool = False,
    declared_log_start: Mapping[TP, int] | None = None,
    max_offsets: int | None = None,
) -> ArchivePass:
    """Steps 1-2: the ranges ``[hw, high)`` per partition of ``topics`` on top of ``table``.

    ``max_offsets`` caps the offsets of the pass (shared over partitions in order), for
    passes of bounded size; the next pass continues where this one stops.
    """
    from rewind.core.windows import BoundSpec, WindowRequest
    from rewind.kafka.resolve import resolve

    if not topics:
        raise HistoryError("name at least one topic to archive")
    state = archive_state(table)
    conf = settings.kafka_config()
    from rewind.kafka import clients

    metadata = clients.cluster_metadata(conf)
    starts: dict[TP, int] = {}
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            raise HistoryError(f"topic '{topic}' does not exist; create it or check the name")
        for partition in meta.partitions:
            starts[(topic, partition)] = state.hw.get((topic, partition), -2)
    request = WindowRequest(
        subscribe=tuple(dict.fromkeys(topics)),
        start=BoundSpec(None, starts, option="archive high-water"),
    )
    plan = resolve(conf, request, declared_log_start=declared_log_start)
    ranges: list[OffsetRange] = []
    lost: list[OffsetRange] = []
    new: list[TP] = []
    notes: list[str] = list(plan.notes)
    budget = max_offsets
    for p in plan.partitions:
        tp = (p.topic, p.partition)
        hw = state.hw.get(tp)
        if hw is None:
            new.append(tp)
        else:
            if hw > p.high:
                raise ArchivePositionError(
                    f"the archive of {p.topic}/{p.partition} is at offset {hw}, after the end of the log "
                    f"({p.high}): the topic was recreated or the broker lost records; archive it into a "
                    "new table"
                )
            if p.missing_below_low is not None:
                gone = p.missing_below_low
                if not allow_loss:
                    raise ArchiveLossError(
                        f"offsets [{gone.start}, {gone.end}) of {p.topic}/{p.partition} left Kafka "
                        f"before they were archived (the log now starts at {p.low}); rerun with --allow-loss "
                        "to record them as lost and continue"
                    )
                lost.append(gone)
                notes.append(
                    f"{p.topic}/{p.partition}: offsets [{gone.start}, {gone.end}) lost before archiving"
                )
        end = p.end
        if budget is not None:
            end = min(end, p.start + budget)
            budget -= end - p.start
        ranges.append(OffsetRange(p.topic, p.partition, p.start, end))
    return ArchivePass(
        pass_id=f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}",
        table=identifier,
        mode=mode,
        base=state,
        ranges=tuple(ranges),
        lost=tuple(lost),
        new_partitions=tuple(new),
        started_at_us=int(time.time() * 1_000_000),
        notes=tuple(notes),
    )


# -- reading and writing (Spark) ------------------------------------------------------------


def data_folder(table: Table) -> str:
    return f"{table.location().rstrip('/')}/data"


def write_ranges(
    spark: SparkSession,
    settings: Settings,
    archive_pass: ArchivePass,
    folder: str,
    *,
    chunk_records: int = CHUNK_RECORDS,
    via: ReadVia = "tasks",
    source: DataFrame | None = None,
    floors: Mapping[TP, int] | None = None,
) -> Written:
    """Step 3: read the pass's ranges and write archive files from Spark tasks.

    ``via="tasks"`` (default): each task reads its ranges itself with the ``rewind-kafka``
    reader's fetch loop and writes the records, which never cross into the JVM;
    ``via="reader"``: ``spark.read.format("rewind-kafka")`` with the ``ranges`` option, then
    ``mapInArrow``. Both cut the ranges into the same tasks (chunks of ``chunk_records``,
    grouped by :func:`rewind.core.ranges.group_for_tasks`). ``source`` replaces the read (a
    stream's micro-batch); ``floors`` drops records below a per-partition offset (a replayed
    micro-batch).
    """
    chunks = [c for r in archive_pass.ranges if r.size > 0 for c in r.split(chunk_records)]
    if source is None and not chunks:
        return Written()
    ctx = TaskContext(
        archive_pass.pass_id,
        folder,
        archive_pass.started_at_us,
        {tp_key(*tp): o for tp, o in (floors or {}).items()},
    )
    results: DataFrame
    if source is not None:
        results = source.mapInArrow(ArchiveFiles(ctx), RESULT_SCHEMA)
    elif via == "tasks":
        tasks = [
            [c.to_dict() for c in t]
            for t in group_for_tasks(chunks, RANGES_PER_TASK, default_parallelism(spark))
        ]
        fetch = FetchAndArchive(ctx, settings.kafka_config(), tasks, POLL_TIMEOUT_S)
        results = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fetch, RESULT_SCHEMA)
    else:
        reader = (
            spark.read.format("rewind-kafka")
            .option("ranges", json.dumps([c.to_dict() for c in chunks]))
            .option("includeHeaders", "true")
            .option("rangesPerTask", str(RANGES_PER_TASK))
            .option("minPartitions", str(default_parallelism(spark)))
        )
        for key, value in settings.kafka_config().items():
            reader = reader.option(f"kafka.{key}", str(value))
        results = reader.load().mapInArrow(ArchiveFiles(ctx), RESULT_SCHEMA)
    written = Written()
    for row in results.collect():
        tp = (row.topic, row.partition)
        if row.kind == "file":
            written.files.append((row.payload, int(row.rows)))
        else:
            written.runs.setdefault(tp, []).extend((int(s), int(e)) for s, e in json.loads(row.payload))
            written.rows[tp] = written.rows.get(tp, 0) + int(row.rows)
    written.runs = {tp: spans.merge(r) for tp, r in written.runs.items()}
    return written


# -- committing -----------------------------------------------------------------------------


def _check_written(archive_pass: ArchivePass, written: Written) -> dict[TP, list[tuple[int, int]]]:
    """The gaps of every range; raises when the tasks saw offsets outside the ranges or twice."""
    by_tp = {(r.topic, r.partition): r for r in archive_pass.ranges}
    gaps: dict[TP, list[tuple[int, int]]] = {}
    for tp, runs in written.runs.items():
        rng = by_tp.get(tp)
        if rng is None or spans.subtract(runs, [(rng.start, rng.end)]):
            raise ArchivePositionError(
                f"the pass read offsets of {tp[0]}/{tp[1]} outside its planned range; nothing was committed"
            )
        if spans.total(runs) != written.rows.get(tp, 0):
            raise ArchivePositionError(
                f"the pass read {written.rows.get(tp, 0)} records of {tp[0]}/{tp[1]} for "
                f"{spans.total(runs)} distinct offsets; nothing was committed"
            )
    for tp, rng in by_tp.items():
        if rng.size:
            gaps[tp] = spans.subtract([(rng.start, rng.end)], written.runs.get(tp, []))
    file_rows = sum(n for _p, n in written.files)
    if file_rows != sum(written.rows.values()):
        raise ArchivePositionError(
            f"the pass wrote {file_rows} rows into files for {sum(written.rows.values())} records read; "
            "nothing was committed"
        )
    return gaps


def _record_gaps(
    catalog: Catalog,
    archive_pass: ArchivePass,
    gaps: Mapping[TP, list[tuple[int, int]]],
) -> int:
    """Step 4: append the pass's gaps (skipped and lost) to ``<table>__gaps``; returns the count."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    for (topic, partition), found in sorted(gaps.items()):
        for start, end in found:
            rows.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "start_offset": start,
                    "end_offset": end,
                    "kind": "skipped",
                    "pass_id": archive_pass.pass_id,
                    "recorded_at": now,
                }
            )
    for gone in archive_pass.lost:
        rows.append(
            {
                "topic": gone.topic,
                "partition": gone.partition,
                "start_offset": gone.start,
                "end_offset": gone.end,
                "kind": "lost",
                "pass_id": archive_pass.pass_id,
                "recorded_at": now,
            }
        )
    if not rows:
        return 0
    table = open_gaps(catalog, archive_pass.table, create=True)
    assert table is not None
    table.append(pa.Table.from_pylist(rows, schema=gaps_arrow_schema()))
    return len(rows)


def commit_pass(
    catalog: Catalog,
    table: Table,
    archive_pass: ArchivePass,
    written: Written,
    *,
    ends: Mapping[TP, int] | None = None,
    started: float | None = None,
) -> PassResult:
    """Steps 4-5: record the gaps, then commit files and high-water together, once.

    ``table`` must be the table object the pass was planned on: its snapshot is the parent
    the commit asserts. ``ends`` overrides the new high-water per partition (a stream batch's
    end offsets, which equal its ranges' ends).
    """
    from pyiceberg.exceptions import CommitFailedException

    from rewind import faults

    started = time.monotonic() if started is None else started
    gaps = _check_written(archive_pass, written)
    hw = dict(archive_pass.base.hw)
    start = dict(archive_pass.base.start)
    moved = False
    for rng in archive_pass.ranges:
        tp = (rng.topic, rng.partition)
        if tp not in hw:
            start[tp] = rng.start
        new_hw = max(hw.get(tp, rng.start), rng.end, (ends or {}).get(tp, 0))
        if hw.get(tp) != new_hw:
            moved = True
        hw[tp] = new_hw
    records = sum(n for _p, n in written.files)
    skipped = sum(spans.total(g) for g in gaps.values())
    partitions = {
        tp_key(r.topic, r.partition): {
            "from": r.start,
            "to": r.end,
            "records": written.rows.get((r.topic, r.partition), 0),
            "skipped": spans.total(gaps.get((r.topic, r.partition), [])),
        }
        for r in archive_pass.ranges
        if r.size
    }
    lost_dicts = [g.to_dict() for g in archive_pass.lost]

    def result(committed: bool, snapshot_id: int | None, gap_rows: int) -> PassResult:
        return PassResult(
            archive_pass.pass_id,
            archive_pass.table,
            archive_pass.mode,
            committed,
            snapshot_id,
            records,
            skipped,
            gap_rows,
            lost_dicts,
            len(written.files),
            partitions,
            time.monotonic() - started,
            list(archive_pass.notes),
        )

    if not moved and not written.files and not archive_pass.lost:
        return result(False, archive_pass.base.snapshot_id, 0)

    gap_rows = _record_gaps(catalog, archive_pass, gaps)
    faults.point("archive-before-commit")
    props = {
        **ArchiveState(hw, start).properties(),
        PASS_PROPERTY: archive_pass.pass_id,
        MODE_PROPERTY: archive_pass.mode,
        RANGES_PROPERTY: json.dumps(
            {tp_key(r.topic, r.partition): [r.start, r.end] for r in archive_pass.ranges if r.size},
            separators=(",", ":"),
        ),
        RECORDS_PROPERTY: str(records),
        SKIPPED_PROPERTY: str(skipped),
    }
    if archive_pass.lost:
        props[LOST_PROPERTY] = json.dumps(lost_dicts, separators=(",", ":"))
    tx = table.transaction()  # on the table the pass was planned on: its snapshot is asserted
    try:
        if written.files:
            tx.add_files(
                [p for p, _n in written.files], snapshot_properties=props, check_duplicate_files=False
            )
        else:
            import pyarrow as pa

            tx.append(pa.Table.from_batches([], schema=table.schema().as_arrow()), snapshot_properties=props)
        tx.commit_transaction()
    except CommitFailedException as exc:
        raise ArchiveConflictError(
            f"another writer committed to {archive_pass.table} during pass {archive_pass.pass_id}; "
            f"nothing of this pass was committed (its files are orphans); run the pass again ({exc})"
        ) from exc
    faults.point("archive-after-commit")
    head = catalog.load_table(archive_pass.table).current_snapshot()
    return result(True, head.snapshot_id if head else None, gap_rows)


# -- entry points ---------------------------------------------------------------------------


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
    from rewind.catalog import load_catalog

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
            from rewind.spark import session

            spark = session(settings)
        written = write_ranges(
            spark, settings, archive_pass, data_folder(iceberg), chunk_records=chunk_records, via=via
        )
    return commit_pass(catalog, iceberg, archive_pass, written, started=started)


# -- continuous -----------------------------------------------------------------------------


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
        self.spark, self.settings, self.catalog = spark, settings, catalog
        self.topics, self.table = list(topics), table
        self.checkpoint = checkpoint
        self.initial = initial
        self.results: list[PassResult] = []
        self.query: StreamingQuery | None = None
        self.stream_id = uuid.uuid4().hex[:8]

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
        from confluent_kafka import TopicPartition

        from rewind.kafka.clients import private_consumer

        consumer = private_consumer(self.settings.kafka_config(), "archive-stream")
        try:
            low, _high = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)
            return int(low)
        finally:
            consumer.close()

    def on_batch(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch``: commit the micro-batch with its exact end offsets, once."""
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
                self.spark, self.settings, archive_pass, data_folder(table), source=df, floors=floors
            )
        result = commit_pass(self.catalog, table, archive_pass, written, started=started)
        if result.committed:
            self.results.append(result)

    def hw(self) -> dict[TP, int]:
        return dict(archive_state(open_archive(self.catalog, self.table)).hw)

    def wait_for(self, offsets: Mapping[TP, int], timeout_s: float = 60.0) -> bool:
        """Wait until the archived high-water reaches ``offsets``; False on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.query is not None and self.query.exception() is not None:
                return False
            hw = self.hw()
            if all(hw.get(tp, -1) >= o for tp, o in offsets.items()):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def await_termination(self, timeout_s: float | None = None) -> None:
        assert self.query is not None
        if timeout_s is None:
            self.query.awaitTermination()
        else:
            self.query.awaitTermination(int(timeout_s))
        error = self.query.exception()
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise HistoryError(f"continuous archive of {self.table} stopped: {first}")


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
    from rewind.catalog import load_catalog

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
    reader = (
        spark.readStream.format("rewind-kafka")
        .option("subscribe", ",".join(topics))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
    )
    if starting:  # the first pass recorded every partition of every topic
        reader = reader.option("startingOffsets", json.dumps(starting))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in settings.kafka_config().items():
        reader = reader.option(f"kafka.{key}", str(value))
    runner.query = (
        reader.load()
        .writeStream.foreachBatch(runner.on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{max(0.1, trigger_seconds)} seconds")
        .queryName(f"rewind-archive-{runner.stream_id}")
        .start()
    )
    return runner
