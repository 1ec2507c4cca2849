"""The declarative job spec: what the user asked for, from a YAML file or from Python.

A spec names a source window, how to decode it, how to translate it, where the output goes
and the limits of the run::

    name: repair-order-totals
    source:
      kafka: {topics: [orders], from: "2026-10-01T00:00:00Z", to: "2026-10-08T00:00:00Z"}
    decode: json
    translate:
      function: my_pkg.orders:to_order_total
      version: "2"
    key: [order_id]
    sink:
      iceberg: {table: analytics.order_totals}
    guards:
      max_records_per_second: 50000
      max_records: 50000000

:func:`load_spec` reads a file, :func:`parse_spec` a mapping; both return a frozen
:class:`JobSpec` or raise a one-line :class:`~rewind.errors.SpecError`::

    spec.yaml: translate.fucntion: unknown field; allowed: function, sql, version, name, output_schema, fold
    spec.yaml: source.kafka.from: a time without a time zone (got '2026-10-01T00:00:00'); add Z ...

From Python, ``JobSpec(...)`` and ``JobSpec.model_validate(data)`` validate the same way and
raise pydantic's ``ValidationError`` (fields keep their Python names: ``from_`` for ``from``).

What the spec checks and what it leaves to the planner. The spec validates shapes and
everything that can be known without a broker or an import: names, window order, formats,
exactly-one choices, unknown fields (anywhere), secrets out of error messages. It does not
import the translate function, reach the broker or the catalog: those are plan-time gates.

Derived defaults are filled in at validation and are part of the spec from then on
(``translate.name``, ``decode.null_value``, ``sink.iceberg.window_column`` for ``replace-window``,
``quarantine.table``),
so :meth:`JobSpec.to_yaml` prints them and :meth:`JobSpec.fingerprint` does not depend on
whether they were written out.

Modules: ``job`` (the whole spec), one per section (``source``, ``transform``, ``targets``,
``run``, ``verify``), ``values`` (parsing of times, offsets and types), ``errors`` (one-line
errors), ``loader`` (YAML) and ``reference_docs`` (docs/spec-reference.md).
"""

from __future__ import annotations

from rewind.errors import SpecError
from rewind.spec.job import EXAMPLE_SPEC, JobSpec
from rewind.spec.loader import load_spec, load_verify, parse_spec
from rewind.spec.reference_docs import spec_reference_markdown
from rewind.spec.run import Guards, Quarantine, RunSettings
from rewind.spec.source import HistorySource, KafkaSource, Source
from rewind.spec.targets import IcebergTarget, KafkaTarget, SinkConfig, SqlTarget
from rewind.spec.transform import Decode, Translate
from rewind.spec.values import KafkaBound
from rewind.spec.verify import (
    Assertion,
    Buckets,
    PostgresReference,
    Reference,
    Scope,
    SqlReference,
    Tolerance,
    Verify,
)

__all__ = [
    "EXAMPLE_SPEC",
    "Assertion",
    "Buckets",
    "Decode",
    "Guards",
    "HistorySource",
    "IcebergTarget",
    "JobSpec",
    "KafkaBound",
    "KafkaSource",
    "KafkaTarget",
    "PostgresReference",
    "Quarantine",
    "Reference",
    "RunSettings",
    "Scope",
    "SinkConfig",
    "Source",
    "SpecError",
    "SqlReference",
    "SqlTarget",
    "Tolerance",
    "Translate",
    "Verify",
    "load_spec",
    "load_verify",
    "parse_spec",
    "spec_reference_markdown",
]
