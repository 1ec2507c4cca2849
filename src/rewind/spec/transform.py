"""The ``decode:`` and ``translate:`` sections: how records become events and events output rows."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from rewind.spec.errors import _Bad
from rewind.spec.values import _EVENTS_VIEW, _FUNCTION, _TRANSFORM_NAME, _fill, _json_schema, _Model, _schema


class Decode(_Model):
    """How record values become columns. ``decode: json`` is short for ``decode: {format: json}``."""

    AVRO_ONLY: ClassVar[tuple[str, ...]] = ("registry_url", "schema_dir", "reader_schema", "subject")

    format: Literal["json", "avro", "raw", "rows"] = Field(
        description=(
            "`json`: a JSON object per value; `avro`: Confluent wire format (magic byte, schema "
            "id, Avro body); `raw`: no decoding, the value stays bytes; `rows` (a table source "
            "only): the table's columns as the database types them, text as pandas' Arrow-backed "
            "`str` dtype ([reproduce.md](reproduce.md))."
        ),
    )
    registry_url: str | None = Field(
        default=None,
        description="Avro: URL of a Confluent-compatible schema registry (default: from the settings).",
    )
    schema_dir: str | None = Field(
        default=None,
        description="Avro: a folder of `.avsc` files to use instead of a registry.",
    )
    reader_schema: str | None = Field(
        default=None,
        description=(
            "Avro: the schema every record is evolved to, from its writer schema: a path to an "
            '`.avsc` file, or "latest" (the subject\'s latest version in a registry, `latest.avsc` '
            "in a schema_dir). Default: latest."
        ),
    )
    subject: str | None = Field(
        default=None,
        description="Avro: the registry subject (default: `<topic>-value`, the TopicNameStrategy).",
    )
    schema_: dict[str, str] | None = Field(
        default=None,
        validation_alias="schema",
        serialization_alias="schema",
        description=(
            "JSON: the fields to read and their types, `{field: type}`: `string`, `int`, `long`, "
            "`float`, `double`, `boolean`, `timestamp`, `date` or `json` (kept as parsed); other "
            "fields are ignored and a value that does not cast is quarantined. Default: every "
            "field, typed from the values."
        ),
        json_schema_extra={"doc_type": "mapping field → type"},
    )
    null_value: Literal["quarantine", "skip", "keep"] | None = Field(
        default=None,
        description=(
            "What to do with a record whose value is null (a tombstone): `quarantine` it, "
            "`skip` it (counted as filtered), or (format raw only) `keep` it as a null value. "
            "Default: `keep` for raw, `quarantine` otherwise."
        ),
        json_schema_extra={"doc_default": "`keep` for raw, else `quarantine`"},
    )

    @field_validator("registry_url")
    @classmethod
    def _registry(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^/\s]+", url):
            raise _Bad("not an http(s) URL", "like http://registry:8081", got=url)
        return url

    @field_validator("schema_dir", "reader_schema", "subject")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "remove the field or give a value", got=value)
        return value

    @field_validator("schema_", mode="plain")
    @classmethod
    def _schema(cls, value: Any) -> dict[str, str] | None:
        return _json_schema(value)

    @model_validator(mode="after")
    def _format_fields(self) -> Decode:
        if self.null_value is None:
            _fill(self, "null_value", "keep" if self.format == "raw" else "quarantine")
        elif self.null_value == "keep" and self.format != "raw":
            raise _Bad(
                f"not used by format {self.format}",
                "a decoded format quarantines or skips a null value: use quarantine or skip",
                got=self.null_value,
                at=("null_value",),
            )
        for name in self.AVRO_ONLY:
            if self.format != "avro" and getattr(self, name) is not None:
                raise _Bad(
                    f"not used by format {self.format}",
                    f"only format avro reads {', '.join(self.AVRO_ONLY)}",
                    got=getattr(self, name),
                    at=(name,),
                )
        if self.format != "json" and self.schema_ is not None:
            raise _Bad(
                f"not used by format {self.format}",
                "only format json reads schema",
                got=self.schema_,
                at=("schema",),
            )
        if self.registry_url is not None and self.schema_dir is not None:
            raise _Bad(
                "given with registry_url",
                "give a registry_url or a schema_dir, not both",
                got=self.schema_dir,
                at=("schema_dir",),
            )
        return self


class Translate(_Model):
    """The user's transformation: a Python function or a SQL query, and its version."""

    function: str | None = Field(
        default=None,
        description=(
            "`package.module:callable`, called with a pandas DataFrame of decoded events; "
            "imported at plan time and in every task."
        ),
    )
    sql: str | None = Field(
        default=None,
        description=(
            "A Spark SQL query reading the decoded records as the view `events` (`SELECT _rewind_row, "
            "... FROM events`): it must select `_rewind_row`, which names each row's source record; "
            "records it returns no row for are filtered. Runs as a Spark transformation on the "
            "executors; the driver holds no record (see docs/translate-sql.md)."
        ),
    )
    version: str = Field(
        description=(
            'Version of the transformation, like "2": it goes into every event id, so a new '
            "version yields new ids. Quote it in YAML (1.10 is the number 1.1)."
        ),
    )
    name: str | None = Field(
        default=None,
        description="Transform name in lineage and event ids. Default: the callable's name, or `sql`.",
        json_schema_extra={"doc_default": "derived"},
    )
    output_schema: dict[str, str] | None = Field(
        default=None,
        description=(
            "Output columns and their Spark types. Default: learnt at plan time by calling the "
            "function on an empty frame (or from the query)."
        ),
        json_schema_extra={"doc_type": "mapping column → Spark type"},
    )
    fold: str | None = Field(
        default=None,
        description=(
            "`package.module:callable` that combines the rows of each `key` into one row, for read "
            "models (per-order totals...): the translate emits partial rows, one per event, and once "
            "every unit is committed the run's rows are folded across the whole window. Called with a "
            "pandas DataFrame holding every row of some keys (sorted by key, then source time and "
            "offset); returns one row per key with the same columns. Iceberg sinks, and PostgreSQL "
            "sinks in upsert mode (the partial rows then wait in a scratch Iceberg table)."
        ),
    )

    transition: str | None = Field(
        default=None,
        description=(
            "`package.module:callable` of an event reconstruction (`source.table.reconstruct`): "
            "called with a pandas DataFrame of consecutive states per entity (the current row's "
            "columns, the previous row's as `prev_<column>`, `_rewind_change` and `_rewind_time`), "
            "returns zero or more events per pair, each with a type "
            "([runbook-reconstruct.md](runbook-reconstruct.md))."
        ),
    )

    @field_validator("function", "fold", "transition")
    @classmethod
    def _function(cls, value: str | None) -> str | None:
        if value is not None and not _FUNCTION.fullmatch(value.strip()):
            raise _Bad(
                "not a function reference",
                "expected package.module:callable, like my_pkg.orders:to_total",
                got=value,
            )
        return None if value is None else value.strip()

    @field_validator("sql")
    @classmethod
    def _sql(cls, value: str | None) -> str | None:
        if value is not None and not _EVENTS_VIEW.search(value):
            raise _Bad(
                "does not read the view events",
                "Rewind registers the decoded records as the temporary view events: "
                "write SELECT ... FROM events",
                got=value,
            )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_type(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise _Bad("a number, which YAML may have changed", 'quote it, like version: "1.10"', got=value)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("version", "name")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not _TRANSFORM_NAME.fullmatch(value):
            raise _Bad(
                "empty or has characters that are not allowed" if value else "empty",
                "it goes into event ids: use letters, digits and . _ : -",
                got=value,
            )
        return value

    @field_validator("output_schema", mode="plain")
    @classmethod
    def _output_schema(cls, value: Any) -> dict[str, str] | None:
        return _schema(value)

    @model_validator(mode="after")
    def _one(self) -> Translate:
        given = [n for n in ("function", "sql", "transition") if getattr(self, n) is not None]
        if len(given) > 1:
            raise _Bad(
                f"both {given[0]} and {given[1]} given", "give exactly one of: function, sql, transition"
            )
        if not given:
            raise _Bad("neither function nor sql given", "give exactly one of: function, sql")
        if self.name is None:
            reference = self.function or self.transition
            _fill(self, "name", "sql" if reference is None else reference.rsplit(":", 1)[1].split(".")[-1])
        return self

    @property
    def kind(self) -> Literal["function", "sql", "transition"]:
        if self.transition is not None:
            return "transition"
        return "function" if self.function is not None else "sql"
