"""``source.table``: current state of entities read from a source of truth, for re-producing.

The seed pattern "backfilling": the upstream service re-produces current-state messages for a
limited set of entities, built from its database, so downstream services fix themselves. The
table (or query) is read in parallel by key range; every selected row becomes one record keyed
by its entity id (see docs/reproduce.md).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from rewind.spec.errors import _UNSET, _Bad, _Plain
from rewind.spec.reconstruct import Reconstruct
from rewind.spec.values import _ICEBERG_TABLE, _PG_IDENT, _exactly_one, _Model

_SQL_TABLE_HELP = "like public.accounts: 1 or 2 identifiers of letters, digits, _ or $"


class SqlTableSource(_Model):
    """A table or a query of a PostgreSQL database (or a SQLite file), read with SQLAlchemy."""

    url: str = Field(
        description=(
            "`postgresql://user@host:5432/db` (`sqlite:///path/to/file.db` under `sqlite`). Keep "
            "passwords out of spec files (PGPASSWORD, ~/.pgpass); a password in the URL is masked "
            "in the ledger and must be given again to resume."
        ),
    )
    table: str | None = Field(
        default=None, description="`schema.table` or `table`: every column of its rows is read."
    )
    query: str | None = Field(
        default=None,
        description=(
            "A `SELECT` whose rows are the entities (instead of `table`); read as a sub-query, so "
            "`where`, `ids` and the key ranges apply to its result."
        ),
    )

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is None:
            return None
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(p) and len(p) <= 63 for p in parts):
            raise _Bad("not a schema.table name", _SQL_TABLE_HELP, got=table)
        return table

    @field_validator("query")
    @classmethod
    def _query(cls, query: str | None) -> str | None:
        if query is None:
            return None
        text = query.strip().rstrip(";").strip()
        if not re.match(r"(select|with)\b", text, re.IGNORECASE):
            raise _Bad("not a SELECT query", "write SELECT ... FROM ... (or WITH ... SELECT ...)", got=query)
        if ";" in text:
            raise _Bad("more than one statement", "give one SELECT, without ';' inside", got=query)
        return text

    @model_validator(mode="after")
    def _one(self) -> SqlTableSource:
        given = [n for n in ("table", "query") if getattr(self, n) is not None]
        if len(given) != 1:
            raise _Bad(
                "no table or query given" if not given else "both table and query given",
                "give exactly one of: table, query",
                got=_UNSET if not given else _Plain("table, query"),
            )
        return self

    @property
    def name(self) -> str:
        """The table's name, or ``query``."""
        return self.table or "query"


class IcebergTableSource(_Model):
    """An Iceberg table of the catalog in the settings, scanned with pyiceberg."""

    table: str = Field(description="`namespace.table`.")

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        if not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like lake.accounts", got=table)
        return table

    @property
    def name(self) -> str:
        return self.table


class TableSource(_Model):
    """Entities of a table of a source of truth, re-produced as current-state messages.

    Exactly one database (``postgres``, ``sqlite`` or ``iceberg``), the entity id column
    (``key``) and the selection: ``ids``, ``ids_file``, ``where``, or (SQL) a ``query`` that
    selects by itself. The plan counts the selected entities, shows the partition each lands on
    and refuses an empty selection or one above ``guards.max_records``.
    """

    KINDS: ClassVar[tuple[str, ...]] = ("postgres", "sqlite", "iceberg")
    SELECTIONS: ClassVar[tuple[str, ...]] = ("ids", "ids_file", "where")

    postgres: SqlTableSource | None = Field(default=None, description="A PostgreSQL table or query.")
    sqlite: SqlTableSource | None = Field(
        default=None, description="A table or query of a SQLite file (the embedded source of truth)."
    )
    iceberg: IcebergTableSource | None = Field(default=None, description="An Iceberg table.")
    key: str = Field(
        description=(
            "The entity id column: integer or text. It is the record key (its UTF-8 text, as a "
            "Java `StringSerializer` writes it) and the column the key ranges split on."
        ),
    )
    ids: list[int | str] | None = Field(
        default=None,
        description="The entity ids to re-produce, of the key column's type (integers or strings).",
        json_schema_extra={"doc_type": "list of integers or strings"},
    )
    ids_file: str | None = Field(
        default=None,
        description=(
            "A text file of entity ids, one per line (blank lines and `#` comments ignored; "
            "repeated ids counted once)."
        ),
    )
    where: str | None = Field(
        default=None,
        description=(
            "A SQL predicate over the table's columns (`status = 'blocked' AND region = 'eu'`); for "
            "Iceberg, pyiceberg's filter syntax. `TRUE` selects every row."
        ),
    )
    key_ranges: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Work units: the selected keys are cut into this many ranges of about equal size, each "
            "read by one Spark task (`WHERE key >= lo AND key < hi`) and produced in one "
            "transaction. Default: one range per `run.work_unit_records` entities, and at least one "
            "per core once each holds 10,000."
        ),
        json_schema_extra={"doc_default": "selected / `run.work_unit_records`, at least one per core"},
    )
    skip_partitions: list[int] = Field(
        default_factory=list,
        description=(
            "Target partitions to leave out (blocked downstream): entities landing there are not "
            "produced, counted as filtered and named in the plan. With `sink.kafka` only."
        ),
    )
    stuck_check_group: str | None = Field(
        default=None,
        description=(
            "A live consumer group of the target topic: the plan warns when a selected entity "
            "lands on a partition where this group's oldest unconsumed record is older than "
            "`stuck_after_s` (a re-produced message would wait behind it). With `sink.kafka` only."
        ),
    )
    stuck_after_s: float = Field(
        default=300.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds the group's oldest unconsumed record may wait before its partition is stuck.",
    )
    reconstruct: Reconstruct | None = Field(
        default=None,
        description=(
            "Reconstruct domain events from the table's states (a history table or snapshots) "
            "with `translate.transition`, instead of re-producing each row "
            "([runbook-reconstruct.md](runbook-reconstruct.md))."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _ids_types(cls, data: Any) -> Any:
        # checked before pydantic's union turns a float or bool into something else
        ids = data.get("ids") if isinstance(data, dict) else None
        if ids is None:
            return data
        if not isinstance(ids, list) or not ids:
            raise _Bad("expected a non-empty list of ids", "like [1001, 1002] or ['a-1', 'a-2']", got=ids)
        kinds = set()
        for i, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise _Bad("not an entity id", "ids are integers or strings", got=value, at=("ids", i))
            if isinstance(value, str) and not value.strip():
                raise _Bad("an empty id", "ids are non-empty", got=value, at=("ids", i))
            kinds.add(type(value))
        if len(kinds) > 1:
            raise _Bad(
                "mixes integers and strings", "ids are all of the key column's type", got=ids, at=("ids",)
            )
        return data

    @field_validator("key", "stuck_check_group")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "give a column name", got=value)
        return value

    @field_validator("ids")
    @classmethod
    def _ids(cls, ids: list[int | str] | None) -> list[int | str] | None:
        if ids is None:
            return None
        seen: set[int | str] = set()
        for i, value in enumerate(ids):
            if value in seen:
                raise _Bad(f"id {value!r} is listed twice", "list each id once", got=ids, at=(i,))
            seen.add(value)
        return ids

    @field_validator("ids_file", "where")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "remove the field or give a value", got=value)
        return value

    @field_validator("skip_partitions")
    @classmethod
    def _partitions(cls, partitions: list[int]) -> list[int]:
        for i, p in enumerate(partitions):
            if p < 0:
                raise _Bad("not a partition number", "partitions are numbers >= 0", got=p, at=(i,))
            if p in partitions[:i]:
                raise _Bad(f"partition {p} is listed twice", "list each partition once", got=partitions)
        return sorted(partitions)

    @model_validator(mode="after")
    def _choices(self) -> TableSource:
        _exactly_one(self, self.KINDS, "database")
        given = [s for s in self.SELECTIONS if getattr(self, s) is not None]
        sql = self.postgres or self.sqlite
        query = sql.query if sql is not None else None
        if len(given) > 1:
            raise _Bad(
                "more than one selection given",
                f"give one of: {', '.join(self.SELECTIONS)}",
                got=_Plain(", ".join(given)),
            )
        if not given and query is None:
            raise _Bad(
                "no selection given",
                "give ids, ids_file or where (where: TRUE for every row), or select with a query",
            )
        if self.sqlite is not None and not self.sqlite.url.startswith("sqlite:///"):
            raise _Bad(
                "not a SQLite URL",
                "like sqlite:///path/to/file.db",
                got=self.sqlite.url,
                at=("sqlite", "url"),
            )
        if self.postgres is not None and not re.match(r"postgres(ql)?(\+\w+)?://", self.postgres.url):
            raise _Bad(
                "not a PostgreSQL URL",
                "like postgresql://user@host:5432/db",
                got=self.postgres.url,
                at=("postgres", "url"),
            )
        if self.reconstruct is not None and self.reconstruct.key not in (None, self.key):
            raise _Bad(
                "is not source.table.key",
                f"the key ranges split on the entity key: set source.table.key to {self.reconstruct.key}",
                got=self.reconstruct.key,
                at=("reconstruct", "key"),
            )
        return self

    @property
    def kind(self) -> str:
        """``postgres``, ``sqlite`` or ``iceberg``."""
        return next(k for k in self.KINDS if getattr(self, k) is not None)

    @property
    def database(self) -> SqlTableSource | IcebergTableSource:
        found = getattr(self, self.kind)
        assert found is not None
        return found

    @property
    def label(self) -> str:
        """Where the rows come from, as lineage names it: ``postgres:public.accounts``,
        ``sqlite:query``, ``iceberg:lake.accounts`` (the ``rewind.source`` header's first part)."""
        return f"{self.kind}:{self.database.name}"

    @property
    def selection(self) -> str:
        """The selection in words, for the plan."""
        if self.ids is not None:
            return f"{len(self.ids)} ids"
        if self.ids_file is not None:
            return f"ids of {self.ids_file}"
        if self.where is not None:
            return f"where {self.where}"
        return "the query's rows"
