"""What a verification compares, resolved from the spec against the two sides' columns.

Pure Python (no Spark): :func:`resolve` takes the ``verify`` section, the job's key and
window, and the column types of staging and reference (Spark's simple type names), and
returns a frozen :class:`Rules` the comparison engine follows, or raises a one-line
:class:`~rewind.verify.exceptions.VerifyError` naming the field and the column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from rewind.core.columns import EVENT_ID, LINEAGE_PREFIX, SOURCE_TIMESTAMP
from rewind.spec import Tolerance, Verify
from rewind.verify.exceptions import VerifyError

LINEAGE_TIME = SOURCE_TIMESTAMP

# microseconds per unit of a timestamp precision
PRECISION_US: dict[str, int] = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}
GRANULARITY_US: dict[str, int] = {"hour": 3_600_000_000, "day": 86_400_000_000}

_NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double", "decimal", "byte", "short", "long")
_TIME = ("timestamp", "timestamp_ntz", "date")


def is_numeric(spark_type: str) -> bool:
    return spark_type.split("(")[0] in _NUMERIC


def is_time(spark_type: str) -> bool:
    return spark_type in _TIME


@dataclass(frozen=True)
class ColumnRule:
    """How one column is compared."""

    name: str
    kind: Literal["exact", "numeric", "timestamp"]
    abs: float = 0.0
    rel: float = 0.0
    precision_us: int = 1
    nulls_equal: bool = True

    def describe(self) -> str:
        if self.kind == "numeric":
            parts = [f"abs {self.abs:g}" if self.abs else "", f"rel {self.rel:g}" if self.rel else ""]
            text = " + ".join(p for p in parts if p)
        elif self.kind == "timestamp" and self.precision_us > 1:
            unit = next(u for u, us in PRECISION_US.items() if us == self.precision_us)
            text = f"truncated to {unit}"
        else:
            text = "exact"
        return text + ("" if self.nulls_equal else ", null ≠ null")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"column": self.name, "rule": self.describe()}
        if self.kind == "numeric" and self.abs > 0:
            out["abs"] = self.abs  # the report rounds this column's numbers to it
        return out


@dataclass(frozen=True)
class Rules:
    """Everything the comparison needs, resolved and checked."""

    mode: Literal["match", "repair"]
    key: tuple[str, ...]
    columns: tuple[ColumnRule, ...]
    time_column: str | None = None
    window: tuple[datetime | None, datetime | None] = (None, None)
    filter: str | None = None
    key_from: Any = None
    key_to: Any = None
    bucket_column: str | None = None
    granularity: Literal["hour", "day"] = "day"
    category: str | None = None
    samples: int = 20
    drill_rows: int = 500_000
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def bucket_us(self) -> int:
        return GRANULARITY_US[self.granularity]

    @property
    def windowed(self) -> bool:
        return self.time_column is not None and self.window != (None, None)

    def scope_dict(self) -> dict[str, Any]:
        lo, hi = self.window
        return {
            "mode": self.mode,
            "time_column": self.time_column,
            "from": lo.isoformat() if lo else None,
            "to": hi.isoformat() if hi else None,
            "filter": self.filter,
            "key_from": self.key_from,
            "key_to": self.key_to,
        }


def resolve(
    verify: Verify,
    staging_types: Mapping[str, str],
    reference_types: Mapping[str, str],
    *,
    job_key: list[str] | tuple[str, ...] = (),
    job_window: tuple[datetime | None, datetime | None] = (None, None),
    sink_window_column: str | None = None,
    reference_name: str = "reference",
) -> Rules:
    """Check the ``verify`` section against both sides' columns and fill in the defaults.

    Defaults: the key is the job's (``_rewind_event_id`` for a job without one); compared
    columns are those on both sides but the key and Rewind's ``_rewind_*`` columns; the
    scope's time column is the sink's replace-window column, else ``_rewind_source_timestamp``
    when staging has it; the window is the job's source window where its ends are times.
    """
    notes: list[str] = []
    key = tuple(verify.key or job_key or (EVENT_ID,))
    sides = (("staging", staging_types), (reference_name, reference_types))

    def need(column: str, field_name: str, *, numeric: bool = False, time: bool = False) -> None:
        for side, types in sides:
            if column not in types:
                shown = ", ".join(sorted(types)) or "none"
                raise VerifyError(
                    f"verify.{field_name}: column {column!r} is not in {side} (its columns: {shown})"
                )
        kind = staging_types[column]
        if time and not is_time(kind):
            raise VerifyError(f"verify.{field_name}: column {column!r} is {kind}, not a timestamp or date")
        if numeric and not is_numeric(kind):
            raise VerifyError(
                f"verify.{field_name}: column {column!r} is {kind}; abs and rel apply to numbers only"
            )

    for column in key:
        need(column, "key")

    rules: list[ColumnRule] = []
    if verify.compare is None:
        for column in staging_types:
            if column in key or column in verify.ignore or column.startswith(LINEAGE_PREFIX):
                continue
            if column not in reference_types:
                notes.append(f"column {column} is only in staging: not compared")
                continue
            rules.append(_rule(column, Tolerance(), staging_types[column], verify.nulls_equal))
        only_ref = [c for c in reference_types if c not in staging_types and not c.startswith(LINEAGE_PREFIX)]
        if only_ref:
            notes.append(f"columns only in {reference_name}, not compared: {', '.join(only_ref)}")
    else:
        for column, tolerance in verify.compare.items():
            numeric = tolerance.abs is not None or tolerance.rel is not None
            need(column, f"compare.{column}", numeric=numeric, time=tolerance.timestamp_precision is not None)
            rules.append(_rule(column, tolerance, staging_types[column], verify.nulls_equal))

    scope = verify.scope
    time_column = scope.time_column
    if time_column is None and (scope.from_ or scope.to or verify.mode == "repair"):
        candidate = sink_window_column or LINEAGE_TIME
        if candidate in staging_types and candidate in reference_types:
            time_column = candidate
        elif scope.from_ or scope.to:
            raise VerifyError(
                f"verify.scope.from/to need a time column: set verify.scope.time_column ({candidate} is not "
                "on both sides)"
            )
    window: tuple[datetime | None, datetime | None] = (None, None)
    if time_column is not None:
        need(time_column, "scope.time_column", time=True)
        window = (scope.from_ or job_window[0], scope.to or job_window[1])
    if verify.mode == "repair" and window == (None, None):
        notes.append(
            "the repaired window is unbounded (the job's window is not in times): "
            "every difference is a change"
        )

    if scope.key_from is not None or scope.key_to is not None:
        first = key[0]
        if is_numeric(staging_types[first]) and any(
            isinstance(v, str) for v in (scope.key_from, scope.key_to) if v is not None
        ):
            raise VerifyError(f"verify.scope.key_from/key_to: key column {first!r} is a number; give numbers")

    bucket_column = verify.buckets.time_column or time_column
    if bucket_column is not None and bucket_column != time_column:
        need(bucket_column, "buckets.time_column", time=True)
    category = verify.buckets.category
    if category is not None:
        need(category, "buckets.category")

    return Rules(
        mode=verify.mode or "match",
        key=key,
        columns=tuple(rules),
        time_column=time_column,
        window=window,
        filter=scope.filter,
        key_from=scope.key_from,
        key_to=scope.key_to,
        bucket_column=bucket_column,
        granularity=verify.buckets.granularity,
        category=category,
        samples=verify.samples,
        drill_rows=verify.drill_rows,
        notes=tuple(notes),
    )


def _rule(column: str, tolerance: Tolerance, spark_type: str, nulls_equal: bool) -> ColumnRule:
    nulls = tolerance.nulls_equal if tolerance.nulls_equal is not None else nulls_equal
    if tolerance.abs or tolerance.rel:
        return ColumnRule(column, "numeric", tolerance.abs or 0.0, tolerance.rel or 0.0, nulls_equal=nulls)
    if tolerance.timestamp_precision is not None:
        return ColumnRule(
            column, "timestamp", precision_us=PRECISION_US[tolerance.timestamp_precision], nulls_equal=nulls
        )
    return ColumnRule(column, "exact", nulls_equal=nulls)
