"""A wave of a ``translate.sql`` job, on the executors: the query is a Spark transformation.

The driver holds no record; it builds one Spark plan per wave and collects one small row per
unit (its files and counts), as a Python translate's wave does (:mod:`rewind.spark.job_stage`):

1. ``records``: the wave's records in Kafka's schema (the log through ``rewind-kafka``, the
   archive through the job's reader), each tagged with its unit's ordinal in the wave
   (:class:`TagUnits`), persisted on the executors so that the steps below read them once;
2. the view ``events``: ``records`` decoded in the tasks (:class:`DecodeEvents`), one row per
   decodable record with the decoded fields and the input columns of a Python translate;
   ``_rewind_row`` is the record's id in the wave (:func:`row_id`: the unit's ordinal and the
   record's place in the unit), so the query's rows say which record they come from;
3. the user's query over ``events``, run by Spark where the data is;
4. per unit, the unit's records and the query's rows for them meet in one task (a cogroup on
   the unit, :class:`FinishUnits`), which runs :func:`rewind.translate.process.process_batch`
   with the query's rows as the translate's output: decode failures, key checks, lineage,
   event ids, quarantine and the conservation law are the Python translate's own code.

A query that fails at run time on some records (an ANSI cast, a ``raise_error``) fails the
wave's Spark job. The wave then looks for those records without moving any to the driver:
it runs the query over halves of the failing units' records (Spark jobs that write nothing),
down to single records, at most :data:`MAX_PROBES` jobs per wave, and runs the wave again
without them; each is quarantined as ``translate-error`` with Spark's message, as a Python
translate's record that raises alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.columns import ROW, ROW_INDEX, SRC_KEY
from rewind.core.store import activate
from rewind.errors import RewindError
from rewind.spark.job_stage import (
    RESULT_SCHEMA,
    ArchiveReader,
    StageContext,
    StageError,
    UnitOutput,
    collect_outputs,
    task_error,
    unit_result_rows,
    wave_source,
)
from rewind.spark.sql_translate import VIEW, SqlTranslateError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from rewind.core.units import WorkUnit

log = logging.getLogger(__name__)

UNIT = "_rewind_unit"
"""The column of ``records`` and of the query's rows that names the unit (its ordinal)."""

ROW_BITS = 40
"""``_rewind_row`` = unit ordinal << ROW_BITS | (offset - unit start): a unit spans fewer than
2**40 offsets, a wave fewer than 2**23 units."""

MAX_PROBES = 256
"""Spark jobs a wave may spend looking for the records its query fails on."""

SAMPLE_ROWS = 2_000
"""Records decoded in the driver to type the view when decode does not declare the fields."""


def row_id(ordinal: int, offset_in_unit: int) -> int:
    return (ordinal << ROW_BITS) | offset_in_unit


class TagUnits:
    """``mapInArrow``: Kafka-schema batches in, the same with :data:`UNIT` (records outside
    the wave's units, which a range read never yields, are dropped)."""

    def __init__(self, units: tuple[WorkUnit, ...]) -> None:
        self.units = units

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow as pa

        by_partition: dict[tuple[str, int], list[tuple[int, WorkUnit]]] = {}
        for ordinal, unit in enumerate(self.units):
            by_partition.setdefault((unit.topic, unit.partition), []).append((ordinal, unit))
        for batch in batches:
            if batch.num_rows == 0:
                continue
            topics = batch.column("topic").to_numpy(zero_copy_only=False)
            partitions = batch.column("partition").to_numpy(zero_copy_only=False)
            offsets = batch.column("offset").to_numpy(zero_copy_only=False)
            tags = np.full(batch.num_rows, -1, dtype=np.int32)
            for (topic, partition), units in by_partition.items():
                mine = (topics == topic) & (partitions == partition)
                if not mine.any():
                    continue
                for ordinal, unit in units:
                    tags[mine & (offsets >= unit.start) & (offsets < unit.end)] = ordinal
            keep = tags >= 0
            tagged = batch.append_column(UNIT, pa.array(tags, type=pa.int32()))
            yield tagged if keep.all() else tagged.filter(pa.array(keep))


class DecodeEvents:
    """``mapInArrow``: tagged records in, the view ``events`` out (decodable records only; the
    failures are found again, and quarantined, by :class:`FinishUnits`)."""

    def __init__(self, spec_json: str, units: tuple[WorkUnit, ...], schema: pa.Schema) -> None:
        self.spec_json, self.starts, self.schema = spec_json, [u.start for u in units], schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from rewind.spec import JobSpec
        from rewind.translate.factory import make_decoder

        decoder = make_decoder(JobSpec.model_validate_json(self.spec_json).decode)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            events = decoder.decode(batch.drop_columns([UNIT])).events
            if len(events) == 0:
                continue
            units = batch.column(UNIT).to_numpy(zero_copy_only=False)[events[ROW].to_numpy()]
            yield from events_batches(events, units, self.starts, self.schema)


def events_batches(
    events: pd.DataFrame, units: Any, starts: list[int], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Decoded events as the view's Arrow rows: ``_rewind_row`` made the wave's record id."""
    import numpy as np
    import pyarrow as pa

    offsets = events["_src_offset"].to_numpy(dtype=np.int64)
    ids = (units.astype(np.int64) << ROW_BITS) | (offsets - np.asarray(starts, dtype=np.int64)[units])
    frame = events.reset_index(drop=True).assign(**{ROW: ids})
    try:
        table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False, safe=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SqlTranslateError(
            f"decoded events do not fit the view events' columns ({exc}); declare decode.schema so "
            "that every record's fields have one type"
        ) from exc
    yield from table.to_batches()


class QueryFailedOnRecord(RewindError):
    """The query failed on this record alone (Spark's message): quarantined as ``translate-error``."""


class QueryRows:
    """A unit's rows of the query, served as a translate function's output to
    :func:`~rewind.translate.process.process_batch`: the rows of the records it is given, and
    an error for a record the query failed on (which process_batch isolates and quarantines)."""

    def __init__(self, rows: pd.DataFrame, failed: dict[int, tuple[str, str]], whole: int) -> None:
        self.rows, self.failed, self.whole = rows, failed, whole
        """``whole``: how many events the unit decodes to (asked for all of them, all rows)."""
        self.__name__ = "translate.sql"

    def __call__(self, events: pd.DataFrame) -> pd.DataFrame:
        asked = events[ROW].to_numpy()
        if self.failed:
            for row in set(asked.tolist()) & self.failed.keys():
                kind, message = self.failed[row]
                # named as Spark named the error, as the record's quarantine reason says
                raise type(kind, (QueryFailedOnRecord,), {})(message)
        return self.rows if len(asked) == self.whole else self.rows[self.rows[ROW].isin(asked)]


@dataclass(frozen=True)
class WaveQuery:
    """What the finishing tasks need besides the stage context (pickled to every task)."""

    ctx: StageContext
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Wave record id → Spark's error (class name, message), for the records the query failed
    on alone."""


class FinishUnits:
    """``cogroup.applyInArrow``: one unit's records and its query rows in, its result row out."""

    def __init__(self, wave: WaveQuery) -> None:
        self.wave = wave

    def __call__(self, key: tuple[Any, ...], records: pa.Table, rows: pa.Table) -> pa.Table:
        import numpy as np
        import pyarrow as pa

        from rewind.spark.job_stage import UnitFiles, result_arrow_schema
        from rewind.spec import JobSpec
        from rewind.translate.factory import lineage_options, make_decoder, transform_name
        from rewind.translate.process import ProcessContext, process_batch

        ctx = self.wave.ctx
        activate(ctx.store)  # a unit the task loads into the sink reads its files back
        ordinal = int(key[0].as_py())
        unit = ctx.units[ordinal]
        schema = schema_from_b64(ctx.output_schema_b64)
        out = UnitFiles(ctx, unit, schema)
        if records.num_rows:
            spec = JobSpec.model_validate_json(ctx.spec_json)
            batch = records.drop_columns([UNIT]).sort_by("offset")
            if ctx.latest is not None:
                batch, left_out = ctx.latest.split(batch, unit.topic, unit.partition)
                out.counts = out.counts.merge(left_out)
            offsets = batch["offset"].to_numpy()
            frame = rows.drop_columns([UNIT]).to_pandas()
            wanted = (frame[ROW].to_numpy(dtype=np.int64) & ((1 << ROW_BITS) - 1)) + unit.start
            at = np.searchsorted(offsets, wanted)
            found = (at < len(offsets)) & (offsets[np.minimum(at, len(offsets) - 1)] == wanted)
            frame = frame[found].assign(**{ROW: at[found].astype(np.int64)})
            frame.index = frame[ROW].to_numpy()
            frame.index.name = ROW_INDEX
            base = ordinal << ROW_BITS
            failed = {
                int(np.searchsorted(offsets, (rid - base) + unit.start)): why
                for rid, why in self.wave.failed.items()
                if rid >> ROW_BITS == ordinal
            }
            pctx = ProcessContext(
                ctx.run_id, unit.id, transform_name(spec.translate), spec.translate.version, datetime.now(UTC)
            )
            decoder = make_decoder(spec.decode)
            decoded = len(decoder.decode(batch).events) if failed else -1
            result = process_batch(
                batch,
                decoder,
                QueryRows(frame, failed, decoded),
                spec.key,
                pctx,
                output_schema=pa.schema([f for f in schema if not f.name.startswith("_rewind_")]),
                translator_name="translate.sql",
                **lineage_options(spec),
            )
            out.write(result.rows, result.quarantine)
            out.counts = out.counts.merge(result.counts)
        return pa.Table.from_pylist(unit_result_rows(ctx, [out]), schema=result_arrow_schema())


def view_schema(spark: SparkSession, ctx: StageContext, records: DataFrame) -> pa.Schema:
    """The Arrow schema of the view ``events``: the decoder's declared fields, or (schemaless
    JSON, table rows) those of the wave's first :data:`SAMPLE_ROWS` records, then the input
    columns, ``_rewind_row`` an int64."""
    import pyarrow as pa

    from rewind.spec import JobSpec
    from rewind.translate.factory import make_decoder

    decoder = make_decoder(JobSpec.model_validate_json(ctx.spec_json).decode)
    declared = decoder.empty_events()
    frame = declared
    if not decoder.field_dtypes():
        sample = records.drop(UNIT).limit(SAMPLE_ROWS).toArrow()
        if sample.num_rows:
            frame = decoder.decode(sample.combine_chunks().to_batches()[0]).events
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
    """One wave's Spark plan: the tagged records (persisted), the view and the query over it."""

    def __init__(self, spark: SparkSession, ctx: StageContext, query: str, records: DataFrame) -> None:
        self.spark, self.ctx, self.query, self.records = spark, ctx, query, records
        self.schema = view_schema(spark, ctx, records)

    def ddl(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.schema)

    def rows(self, where: Any | None = None, without: frozenset[int] = frozenset()) -> DataFrame:
        """The query's rows over the records ``where`` selects, minus records ``without``."""
        from pyspark.sql import functions as F

        records = self.records if where is None else self.records.where(where)
        decode: Any = DecodeEvents(self.ctx.spec_json, self.ctx.units, self.schema)
        events = records.mapInArrow(decode, self.ddl())
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
        from pyspark.sql import functions as F

        rows = self.rows(without=frozenset(failed))
        finisher = FinishUnits(WaveQuery(self.ctx, failed))

        def finish(key: tuple[Any, ...], records: pa.Table, rows: pa.Table) -> pa.Table:
            return finisher(key, records, rows)  # Spark counts a function's arguments: not an object's

        grouped = self.records.groupBy(F.col(UNIT)).cogroup(rows.groupBy(F.col(UNIT)))
        results = grouped.applyInArrow(finish, RESULT_SCHEMA).collect()
        return collect_outputs(self.ctx, results)

    def fails(self, where: Any, without: frozenset[int]) -> tuple[str, str] | None:
        """Spark's error (class name, message) when the query fails over the records ``where``
        selects, else None."""
        try:
            self.rows(where, without).write.format("noop").mode("overwrite").save()
        except SqlTranslateError:
            raise
        except Exception as exc:  # the query's own runtime error, from a task
            return type(exc).__name__, query_error(exc)
        return None


def query_error(exc: BaseException) -> str:
    """The first line of a failed query's error (``[ERROR_CLASS] message``), without Spark's
    hints and stack."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= 1000 else first[:997] + "..."


def find_failing_records(wave: _Wave) -> dict[int, tuple[str, str]]:
    """The records the query fails on alone, by halving the wave's units' records; raises a
    one-line error after :data:`MAX_PROBES` Spark jobs."""
    from pyspark.sql import functions as F

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
        start = wave.ctx.units[ordinal].start
        where = (F.col(UNIT) == ordinal) & (F.col("offset") >= start + lo) & (F.col("offset") < start + hi)
        return wave.fails(where, frozenset(failed))

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
    from pyspark import StorageLevel

    for unit in ctx.units:
        if unit.end - unit.start >= 1 << ROW_BITS:
            raise StageError(
                f"unit {unit.id} spans {unit.end - unit.start} offsets, more than a SQL wave can name"
            )
    source = wave_source(spark, ctx, read_archive)
    if source is None:
        return {u.id: UnitOutput(u.id) for u in ctx.units}
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
        wave = _Wave(spark, ctx, query, records)
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
    finally:
        records.unpersist()
