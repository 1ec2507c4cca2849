"""The Spark part of a backfill run: read units, process them in tasks, write Parquet files.

One wave = one Spark job over a set of work units. Each task reads its units' ranges with
the ``rewind-kafka`` reader (a unit is never split across tasks), runs
:func:`rewind.translate.process.process_batch` on every Arrow batch, streams output rows and
quarantined records into one Parquet file per unit, and returns one small row per unit:
its files and its counts. Nothing is visible until the driver commits the files
(:mod:`rewind.job.runner`), so a failed task or a killed driver leaves only orphan files.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from rewind.core.arrow import schema_from_b64
from rewind.core.counts import QUARANTINE_FILES_KEY, RecordCounts
from rewind.core.parquet import open_writer
from rewind.core.ranges import OffsetRange
from rewind.core.store import WarehouseStore, activate, active_store
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.spark.kafka_fetch import partitions_in
from rewind.spark.pace_server import PACE_OPTION, PaceAddress
from rewind.spark.progress_channel import PROGRESS_OPTION, ProgressAddress, TaskReporter
from rewind.spark.stage_clock import StageClock, TimedDecoder, add_stage_seconds
from rewind.spark.unit_produce import read_ranges
from rewind.spec import JobSpec
from rewind.translate.factory import lineage_options, make_decoder, make_translator, transform_name

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

ArchiveReader = Callable[[list["OffsetRange"]], "DataFrame"]
"""Reads offset ranges from the lake archive as a DataFrame in Kafka's schema."""

RESULT_SCHEMA = "unit_id string, data_file string, quarantine_file string, counts string, stages string"

_ERROR_LINE = re.compile(r"([A-Za-z_][\w.]*(?:Error|Exception))(?:: (.*))?")


class StageError(RewindError):
    """A Spark task of a wave failed; the message is the task's own error, on one line."""


class KeptRecords(Protocol):
    """What a task asks of the ``latest_per_key`` decision
    (:class:`~rewind.spark.latest_per_key.LatestPerKey`, which is made from this module's
    :func:`wave_source`: so the stage names it by this protocol and never imports it back)."""

    def split(self, records: pa.Table, topic: str, partition: int) -> tuple[pa.Table, RecordCounts]: ...


@dataclass(frozen=True)
class StageContext:
    """Everything a task needs, as plain data (it is pickled to every task)."""

    run_id: str
    spec_json: str
    output_schema_b64: str
    data_folder: str
    quarantine_folder: str
    kafka_conf: dict[str, Any]
    units: tuple[WorkUnit, ...]
    max_records_per_second: float | None = None
    ranges_per_task: int = 4
    rate_limit_id: str = ""
    progress: ProgressAddress | None = None
    """Where tasks report records read while the wave runs (:mod:`rewind.spark.progress_channel`)."""
    pace: PaceAddress | None = None
    """The driver's job-wide rate budget on a cluster (:mod:`rewind.spark.pace_server`)."""
    latest: KeptRecords | None = None
    """``source.kafka.latest_per_key``: the records to process (:mod:`rewind.spark.latest_per_key`)."""
    store: WarehouseStore = field(default_factory=active_store)
    """The warehouse's filesystem properties, captured in the driver (:mod:`rewind.core.store`)."""
    whole_partitions: bool = False
    """Read a wave's units of one source partition as one range, in one task, in offset order
    (units loaded by their tasks keep per-key order: :mod:`rewind.spark.unit_produce`)."""
    unit_loader: Any = None
    """Loads each finished Kafka unit into the sink from its task, one transaction per unit
    (``load(unit_id, files, quarantine_files, counts) -> (recorded counts, loaded)``, e.g.
    :class:`rewind.sinks.sql.task_load.TaskLoader`); None: the driver commits the files."""


@dataclass
class UnitOutput:
    unit_id: str
    data_files: list[str] = field(default_factory=list)
    quarantine_files: list[str] = field(default_factory=list)
    counts: RecordCounts = field(default_factory=RecordCounts)
    stage_s: dict[str, float] = field(default_factory=dict)
    """Seconds per task stage (:mod:`rewind.spark.stage_clock`) of the tasks that reported them
    with this unit (each task reports its own with its first unit)."""
    bytes_read: dict[str, int] = field(default_factory=dict)
    """Record bytes read per source (``kafka``, ``archive``), reported like ``stage_s``."""
    loaded: bool = False
    """The task loaded the unit into the sink (:attr:`StageContext.unit_loader`)."""


class UnitFiles:
    """Streams one unit's output rows and quarantine rows into Parquet files, lazily opened."""

    def __init__(self, ctx: StageContext, unit: WorkUnit, schema: pa.Schema) -> None:
        self.ctx, self.unit, self.schema = ctx, unit, schema
        self.rows_writer: Any = None
        self.q_writer: Any = None
        self.rows_path = ""
        self.q_path = ""
        self.counts = RecordCounts()

    def _open(self, folder: str, schema: pa.Schema, kind: str) -> tuple[Any, str]:
        safe = self.unit.id.replace("/", "_")
        return open_writer(folder, f"{self.ctx.run_id}-{kind}-{safe}", schema, self.ctx.store)

    def write(self, rows: pa.Table, quarantine: pa.Table) -> None:
        if rows.num_rows:
            if self.rows_writer is None:
                self.rows_writer, self.rows_path = self._open(self.ctx.data_folder, self.schema, "data")
            self.rows_writer.write_table(rows.select(self.schema.names).cast(self.schema))
        if quarantine.num_rows:
            if self.q_writer is None:
                self.q_writer, self.q_path = self._open(
                    self.ctx.quarantine_folder, quarantine.schema, "quarantine"
                )
            self.q_writer.write_table(quarantine)

    def close(self) -> UnitOutput:
        for writer in (self.rows_writer, self.q_writer):
            if writer is not None:
                writer.close()
        return UnitOutput(
            self.unit.id,
            [self.rows_path] if self.rows_path else [],
            [self.q_path] if self.q_path else [],
            self.counts,
        )


class ProcessUnits:
    """The ``mapInArrow`` function of a wave: Kafka batches in, one result row per unit out."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc

        # lazy: avoids numpy, pandas, pyarrow at import
        from rewind.translate.process import ProcessContext, process_batch

        spec = JobSpec.model_validate_json(self.ctx.spec_json)
        # the task's own reads of spool files (a unit it loads or produces) use the driver's store
        activate(self.ctx.store)
        clock = StageClock()
        decoder: Any = TimedDecoder(make_decoder(spec.decode), clock)
        translator = make_translator(spec.translate)
        schema = schema_from_b64(self.ctx.output_schema_b64)
        user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
        by_partition: dict[tuple[str, int], list[WorkUnit]] = {}
        for unit in sorted(self.ctx.units, key=lambda u: u.start):  # a task's units load in this order
            by_partition.setdefault((unit.topic, unit.partition), []).append(unit)
        files: dict[str, UnitFiles] = {}
        extracted_at = datetime.now(UTC)
        name = transform_name(spec.translate)
        lineage = lineage_options(spec)
        # Kafka units are reported by the reader as it fetches (batches reach this function
        # only in Spark's large Arrow batches); archive units are reported here
        reporter = TaskReporter(self.ctx.progress)
        for table in clock.timed_iter(coalesced(batches)):
            for topic, partition in partitions_in(table):
                part = table.filter(
                    pc.and_(pc.equal(table["topic"], topic), pc.equal(table["partition"], partition))
                )
                offsets = part["offset"]
                for unit in by_partition.get((topic, partition), []):
                    in_unit = part.filter(
                        pc.and_(pc.greater_equal(offsets, unit.start), pc.less(offsets, unit.end))
                    )
                    if in_unit.num_rows == 0:
                        continue
                    if unit.source == "archive" or self.ctx.whole_partitions:  # not the reader's ranges
                        reporter.add(unit.id, in_unit.num_rows)
                    clock.add_bytes(unit.source, in_unit)
                    left_out = None
                    if self.ctx.latest is not None:
                        in_unit, left_out = self.ctx.latest.split(in_unit, topic, partition)
                    out = files.get(unit.id) or files.setdefault(unit.id, UnitFiles(self.ctx, unit, schema))
                    if left_out is not None:
                        out.counts = out.counts.merge(left_out)
                    if in_unit.num_rows == 0:
                        continue
                    ctx = ProcessContext(self.ctx.run_id, unit.id, name, spec.translate.version, extracted_at)
                    t0, decoding = time.perf_counter(), clock.seconds["decode"]
                    result = process_batch(
                        in_unit, decoder, translator, spec.key, ctx, output_schema=user_schema, **lineage
                    )
                    t1 = time.perf_counter()
                    clock.add("translate", t1 - t0 - (clock.seconds["decode"] - decoding))
                    out.write(result.rows, result.quarantine)
                    clock.add("write", time.perf_counter() - t1)
                    out.counts = out.counts.merge(result.counts)
        reporter.close()
        rows = unit_result_rows(self.ctx, list(files.values()), clock)
        if rows:  # the task's stage seconds ride with its first unit
            rows[0]["stages"] = json.dumps(clock.to_dict())
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=result_arrow_schema())


def unit_result_rows(
    ctx: StageContext, units: list[UnitFiles], clock: StageClock | None = None
) -> list[dict[str, str]]:
    """Close each unit's files (and load it into the sink from the task, when the sink does
    that: :attr:`StageContext.unit_loader`); one result row per unit."""
    rows = []
    for out in units:
        t0 = time.perf_counter()
        done = out.close()
        # a unit is loaded by its task only if it is whole there: archive units may span tasks
        if ctx.unit_loader is not None and out.unit.source == "kafka":
            done.counts.check(done.unit_id)
            recorded, _ = ctx.unit_loader.load(
                done.unit_id, done.data_files, done.quarantine_files, done.counts.to_dict()
            )
            done = UnitOutput(done.unit_id, [], list(recorded.get(QUARANTINE_FILES_KEY) or []))
            done.counts = RecordCounts.from_dict(recorded)
        if clock is not None:
            clock.add("write", time.perf_counter() - t0)
        rows.append(
            {
                "unit_id": done.unit_id,
                "data_file": json.dumps(done.data_files),
                "quarantine_file": json.dumps(done.quarantine_files),
                "counts": json.dumps(done.counts.to_dict()),
                "stages": "{}",
            }
        )
    return rows


COALESCE_ROWS = 100_000
COALESCE_BYTES = 32 * 1024 * 1024


def coalesced(
    batches: Iterator[pa.RecordBatch], rows: int = COALESCE_ROWS, nbytes: int = COALESCE_BYTES
) -> Iterator[pa.Table]:
    """``batches`` gathered into tables of at least ``rows`` records (or ``nbytes``), in order.

    A fetch response (20,000 records) split over a task's 4 partitions gives ~5,000 records
    per unit, and ``process_batch`` costs ~1.5x more per record at that size than at 100,000
    (pandas and Arrow's per-call costs; measured, ``bench/RESULTS.md`` "#18.1")."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    held: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        held.append(batch)
        count, size = count + batch.num_rows, size + batch.nbytes
        if count >= rows or size >= nbytes:
            yield pa.Table.from_batches(held)
            held, count, size = [], 0, 0
    if held:
        yield pa.Table.from_batches(held)


def result_arrow_schema() -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return pa.schema(
        [
            ("unit_id", pa.string()),
            ("data_file", pa.string()),
            ("quarantine_file", pa.string()),
            ("counts", pa.string()),
            ("stages", pa.string()),
        ]
    )


def run_wave(
    spark: SparkSession, ctx: StageContext, read_archive: ArchiveReader | None = None
) -> dict[str, UnitOutput]:
    """Run one wave; every unit of ``ctx`` gets an output (zero counts if it held no record).

    Units whose source is the archive are read by ``read_archive`` (the job layer passes
    :func:`rewind.history.read_ranges_from_archive` bound to the plan's archive snapshot).

    A unit that yields no result row had no records in its range (all gaps): Spark fails
    the whole job if any task fails, so a finished job has read every unit completely.
    """
    results_df = _fetched_in_tasks(spark, ctx)
    if results_df is None:
        source = wave_source(spark, ctx, read_archive)
        if source is None:
            return {u.id: UnitOutput(u.id) for u in ctx.units}
        process: Any = ProcessUnits(ctx)  # a callable object; Spark's stubs want a function
        results_df = source.mapInArrow(process, RESULT_SCHEMA)
    try:
        results = results_df.collect()
    except Exception as exc:
        if isinstance(exc, RewindError):
            raise
        what = f"a Spark task of a wave of {len(ctx.units)} units failed"
        raise StageError(f"{what}: {task_error(exc)}") from exc
    return collect_outputs(ctx, results)


def collect_outputs(ctx: StageContext, results: list[Any]) -> dict[str, UnitOutput]:
    """A wave's result rows (``RESULT_SCHEMA``) added up per unit; every unit of ``ctx`` gets
    an output (zero counts if it held no record)."""
    outputs = {u.id: UnitOutput(u.id) for u in ctx.units}
    loadable = {u.id for u in ctx.units if u.source == "kafka"}
    for row in results:
        out = outputs[row.unit_id]
        out.data_files += json.loads(row.data_file)
        out.quarantine_files += json.loads(row.quarantine_file)
        out.counts = out.counts.merge(RecordCounts.from_dict(json.loads(row.counts)))
        out.loaded = ctx.unit_loader is not None and out.unit_id in loadable
        task = json.loads(row.stages or "{}")
        add_stage_seconds(out.stage_s, task.get("seconds") or {})
        for source, n in (task.get("bytes") or {}).items():
            out.bytes_read[source] = out.bytes_read.get(source, 0) + int(n)
    return outputs


def reader_options(ctx: StageContext) -> dict[str, str]:
    """The ``rewind-kafka`` reader's options for a wave's Kafka units."""
    kafka_units = [u for u in ctx.units if u.source == "kafka"]
    options = {"ranges": json.dumps([r.to_dict() for r in read_ranges(kafka_units, ctx.whole_partitions)])}
    for key, value in ctx.kafka_conf.items():
        options[f"kafka.{key}"] = str(value)
    options["rangesPerTask"] = str(ctx.ranges_per_task)
    if ctx.max_records_per_second:
        options["maxRecordsPerSecond"] = str(ctx.max_records_per_second)
        options["rateLimitId"] = ctx.rate_limit_id or ctx.run_id
        if ctx.pace is not None:
            options[PACE_OPTION] = ctx.pace.to_json()
    if ctx.progress is not None and not ctx.whole_partitions:
        options[PROGRESS_OPTION] = ctx.progress.to_json()
    return options


def _fetched_in_tasks(spark: SparkSession, ctx: StageContext) -> DataFrame | None:
    """The wave's result rows when its tasks read their Kafka units themselves
    (:class:`FetchAndProcess`), or None: the wave holds archive units (read by Spark, then
    handed to the tasks), or ``REWIND_WAVE_READ=reader`` asks for the ``rewind-kafka`` reader
    + ``mapInArrow`` path (kept to compare the two in ``bench/job_profile.py``)."""
    if not ctx.units or any(u.source != "kafka" for u in ctx.units):
        return None
    if os.environ.get("REWIND_WAVE_READ", "tasks") == "reader":
        return None
    # lazy: avoids pyspark at import
    from rewind.spark.kafka_source import KafkaBatchReader, RangesPartition

    options = reader_options(ctx)
    # the reader's own grouping into tasks (distinct partitions per task, layer by layer)
    tasks = [[r.to_dict() for r in p.ranges] for p in KafkaBatchReader(options).partitions()
             if isinstance(p, RangesPartition)]
    if not tasks:
        return None
    fetch: Any = FetchAndProcess(ctx, options, tasks)  # a callable object; Spark's stubs want a function
    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fetch, RESULT_SCHEMA)


class FetchAndProcess:
    """The ``mapInArrow`` function of a wave of Kafka units read inside its tasks: task ids in,
    one result row per unit out.

    Each id names one task's ranges; the task reads them with the ``rewind-kafka`` reader's own
    ``read`` (its fetch loop, rate limit and progress reports) and hands the batches straight to
    :class:`ProcessUnits`. The records never cross into the JVM and back, which the reader +
    ``mapInArrow`` path pays per record twice (Arrow to Spark rows and back) on top of a second
    Python worker per task (see ``bench/RESULTS.md``, "#18.1").
    """

    def __init__(self, ctx: StageContext, options: dict[str, str], tasks: list[list[dict[str, Any]]]) -> None:
        self.ctx, self.options, self.tasks = ctx, options, tasks

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyspark at import
        from rewind.spark.kafka_source import KafkaBatchReader, RangesPartition

        reader = KafkaBatchReader(self.options)
        for batch in batches:
            for task_id in batch.column(0).to_pylist():
                ranges = [OffsetRange.from_dict(d) for d in self.tasks[task_id]]
                yield from ProcessUnits(self.ctx)(reader.read(RangesPartition(ranges)))


def wave_source(
    spark: SparkSession, ctx: StageContext, read_archive: ArchiveReader | None
) -> DataFrame | None:
    """The records of a wave's units, in Kafka's schema: the log's through ``rewind-kafka``,
    the archive's through ``read_archive``; None when the wave has no unit to read."""
    kafka_units = [u for u in ctx.units if u.source == "kafka"]
    archive_units = [u for u in ctx.units if u.source == "archive"]
    reader = spark.read.format("rewind-kafka").options(**reader_options(ctx))
    frames = [reader.load()] if kafka_units else []
    if archive_units:
        # history below the log start: read from the lake archive in Kafka's schema; an
        # archive unit may be split over several tasks, whose counts add up per unit below
        if read_archive is None:
            raise StageError("archive units need an archive reader (the plan's history source)")
        frames.append(read_archive([u.range for u in archive_units]))
    if not frames:
        return None
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


def task_error(exc: BaseException) -> str:
    """The task's own error out of a Spark exception: its text ends with the Python traceback
    of the worker, whose last line is ``module.ErrorClass: message``."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    for line in reversed(lines):
        match = _ERROR_LINE.fullmatch(line)
        if match:
            name = match.group(1).rsplit(".", 1)[-1]
            return f"{name}: {match.group(2)}" if match.group(2) else name
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
