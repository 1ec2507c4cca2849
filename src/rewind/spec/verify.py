"""The ``verify:`` section: the reference, the scope, tolerances, buckets and assertions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from rewind.spec.errors import _Bad, _Plain
from rewind.spec.values import (
    _ICEBERG_TABLE,
    _LINEAGE_TIME,
    _PG_IDENT,
    _check_column,
    _exactly_one,
    _fill,
    _iso,
    _Model,
    _verify_time,
)

_VIEW_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_VIEWS = ("staging", "reference", "target")
_PRECISIONS = ("us", "ms", "s", "min", "h", "d")


class PostgresReference(_Model):
    """A PostgreSQL table, or a query, holding the expected rows (a source of truth).

    Read through the driver with ``COPY ... TO STDOUT`` into a temporary Parquet file that
    Spark then reads: fine for reference tables up to tens of millions of rows.
    """

    url: str | None = Field(
        default=None,
        description=(
            "`postgresql://user@host:5432/db`. Default: `sink.postgres.url`, else the ledger's URL "
            "when it is PostgreSQL. Keep passwords out of spec files (settings or PGPASSWORD)."
        ),
        json_schema_extra={"doc_default": "the sink's, else the ledger's"},
    )
    table: str | None = Field(
        default=None, description="`schema.table` or `table`; exactly one of `table` and `query`."
    )
    query: str | None = Field(
        default=None,
        description="A PostgreSQL `SELECT` whose rows are the reference (run in a read-only transaction).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"postgres(ql)?(\+\w+)?://", url):
            raise _Bad("not a PostgreSQL URL", "like postgresql://user@host:5432/db", got=url)
        return url

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is None:
            return None
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(p) and len(p) <= 63 for p in parts):
            raise _Bad("not a schema.table name", "like public.order_totals", got=table)
        return table

    @model_validator(mode="after")
    def _one(self) -> PostgresReference:
        _exactly_one(self, ("table", "query"), "table or query")
        return self


class SqlReference(_Model):
    """A recomputation: a Spark SQL query whose result is what staging should hold.

    The query sees the temporary views ``staging`` (the run's whole staging), ``target`` (the
    production target, when it exists) and every view named in ``views``; the scope is applied
    to its result like to any reference. Recomputing straight from the Kafka window (a view
    of decoded events) is not offered yet: archive the history into Iceberg and name it in
    ``views``.
    """

    query: str = Field(
        description="Spark SQL, like `SELECT order_id, sum(amount) AS total FROM lines GROUP BY 1`."
    )
    views: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra views for the query: view name → Iceberg table (`namespace.table`) of the "
            "catalog in the settings, like `{lines: lake.order_lines}`."
        ),
        json_schema_extra={"doc_type": "mapping view → Iceberg table"},
    )

    @field_validator("query")
    @classmethod
    def _query(cls, query: str) -> str:
        if not query.strip():
            raise _Bad("empty", "write a SELECT over the views staging, target or your own views", got=query)
        return query

    @field_validator("views")
    @classmethod
    def _views(cls, views: dict[str, str]) -> dict[str, str]:
        for name, table in views.items():
            if not _VIEW_NAME.fullmatch(name) or name.lower() in _RESERVED_VIEWS:
                raise _Bad(
                    "not a free view name",
                    f"a SQL identifier other than {', '.join(_RESERVED_VIEWS)}",
                    got=name,
                    at=(name,),
                )
            if not _ICEBERG_TABLE.fullmatch(table):
                raise _Bad("not a namespace.table name", "like lake.order_lines", got=table, at=(name,))
        return views


class Reference(_Model):
    """What staging is compared with: exactly one of `target`, `iceberg`, `postgres`, `sql`."""

    KINDS: ClassVar[tuple[str, ...]] = ("target", "iceberg", "postgres", "sql")

    target: bool | None = Field(
        default=None,
        description=(
            "`true`: the production target as it is now, i.e. what promotion would replace (the usual "
            "case; an absent target, for a new read model, counts as empty)."
        ),
    )
    iceberg: str | None = Field(
        default=None, description="`namespace.table` of the catalog in the settings (its `main`)."
    )
    postgres: PostgresReference | None = Field(default=None, description="A PostgreSQL table or query.")
    sql: SqlReference | None = Field(
        default=None,
        description="A recomputation in Spark SQL; a string is short for `{query: ...}`.",
        json_schema_extra={"doc_type": "string or mapping, see `verify.reference.sql`"},
    )

    @field_validator("target")
    @classmethod
    def _target(cls, target: bool | None) -> bool | None:
        if target is False:
            raise _Bad("not true", "write target: true, or name another reference", got=target)
        return target

    @field_validator("iceberg")
    @classmethod
    def _iceberg(cls, table: str | None) -> str | None:
        if table is not None and not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.order_totals_truth", got=table)
        return table

    @field_validator("sql", mode="before")
    @classmethod
    def _sql(cls, value: Any) -> Any:
        return {"query": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one(self) -> Reference:
        _exactly_one(self, self.KINDS, "reference")
        return self

    @property
    def kind(self) -> Literal["target", "iceberg", "postgres", "sql"]:
        """The name of the reference given."""
        if self.target:
            return "target"
        if self.iceberg is not None:
            return "iceberg"
        return "postgres" if self.postgres is not None else "sql"


class Scope(_Model):
    """Which rows are compared: a time window, a filter and a key range, applied to both sides."""

    time_column: str | None = Field(
        default=None,
        description=(
            "Time column of the window. Default: the sink's `window_column` (Iceberg replace-window, "
            f"PostgreSQL with a fold), else `{_LINEAGE_TIME}` when staging has it."
        ),
        json_schema_extra={"doc_default": "derived"},
    )
    from_: datetime | None = Field(
        default=None,
        validation_alias="from",
        serialization_alias="from",
        description=(
            "Start of the window, included: an ISO-8601 time with a zone or epoch milliseconds. "
            "Default: the sink's `window_from`, else the source's `from` when it is a time, else unbounded."
        ),
        json_schema_extra={"doc_type": "time", "doc_default": "the job's window"},
    )
    to: datetime | None = Field(
        default=None,
        description=(
            "End of the window, excluded. Default: the sink's `window_to`, else the source's `to` when it "
            "is a time, else unbounded."
        ),
        json_schema_extra={"doc_type": "time", "doc_default": "the job's window"},
    )
    filter: str | None = Field(
        default=None,
        description="A Spark SQL condition both sides must meet, like `status != 'test'`.",
    )
    key_from: int | str | None = Field(
        default=None,
        description="Smallest value of the first key column compared (included).",
        json_schema_extra={"doc_type": "integer or string"},
    )
    key_to: int | str | None = Field(
        default=None,
        description="End of the key range on the first key column (excluded).",
        json_schema_extra={"doc_type": "integer or string"},
    )

    @field_validator("time_column", "filter")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _check_column(value, "a value")

    @field_validator("from_", mode="plain")
    @classmethod
    def _from(cls, value: Any) -> datetime | None:
        return _verify_time(value, "from")

    @field_validator("to", mode="plain")
    @classmethod
    def _to(cls, value: Any) -> datetime | None:
        return _verify_time(value, "to")

    @field_serializer("from_", "to")
    def _dump_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _order(self) -> Scope:
        if self.from_ is not None and self.to is not None and self.to <= self.from_:
            raise _Bad(
                "is not after from",
                "the window is [from, to): to must be after from",
                got=_Plain(f"{_iso(self.to)}, from is {_iso(self.from_)}"),
                at=("to",),
            )
        if (
            self.key_from is not None
            and self.key_to is not None
            and type(self.key_from) is type(self.key_to)
            and self.key_to <= self.key_from  # type: ignore[operator]
        ):
            raise _Bad(
                "is not after key_from",
                "the key range is [key_from, key_to)",
                got=self.key_to,
                at=("key_to",),
            )
        return self


class Tolerance(_Model):
    """How one column is compared. `exact` (the string) is short for no tolerance at all.

    Numbers are equal when ``|staging - reference| <= abs + rel * |reference|`` (numpy's
    ``isclose``); timestamps when they are equal once truncated to ``timestamp_precision``.
    """

    abs: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Absolute tolerance of a numeric column."
    )
    rel: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Relative tolerance of a numeric column, a fraction of the reference value (0.001 = 0.1%)."
        ),
    )
    timestamp_precision: Literal["us", "ms", "s", "min", "h", "d"] | None = Field(
        default=None,
        description="Timestamps are compared truncated to this unit: `us`, `ms`, `s`, `min`, `h` or `d`.",
    )
    nulls_equal: bool | None = Field(
        default=None, description="Overrides `verify.nulls_equal` for this column."
    )

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().lower() != "exact":
                raise _Bad(
                    "not a tolerance",
                    "write exact, or a mapping like {abs: 0.01}, {rel: 0.001} or {timestamp_precision: s}",
                    got=value,
                )
            return {}
        return {} if value is None else value

    @model_validator(mode="after")
    def _kinds(self) -> Tolerance:
        numeric = self.abs is not None or self.rel is not None
        if numeric and self.timestamp_precision is not None:
            raise _Bad(
                "numeric and timestamp tolerances given together",
                "a column is a number (abs, rel) or a timestamp (timestamp_precision)",
            )
        return self

    @property
    def exact(self) -> bool:
        """No tolerance: equal means equal (after truncation for timestamps)."""
        return not self.abs and not self.rel


class Buckets(_Model):
    """Row counts and checksums per time bucket (and per category) in the report."""

    time_column: str | None = Field(
        default=None,
        description="Time column that places a row in a bucket. Default: the scope's time column.",
        json_schema_extra={"doc_default": "`scope.time_column`"},
    )
    granularity: Literal["hour", "day"] = Field(
        default="day", description="Bucket size: `hour` or `day` (UTC)."
    )
    category: str | None = Field(
        default=None, description="A column whose values the report breaks drift down by, like `status`."
    )

    @field_validator("time_column", "category")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        return _check_column(value)


class Assertion(_Model):
    """A check of the outcome in Spark SQL over the views `staging` and `reference` (in scope).

    Three forms: with `expect`, the query returns one value that must equal it (within `abs`
    / `rel`); with `compare_to_reference`, the query is run once as written and once with
    `staging` meaning the reference, and both results must agree (numbers within `abs` /
    `rel`, rows matched on their other columns); with neither, the query lists offending rows
    and must return none.
    """

    name: str = Field(description="Shown in the report, like `no negative totals`.")
    sql: str = Field(description="Spark SQL over the views `staging` and `reference`.")
    expect: float | None = Field(
        default=None, allow_inf_nan=False, description="The single value the query must return."
    )
    compare_to_reference: bool = Field(
        default=False, description="Run the query over the reference too and compare the two results."
    )
    abs: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="Absolute tolerance.")
    rel: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Relative tolerance (0.0001 = 0.01%)."
    )

    @field_validator("name", "sql")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise _Bad("empty", "give a value", got=value)
        return value

    @model_validator(mode="after")
    def _form(self) -> Assertion:
        if self.expect is not None and self.compare_to_reference:
            raise _Bad(
                "expect given with compare_to_reference",
                "compare with a fixed value (expect) or with the reference, not both",
                got=self.expect,
                at=("expect",),
            )
        return self


class Verify(_Model):
    """Reconciliation of a run's staging with a reference, run by `rewind verify RUN`.

    Frozen into the plan with the rest of the spec; `rewind verify RUN --spec SPEC` (or
    `--verify-file FILE`) verifies the same staging with another section, without running again.

    Three levels: records (every key of the reference is in staging and vice versa), state
    (per-key values of the compared columns, with tolerances) and outcome (SQL assertions).
    A missing `verify` section means `{reference: {target: true}}` with every default.
    """

    reference: Reference = Field(
        default_factory=lambda: Reference(target=True),
        description="What staging is compared with. Default: `{target: true}`.",
        json_schema_extra={"doc_default": "`{target: true}`"},
    )
    mode: Literal["match", "repair"] | None = Field(
        default=None,
        description=(
            "`match`: inside the scope staging must equal the reference; rows outside the window are "
            "not compared. `repair`: staging replaces the reference: differences inside the window "
            "are the repair (reported as changes), outside it staging must equal the reference. "
            "Default: `repair` for `target`, `match` otherwise."
        ),
        json_schema_extra={"doc_default": "derived"},
    )
    scope: Scope = Field(default_factory=lambda: Scope(), description="Which rows are compared.")
    key: list[str] = Field(
        default_factory=list,
        description=(
            "Columns identifying a row on both sides. Default: the job's `key` (or `_rewind_event_id`)."
        ),
        json_schema_extra={"doc_default": "the job's key"},
    )
    compare: dict[str, Tolerance] | None = Field(
        default=None,
        description=(
            "Columns compared and how: `{total: {abs: 0.01}, status: exact}`; a list means exact. "
            "Default: every column on both sides but the key and Rewind's `_rewind_*` columns, exact."
        ),
        json_schema_extra={
            "doc_type": "list, or mapping column → `exact` or see `verify.compare.<name>`",
            "doc_default": "common columns, exact",
        },
    )
    ignore: list[str] = Field(
        default_factory=list, description="Columns left out of the default `compare` set."
    )
    nulls_equal: bool = Field(
        default=True, description="A null equals a null; `false` follows SQL (null never equals anything)."
    )
    buckets: Buckets = Field(default_factory=lambda: Buckets(), description="Time buckets and category.")
    assertions: list[Assertion] = Field(
        default_factory=list,
        description="Checks of the outcome in SQL.",
        json_schema_extra={"doc_type": "list of mappings, see `verify.assertions[]`"},
    )
    samples: int = Field(
        default=20, ge=0, le=10_000, description="Differing rows (and missing, extra keys) shown per kind."
    )
    drill_rows: int = Field(
        default=500_000,
        gt=0,
        description=(
            "Rows of differing keys inside the repaired window compared row by row; beyond this many, "
            "a sample of those keys (the report says so). Differences outside the window are all compared."
        ),
    )

    @field_validator("scope", "buckets", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("compare", mode="before")
    @classmethod
    def _compare_list(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {str(column): "exact" for column in value}
        if isinstance(value, Mapping):
            return {k: ("exact" if v is None else v) for k, v in value.items()}
        return value

    @field_validator("compare")
    @classmethod
    def _compare(cls, value: dict[str, Tolerance] | None) -> dict[str, Tolerance] | None:
        if value is not None and not value:
            raise _Bad("empty", "name the columns to compare, or remove compare to compare all", got={})
        for column in value or {}:
            if not column.strip():
                raise _Bad("empty column name", "name the columns to compare", got=column)
        return value

    @field_validator("key", "ignore")
    @classmethod
    def _columns(cls, columns: list[str]) -> list[str]:
        for i, column in enumerate(columns):
            if not column.strip():
                raise _Bad("empty column name", "list column names", got=column, at=(i,))
            if column in columns[:i]:
                raise _Bad(f"column '{column}' is listed twice", "list each column once", got=columns)
        return columns

    @model_validator(mode="after")
    def _across(self) -> Verify:
        if self.mode is None:
            _fill(self, "mode", "repair" if self.reference.target else "match")
        names = [a.name for a in self.assertions]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _Bad(
                    "name used twice",
                    "give each assertion its own name",
                    got=name,
                    at=("assertions", i, "name"),
                )
        for column in self.key:
            if self.compare and column in self.compare:
                raise _Bad(
                    "a key column is compared",
                    "key columns identify rows; list only the other columns in compare",
                    got=column,
                    at=("compare", column),
                )
        return self
