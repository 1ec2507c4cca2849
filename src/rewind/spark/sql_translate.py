"""``translate.sql``: the user's Spark SQL over the decoded records, as a translate function.

A SQL translate is the same contract as a Python one (:mod:`rewind.translate.functions`),
so everything around it is the same code: decoding, quarantine with the record's bytes,
key checks, lineage, event ids and the conservation law
(:func:`rewind.translate.process.process_batch`). What differs is where it runs: the query
needs a SparkSession, which exists only in the driver, so a wave of a SQL job
(:func:`run_sql_wave`) collects its units' records to the driver and processes them there,
one unit at a time, each unit's decoded events registered as the temporary view ``events``.

The query must select ``_rewind_row`` (the view has it: which record a row comes from), as a
Python translate returns it; records it returns no row for are counted as filtered. A
query that fails on a unit is retried on halves down to single records, whose failures are
quarantined (``translate-error``), as for a function. The driver holds one wave's raw records
at a time: size waves (``run.work_unit_records`` times units per wave) to the driver's memory.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rewind.core.arrow import schema_from_b64
from rewind.core.columns import ROW, ROW_INDEX
from rewind.errors import RewindError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.spark.job_stage import ArchiveReader, StageContext, UnitOutput
    from rewind.spec import JobSpec

VIEW = "events"


class SqlTranslateError(RewindError):
    """The query cannot run over the view ``events`` (a plan-time check, one line)."""


class SqlTranslator:
    """Callable like a translate function: a pandas frame of events in, the query's rows out."""

    def __init__(self, spark: SparkSession, query: str) -> None:
        self.spark = spark
        self.query = query
        self.__name__ = "translate.sql"

    def _view(self, events: pd.DataFrame) -> DataFrame:
        frame = events.reset_index(drop=True)
        if frame.empty:
            import pyarrow as pa
            from pyspark.sql.pandas.types import from_arrow_schema

            schema = pa.Schema.from_pandas(frame, preserve_index=False)
            return self.spark.createDataFrame([], from_arrow_schema(schema))
        return self.spark.createDataFrame(frame)

    def __call__(self, events: pd.DataFrame) -> pd.DataFrame:
        self._view(events).createOrReplaceTempView(VIEW)
        out: pd.DataFrame = self.spark.sql(self.query).toPandas()
        if ROW not in out.columns:
            raise SqlTranslateError(
                "translate.sql does not select _rewind_row: keep it in the SELECT list (the view events "
                "has it) so every row names its source record"
            )
        out.index = out[ROW].to_numpy()
        out.index.name = ROW_INDEX
        return out

    def check(self, events: pd.DataFrame) -> None:
        """Raise a one-line :class:`SqlTranslateError` unless the query analyses over ``events``
        and selects ``_rewind_row``."""
        self._view(events.iloc[0:0]).createOrReplaceTempView(VIEW)
        try:
            columns = self.spark.sql(self.query).columns
        except Exception as exc:  # AnalysisException, ParseException: the query's own error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SqlTranslateError(f"translate.sql does not run over the view events: {first}") from exc
        if ROW not in columns:
            self(events.iloc[0:0])  # raises the one-line error above


def sql_translator(settings: Settings, spec: JobSpec) -> tuple[SqlTranslator, tuple[str, bool, str]]:
    """The plan's translate gate for a SQL job: the query analysed over the view ``events``
    typed as decode gives it (when decode knows the fields up front; else the sample shows)."""
    from rewind.spark import session
    from rewind.translate.columns import user_columns
    from rewind.translate.factory import make_decoder

    query = spec.translate.sql
    assert query is not None
    translator = SqlTranslator(session(settings), query)
    empty = make_decoder(spec.decode).empty_events()
    if user_columns(empty.columns):
        translator.check(empty)
    shown = " ".join(query.split())
    version = spec.translate.version
    return translator, ("translate", True, f"translate.sql over the view events: {shown} (version {version})")


def run_sql_wave(
    spark: SparkSession, ctx: StageContext, query: str, read_archive: ArchiveReader | None = None
) -> dict[str, UnitOutput]:
    """One wave of a SQL job: the units' records to the driver, each unit processed there with
    the query as its translate; the same files and counts as :func:`run_wave`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rewind.spark.job_stage import UnitOutput, _UnitFiles, wave_source
    from rewind.spec import JobSpec
    from rewind.translate.factory import lineage_options, make_decoder, transform_name
    from rewind.translate.process import ProcessContext, process_batch

    spec = JobSpec.model_validate_json(ctx.spec_json)
    source = wave_source(spark, ctx, read_archive)
    outputs = {u.id: UnitOutput(u.id) for u in ctx.units}
    if source is None:
        return outputs
    records: pa.Table = source.toArrow()
    decoder = make_decoder(spec.decode)
    translator = SqlTranslator(spark, query)
    schema = schema_from_b64(ctx.output_schema_b64)
    user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
    extracted_at = datetime.now(UTC)
    name = transform_name(spec.translate)
    for unit in ctx.units:
        mask = pc.and_(
            pc.and_(pc.equal(records["topic"], unit.topic), pc.equal(records["partition"], unit.partition)),
            pc.and_(pc.greater_equal(records["offset"], unit.start), pc.less(records["offset"], unit.end)),
        )
        batch = records.filter(mask).sort_by("offset")
        if batch.num_rows == 0:
            continue
        pctx = ProcessContext(ctx.run_id, unit.id, name, spec.translate.version, extracted_at)
        result = process_batch(
            batch,
            decoder,
            translator,
            spec.key,
            pctx,
            output_schema=user_schema,
            translator_name="translate.sql",
            **lineage_options(spec),
        )
        files = _UnitFiles(ctx, unit, schema)
        files.write(result.rows, result.quarantine)
        files.counts = result.counts
        outputs[unit.id] = files.close()
    return outputs

