"""The Spark stage of a re-produce wave: tasks read key ranges and produce them, one unit each.

One wave = one Spark job of at most one task per core (``spark.range(units, numPartitions=
min(units, parallelism))``: a Spark task costs about half a second to schedule, a unit only
its transaction), each running its units one after the other. Per unit, a task:

1. opens the unit with the writer the job layer handed in (the Kafka sink's
   :class:`~rewind.sinks.kafka.unit_writer.UnitWriter`): an earlier attempt's commit means
   nothing more to do, and its counts and quarantine files are returned as they were;
2. reads the unit's rows, ``key >= lo AND key < hi`` in key order, in batches, at the pace of
   ``guards.max_records_per_second`` shared by the job's tasks;
3. per batch: rows become Kafka-shaped records (:mod:`rewind.tables.records`); entities on
   ``skip_partitions`` are counted as filtered; the rest go through
   :func:`rewind.translate.process.process_batch` (decode, translate, key check, lineage);
   rejected rows are written to a quarantine Parquet file, output rows are produced;
4. closes the quarantine file, checks the conservation law, and commits the unit (its records
   and its marker, naming its counts and quarantine file, in one transaction).

Each task returns one row per unit: its counts, its quarantine files and what it produced. The
driver then commits the quarantine files to the quarantine table and marks the units done
(:mod:`rewind.job.reproduce`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from rewind.core.arrow import schema_from_b64
from rewind.core.counts import RecordCounts
from rewind.core.parquet import open_writer
from rewind.core.store import WarehouseStore, active_store
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.kafka.partitioner import partitions_for
from rewind.kafka.unit_redo import redo_interrupted
from rewind.spark.job_stage import task_error
from rewind.spark.pace_server import PaceAddress, RemotePacer
from rewind.spark.progress_channel import ProgressAddress, TaskReporter
from rewind.spark.ratelimit import RateLimit, SharedFilePacer, default_state_dir, shared_state_path
from rewind.spark.topology import default_parallelism
from rewind.spark.unit_produce import first_attempt
from rewind.spec import JobSpec
from rewind.tables.placement import key_bytes
from rewind.tables.readers import Key, Selection, TableReader
from rewind.tables.records import as_records, with_row_values
from rewind.translate.factory import lineage_options, make_decoder, make_translator, transform_name
from rewind.translate.process import ProcessContext, process_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RESULT_SCHEMA = "unit_id string, quarantine_files string, counts string, written string"


class UnitSession(Protocol):
    """One unit's output inside a task (a Kafka transaction)."""

    done: Any
    """Set when an earlier attempt committed the unit: ``counts``, ``quarantine_files``, ``rows``."""

    def produce(self, rows: pa.Table) -> None: ...

    def commit(self, counts: dict[str, Any], quarantine_files: list[str]) -> dict[str, Any]: ...

    def abort(self) -> None: ...


class UnitWriter(Protocol):
    """Plain data pickled to the tasks: opens one unit's output."""

    def open(self, unit_id: str, first_attempt: bool = False) -> UnitSession: ...


@dataclass(frozen=True)
class TableStageContext:
    """Everything a task needs, as plain data (pickled to every task)."""

    run_id: str
    spec_json: str
    output_schema_b64: str
    quarantine_folder: str
    reader: TableReader
    selection: Selection
    units: tuple[WorkUnit, ...]
    ranges: tuple[tuple[Key | None, Key | None], ...]
    partitions: int
    partitioner: str
    skip_partitions: tuple[int, ...] = ()
    max_records_per_second: float | None = None
    rate_limit_id: str = ""
    pace: PaceAddress | None = None
    """The driver's job-wide rate budget on a cluster (:mod:`rewind.spark.pace_server`)."""
    progress: ProgressAddress | None = None
    batch_rows: int = 10_000
    attempted: frozenset[str] = frozenset()
    """Units an earlier run attempt started (a Spark task's first attempt of another unit has
    nothing committed to look for)."""
    store: WarehouseStore = field(default_factory=active_store)
    """The warehouse's filesystem properties, captured in the driver (:mod:`rewind.core.store`)."""


@dataclass
class TableUnitOutput:
    unit_id: str
    quarantine_files: list[str] = field(default_factory=list)
    counts: RecordCounts = field(default_factory=RecordCounts)
    written: dict[str, Any] = field(default_factory=dict)


class TableUnits:
    """The ``mapInArrow`` function of a wave: unit numbers in, one result row per unit out."""

    def __init__(self, ctx: TableStageContext, writer: UnitWriter) -> None:
        self.ctx = ctx
        self.writer = writer

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        reporter = TaskReporter(self.ctx.progress)
        try:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    out = self._unit(int(index), reporter)
                    row = {
                        "unit_id": out.unit_id,
                        "quarantine_files": json.dumps(out.quarantine_files),
                        "counts": json.dumps(out.counts.to_dict()),
                        "written": json.dumps(out.written),
                    }
                    yield pa.RecordBatch.from_pylist([row], schema=result_arrow_schema())
        finally:
            self.ctx.reader.close()
            reporter.close()

    def _unit(self, index: int, reporter: TaskReporter) -> TableUnitOutput:
        unit_id = self.ctx.units[index].id
        return redo_interrupted(
            lambda first: self._write_unit(index, reporter, first),
            first_attempt(unit_id, self.ctx.attempted),
        )

    def _write_unit(self, index: int, reporter: TaskReporter, first_try: bool) -> TableUnitOutput:
        ctx = self.ctx
        unit = ctx.units[index]
        lo, hi = ctx.ranges[index]
        spec = JobSpec.model_validate_json(ctx.spec_json)
        table = spec.source.table
        assert table is not None
        session = self.writer.open(unit.id, first_try)  # 1.
        if session.done is not None:
            done = session.done
            return TableUnitOutput(
                unit.id,
                list(done.quarantine_files),
                RecordCounts.from_dict(done.counts),
                {"rows": done.rows, "repeat": True},
            )
        decoder = make_decoder(spec.decode)
        translator = make_translator(spec.translate)
        schema = schema_from_b64(ctx.output_schema_b64)
        user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
        pctx = ProcessContext(
            ctx.run_id,
            unit.id,
            transform_name(spec.translate),
            spec.translate.version,
            datetime.now(UTC),
            id_scheme="table",
        )
        pacer = self._pacer()
        skip = set(ctx.skip_partitions)
        counts = RecordCounts()
        q_writer: Any = None
        q_files: list[str] = []
        offset = 0
        try:
            for rows in ctx.reader.read(ctx.selection, lo, hi, ctx.batch_rows):  # 2.
                n = len(rows)
                if pacer is not None:
                    pacer.acquire(n, 0, time.sleep)
                first = offset
                records = as_records(rows, table.key, table.label, unit.partition, first, pctx.extracted_at)
                offset += n
                reporter.add(unit.id, n)
                if skip:  # 3. entities of blocked partitions: read, filtered, never produced
                    keys = [key_bytes(value) for value in rows.values(table.key)]
                    placed = partitions_for(keys, ctx.partitions, ctx.partitioner)  # type: ignore[arg-type]
                    keep = pa.array([p not in skip for p in placed])
                    left_out = n - pc.sum(keep).as_py()
                    if left_out:
                        counts = counts.merge(RecordCounts(records_read=left_out, filtered=left_out))
                        records = records.filter(keep)
                if records.num_rows == 0:
                    continue
                result = process_batch(
                    records,
                    decoder,
                    translator,
                    spec.key,
                    pctx,
                    output_schema=user_schema,
                    **lineage_options(spec),
                )
                if result.quarantine.num_rows:
                    quarantine = with_row_values(result.quarantine, rows, first)
                    if q_writer is None:
                        safe = unit.id.replace("/", "_").replace(":", "_")
                        q_writer, path = open_writer(
                            ctx.quarantine_folder,
                            f"{ctx.run_id}-quarantine-{safe}",
                            quarantine.schema,
                            ctx.store,
                        )
                        q_files.append(path)
                    q_writer.write_table(quarantine)
                session.produce(result.rows)
                counts = counts.merge(result.counts)
            if q_writer is not None:  # 4.
                q_writer.close()
                q_writer = None
            counts.check(unit.id)
            written = session.commit(counts.to_dict(), q_files)
        except BaseException:
            if q_writer is not None:
                q_writer.close()
            session.abort()
            raise
        return TableUnitOutput(unit.id, q_files, counts, written)

    def _pacer(self) -> Any:
        if not self.ctx.max_records_per_second:
            return None
        if self.ctx.pace is not None:  # tasks on several hosts: the driver keeps the budget
            return RemotePacer(self.ctx.pace)

        limit = RateLimit(self.ctx.max_records_per_second)
        return SharedFilePacer(
            limit, shared_state_path(default_state_dir(), f"read-{self.ctx.rate_limit_id}")
        )


def result_arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            ("unit_id", pa.string()),
            ("quarantine_files", pa.string()),
            ("counts", pa.string()),
            ("written", pa.string()),
        ]
    )


class TableStageError(RewindError):
    """A task of a re-produce wave failed; the message is the task's own error, on one line."""


def _parallelism(spark: SparkSession) -> int:
    """How many tasks run at once (the default parallelism; a Connect server's, asked of it)."""
    return default_parallelism(spark)


def run_table_wave(
    spark: SparkSession, ctx: TableStageContext, writer: UnitWriter
) -> dict[str, TableUnitOutput]:
    """Run one wave: one task per unit; every unit of ``ctx`` gets its output."""
    return run_unit_tasks(spark, ctx, TableUnits(ctx, writer))


def run_unit_tasks(spark: SparkSession, ctx: TableStageContext, process: Any) -> dict[str, TableUnitOutput]:
    """``process`` (a ``mapInArrow`` function over unit indices, returning ``RESULT_SCHEMA``
    rows) over every unit of ``ctx``, as many tasks at once as Spark runs; every unit gets its
    output, or the wave fails in one line."""
    units = len(ctx.units)
    if not units:
        return {}
    tasks = min(units, _parallelism(spark))
    try:
        results = spark.range(0, units, 1, tasks).mapInArrow(process, RESULT_SCHEMA).collect()
    except Exception as exc:
        if isinstance(exc, RewindError):
            raise
        raise TableStageError(f"a Spark task of a wave of {units} units failed: {task_error(exc)}") from exc
    outputs: dict[str, TableUnitOutput] = {}
    for row in results:
        outputs[row.unit_id] = TableUnitOutput(
            row.unit_id,
            json.loads(row.quarantine_files),
            RecordCounts.from_dict(json.loads(row.counts)),
            json.loads(row.written),
        )
    missing = [u.id for u in ctx.units if u.id not in outputs]
    if missing:
        raise TableStageError(f"units {missing[:3]} returned no result; the wave is not complete")
    return outputs
