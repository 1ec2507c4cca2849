"""Which Avro schema a Kafka sink writes with, and pinning it for the run.

Two places hold schemas, as for decoding:

* a folder of ``.avsc`` files named by schema id (``1.avsc``, ``2.avsc``...; ``latest.avsc``
  is the readers' schema): the sink writes with the highest id, and ``latest.avsc``, when
  present, must be that schema (:meth:`LocalSchemaSource.latest_writer`);
* a Confluent-compatible registry: the sink writes with the latest version of
  ``sink.kafka.subject`` (default ``<topic>-value``). With ``register_schema: true`` it writes
  with the schema the records were decoded to (``decode``'s reader schema: Avro in, Avro out)
  and registers it under the subject first, where the registry checks its compatibility.

The plan resolves the schema without changing anything (a schema still to be registered is
checked as it will be) and refuses, in one line, output that does not fit it. ``prepare``
resolves it again, registering when allowed, and pins the id and the schema in the run's
staging record: every commit and every resume writes with that schema, even if the subject
moves on during the run, and reading the topic back needs no registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.secrets import mask_url
from rewind.sinks.kafka.avro_fit import AvroSchemaMismatch
from rewind.sinks.kafka.avro_values import AvroValues
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.records import user_columns
from rewind.translate.avro_schemas import LocalSchemaSource, RegistrySchemaSource, WriterSchema
from rewind.translate.exceptions import SchemaSourceError
from rewind.translate.factory import make_decoder

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.spec import JobSpec
    from rewind.translate.avro_schemas import SchemaSource

FIELD = "sink.kafka.registry_url"


@dataclass
class AvroTarget:
    """``sink.kafka.encode: avro`` and where its schema comes from (exactly one of the two)."""

    schema_dir: str | None = None
    registry_url: str | None = None
    subject: str | None = None
    register_schema: bool = False
    registry_config: dict[str, Any] = field(default_factory=dict)
    registered_from: SchemaSource | None = None
    """With ``register_schema``: whose reader schema is registered (decode's schema source)."""

    def __post_init__(self) -> None:
        if (self.schema_dir is None) == (self.registry_url is None):
            raise KafkaSinkError("sink.kafka.encode avro needs exactly one of schema_dir and registry_url")
        if self.register_schema and (self.registry_url is None or self.registered_from is None):
            raise KafkaSinkError(
                "sink.kafka.register_schema registers decode's reader schema in a registry: it needs "
                "sink.kafka.registry_url and decode: avro"
            )

    def subject_for(self, topic: str) -> str:
        """The subject of a topic: ``sink.kafka.subject``, else ``<topic>-value`` (TopicNameStrategy)."""
        return self.subject or f"{topic}-value"

    def describe(self) -> str:
        return (
            f"schema folder {self.schema_dir}"
            if self.schema_dir
            else f"schema registry {mask_url(self.registry_url or '')}"
        )

    def _registry(self) -> RegistrySchemaSource:
        assert self.registry_url is not None
        return RegistrySchemaSource(self.registry_url, config=self.registry_config, field=FIELD)

    def resolve(self, topic: str | None, *, register: bool) -> WriterSchema:
        """The writer schema for ``topic`` (None: the run's default topic, unknown before the run).

        ``register`` (prepare only) registers the schema when ``register_schema`` allows it;
        without it a schema still to be registered comes back with id 0, good for the fit.
        """
        try:
            if self.schema_dir is not None:
                return LocalSchemaSource(self.schema_dir).latest_writer()
            registry = self._registry()
            if self.register_schema:
                assert self.registered_from is not None
                schema = self.registered_from.reader_schema()
                if topic is None and self.subject is None:
                    return WriterSchema(
                        0, schema, "decode's reader schema, registered under <topic>-value by the run"
                    )
                subject = self.subject_for(topic or "")
                if register:
                    return registry.register(subject, schema)
                return WriterSchema(
                    0, schema, f"decode's reader schema, registered under subject {subject} by the run"
                )
            if topic is None and self.subject is None:
                raise KafkaSinkError(
                    "sink.kafka: the default subject <topic>-value of a backfill topic named after its run "
                    "has no version before the run; set sink.kafka.subject to the subject consumers read "
                    "(like orders-value) or register_schema: true"
                )
            subject = self.subject_for(topic or "")
            found = registry.latest_writer(subject)
            if found is None:
                raise KafkaSinkError(
                    f"sink.kafka: subject {subject} has no version in {self.describe()}; set "
                    "sink.kafka.subject to the subject consumers read or register_schema: true"
                )
            return found
        except SchemaSourceError as exc:
            raise KafkaSinkError(f"sink.kafka: {exc}") from exc

    def values(self, writer: WriterSchema, schema: pa.Schema) -> AvroValues:
        """The encoder of ``schema``'s rows with ``writer``; raises when they do not fit."""
        return AvroValues(writer, schema, user_columns(schema))

    def check(self, topic: str | None, schema: pa.Schema) -> str:
        """The plan's gate: resolve without changing anything, fit; what the values will be."""
        writer = self.resolve(topic, register=False)
        values = self.values(writer, schema)
        defaulted = [c.name for c in values.codecs if c.column is None]
        extra = f", defaults for {', '.join(defaulted)}" if defaulted else ""
        return f"values Avro with {writer.where}{extra}"

    def pin(self, topic: str, schema: pa.Schema) -> dict[str, Any]:
        """Resolve (registering when allowed) and fit at prepare; what the staging record keeps."""
        writer = self.resolve(topic, register=True)
        self.values(writer, schema)
        return pinned(writer)


def pinned(writer: WriterSchema) -> dict[str, Any]:
    """A writer schema as the staging record keeps it (JSON)."""
    return {
        "encode": "avro",
        "schema_id": writer.schema_id,
        "schema": json.dumps(writer.schema, separators=(",", ":")),
        "where": writer.where,
    }


def values_of(value_format: dict[str, Any] | None, schema: pa.Schema) -> AvroValues | None:
    """The encoder of a staging's pinned schema; None for JSON values."""
    if not value_format or value_format.get("encode") != "avro":
        return None
    writer = WriterSchema(
        int(value_format["schema_id"]), json.loads(value_format["schema"]), str(value_format["where"])
    )
    try:
        return AvroValues(writer, schema, user_columns(schema))
    except AvroSchemaMismatch as exc:  # pragma: no cover - fitted at prepare
        raise KafkaSinkError(f"the run's pinned Avro schema no longer fits its output: {exc}") from exc


def avro_target_of(spec: JobSpec) -> AvroTarget | None:
    """The spec's ``sink.kafka`` Avro settings (None for JSON values)."""
    kafka = spec.sink.kafka
    if kafka is None or kafka.encode != "avro":
        return None
    registered_from = None
    if kafka.register_schema:
        # lazy: avoids numpy, pandas, pyarrow at import
        from rewind.translate.avro_decoder import AvroDecoder

        decoder = make_decoder(spec.decode)
        registered_from = decoder.source if isinstance(decoder, AvroDecoder) else None
    return AvroTarget(
        schema_dir=kafka.schema_dir,
        registry_url=kafka.registry_url,
        subject=kafka.subject,
        register_schema=kafka.register_schema,
        registered_from=registered_from,
    )
