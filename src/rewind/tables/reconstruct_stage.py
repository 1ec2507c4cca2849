"""The Spark stage of a reconstruction wave: tasks read key ranges of states and produce events.

The same wave as a re-produce's (:mod:`rewind.tables.stage`: one Spark job, one task per core,
each running its units one after the other, one Kafka transaction per unit with its marker),
with another unit body. Into a table sink, the unit writer is
:class:`rewind.tables.unit_files.FileUnitWriter` instead (a Parquet file per unit, loaded by the
task or committed by the driver with its unit). Per unit, a task:

1. opens the unit with the sink's unit writer: an earlier attempt's commit means nothing
   more to do, and its counts and quarantine files are returned as they were;
2. reads the unit's rows, ``key >= lo AND key < hi`` in key order, in batches, at the pace of
   ``guards.max_records_per_second``; every state of an entity is in the unit (the key ranges
   never split a key), and batches are cut between entities: the last entity of a batch waits
   for the next one, so an entity's states are always ordered and paired together;
3. per batch of complete entities: states of entities on ``skip_partitions`` are counted as
   filtered; the rest go through :func:`rewind.translate.transition.reconstruct_batch` (sort
   by key, business time and ties; pairs; the transition once; checks; lineage); quarantined
   states go to a quarantine Parquet file, events are produced, in business order, each on its
   entity's partition;
4. closes the quarantine file, checks the conservation law (states in = consumed + quarantined
   + filtered), and commits the unit (its events and its marker, in one transaction).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from rewind.core.arrow import schema_from_b64
from rewind.core.counts import QUARANTINE_FILES_KEY, RecordCounts
from rewind.core.parquet import open_writer
from rewind.kafka.partitioner import partitions_for
from rewind.spark.progress_channel import TaskReporter
from rewind.spec import JobSpec
from rewind.tables.placement import key_bytes
from rewind.tables.records import _column
from rewind.tables.stage import (
    TableStageContext,
    TableUnitOutput,
    TableUnits,
    UnitWriter,
    run_unit_tasks,
)
from rewind.translate.factory import transform_name
from rewind.translate.functions import load_callable
from rewind.translate.process import ProcessContext
from rewind.translate.states import StateOrder
from rewind.translate.transition import ReconstructContext, reconstruct_batch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rewind.tables.readers import Rows

CHUNK_ROWS = 50_000
"""States handed to the transition at once (at least; a batch is cut between entities)."""


def state_order(spec: JobSpec, snapshots: tuple[int, ...] = ()) -> StateOrder:
    """The spec's ``source.table.reconstruct`` as the plain data the tasks order states by."""
    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    rec = table.reconstruct
    return StateOrder(
        key=table.key,
        time=rec.time,
        tie=tuple(rec.tie),
        mode=rec.mode,
        compare=tuple(rec.compare) if rec.compare is not None else None,
        type_column=rec.type_column,
        snapshots=tuple(snapshots),
    )


def source_system(spec: JobSpec) -> str:
    """``lineage.source_system``, else the table's label (``sqlite:policy_history``)."""
    table = spec.source.table
    assert table is not None
    if spec.lineage is not None and spec.lineage.source_system:
        return spec.lineage.source_system
    return table.label


def rows_table(rows: Rows) -> pa.Table:
    """A batch of a reader as an Arrow table of the table's columns."""
    if rows.batch is not None:
        return pa.Table.from_batches([rows.batch])
    columns = list(zip(*rows.rows, strict=True)) if len(rows) else [() for _ in rows.columns]
    return pa.Table.from_arrays([_column(c) for c in columns], names=list(rows.columns))


def split_last_entity(states: pa.Table, key: str) -> tuple[pa.Table, pa.Table]:
    """``states`` (in key order) cut before its last entity: (complete entities, the last one)."""
    n = states.num_rows
    if n == 0:
        return states, states
    keys = states.column(key)
    last = keys[n - 1]
    start = n - int(pc.sum(pc.equal(keys, last)).as_py() or 0)
    return states.slice(0, start), states.slice(start)


@dataclasses.dataclass(frozen=True)
class ReconstructPlanFacts:
    """What the tasks take from the plan besides the stage context: the snapshots' times."""

    snapshots: tuple[int, ...] = ()


class ReconstructUnits(TableUnits):
    """The ``mapInArrow`` function of a reconstruction wave (see the module docstring)."""

    def __init__(self, ctx: TableStageContext, writer: UnitWriter, facts: ReconstructPlanFacts) -> None:
        super().__init__(ctx, writer)
        self.facts = facts

    def _write_unit(self, index: int, reporter: TaskReporter, first_attempt: bool) -> TableUnitOutput:
        ctx = self.ctx
        unit = ctx.units[index]
        lo, hi = ctx.ranges[index]
        spec = JobSpec.model_validate_json(ctx.spec_json)
        table = spec.source.table
        assert table is not None and spec.translate.transition is not None
        session = self.writer.open(unit.id, first_attempt)  # 1.
        if session.done is not None:
            done = session.done
            return TableUnitOutput(
                unit.id,
                list(done.quarantine_files),
                RecordCounts.from_dict(done.counts),
                {"rows": done.rows, "repeat": True},
            )
        transition = load_callable(spec.translate.transition, "translate.transition")
        order = state_order(spec, self.facts.snapshots)
        schema = schema_from_b64(ctx.output_schema_b64)
        user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
        rctx = ReconstructContext(
            ProcessContext(
                ctx.run_id,
                unit.id,
                transform_name(spec.translate),
                spec.translate.version,
                datetime.now(UTC),
                id_scheme="table",
            ),
            table.label,
            unit.partition,
            source_system(spec),
            spec.key[0],
        )
        pacer = self._pacer()
        run = _UnitRun(
            self, session, order, rctx, transition, user_schema, unit.id, spec.translate.transition
        )
        pending: list[pa.Table] = []
        held = 0
        try:
            for rows in ctx.reader.read(ctx.selection, lo, hi, ctx.batch_rows):  # 2.
                n = len(rows)
                if pacer is not None:
                    pacer.acquire(n, 0, time.sleep)
                reporter.add(unit.id, n)
                pending.append(rows_table(rows))
                held += n
                if held >= CHUNK_ROWS:
                    whole, rest = split_last_entity(_concat(pending), table.key)
                    if whole.num_rows:
                        run.chunk(whole)  # 3.
                    pending, held = [rest], rest.num_rows
            if held:
                run.chunk(_concat(pending))
            run.close_quarantine()  # 4.
            run.counts.check(unit.id)
            written = session.commit(run.counts.to_dict(), run.q_files)
        except BaseException:
            run.close_quarantine()
            session.abort()
            raise
        recorded = written.pop("recorded", None)
        if recorded is not None:  # a table sink's earlier attempt loaded the unit: its record stands
            files = list(recorded.get(QUARANTINE_FILES_KEY) or [])
            return TableUnitOutput(
                unit.id, files, RecordCounts.from_dict(recorded), {**written, "repeat": True}
            )
        written["types"] = run.types
        return TableUnitOutput(unit.id, run.q_files, run.counts, written)


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    # a batch may type an all-null column as null, another as text: the wider type wins
    return pa.concat_tables([t for t in tables if t.num_rows] or tables[:1], promote_options="permissive")


class _UnitRun:
    """Step 3 of one unit: complete entities in, events produced, quarantine written."""

    def __init__(
        self,
        units: ReconstructUnits,
        session: Any,
        order: StateOrder,
        rctx: Any,
        transition: Any,
        user_schema: pa.Schema,
        unit_id: str,
        name: str,
    ) -> None:
        self.units, self.session, self.order, self.rctx = units, session, order, rctx
        self.transition, self.user_schema, self.unit_id, self.name = transition, user_schema, unit_id, name
        self.counts = RecordCounts()
        self.types: dict[str, int] = {}
        self.q_files: list[str] = []
        self._q_writer: Any = None
        self.offset = 0

    def chunk(self, states: pa.Table) -> None:
        ctx = self.units.ctx
        skip = set(ctx.skip_partitions)
        if skip:  # entities of blocked partitions: read, filtered, never reconstructed
            keys = [key_bytes(v) for v in states.column(self.order.key).to_pylist()]
            placed = partitions_for(keys, ctx.partitions, ctx.partitioner)  # type: ignore[arg-type]
            keep = pa.array([p not in skip for p in placed])
            left_out = states.num_rows - sum(1 for k in keep.to_pylist() if k)
            if left_out:
                self.counts = self.counts.merge(RecordCounts(records_read=left_out, filtered=left_out))
                states = states.filter(keep)
        if states.num_rows == 0:
            return
        out = reconstruct_batch(
            states,
            self.transition,
            self.order,
            self.rctx,
            self.offset,
            output_schema=self.user_schema,
            name=self.name,
        )
        self.offset += states.num_rows
        if out.quarantine.num_rows:
            if self._q_writer is None:
                safe = self.unit_id.replace("/", "_").replace(":", "_")
                self._q_writer, path = open_writer(
                    ctx.quarantine_folder, f"{ctx.run_id}-quarantine-{safe}", out.quarantine.schema, ctx.store
                )
                self.q_files.append(path)
            self._q_writer.write_table(out.quarantine)
        self.session.produce(out.rows)
        self.counts = self.counts.merge(out.counts)
        for kind, n in out.types.items():
            self.types[kind] = self.types.get(kind, 0) + n

    def close_quarantine(self) -> None:
        if self._q_writer is not None:
            self._q_writer.close()
            self._q_writer = None


def run_reconstruct_wave(
    spark: SparkSession, ctx: TableStageContext, writer: UnitWriter, facts: ReconstructPlanFacts
) -> dict[str, TableUnitOutput]:
    """Run one wave of a reconstruction: one task per core, every unit of ``ctx`` gets its output."""
    return run_unit_tasks(spark, ctx, ReconstructUnits(ctx, writer, facts))
