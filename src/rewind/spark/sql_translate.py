"""``translate.sql``: the user's Spark SQL over the decoded records, as a translate function.

A SQL translate is the same contract as a Python one (:mod:`rewind.translate.functions`),
so everything around it is the same code: decoding, quarantine with the record's bytes,
key checks, lineage, event ids and the conservation law
(:func:`rewind.translate.process.process_batch`). What differs is where it runs: a wave's
query is a Spark transformation of the decoded records, on the executors
(:mod:`rewind.spark.sql_wave`); this module is the plan's side: the gate that analyses the
query over an empty view ``events`` typed as decode gives it, and :class:`SqlTranslator`, which
runs the query over a small frame in the driver (the plan's sample, to learn its output).

The query must select ``_rewind_row`` (the view has it: which record a row comes from), as a
Python translate returns it, and the sink's key columns; records it returns no row for are
counted as filtered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.core.columns import ROW, ROW_INDEX
from rewind.errors import RewindError
from rewind.spark import session
from rewind.translate.columns import user_columns
from rewind.translate.factory import make_decoder

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
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
            # lazy: avoids pyarrow, pyspark at import
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

    def check(self, events: pd.DataFrame, key: list[str]) -> None:
        """Raise a one-line :class:`SqlTranslateError` unless the query analyses over ``events``
        and selects ``_rewind_row`` and the ``key`` columns."""
        self._view(events.iloc[0:0]).createOrReplaceTempView(VIEW)
        try:
            columns = self.spark.sql(self.query).columns
        except Exception as exc:  # AnalysisException, ParseException: the query's own error
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SqlTranslateError(f"translate.sql does not run over the view events: {first}") from exc
        if ROW not in columns:
            self(events.iloc[0:0])  # raises the one-line error above
        missing = [k for k in key if k not in columns]
        if missing:
            raise SqlTranslateError(
                f"translate.sql does not select the key column(s) {', '.join(missing)} (it selects "
                f"{', '.join(c for c in columns if c != ROW) or 'nothing else'}); select them, or change key"
            )


def sql_translator(settings: Settings, spec: JobSpec) -> tuple[SqlTranslator, tuple[str, bool, str]]:
    """The plan's translate gate for a SQL job: the query analysed over the view ``events``
    typed as decode gives it (when decode knows the fields up front; else the sample shows)."""
    query = spec.translate.sql
    assert query is not None
    translator = SqlTranslator(session(settings), query)
    empty = make_decoder(spec.decode).empty_events()
    if user_columns(empty.columns):
        translator.check(empty, list(spec.key))
    shown = " ".join(query.split())
    version = spec.translate.version
    return translator, ("translate", True, f"translate.sql over the view events: {shown} (version {version})")
