"""Steps 1 and 2 of a comparison: cut both sides to the scope and hash each row.

See :mod:`rewind.verify.compare` for the whole algorithm.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from rewind.verify.rules import ColumnRule, Rules, is_time
from rewind.verify.spark_util import analysis_error, quiet_query_errors, spark_types

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

NULL_BUCKET = -(2**62)
"""Time bucket of rows whose time is null."""
NULL_CATEGORY = "\x00null"
"""Category of rows whose category is null (a cell key must not be null: it is joined on)."""
WINDOW_FLAG = "_rewind_w"


def apply_scope(df: DataFrame, rules: Rules, types: dict[str, str], *, side: int, name: str) -> DataFrame:
    """``df`` cut to the scope: filter, key range and (``match`` mode) the window.

    ``types`` are staging's column types: the reference's key and time columns are cast to
    them first, so both sides are cut by the same values. Adds the window flag ``_rewind_w``
    (1 inside the window, 0 outside or when there is no window).
    """
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    own = spark_types(df)

    def col(column: str) -> Column:
        c = F.col(f"`{column}`")
        if side == 1 and own.get(column) != types[column]:
            c = c.try_cast(types[column])
        return c

    if rules.filter:
        try:
            with quiet_query_errors():
                df = df.where(F.expr(rules.filter))
        except Exception as exc:  # pyspark's AnalysisException, ParseException...
            raise analysis_error(name, "scope.filter", exc) from None
    first = col(rules.key[0])
    if rules.key_from is not None:
        df = df.where(first >= F.lit(rules.key_from))
    if rules.key_to is not None:
        df = df.where(first < F.lit(rules.key_to))
    # repair mode with no bounded window: the whole table is the repaired window, so every
    # difference is a change (as the rules' note says), none a failure
    w: Column = F.lit(1 if rules.mode == "repair" and not rules.windowed else 0)
    if rules.time_column is not None and rules.windowed:
        t = _as_timestamp(col(rules.time_column), types[rules.time_column])
        lo, hi = rules.window
        inside = F.lit(True)
        if lo is not None:
            inside = inside & (t >= F.lit(lo))
        if hi is not None:
            inside = inside & (t < F.lit(hi))
        if rules.mode == "match":
            df = df.where(inside)
        else:
            w = F.when(inside, F.lit(1)).otherwise(F.lit(0))
    return df.withColumn(WINDOW_FLAG, w.cast("int"))


def without_flag(df: DataFrame) -> DataFrame:
    """``df`` without the window flag :func:`apply_scope` added (for the assertions' views)."""
    return df.drop(WINDOW_FLAG)


def prepare_side(df: DataFrame, rules: Rules, types: dict[str, str], *, side: int, name: str) -> DataFrame:
    """One side in scope, aligned to staging's types, with w, tb, cat, kh, h, k*, c*."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    own = spark_types(df)

    def col(column: str) -> Column:
        c = F.col(f"`{column}`")
        if side == 1 and own.get(column) != types[column]:
            c = c.try_cast(types[column])
        return c

    df = apply_scope(df, rules, types, side=side, name=name)
    w = F.col(WINDOW_FLAG)
    if rules.bucket_column is not None:
        micros = F.unix_micros(_as_timestamp(col(rules.bucket_column), types[rules.bucket_column]))
        tb = F.coalesce(truncate_micros(micros, rules.bucket_us), F.lit(NULL_BUCKET))
    else:
        tb = F.lit(0).cast("long")

    keys = [col(k).alias(f"k{i}") for i, k in enumerate(rules.key)]
    values = [col(c.name).alias(f"c{i}") for i, c in enumerate(rules.columns)]
    extra = [w.cast("int").alias("w"), tb.alias("tb")]
    if rules.category is not None:
        extra.append(F.coalesce(col(rules.category).cast("string"), F.lit(NULL_CATEGORY)).alias("cat"))
    projected = df.select(*keys, *values, *extra)

    key_cols = [F.col(f"k{i}") for i in range(len(rules.key))]
    kh = F.xxhash64(*key_cols, *_null_masks(key_cols))
    normal = [_normalise(F.col(f"c{i}"), rule, types[rule.name]) for i, rule in enumerate(rules.columns)]
    value_cols = [F.col(f"c{i}") for i in range(len(rules.columns))]
    unequal = [F.col(f"c{i}").isNull() for i, rule in enumerate(rules.columns) if not rule.nulls_equal]
    salt = [F.when(any_of(unequal), F.lit(side + 1)).otherwise(F.lit(0))] if unequal else []
    # the key hash enters the row hash: otherwise two keys of one cell that trade their values
    # (or a key replaced by another with the same values) leave the cell's count and sum as they were
    h = F.xxhash64(F.col("kh"), *normal, *_null_masks(value_cols), *salt)
    return projected.withColumn("kh", kh).withColumn("h", h)


def any_of(conditions: list[Column]) -> Column:
    out = conditions[0]
    for c in conditions[1:]:
        out = out | c
    return out


def _null_masks(columns: list[Column]) -> list[Column]:
    """One long per 62 columns: bit i set when column i is null."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    masks = []
    for start in range(0, len(columns), 62):
        mask: Column = F.lit(0).cast("long")
        for i, c in enumerate(columns[start : start + 62]):
            mask = mask + F.when(c.isNull(), F.lit(1 << i)).otherwise(F.lit(0)).cast("long")
        masks.append(mask)
    return masks


def _as_timestamp(column: Column, spark_type: str) -> Column:
    return column.cast("timestamp") if spark_type == "date" else column


def truncate_micros(micros: Column, unit: int) -> Column:
    """``micros`` rounded down to a multiple of ``unit`` (also before 1970), in integers."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    if unit == 1:
        return micros
    return micros - F.pmod(micros, F.lit(unit).cast("long"))


def _normalise(column: Column, rule: ColumnRule, spark_type: str) -> Column:
    """The value that enters the row hash: timestamps floored to their precision."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    if rule.kind == "timestamp" and is_time(spark_type):
        return truncate_micros(F.unix_micros(_as_timestamp(column, spark_type)), rule.precision_us)
    return column


def bucket_label(tb: int, rules: Rules) -> str:
    if rules.bucket_column is None:
        return "all"
    if tb == NULL_BUCKET:
        return "null"
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=tb)
    return start.strftime("%Y-%m-%dT%H:00Z" if rules.granularity == "hour" else "%Y-%m-%d")
