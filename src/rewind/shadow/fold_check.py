"""Before a folded shadow starts: the fold must take its own output rows as input.

The tail folds each micro-batch's partial rows together with v2's current rows of the same
keys, and a current row is the fold's own output. That is the contract
``source.kafka.snapshot`` already asks of a fold (sums, counts, last non-null, min, max: yes;
an average: keep a sum and a count). It cannot be proven without data, but a fold whose output
columns differ from its input's cannot take its own rows, and that is checked here, before
anything is written: the fold is called on an empty frame of the translate's columns, typed
as the fold gets them (and on one row of defaults if it refuses an empty frame).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.core.columns import LINEAGE_PREFIX
from rewind.errors import RewindError
from rewind.job.planner import build_plan
from rewind.shadow.exceptions import ShadowError
from rewind.spark.fold_stage import _nullable
from rewind.translate.factory import declared_output_schema, make_decoder, make_translator
from rewind.translate.functions import infer_output_schema, load_callable

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings
    from rewind.spec import JobSpec


def check_fold_takes_own_rows(settings: Settings, spec: JobSpec) -> None:
    """Raise a one-line :class:`ShadowError` when ``translate.fold`` cannot take its own rows."""
    # lazy: avoids pandas at import
    import pandas as pd


    reference = spec.translate.fold
    if reference is None:
        return
    fold = load_callable(reference, "translate.fold")
    schema = _translate_schema(settings, spec)
    if schema is None:
        return  # the plan refuses a job whose output schema is unknown, in its own line
    columns = [f for f in schema if not f.name.startswith(LINEAGE_PREFIX)]
    names = [f.name for f in columns]
    errors = []
    for frame in (_frame(columns, 0), _frame(columns, 1)):
        try:
            out = fold(frame.copy())
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
            continue
        got = list(out.columns) if isinstance(out, pd.DataFrame) else None
        if got is None or sorted(got) != sorted(names):
            raise ShadowError(
                f"translate.fold {reference}: its output columns {got} differ from its input's {names}, "
                "so it cannot take its own rows; a shadow folds each micro-batch with v2's rows (as "
                "source.kafka.snapshot does): return the input's columns (a sum and a count, not an average)"
            )
        return
    raise ShadowError(
        f"translate.fold {reference} fails on rows of its own columns {names} ({errors[-1]}); a shadow "
        "folds each micro-batch with v2's rows (as source.kafka.snapshot does): the fold must take them"
    )


def _translate_schema(settings: Settings, spec: JobSpec) -> pa.Schema | None:
    """The translate's output columns: declared, or the function's on an empty frame, or the plan's."""
    declared = declared_output_schema(spec.translate)
    if declared is not None:
        return declared
    translator = make_translator(spec.translate)
    if translator is not None:
        try:
            return infer_output_schema(translator, make_decoder(spec.decode).empty_events()).arrow_schema()
        except RewindError:
            pass

    plan = build_plan(settings, spec)  # samples the source: only when nothing cheaper knows
    return plan.output_schema() if plan.output_schema_b64 else None


def _frame(fields: list[pa.Field], rows: int) -> Any:
    """``rows`` (0 or 1) rows of ``fields``, typed as a fold task gets them; the one row holds
    each type's zero (0, "", the epoch...)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    arrays = []
    for f in fields:
        if rows and not pa.types.is_null(f.type):
            arrays.append(pa.array([_zero(f.type)], f.type))
        else:
            arrays.append(pa.array([None] * rows, f.type))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    return table.to_pandas(types_mapper=_nullable)


def _zero(t: pa.DataType) -> Any:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return False
    if pa.types.is_integer(t):
        return 0
    if pa.types.is_floating(t):
        return 0.0
    if pa.types.is_decimal(t):
        return Decimal(0)
    if pa.types.is_timestamp(t):
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC if t.tz else None)
    if pa.types.is_date(t):
        return dt.date(1970, 1, 1)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return b""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return ""
    return None
