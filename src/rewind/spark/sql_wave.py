"""A wave of a ``translate.sql`` job, on the executors: the query is a Spark transformation.

The driver holds no record; it builds one Spark plan per wave and collects one small row per
unit (its files and counts), as a Python translate's wave does (:mod:`rewind.spark.job_stage`):

1. the view ``events``: the wave's records decoded in the tasks, one row per decodable record
   with the decoded fields and the input columns of a Python translate; ``_rewind_row`` is the
   record's id in the wave (:func:`~rewind.spark.sql_wave_tasks.row_id`: the unit's ordinal and
   the record's place in the unit), so the query's rows say which record they come from. A wave
   of Kafka units reads them in the tasks that decode them (:class:`FetchDecode`), so records
   never enter the JVM; a wave holding archive units (read through Spark) tags its records with
   their unit (:class:`TagUnits`) and persists them on the executors, read once for every step;
2. the user's query over ``events``, run by Spark where the data is;
3. per unit, its records and the query's rows of them go through the Python translate's own
   :func:`rewind.translate.process.process_batch`, with the query's rows as the translate's
   output: decode failures, key checks, lineage, event ids, quarantine and the conservation law
   are the Python translate's own code. Where this happens:

   * in place (a Kafka wave whose query works row by row, :func:`runs_in_place`: filters and
     projections, the usual translate): one stage; each task reads its units (a partition's
     units as one range), spools the records with their decoding's fate on its host
     (:class:`~rewind.spark.sql_wave_tasks.FetchDecode`), the query runs over the decoded
     rows in the same task, and :class:`FinishInPlace` finishes the units from the spool. No
     shuffle, no second read from Kafka, no second decode (``bench/sql_translate.py`` at 10M
     records: 0.44 of the Python translate's rate by unit, 0.78-0.82 in place);
   * by unit (a query with a shuffle: a window, an aggregate, a join, a limit; a wave with
     archive units; Spark Connect, which shows no plan to check): one task per unit gets the
     query's rows for the unit (a cogroup on the unit, :class:`FinishUnits`) and reads the
     unit's records again (from Kafka, or the persisted ones).

A query that fails at run time on some records (an ANSI cast, a ``raise_error``) fails the
wave's Spark job. The wave then looks for those records without moving any to the driver:
it runs the query over halves of the failing units' records (Spark jobs that write nothing),
down to single records, at most :data:`MAX_PROBES` jobs per wave, and runs the wave again
without them; each is quarantined as ``translate-error`` with Spark's message, as a Python
translate's record that raises alone.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rewind.core.columns import ROW, SRC_KEY
from rewind.core.ranges import OffsetRange
from rewind.errors import RewindError
from rewind.spark.job_stage import (
    RESULT_SCHEMA,
    ArchiveReader,
    StageContext,
    StageError,
    UnitOutput,
    collect_outputs,
    reader_options,
    task_error,
    wave_source,
)
from rewind.spark.kafka_fetch import fetch_ranges
from rewind.spark.physical_plan import plan_nodes, scala_seq
from rewind.spark.sql_translate import VIEW, SqlTranslateError
from rewind.spark.sql_wave_tasks import (
    ROW_BITS,
    UNIT,
    DecodeEvents,
    FetchDecode,
    FinishInPlace,
    FinishUnits,
    TagUnits,
    WaveQuery,
    row_id,
)
from rewind.spark.unit_produce import read_ranges
from rewind.spec import JobSpec
from rewind.translate.factory import make_decoder

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from rewind.core.units import WorkUnit


log = logging.getLogger(__name__)

MAX_PROBES = 256
"""Spark jobs a wave may spend looking for the records its query fails on."""

SAMPLE_ROWS = 2_000
"""Records decoded in the driver to type the view when decode does not declare the fields."""


def view_schema(ctx: StageContext, sample: Callable[[], pa.Table]) -> pa.Schema:
    """The Arrow schema of the view ``events``: the decoder's declared fields, or (schemaless
    JSON, table rows) those of the wave's first records (``sample()``), then the input columns,
    ``_rewind_row`` an int64."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    decoder = make_decoder(JobSpec.model_validate_json(ctx.spec_json).decode)
    declared = decoder.empty_events()
    frame = declared
    if not decoder.field_dtypes():
        records = sample()
        if records.num_rows:
            frame = decoder.decode(records.combine_chunks().to_batches()[0]).events
    types = {
        f.name: f.type for f in pa.Schema.from_pandas(declared.reset_index(drop=True), preserve_index=False)
    }
    fields = []
    for f in pa.Schema.from_pandas(frame.reset_index(drop=True), preserve_index=False):
        kind = f.type
        if pa.types.is_null(kind):
            kind = types.get(f.name, pa.string())
            kind = (pa.binary() if f.name == SRC_KEY else pa.string()) if pa.types.is_null(kind) else kind
        if pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_large_binary(kind):
            kind = pa.binary()
        elif pa.types.is_timestamp(kind):
            kind = pa.timestamp("us", tz=kind.tz)
        fields.append(pa.field(f.name, kind))
    return pa.schema(fields)


class _Wave:
    """One wave's Spark plan: where its records come from, the view and the query over it.

    A wave of Kafka units reads them in its tasks (``fetch``: the reader's options): once to
    build the view, once more in each finishing task for its unit, so the records never enter
    the JVM; a wave with archive units (read through Spark) persists its tagged records on the
    executors (``records``) and reads them from there.
    """

    def __init__(
        self,
        spark: SparkSession,
        ctx: StageContext,
        query: str,
        records: DataFrame | None = None,
        fetch: dict[str, str] | None = None,
    ) -> None:
        self.spark, self.ctx, self.query, self.records, self.fetch = spark, ctx, query, records, fetch
        self.schema = view_schema(ctx, self._sample)

    def _sample(self) -> pa.Table:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if self.records is not None:
            return self.records.drop(UNIT).limit(SAMPLE_ROWS).toArrow()

        first = self.ctx.units[0]
        window = OffsetRange(
            first.topic, first.partition, first.start, min(first.end, first.start + SAMPLE_ROWS)
        )
        batches = list(fetch_ranges(self.ctx.kafka_conf, [window], poll_timeout_s=30))
        return pa.Table.from_batches(batches) if batches else pa.table({})

    def ddl(self) -> Any:
        # lazy: avoids pyspark at import
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.schema)

    def events(self, part: tuple[int, int, int] | None = None) -> DataFrame:
        """The view's rows: of the whole wave, or of ``part`` (unit ordinal, first and end
        offset within the unit)."""
        # lazy: avoids pyspark at import
        from pyspark.sql import functions as F

        if self.records is not None:
            records = self.records
            if part is not None:
                ordinal, lo, hi = part
                start = self.ctx.units[ordinal].start
                offset = F.col("offset")
                records = records.where(
                    (F.col(UNIT) == ordinal) & (offset >= start + lo) & (offset < start + hi)
                )
            decode: Any = DecodeEvents(self.ctx.spec_json, self.ctx.units, self.schema)
            return records.mapInArrow(decode, self.ddl())
        assert self.fetch is not None
        if part is None:
            # lazy: avoids pyspark at import
            from rewind.spark.kafka_source import KafkaBatchReader, RangesPartition

            reader = KafkaBatchReader(self.fetch)  # the reader's own grouping of ranges into tasks
            tasks = [
                [r.to_dict() for r in p.ranges] for p in reader.partitions() if isinstance(p, RangesPartition)
            ]
        else:
            ordinal, lo, hi = part
            unit = self.ctx.units[ordinal]
            tasks = [
                [
                    {
                        "topic": unit.topic,
                        "partition": unit.partition,
                        "start": unit.start + lo,
                        "end": unit.start + hi,
                    }
                ]
            ]
        fetch: Any = FetchDecode(self.ctx, self.schema, self.fetch, tasks)
        return self.spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fetch, self.ddl())

    def rows(
        self, part: tuple[int, int, int] | None = None, without: frozenset[int] = frozenset()
    ) -> DataFrame:
        """The query's rows over the wave (or ``part`` of it), minus records ``without``."""
        return self._query(self.events(part), without)

    def _query(self, events: DataFrame, without: frozenset[int]) -> DataFrame:
        # lazy: avoids pyspark at import
        from pyspark.sql import functions as F

        if without:
            events = events.where(~F.col(ROW).isin(list(without)))
        events.createOrReplaceTempView(VIEW)
        out = self.spark.sql(self.query)
        if ROW not in out.columns:
            raise SqlTranslateError(
                "translate.sql does not select _rewind_row: keep it in the SELECT list (the view events has "
                "it) so every row names its source record"
            )
        return out.withColumn(UNIT, F.shiftright(F.col(ROW), ROW_BITS).cast("int"))

    def finish(self, failed: dict[int, tuple[str, str]]) -> dict[str, UnitOutput]:
        # lazy: avoids pyspark at import
        from pyspark.sql import functions as F

        in_place = self._finish_in_place(failed)
        if in_place is not None:
            return in_place
        rows = self.rows(without=frozenset(failed))
        finisher = FinishUnits(WaveQuery(self.ctx, failed, self.fetch))

        def finish(key: tuple[Any, ...], records: pa.Table, rows: pa.Table) -> pa.Table:
            return finisher(key, records, rows)  # Spark counts a function's arguments: not an object's

        if self.records is not None:
            left = self.records
        else:  # one row per unit: its task reads the unit's records itself
            left = self.spark.range(0, len(self.ctx.units)).select(F.col("id").cast("int").alias(UNIT))
        grouped = left.groupBy(F.col(UNIT)).cogroup(rows.groupBy(F.col(UNIT)))
        results = grouped.applyInArrow(finish, RESULT_SCHEMA).collect()
        return collect_outputs(self.ctx, results)

    def _finish_in_place(self, failed: dict[int, tuple[str, str]]) -> dict[str, UnitOutput] | None:
        """A Kafka wave whose query keeps each row in its record's task (no shuffle, join, limit
        or union: :func:`runs_in_place`) is finished in one stage: each task reads its units
        (a partition's units in offset order when the sink produces a partition's units in one
        task), decodes them, runs the query and finishes them from the records it spooled on its
        host. None when the query cannot run so; the wave is then finished by a cogroup."""
        if self.fetch is None:
            return None
        # lazy: avoids pyarrow, pyspark at import
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        tasks = unit_tasks(self.ctx.units, self.ctx.whole_partitions, self.ctx.ranges_per_task)
        token = f"{self.ctx.run_id}-{uuid.uuid4().hex[:12]}"
        # a partition's units of a task read as one range (the reader takes one per partition)
        spans = [read_ranges([self.ctx.units[i] for i in task], whole_partitions=True) for task in tasks]
        ranges = [[r.to_dict() for r in task_spans] for task_spans in spans]

        def query(schema: pa.Schema) -> DataFrame:
            fetch: Any = FetchDecode(self.ctx, schema, self.fetch or {}, ranges, spool=token)
            view = self.spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fetch, from_arrow_schema(schema))
            return self._query(view, frozenset(failed))

        rows = query(self.schema)
        if not runs_in_place(rows):
            return None
        # the view's columns the query does not read never leave Python (the JVM cannot prune
        # a Python function's output): its lineage inputs, mostly
        used = columns_read(rows, set(self.schema.names)) | {ROW}
        if used < set(self.schema.names):
            rows = query(pa.schema([f for f in self.schema if f.name in used]))
        finisher: Any = FinishInPlace(WaveQuery(self.ctx, failed, self.fetch), token, tasks)
        return collect_outputs(self.ctx, rows.mapInArrow(finisher, RESULT_SCHEMA).collect())

    def fails(self, part: tuple[int, int, int], without: frozenset[int]) -> tuple[str, str] | None:
        """Spark's error (class name, message) when the query fails over ``part`` of the wave,
        else None."""
        try:
            self.rows(part, without).write.format("noop").mode("overwrite").save()
        except SqlTranslateError:
            raise
        except Exception as exc:  # the query's own runtime error, from a task
            return type(exc).__name__, query_error(exc)
        return None


IN_PLACE_NODES = frozenset({"Range", "MapInArrow", "Project", "Filter", "InputAdapter"})
"""The physical operators a query may have for its rows to stay in the task that decoded their
records (besides ``WholeStageCodegen``): one read of the view, then row-by-row work."""


def runs_in_place(df: DataFrame) -> bool:
    """Whether ``df``'s physical plan keeps every row in the partition of the view it comes from:
    one view, only :data:`IN_PLACE_NODES`. A Spark Connect DataFrame shows no plan: no."""
    nodes = plan_nodes(df)
    if nodes is None:
        return False
    names = [str(node.nodeName()) for node in nodes]
    return (
        names.count("Range") == 1
        and names.count("MapInArrow") == 1
        and all(n in IN_PLACE_NODES or n.startswith("WholeStageCodegen") for n in names)
    )


def columns_read(df: DataFrame, among: set[str]) -> set[str]:
    """The columns of ``among`` (the view's) that the operators of ``df``'s physical plan read,
    the view's own function and its input aside (a plan of :func:`runs_in_place`), or that it
    outputs (a column passed through untouched is read by no operator)."""
    nodes = plan_nodes(df)
    assert nodes is not None  # a plan of runs_in_place
    names = {str(a.name()) for a in scala_seq(nodes[0].output())}
    for node in nodes:
        if str(node.nodeName()) not in ("MapInArrow", "Range"):
            names |= {str(a.name()) for a in scala_seq(node.references().toSeq())}
    return names & among


def unit_tasks(units: tuple[WorkUnit, ...], whole_partitions: bool, per_task: int) -> list[list[int]]:
    """The unit ordinals of each task of an in-place wave: runs of up to ``per_task`` units of one
    source partition in offset order (the reader's own grouping, without splitting a unit), or
    (``whole_partitions``: the Kafka sink produces a partition's units in order) all of a
    partition's units."""
    by_partition: dict[tuple[str, int], list[int]] = {}
    for i, unit in enumerate(units):
        by_partition.setdefault((unit.topic, unit.partition), []).append(i)
    tasks: list[list[int]] = []
    for _, ids in sorted(by_partition.items()):
        ids.sort(key=lambda i: units[i].start)
        step = len(ids) if whole_partitions else max(1, per_task)
        tasks += [ids[k : k + step] for k in range(0, len(ids), step)]
    return tasks


def query_error(exc: BaseException) -> str:
    """The first line of a failed query's error (``[ERROR_CLASS] message``), without Spark's
    hints and stack."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= 1000 else first[:997] + "..."


def find_failing_records(wave: _Wave) -> dict[int, tuple[str, str]]:
    """The records the query fails on alone, by halving the wave's units' records; raises a
    one-line error after :data:`MAX_PROBES` Spark jobs."""
    failed: dict[int, tuple[str, str]] = {}
    probes = 0

    def probe(ordinal: int, lo: int, hi: int) -> tuple[str, str] | None:
        nonlocal probes
        probes += 1
        if probes > MAX_PROBES:
            unit = wave.ctx.units[ordinal]
            first = next(iter(failed.values()), ("", "?"))[1]
            raise StageError(
                f"translate.sql fails on many records of unit {unit.id} (more than {MAX_PROBES} Spark jobs "
                f"spent finding them; first: {first}); make the query total (try_cast, try_divide, ...) or "
                "filter those records in its WHERE"
            )
        return wave.fails((ordinal, lo, hi), frozenset(failed))

    def search(ordinal: int, lo: int, hi: int, error: tuple[str, str]) -> None:
        if hi - lo == 1:
            failed[row_id(ordinal, lo)] = error
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            found = probe(ordinal, a, b)
            if found is not None:
                search(ordinal, a, b, found)

    for ordinal, unit in enumerate(wave.ctx.units):
        error = probe(ordinal, 0, unit.end - unit.start)
        if error is not None:
            search(ordinal, 0, unit.end - unit.start, error)
    return failed


def run_sql_wave(
    spark: SparkSession, ctx: StageContext, query: str, read_archive: ArchiveReader | None = None
) -> dict[str, UnitOutput]:
    """One wave of a SQL job on the executors; the same files and counts as :func:`run_wave`."""
    # lazy: avoids pyspark at import
    from pyspark import StorageLevel

    for unit in ctx.units:
        if unit.end - unit.start >= 1 << ROW_BITS:
            raise StageError(
                f"unit {unit.id} spans {unit.end - unit.start} offsets, more than a SQL wave can name"
            )
    if ctx.units and all(u.source == "kafka" for u in ctx.units):
        wave = _Wave(spark, ctx, query, fetch=reader_options(ctx))
        return _finish(wave)
    source = wave_source(spark, ctx, read_archive)
    if source is None:
        return {u.id: UnitOutput(u.id) for u in ctx.units}
    # lazy: avoids pyspark at import
    from pyspark.sql.types import IntegerType, StructField, StructType

    tag: Any = TagUnits(ctx.units)
    tagged = StructType([*source.schema.fields, StructField(UNIT, IntegerType(), False)])
    records = source.mapInArrow(tag, tagged).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        try:
            records.count()  # read once, here: the view, the probes and the finishing tasks reuse it
        except Exception as exc:
            raise StageError(
                f"a Spark task of a wave of {len(ctx.units)} units failed: {task_error(exc)}"
            ) from exc
        return _finish(_Wave(spark, ctx, query, records=records))
    finally:
        records.unpersist()


def _finish(wave: _Wave) -> dict[str, UnitOutput]:
    """The wave's units finished; when the query fails on some records, those are found and the
    wave finished again without them (quarantined)."""
    try:
        return wave.finish({})
    except RewindError:
        raise
    except Exception as exc:
        first = exc
        log.info(
            "translate.sql failed on the wave (%s); looking for the records it fails on", query_error(exc)
        )
    failed = find_failing_records(wave)
    if not failed:  # not the query's error: the finishing tasks' own (a bad output column...)
        raise StageError(f"a Spark task of a SQL wave failed: {task_error(first)}") from first
    try:
        return wave.finish(failed)
    except RewindError:
        raise
    except Exception as exc:
        raise StageError(f"a Spark task of a SQL wave failed: {task_error(exc)}") from exc
