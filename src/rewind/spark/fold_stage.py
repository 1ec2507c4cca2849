"""The Spark part of a run's last step: fold the run's rows per key and keep the replaced window.

A read model (per-order totals...) is a fold of many events per key, while the translate sees
one Arrow batch of one unit at a time. So the translate emits partial rows (one per event, in
the read model's columns) and, once every unit is committed, this stage:

1. reads the run's rows from staging (``_rewind_run_id`` = the run),
2. repartitions them by the spec's ``key`` so every row of a key is in one task,
3. in each task, sorts by key then source time/topic/partition/offset and calls the user's
   fold once for all the task's keys (vectorised pandas, not one Python call per key),
4. drops rows whose window column falls outside the replaced window (they would duplicate the
   target's rows kept outside it), and
5. writes one Parquet file per task, returning its path and counts.

Lineage of a folded row is that of its key's last source row, so the row still names the
record that completed it, and its event id stays deterministic. The driver commits the files
(:mod:`rewind.job.finalize`); nothing here is visible until then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.columns import (
    LINEAGE_COLUMNS,
    OPTIONAL_LINEAGE,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from rewind.core.parquet import write_parquet
from rewind.core.store import WarehouseStore, active_store
from rewind.errors import RewindError
from rewind.spark.job_stage import StageError, task_error
from rewind.translate.functions import load_callable

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame

FOLD_RESULT_SCHEMA = "data_file string, counts string"
_ORDER = [SOURCE_TIMESTAMP, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET]


class FoldError(RewindError):
    """The fold function broke its contract (one row per key, the same columns)."""


@dataclass(frozen=True)
class FoldContext:
    """What a fold task needs, as plain data (pickled to every task)."""

    run_id: str
    key: tuple[str, ...]
    fold: str | None
    schema_b64: str
    data_folder: str
    window_column: str | None = None
    window: tuple[datetime, datetime] | None = None
    store: WarehouseStore = field(default_factory=active_store)
    """The warehouse's filesystem properties, captured in the driver (:mod:`rewind.core.store`)."""


@dataclass
class FoldCounts:
    rows_in: int = 0
    rows_out: int = 0
    outside_window: int = 0

    def add(self, other: FoldCounts) -> None:
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.outside_window += other.outside_window

    def to_dict(self) -> dict[str, int]:
        return {"rows_in": self.rows_in, "rows_out": self.rows_out, "outside_window": self.outside_window}


def fold_frame(rows: pd.DataFrame, key: list[str], fold: Any) -> pd.DataFrame:
    """One row per key: the user's fold over the sorted rows, with the last row's lineage (its
    source system and effective time too, when the spec's ``lineage:`` asks; without a fold,
    the rows unchanged). Pure pandas (no Spark): the contract checks are testable on their own.
    """
    # lazy: avoids pandas at import
    import pandas as pd

    if fold is None:  # only the window is kept: rows pass as they are
        return rows
    rows = rows.sort_values([*key, *_ORDER], kind="stable", na_position="first").reset_index(drop=True)
    carried = [*LINEAGE_COLUMNS, *(c for c in OPTIONAL_LINEAGE if c in rows.columns)]
    user = [c for c in rows.columns if c not in carried]
    out = fold(rows[user].copy())
    if not isinstance(out, pd.DataFrame):
        raise FoldError(f"translate.fold returned {type(out).__name__}, expected a pandas DataFrame")
    missing = [c for c in user if c not in out.columns]
    if missing:
        raise FoldError(f"translate.fold output lacks columns {missing}; return every translate column")
    out = out[user].reset_index(drop=True)
    if out.duplicated(subset=key).any():
        raise FoldError(f"translate.fold returned several rows for one {', '.join(key)}; return one per key")
    given = len(rows.drop_duplicates(subset=key))
    if len(out) < given:  # a key without a row would vanish from a replaced window unnoticed
        raise FoldError(
            f"translate.fold returned {len(out)} rows for {given} keys; return one row per key "
            "(filter in the translate to leave an entity out)"
        )
    lineage = rows.drop_duplicates(subset=key, keep="last")[[*key, *carried]]
    merged = out.merge(lineage, on=key, how="left", validate="one_to_one")
    if merged[RUN_ID].isna().any():
        raise FoldError("translate.fold returned a key that is not in its input; fold only the keys given")
    return merged


def fold_arrow(rows: pa.Table, key: list[str], fold: Any, schema: pa.Schema) -> pa.Table:
    """:func:`fold_frame` over Arrow rows (pandas' nullable integers, as a fold task gets them),
    back to ``schema``: a shadow's tail folds a micro-batch's partial rows together with v2's
    current rows of the same keys with it, in the driver."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    frame = fold_frame(rows.to_pandas(types_mapper=_nullable), key, fold)
    return pa.Table.from_pandas(frame, preserve_index=False).select(schema.names).cast(schema)


def _outside(frame: pd.DataFrame, column: str, window: tuple[datetime, datetime]) -> pd.Series:
    # lazy: avoids pandas at import
    import pandas as pd

    values = pd.to_datetime(frame[column], utc=True)
    lo, hi = (pd.Timestamp(t) for t in window)
    return values.isna() | (values < lo) | (values >= hi)


def _nullable(arrow_type: pa.DataType) -> Any:
    """Integers and booleans as pandas' nullable dtypes, as the translate gets them: a null in a
    task must not turn the column into floats (2**53 + 1 would come back as 2**53)."""
    # lazy: avoids pandas, pyarrow at import
    import pandas as pd
    import pyarrow as pa

    dtypes = {
        pa.int8(): pd.Int8Dtype(),
        pa.int16(): pd.Int16Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
    }
    return dtypes.get(arrow_type)


class FoldPartitions:
    """The ``mapInArrow`` function: all rows of some keys in, one Parquet file and counts out."""

    def __init__(self, ctx: FoldContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:

        # lazy: avoids pyarrow at import
        import pyarrow as pa

        ctx = self.ctx
        schema = schema_from_b64(ctx.schema_b64)
        parts = [b for b in batches if b.num_rows]
        if not parts:
            return
        table = pa.Table.from_batches(parts)  # Spark's nullability differs from the file schema
        fold = load_callable(ctx.fold, "translate.fold") if ctx.fold else None
        frame = fold_frame(table.to_pandas(types_mapper=_nullable), list(ctx.key), fold)
        counts = FoldCounts(rows_in=table.num_rows)
        if ctx.window is not None and ctx.window_column:
            outside = _outside(frame, ctx.window_column, ctx.window)
            counts.outside_window = int(outside.sum())
            frame = frame[~outside]
        counts.rows_out = len(frame)
        path = ""
        if len(frame):
            out = pa.Table.from_pandas(frame, preserve_index=False).select(schema.names).cast(schema)
            path = write_parquet(ctx.data_folder, out, f"{ctx.run_id}-fold", ctx.store)
        yield pa.RecordBatch.from_pylist(
            [{"data_file": path, "counts": json.dumps(counts.to_dict())}],
            schema=pa.schema([("data_file", pa.string()), ("counts", pa.string())]),
        )


def run_fold(rows: DataFrame, ctx: FoldContext, partitions: int) -> tuple[list[str], FoldCounts]:
    """Fold ``rows`` (the run's staged rows) in Spark; the files written and the totals."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    mine = rows.where(F.col(RUN_ID) == ctx.run_id).repartition(max(1, partitions), *ctx.key)
    try:
        results = mine.mapInArrow(FoldPartitions(ctx), FOLD_RESULT_SCHEMA).collect()
    except Exception as exc:
        raise StageError(f"fold of run {ctx.run_id} failed: {task_error(exc)}") from exc
    totals = FoldCounts()
    files = []
    for row in results:
        totals.add(FoldCounts(**json.loads(row["counts"])))
        if row["data_file"]:
            files.append(row["data_file"])
    return files, totals
