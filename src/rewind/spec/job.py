"""The whole job spec (:class:`JobSpec`) and its example, checked across sections."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

import yaml
from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from rewind.core.windows import WindowRequest
from rewind.secrets import mask
from rewind.spec.errors import _Bad, _Plain
from rewind.spec.lineage import Lineage
from rewind.spec.merge import Merge
from rewind.spec.run import Guards, Quarantine, RunSettings
from rewind.spec.shadow import Shadow
from rewind.spec.source import Source
from rewind.spec.targets import KafkaTarget, SinkConfig
from rewind.spec.transform import Decode, Translate
from rewind.spec.values import _QUARANTINE_NAME, _SLUG, _fill, _iso, _Model
from rewind.spec.verify import (
    Verify,
)

EXAMPLE_SPEC = """\
name: repair-order-totals
description: Recompute order totals after the rounding bug of October
source:
  kafka: {topics: [orders], from: "2026-10-01T00:00:00Z", to: "2026-10-08T00:00:00Z"}
decode: json                     # or avro (Confluent wire format), or raw
translate:
  function: my_pkg.orders:to_order_total    # or sql: "SELECT ... FROM events"
  version: "2"
key: [order_id]                  # business key of the output
sink:
  iceberg: {table: analytics.order_totals}
guards:
  max_records_per_second: 50000
  max_records: 50000000
"""


class JobSpec(_Model):
    """A backfill job: read a window, decode, translate, write, within guards."""

    name: str = Field(
        description=(
            "Job name: lowercase letters, digits, `-` and `_` (at most 63); used in ids and topic names."
        ),
    )
    description: str | None = Field(
        default=None, description="Free text for people; not part of the fingerprint."
    )
    source: Source = Field(description="Where the records come from.")
    decode: Decode = Field(
        description="How values are decoded: `json`, `avro`, `raw`, or a mapping with `format` and options.",
        json_schema_extra={"doc_type": "string or mapping, see `decode`"},
    )
    translate: Translate = Field(description="The transformation and its version.")
    key: list[str] = Field(
        default_factory=list,
        description=(
            "Business key of the output rows (column names). Empty: append-only, keyed by the "
            "event id `_rewind_event_id`."
        ),
    )
    sink: SinkConfig = Field(description="Where the output goes.")
    merge: Merge | None = Field(
        default=None,
        description=(
            "How the run's rows merge with the rows live already wrote, per `key` (see "
            "docs/merge-policies.md). Absent: the sink's own rule (upsert keeps the later event, "
            "Iceberg appends)."
        ),
    )
    lineage: Lineage | None = Field(
        default=None,
        description="Lineage columns beyond the source record's: the source system, the effective time.",
    )
    guards: Guards = Field(default_factory=lambda: Guards(), description="Limits of the run.")
    live_groups: list[str] | None = Field(
        default=None,
        description=(
            "Consumer groups of the live pipeline whose lag the run's metrics sample "
            "(`rewind_live_group_lag`) beside the backfill's throughput; `rewind readiness` wants "
            "their lag measured (docs/operations.md)."
        ),
    )
    run: RunSettings = Field(default_factory=lambda: RunSettings(), description="Work units and leases.")
    quarantine: Quarantine = Field(
        default_factory=lambda: Quarantine(), description="Where rejected records go."
    )
    verify: Verify | None = Field(
        default=None,
        description=(
            "How `rewind verify` reconciles staging with a reference; absent: `{reference: {target: true}}`."
        ),
    )
    shadow: Shadow | None = Field(
        default=None,
        description=(
            "`rewind shadow`: rebuild the target as a v2 from history, follow the live topic, verify "
            "against v1 and cut over. Needs a history source and a PostgreSQL (or SQLite) sink in "
            "upsert mode."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _SLUG.fullmatch(name):
            raise _Bad(
                "not a slug",
                "use 1-63 lowercase letters, digits, - and _, starting with a letter or digit "
                "(it goes into ids and topic names), like repair-order-totals",
                got=name,
            )
        return name

    @field_validator("decode", mode="before")
    @classmethod
    def _decode(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().lower() not in ("json", "avro", "raw", "rows"):
                raise _Bad(
                    "unknown format",
                    "allowed: json, avro, raw, rows, or a mapping with format: and options",
                    got=value,
                )
            return {"format": value.strip().lower()}
        return value

    @field_validator("guards", "run", "quarantine", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value  # `guards:` with nothing under it

    @field_validator("key")
    @classmethod
    def _key(cls, key: list[str]) -> list[str]:
        for i, column in enumerate(key):
            if not column.strip():
                raise _Bad("empty column name", "list column names of the output", got=column, at=(i,))
            if column in key[:i]:
                raise _Bad(f"column '{column}' is listed twice", "list each column once", got=key)
        return key

    @model_validator(mode="after")
    def _across(self) -> JobSpec:
        schema = self.translate.output_schema
        if schema is not None:
            for i, column in enumerate(self.key):
                if column not in schema:
                    raise _Bad(
                        "not a column of translate.output_schema",
                        f"key columns are output columns: {', '.join(schema)}",
                        got=column,
                        at=("key", i),
                    )
        self._kafka_values()
        iceberg = self.sink.iceberg
        if self.quarantine.table is None:
            namespace = iceberg.namespace if iceberg else "rewind"
            _fill(self, "quarantine", Quarantine(table=f"{namespace}.{_QUARANTINE_NAME}"))
        if iceberg and iceberg.table == self.quarantine.table:
            raise _Bad(
                "the sink table is the quarantine table",
                "give the quarantine its own table",
                got=self.quarantine.table,
                at=("quarantine", "table"),
            )
        if any(self.sink.window_bounds):
            self._replaced_within_source()
        postgres = self.sink.postgres
        if postgres is not None and postgres.window_column and self.translate.fold is None:
            raise _Bad(
                "used only with translate.fold",
                "a fold's rows are kept inside the window; remove it or add translate.fold",
                got=postgres.window_column,
                at=("sink", "postgres", "window_column"),
            )
        if self.translate.fold is not None and not (iceberg or (postgres and postgres.mode == "upsert")):
            raise _Bad(
                "needs an Iceberg sink or a PostgreSQL sink in upsert mode",
                "a fold writes one row per key: write the read model to sink.iceberg or sink.postgres",
                got=self.translate.fold,
                at=("translate", "fold"),
            )
        if self.shadow is not None:
            self._shadowable()
        if self.merge is not None:
            self._mergeable()
        if self.lineage is not None:
            self._lineage()
        if self.translate.transition is not None and self.source.table is None:
            raise _Bad(
                "used only with source.table.reconstruct",
                "a transition reads states of a table: use function for Kafka records",
                got=self.translate.transition,
                at=("translate", "transition"),
            )
        if self.source.table is not None:
            self._reproduce()
        elif self.decode.format == "rows":
            raise _Bad(
                "used only by a table source",
                "Kafka values are decoded: use json, avro or raw",
                got="rows",
                at=("decode",),
            )
        kafka_sink, kafka_source = self.sink.kafka, self.source.kafka_window
        if kafka_sink and kafka_sink.partitioner != "murmur2" and kafka_source is not None:
            raise _Bad(
                "used only when re-producing from a table source",
                "a Kafka-source backfill keeps source partitions (or places by murmur2): remove it",
                got=kafka_sink.partitioner,
                at=("sink", "kafka", "partitioner"),
            )
        if kafka_sink and kafka_source and kafka_sink.topic in kafka_source.topics:
            raise _Bad(
                "is a source topic",
                f"a backfill writes to its own topic, like {kafka_sink.topic}.backfill",
                got=kafka_sink.topic,
                at=("sink", "kafka", "topic"),
            )
        return self

    def _reproduce(self) -> None:
        """A table source re-produces entities to Kafka: one key (the entity id), JSON rows in,
        a named topic, always transactional; a reconstruction may write its events to a table."""
        table = self.source.table
        assert table is not None
        kafka = self.sink.kafka
        if kafka is not None:
            self._reproduce_to_kafka(kafka)
        elif table.reconstruct is not None:
            self._events_into_table()
        else:
            raise _Bad(
                "a table source re-produces to Kafka",
                "give sink.kafka with the live topic or a dedicated one (a reconstruction may also write "
                "its events to sink.iceberg or sink.postgres)",
                got=_Plain(f"sink.{self.sink.kind}"),
                at=("sink",),
            )
        if self.decode.format != "rows":
            raise _Bad(
                "a table source hands the translate rows, not serialized values",
                "use decode: rows (the table's columns as the database types them)",
                got=self.decode.format,
                at=("decode",),
            )
        self._reconstruct()
        if not self.key:
            _fill(self, "key", [table.key])
        elif len(self.key) != 1:
            raise _Bad(
                "a re-produced record has one key: the entity id",
                f"give one output column, like [{table.key}]",
                got=self.key,
                at=("key",),
            )

    def _reproduce_to_kafka(self, kafka: KafkaTarget) -> None:
        if kafka.topic is None:
            raise _Bad(
                "no topic given",
                "name the live topic or a dedicated topic: there is no source topic to derive it from",
                at=("sink", "kafka", "topic"),
            )
        if "transactional" in kafka.model_fields_set and not kafka.transactional:
            raise _Bad(
                "a re-produce is transactional",
                "each work unit is one Kafka transaction with its marker: remove transactional: false",
                got=False,
                at=("sink", "kafka", "transactional"),
            )
        _fill(kafka, "transactional", True)

    def _events_into_table(self) -> None:
        """A reconstruction into an Iceberg or SQL table appends its events, each unit once; what
        places entities on Kafka partitions, or replaces rows, has no meaning there."""
        table = self.source.table
        assert table is not None
        for name in ("skip_partitions", "stuck_check_group"):
            if getattr(table, name):
                raise _Bad(
                    f"used only with sink.kafka (partitions of a topic), not sink.{self.sink.kind}",
                    "remove it: a table of events has no partitions to skip or watch",
                    got=getattr(table, name),
                    at=("source", "table", name),
                )
        postgres, iceberg = self.sink.postgres, self.sink.iceberg
        if postgres is not None and "mode" in postgres.model_fields_set and postgres.mode != "append":
            raise _Bad(
                "a reconstruction appends its events (an entity has many)",
                "use mode: append (an upsert on the entity key would keep one event per entity)",
                got=postgres.mode,
                at=("sink", "postgres", "mode"),
            )
        if postgres is not None:
            _fill(postgres, "mode", "append")
        if iceberg is not None and iceberg.mode != "append":
            raise _Bad(
                "a reconstruction appends its events",
                "use mode: append",
                got=iceberg.mode,
                at=("sink", "iceberg", "mode"),
            )
        for name in ("fold", "merge"):
            given = self.translate.fold if name == "fold" else self.merge
            if given is not None:
                raise _Bad(
                    "not with an event reconstruction",
                    "a reconstruction appends events; fold them with source.table.reconstruct.fold "
                    "when verifying",
                    at=("translate", "fold") if name == "fold" else ("merge",),
                )

    def _reconstruct(self) -> None:
        """``source.table.reconstruct`` and ``translate.transition`` go together."""
        table = self.source.table
        assert table is not None
        if table.reconstruct is not None and self.translate.transition is None:
            raise _Bad(
                "a reconstruction needs translate.transition",
                "name the function that turns consecutive states into events: transition: my_pkg:events",
                at=("translate",),
            )
        if table.reconstruct is None and self.translate.transition is not None:
            raise _Bad(
                "used only with source.table.reconstruct",
                "name the entity key and the business time in source.table.reconstruct, or use function",
                got=self.translate.transition,
                at=("translate", "transition"),
            )
        if table.reconstruct is not None and self.lineage and self.lineage.effective_time_column:
            raise _Bad(
                "is source.table.reconstruct.time in a reconstruction",
                "every event carries its state's business time: remove effective_time_column",
                got=self.lineage.effective_time_column,
                at=("lineage", "effective_time_column"),
            )

    def _lineage(self) -> None:
        """Optional lineage is written by the Kafka and history runs' tasks, onto the translate's rows."""
        lineage = self.lineage
        assert lineage is not None
        schema = self.translate.output_schema
        column = lineage.effective_time_column
        if column is not None and schema is not None and column not in schema:
            raise _Bad(
                "not a column of translate.output_schema",
                f"the effective time is an output column: {', '.join(schema)}",
                got=column,
                at=("lineage", "effective_time_column"),
            )
        if self.shadow is not None:
            raise _Bad(
                "is not supported with shadow yet", "remove lineage, or run without it", at=("lineage",)
            )

    def _mergeable(self) -> None:
        """A merge decides per key between the run's rows and rows already in a table."""
        merge = self.merge
        assert merge is not None
        kind = self.sink.kind
        misfit = None
        if kind == "kafka":
            misfit = "a backfill topic is a log: its records are not merged with live's; remove merge"
        elif self.sink.iceberg is not None and self.sink.iceberg.mode != "append":
            misfit = "replace-window already replaces the window's rows; use mode: append or remove merge"
        elif self.sink.postgres is not None and self.sink.postgres.mode != "upsert":
            misfit = "an append-mode table keeps every row; use mode: upsert or remove merge"
        if misfit is not None:
            mode = getattr(self.sink.target, "mode", None)
            raise _Bad(
                f"policy on_collision {merge.on_collision} does not fit sink.{kind}"
                + (f" in mode {mode}" if mode else ""),
                misfit,
                at=("merge",),
            )
        if not self.key:
            raise _Bad("needs a key", "a merge decides per key: list the key columns in key", at=("merge",))
        if self.translate.fold is not None:
            raise _Bad(
                "is not supported with translate.fold",
                "a fold already writes one row per key; remove merge or the fold",
                at=("merge",),
            )
        if self.shadow is not None:
            raise _Bad(
                "is not supported with shadow", "a shadow's v2 has no live rows to merge with", at=("merge",)
            )

    def _shadowable(self) -> None:
        # the tail continues the history run on the live log: it needs the whole history and
        # a target that is a table rows can be upserted into by key
        if self.source.history is None:
            raise _Bad(
                "needs a history source",
                "a shadow rebuilds v2 from all history: use source.history with an archive",
                at=("shadow",),
            )
        if self.sink.postgres is None and self.sink.iceberg is None:
            raise _Bad(
                f"needs a table sink, not sink.{self.sink.kind}",
                "a shadow upserts v2 on the key: use sink.postgres (or SQLite) or sink.iceberg",
                at=("shadow",),
            )
        if self.sink.iceberg is not None and self.sink.iceberg.mode != "append":
            raise _Bad(
                "needs sink.iceberg.mode append",
                "a shadow rebuilds the whole table as v2 and upserts it on the key; there is no window",
                got=self.sink.iceberg.mode,
                at=("sink", "iceberg", "mode"),
            )
        if self.sink.postgres is not None and self.sink.postgres.mode != "upsert":
            raise _Bad(
                "needs sink.postgres.mode upsert",
                "the live tail and the cut line's overlap are absorbed by upserts on the key",
                got=self.sink.postgres.mode,
                at=("sink", "postgres", "mode"),
            )
        if not self.key:
            raise _Bad(
                "needs a key",
                "a shadow upserts v2 on the business key: list the key columns",
                at=("key",),
            )
        overlap = self.shadow.rewind_by if self.shadow is not None else 0
        if self.translate.fold is not None and overlap not in (0, "0"):
            raise _Bad(
                "must be 0 with translate.fold",
                "a fold counts an event applied twice twice: a folded v2's cut line is where it ends",
                got=overlap,
                at=("shadow", "rewind_by"),
            )
        if self.source.window.to != "latest":
            raise _Bad(
                "a shadow's history ends at latest",
                "remove source.history.to (the live tail continues where history ends)",
                got=self.source.window.to,
                at=("source", "history", "to"),
            )

    def _kafka_values(self) -> None:
        """``sink.kafka.encode: avro`` takes decode's schema folder or registry unless it names its own."""
        kafka = self.sink.kafka
        if kafka is None or kafka.encode != "avro":
            return
        if kafka.schema_dir is None and kafka.registry_url is None:
            if self.decode.schema_dir is not None:
                _fill(kafka, "schema_dir", self.decode.schema_dir)
            elif self.decode.registry_url is not None:
                _fill(kafka, "registry_url", self.decode.registry_url)
            else:
                raise _Bad(
                    "needs a schema folder or a registry",
                    "give sink.kafka.schema_dir or sink.kafka.registry_url (decode: avro lends its own)",
                    got="avro",
                    at=("sink", "kafka", "encode"),
                )
        for name in ("subject", "register_schema"):
            if kafka.schema_dir is not None and getattr(kafka, name) not in (None, False):
                raise _Bad(
                    "not used with a schema folder",
                    "the folder's highest <id>.avsc is the schema: remove it, or use a registry_url",
                    got=getattr(kafka, name),
                    at=("sink", "kafka", name),
                )
        if kafka.register_schema and self.decode.format != "avro":
            raise _Bad(
                "registers decode's reader schema, and decode is not avro",
                "register the schema yourself and name its subject in sink.kafka.subject",
                got=True,
                at=("sink", "kafka", "register_schema"),
            )

    def _replaced_within_source(self) -> None:
        # rows of a replaced window the source does not cover would be deleted and never rewritten
        window = self.source.window
        lo, hi = window.from_, window.to
        kind = self.sink.kind
        start, end = self.sink.window_bounds
        if not (isinstance(lo, datetime) and isinstance(hi, datetime)):
            raise _Bad(
                "needs a source window given as times",
                "give source from/to as ISO times, or drop window_from/window_to",
                at=("sink", kind, "window_from" if start else "window_to"),
            )
        for name, value in (("window_from", start), ("window_to", end)):
            if value is not None and not lo <= value <= hi:
                raise _Bad(
                    "outside the source window",
                    f"the replaced window must lie within the source window {_iso(lo)} .. {_iso(hi)}",
                    got=_Plain(_iso(value)),
                    at=("sink", kind, name),
                )

    # -- derived ----------------------------------------------------------------------------

    def replaced_window(self) -> tuple[datetime, datetime] | None:
        """The repaired window: the sink's ``window_from``/``window_to``, else the source window;
        None unless both ends are times."""
        window = self.source.kafka_window
        if window is None:
            return None
        start, end = self.sink.window_bounds
        lo, hi = start or window.from_, end or window.to
        if isinstance(lo, datetime) and isinstance(hi, datetime):
            return lo, hi
        return None

    def window_request(self) -> WindowRequest:
        """The Kafka source's :meth:`KafkaSource.window_request`."""
        return self.source.window.window_request()

    def canonical(self) -> dict[str, Any]:
        """The spec as JSON-ready data: aliases, derived defaults filled in, no nulls."""
        return self.model_dump(mode="json", exclude_none=True)

    def public(self) -> dict[str, Any]:
        """:meth:`canonical` with secrets masked (URL passwords, secret configs): safe to print or store."""
        data: dict[str, Any] = mask(self.canonical())
        return data

    def fingerprint(self) -> str:
        """sha256 (hex) of the canonical JSON (sorted keys, aliases, no nulls, no description).

        The same job gives the same fingerprint whether it came from YAML or Python, with any
        key order and with derived defaults written out or not; a deterministic plan id can be
        built on it. ``description`` is left out: rewording it does not make a new job.
        """
        data = self.canonical()
        data.pop("description", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_yaml(self) -> str:
        """The spec as YAML that :func:`parse_spec` reads back into an equal spec."""
        return yaml.safe_dump(self.canonical(), sort_keys=False, allow_unicode=True, width=100)
