"""The ``sink:`` section: where output goes (an Iceberg table, a SQL table, a Kafka topic)."""

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

from rewind.spec.errors import _Bad
from rewind.spec.values import (
    _ICEBERG_TABLE,
    _LINEAGE_TIME,
    _PG_IDENT,
    _TOPIC,
    _check_window_order,
    _exactly_one,
    _fill,
    _iso,
    _Model,
    _verify_time,
)


class IcebergTarget(_Model):
    """Write to an Iceberg table of the catalog in the settings."""

    table: str = Field(description="`namespace.table` (nested namespaces: `a.b.table`).")
    mode: Literal["append", "replace-window"] = Field(
        default="append",
        description=(
            "`append` adds the output; `replace-window` replaces the rows whose `window_column` "
            "falls in the window with the output, in one snapshot."
        ),
    )
    window_column: str | None = Field(
        default=None,
        description=(
            "`replace-window` only: the time column that places a row in the window. "
            f"Default: `{_LINEAGE_TIME}`."
        ),
        json_schema_extra={"doc_default": f"`{_LINEAGE_TIME}` for replace-window"},
    )
    window_from: datetime | None = Field(
        default=None,
        description=(
            "`replace-window` only: start of the replaced window when it is not the source window "
            "(a read model keyed by order time reads a few days past the window so every order in it "
            "is whole). Output rows outside the replaced window are dropped and counted. Default: the "
            "source window's start."
        ),
    )
    window_to: datetime | None = Field(
        default=None,
        description=(
            "`replace-window` only: end (exclusive) of the replaced window. Default: the source window's end."
        ),
    )

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        if not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.order_totals", got=table)
        return table

    @field_validator("window_from", "window_to", mode="plain")
    @classmethod
    def _window_time(cls, value: Any, info: Any) -> datetime | None:
        return _verify_time(value, info.field_name)

    @field_serializer("window_from", "window_to")
    def _dump_window_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _window(self) -> IcebergTarget:
        for name in ("window_column", "window_from", "window_to"):
            if self.mode == "append" and getattr(self, name) is not None:
                raise _Bad(
                    "used only by mode replace-window",
                    "remove it or set mode: replace-window",
                    got=getattr(self, name),
                    at=(name,),
                )
        if self.mode == "replace-window" and self.window_column is None:
            _fill(self, "window_column", _LINEAGE_TIME)
        _check_window_order(self.window_from, self.window_to, "replaced")
        return self

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]


class SqlTarget(_Model):
    """Write to a PostgreSQL table (a service's read model)."""

    table: str = Field(description="`schema.table` or `table` (in the search path).")
    url: str | None = Field(
        default=None,
        description=(
            "`postgresql://user@host/db` (or `sqlite:///file.db`, the embedded SQL sink). Default: "
            "the ledger's URL when it is PostgreSQL. Keep passwords out of "
            "spec files (use the settings or PGPASSWORD)."
        ),
    )
    mode: Literal["upsert", "append"] = Field(
        default="upsert",
        description=(
            "`upsert` on `key` (on the event id when `key` is empty), or `append` (an event "
            "reconstruction appends: its default, and the only mode it takes)."
        ),
    )
    window_column: str | None = Field(
        default=None,
        description=(
            "With `translate.fold`: the output column that places a folded row in the repaired window. "
            "Folded rows outside `[window_from, window_to)` are dropped and counted (an entity cut by "
            "the window's edge would be folded from part of its events)."
        ),
    )
    window_from: datetime | None = Field(
        default=None,
        description="With `window_column`: start of the repaired window. Default: the source window's start.",
    )
    window_to: datetime | None = Field(
        default=None,
        description=(
            "With `window_column`: end (exclusive) of the repaired window. Default: the source window's end."
        ),
    )

    @field_validator("window_from", "window_to", mode="plain")
    @classmethod
    def _window_time(cls, value: Any, info: Any) -> datetime | None:
        return _verify_time(value, info.field_name)

    @field_serializer("window_from", "window_to")
    def _dump_window_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _window(self) -> SqlTarget:
        for name in ("window_from", "window_to"):
            if getattr(self, name) is not None and self.window_column is None:
                raise _Bad(
                    "needs window_column", "name the column that places a row in the window", at=(name,)
                )
        _check_window_order(self.window_from, self.window_to, "repaired")
        return self

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(p) and len(p) <= 63 for p in parts):
            raise _Bad(
                "not a schema.table name",
                "like public.order_totals: 1 or 2 identifiers of at most 63 letters, digits, _ or $",
                got=table,
            )
        return table

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        # sqlite:/// is the embedded SQL sink (the same table semantics, one process)
        if url is not None and not re.match(r"(postgres(ql)?(\+\w+)?|sqlite)://", url):
            raise _Bad(
                "not a PostgreSQL or SQLite URL",
                "like postgresql://user@host:5432/db or sqlite:///path/to/file.db",
                got=url,
            )
        return url


class KafkaTarget(_Model):
    """Produce the output to a Kafka topic dedicated to the backfill."""

    topic: str | None = Field(
        default=None,
        description="Target topic; never a source topic. Default: `<source topic>.backfill.<run id>`.",
        json_schema_extra={"doc_default": "`<source topic>.backfill.<run id>`"},
    )
    partitions: int | None = Field(
        default=None,
        gt=0,
        description="Partitions of the topic when Rewind creates it. Default: as the source topic.",
    )
    transactional: bool = Field(
        default=False,
        description=(
            "Write through Kafka transactions; consumers read with read_committed. On a broker "
            "whose read_committed hides aborted records, each work unit is produced by its Spark "
            "task in one transaction with its bookkeeping marker; otherwise (tansu) the driver "
            "writes each commit (a wave of units, with its marker) in one transaction."
        ),
    )
    encode: Literal["json", "avro"] = Field(
        default="json",
        description=(
            "Record values: `json` (an object of the output columns) or `avro` (Confluent wire format: "
            "magic byte, schema id, Avro body) with the latest schema of `schema_dir` or of `subject` in "
            "`registry_url`; output columns map to fields by name, lineage stays in headers."
        ),
    )
    schema_dir: str | None = Field(
        default=None,
        description=(
            "`avro`: a folder of `.avsc` files named by schema id (`1.avsc`, `2.avsc`...), as "
            "`decode.schema_dir`; values are written with the highest id (`latest.avsc`, if present, "
            "must be that schema). Default: `decode.schema_dir` when decode is avro."
        ),
        json_schema_extra={"doc_default": "`decode.schema_dir`"},
    )
    registry_url: str | None = Field(
        default=None,
        description=(
            "`avro`: a Confluent-compatible schema registry; values are written with the latest "
            "version of `subject`. Default: `decode.registry_url` when decode is avro."
        ),
        json_schema_extra={"doc_default": "`decode.registry_url`"},
    )
    subject: str | None = Field(
        default=None,
        description="`avro` with a registry: the subject whose latest version values are written with.",
        json_schema_extra={"doc_default": "`<topic>-value`"},
    )
    register_schema: bool = Field(
        default=False,
        description=(
            "`avro` with a registry: write with decode's reader schema (the schema every record was "
            "evolved to), registering it under `subject` when the run starts (the registry checks "
            "compatibility)."
        ),
    )

    AVRO_ONLY: ClassVar[tuple[str, ...]] = ("schema_dir", "registry_url", "subject", "register_schema")
    configs: dict[str, str] = Field(
        default_factory=dict,
        description="Topic configs when Rewind creates the topic, like `{retention.ms: 604800000}`.",
    )
    partitioner: Literal["murmur2", "crc32", "fnv1a"] = Field(
        default="murmur2",
        description=(
            "How a record's partition follows from its key bytes, as the live producer computes it: "
            "`murmur2` (the Java client's default, `toPositive(murmur2(key)) % partitions`), `crc32` "
            "(librdkafka's default `consistent`) or `fnv1a` (librdkafka's `fnv1a`, Sarama's). Used "
            "when re-producing from a table source, whose records always get an explicit partition."
        ),
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str | None) -> str | None:
        if topic is not None and (not _TOPIC.fullmatch(topic) or topic in (".", "..")):
            raise _Bad(
                "not a topic name", "a topic name is 1-249 of letters, digits, '.', '_' and '-'", got=topic
            )
        return topic

    @field_validator("registry_url")
    @classmethod
    def _registry(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^/\s]+", url):
            raise _Bad("not an http(s) URL", "like http://registry:8081", got=url)
        return url

    @field_validator("schema_dir", "subject")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "remove the field or give a value", got=value)
        return value

    @model_validator(mode="after")
    def _encoding(self) -> KafkaTarget:
        for name in self.AVRO_ONLY:
            value = getattr(self, name)
            if self.encode != "avro" and value not in (None, False):
                raise _Bad(
                    "used only by encode: avro", "remove it or set encode: avro", got=value, at=(name,)
                )
        if self.schema_dir is not None and self.registry_url is not None:
            raise _Bad(
                "given with registry_url",
                "give a registry_url or a schema_dir, not both",
                got=self.schema_dir,
                at=("schema_dir",),
            )
        return self

    @field_validator("configs", mode="before")
    @classmethod
    def _configs(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {
            str(k): (str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v)
            for k, v in value.items()
        }


class SinkConfig(_Model):
    """Where the output goes: exactly one kind of sink."""

    KINDS: ClassVar[tuple[str, ...]] = ("iceberg", "postgres", "kafka")

    iceberg: IcebergTarget | None = Field(default=None, description="An Iceberg table.")
    postgres: SqlTarget | None = Field(default=None, description="A PostgreSQL table.")
    kafka: KafkaTarget | None = Field(default=None, description="A Kafka topic.")

    @property
    def window_column(self) -> str | None:
        """The output column that places a row in the repaired window, when the sink has one."""
        if self.iceberg is not None and self.iceberg.mode == "replace-window":
            return self.iceberg.window_column
        return self.postgres.window_column if self.postgres is not None else None

    @property
    def window_bounds(self) -> tuple[datetime | None, datetime | None]:
        """``window_from``/``window_to`` of the sink (None where the source window applies)."""
        found = self.iceberg or self.postgres
        if found is None:
            return None, None
        return found.window_from, found.window_to

    @model_validator(mode="after")
    def _one(self) -> SinkConfig:
        _exactly_one(self, self.KINDS, "sink")
        return self

    @property
    def kind(self) -> Literal["iceberg", "postgres", "kafka"]:
        """The name of the sink given."""
        if self.iceberg is not None:
            return "iceberg"
        return "postgres" if self.postgres is not None else "kafka"

    @property
    def target(self) -> IcebergTarget | SqlTarget | KafkaTarget:
        """The one sink model given."""
        target = next(t for t in (self.iceberg, self.postgres, self.kafka) if t is not None)
        return target
