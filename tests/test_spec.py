"""The job spec: every accepted form, every one-line error, window requests, fingerprints.

Pure Python: no broker, no Spark. Window requests are compared with what
``parse_spark_options`` makes of the equivalent Spark options, so a spec means exactly what
the same window means to the ``rewind-kafka`` reader.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from rewind.core.windows import EARLIEST, LATEST, BoundSpec, Timestamp, WindowRequest
from rewind.errors import RewindError, SpecError
from rewind.kafka.spark_options import parse_spark_options
from rewind.spec import (
    EXAMPLE_SPEC,
    Decode,
    Guards,
    IcebergTarget,
    JobSpec,
    KafkaSource,
    KafkaTarget,
    Quarantine,
    RunSettings,
    SinkConfig,
    Source,
    SqlTarget,
    Translate,
    load_spec,
    parse_spec,
    spec_reference_markdown,
)

SPEC_YAML = """\
name: repair-order-totals
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

OCT_1 = 1_790_812_800_000  # 2026-10-01T00:00:00Z
OCT_8 = 1_791_417_600_000  # 2026-10-08T00:00:00Z
DEL = object()

GUARD_FIELDS = (
    "max_records_per_second, max_records, max_bytes, max_quarantine_ratio, min_records_before_ratio"
)


def base() -> dict[str, Any]:
    data = yaml.safe_load(SPEC_YAML)
    assert isinstance(data, dict)
    return data


def with_(changes: dict[str, Any], data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example spec with dotted paths set (``DEL`` removes)."""
    data = copy.deepcopy(data if data is not None else base())
    for path, value in changes.items():
        target = data
        *parents, last = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        if value is DEL:
            target.pop(last, None)
        else:
            target[last] = value
    return data


def error_of(data: Any, source: str = "spec.yaml") -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(data, source)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"{source}: "), message
    return info.value


def kafka(spec: JobSpec) -> KafkaSource:
    assert spec.source.kafka is not None
    return spec.source.kafka


def stripped(request: WindowRequest) -> WindowRequest:
    """The request without the option names (the spec names its fields, Spark its options)."""
    return dataclasses.replace(
        request,
        start=dataclasses.replace(request.start, option=""),
        end=dataclasses.replace(request.end, option=""),
    )


# -- the example and its forms ----------------------------------------------------------------


def test_the_example_spec_parses(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_YAML)
    spec = load_spec(path)
    assert spec.name == "repair-order-totals"
    source = kafka(spec)
    assert source.topics == ["orders"]
    assert source.from_ == datetime(2026, 10, 1, tzinfo=UTC)
    assert source.to == datetime(2026, 10, 8, tzinfo=UTC)
    assert spec.source.kind == "kafka"
    assert spec.decode == Decode(format="json")
    assert spec.decode.null_value == "quarantine"
    assert spec.translate.function == "my_pkg.orders:to_order_total"
    assert spec.translate.version == "2"
    assert spec.translate.name == "to_order_total"
    assert spec.translate.kind == "function"
    assert spec.key == ["order_id"]
    assert spec.sink.kind == "iceberg"
    assert spec.sink.target == IcebergTarget(table="analytics.order_totals")
    assert spec.sink.iceberg is not None and spec.sink.iceberg.mode == "append"
    assert spec.guards == Guards(max_records_per_second=50000, max_records=50_000_000)
    assert spec.run == RunSettings(work_unit_records=250_000, lease_ttl_s=60)
    assert spec.quarantine.table == "analytics.rewind_quarantine"
    assert spec.verify is None


def test_the_documented_example_parses() -> None:
    spec = parse_spec(yaml.safe_load(EXAMPLE_SPEC))
    assert spec.description and spec.name == "repair-order-totals"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("earliest", "earliest"),
        ("EARLIEST", "earliest"),
        ("latest", "latest"),
        ("2026-10-01T00:00:00Z", datetime(2026, 10, 1, tzinfo=UTC)),
        ("2026-10-01T02:00:00+02:00", datetime(2026, 10, 1, tzinfo=UTC)),
        ("2026-10-01 00:00:00.250Z", datetime(2026, 10, 1, 0, 0, 0, 250_000, tzinfo=UTC)),
        (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)),
        (OCT_1, datetime(2026, 10, 1, tzinfo=UTC)),
        (str(OCT_1), datetime(2026, 10, 1, tzinfo=UTC)),
        ({"orders": {"0": 1200, "1": 1300}}, {"orders": {0: 1200, 1: 1300}}),
        ({"orders": {1: 1300, 0: -2}}, {"orders": {0: -2, 1: 1300}}),
        ('{"orders": {"0": 1200, "1": -1}}', {"orders": {0: 1200, 1: -1}}),
    ],
)
def test_from_accepts_every_form(given: Any, expected: Any) -> None:
    spec = parse_spec(with_({"source.kafka.from": given, "source.kafka.to": "latest"}))
    assert kafka(spec).from_ == expected


def test_unquoted_yaml_times_are_read_as_times() -> None:
    text = SPEC_YAML.replace('"2026-10-01T00:00:00Z"', "2026-10-01T00:00:00Z").replace(
        '"2026-10-08T00:00:00Z"', "2026-10-08 02:00:00+02:00"
    )
    spec = parse_spec(yaml.safe_load(text))
    assert kafka(spec).from_ == datetime(2026, 10, 1, tzinfo=UTC)
    assert kafka(spec).to == datetime(2026, 10, 8, tzinfo=UTC)


def test_window_defaults_to_earliest_latest() -> None:
    spec = parse_spec(with_({"source.kafka": {"topics": ["orders", "payments"]}}))
    assert (kafka(spec).from_, kafka(spec).to) == ("earliest", "latest")


def test_to_accepts_offsets_with_latest() -> None:
    spec = parse_spec(
        with_(
            {
                "source.kafka.from": {"orders": {"0": 10, "1": 20}},
                "source.kafka.to": {"orders": {"0": 10, "1": -1}},
            }
        )
    )
    assert kafka(spec).to == {"orders": {0: 10, 1: -1}}


def test_mixed_window_offsets_to_time() -> None:
    spec = parse_spec(with_({"source.kafka.from": {"orders": {"0": 10}}, "source.kafka.to": OCT_8}))
    assert kafka(spec).to == datetime(2026, 10, 8, tzinfo=UTC)


def test_decode_forms() -> None:
    assert parse_spec(with_({"decode": "avro"})).decode == Decode(format="avro")
    assert parse_spec(with_({"decode": "raw"})).decode.format == "raw"
    avro = parse_spec(
        with_(
            {
                "decode": {
                    "format": "avro",
                    "registry_url": "http://registry:8081",
                    "reader_schema": "latest",
                    "subject": "orders-value",
                    "null_value": "skip",
                }
            }
        )
    ).decode
    assert (avro.registry_url, avro.reader_schema, avro.subject, avro.null_value) == (
        "http://registry:8081",
        "latest",
        "orders-value",
        "skip",
    )
    local = parse_spec(
        with_({"decode": {"format": "avro", "schema_dir": "schemas/", "reader_schema": "schemas/order.avsc"}})
    )
    assert local.decode.schema_dir == "schemas/"
    json_decode = parse_spec(
        with_(
            {
                "decode": {
                    "format": "json",
                    "schema": {"order_id": "string", "total": "Double", "n": "bigint", "raw": "any"},
                }
            }
        )
    ).decode
    assert json_decode.schema_ == {"order_id": "string", "total": "double", "n": "long", "raw": "json"}


def test_null_value_defaults_by_format() -> None:
    assert parse_spec(with_({"decode": "raw"})).decode.null_value == "keep"
    assert parse_spec(with_({"decode": "avro"})).decode.null_value == "quarantine"
    assert parse_spec(base()).decode.null_value == "quarantine"
    raw_skip = parse_spec(with_({"decode": {"format": "raw", "null_value": "skip"}}))
    assert raw_skip.decode.null_value == "skip"


def test_decode_vocabulary_is_the_decoders() -> None:
    """The spec checks decode.schema without importing pandas; it must agree with the decoder."""
    from rewind.core.columns import RESERVED_PREFIXES
    from rewind.spec.values import _JSON_TYPES, _RESERVED_PREFIXES
    from rewind.translate import json_decoder

    assert set(_JSON_TYPES) == set(json_decoder.JSON_TYPE_NAMES)
    for name, canonical in _JSON_TYPES.items():
        assert json_decoder.JsonDecoder(schema={"f": name}).schema == {"f": canonical}
    assert _RESERVED_PREFIXES == RESERVED_PREFIXES


def test_output_schema_takes_spark_types() -> None:
    schema = {
        "order_id": "string",
        "total": "Decimal(10, 2)",
        "items": "array< struct<sku: string, qty:INT> >",
        "tags": "map<string,string>",
        "at": "timestamp",
        "blob": "binary",
    }
    spec = parse_spec(with_({"translate.output_schema": schema}))
    assert spec.translate.output_schema == {
        "order_id": "string",
        "total": "decimal(10,2)",
        "items": "array<struct<sku:string,qty:int>>",
        "tags": "map<string,string>",
        "at": "timestamp",
        "blob": "binary",
    }


def test_translate_sql_and_names() -> None:
    spec = parse_spec(
        with_(
            {
                "translate": {
                    "sql": "SELECT order_id, sum(total) AS total FROM Events GROUP BY order_id",
                    "version": 3,
                    "output_schema": {"order_id": "string", "total": "double"},
                }
            }
        )
    )
    assert (spec.translate.kind, spec.translate.name, spec.translate.version) == ("sql", "sql", "3")
    named = parse_spec(with_({"translate.name": "order-totals"}))
    assert named.translate.name == "order-totals"
    method = parse_spec(with_({"translate.function": "pkg.mod:Totals.compute"}))
    assert method.translate.name == "compute"


def test_sink_forms() -> None:
    pg = parse_spec(
        with_({"sink": {"postgres": {"table": "public.order_totals", "url": "postgresql://svc@db/app"}}})
    )
    assert pg.sink.target == SqlTarget(table="public.order_totals", url="postgresql://svc@db/app")
    assert pg.sink.kind == "postgres" and pg.sink.postgres is not None and pg.sink.postgres.mode == "upsert"
    assert pg.quarantine.table == "rewind.rewind_quarantine"
    ks = parse_spec(
        with_(
            {
                "sink": {
                    "kafka": {
                        "topic": "orders.backfill",
                        "partitions": 6,
                        "transactional": True,
                        "configs": {"retention.ms": 604800000, "cleanup.policy": "delete", "x.flag": True},
                    }
                }
            }
        )
    )
    assert ks.sink.kafka == KafkaTarget(
        topic="orders.backfill",
        partitions=6,
        transactional=True,
        configs={"retention.ms": "604800000", "cleanup.policy": "delete", "x.flag": "true"},
    )
    default_topic = parse_spec(with_({"sink": {"kafka": {}}}))
    assert default_topic.sink.kafka == KafkaTarget()
    window = parse_spec(with_({"sink.iceberg.mode": "replace-window"}))
    assert window.sink.iceberg is not None
    assert window.sink.iceberg.window_column == "_rewind_source_timestamp"
    nested = parse_spec(with_({"sink.iceberg.table": "lake.analytics.totals"}))
    assert nested.quarantine.table == "lake.analytics.rewind_quarantine"


def test_sections_may_be_empty_or_explicit() -> None:
    spec = parse_spec(
        with_(
            {
                "guards": None,
                "run": {"work_unit_records": 1000, "lease_ttl_s": 5},
                "quarantine": {"table": "ops.rejects"},
                "key": [],
                "verify": {
                    "reference": {"iceberg": "analytics.order_totals_v1"},
                    "compare": {"total": {"rel": 0.001}},
                },
                "description": "after the rounding bug",
            }
        )
    )
    assert spec.guards == Guards()
    assert spec.run.work_unit_records == 1000
    assert spec.quarantine == Quarantine(table="ops.rejects")
    assert spec.key == []
    assert spec.verify is not None and spec.verify.reference.iceberg == "analytics.order_totals_v1"
    assert spec.verify.compare is not None and spec.verify.compare["total"].rel == 0.001


@pytest.mark.parametrize(
    ("given", "expected"),
    [(1024, 1024), ("500MB", 500_000_000), ("10 GiB", 10 * 2**30), ("1.5kb", 1500), ("2Ti", 2 * 2**40)],
)
def test_max_bytes_sizes(given: Any, expected: int) -> None:
    assert parse_spec(with_({"guards.max_bytes": given})).guards.max_bytes == expected


def test_declared_log_start() -> None:
    spec = parse_spec(with_({"source.kafka.declared_log_start": {"orders": {"0": 500, 1: 700}}}))
    assert kafka(spec).declared_start() == {("orders", 0): 500, ("orders", 1): 700}
    assert kafka(parse_spec(base())).declared_start() == {}


# -- one-line errors --------------------------------------------------------------------------


def test_unknown_field_message_is_exact() -> None:
    data = with_({"translate.fucntion": "my_pkg.orders:to_order_total", "translate.function": DEL})
    error = error_of(data)
    assert str(error) == (
        "spec.yaml: translate.fucntion: unknown field; "
        "allowed: function, sql, version, name, output_schema, fold, transition"
    )
    assert error.field == "translate.fucntion"


def test_missing_field_message_is_exact() -> None:
    assert str(error_of(with_({"translate.version": DEL}))) == "spec.yaml: translate.version: required"
    assert str(error_of(with_({"name": DEL}), "<spec>")) == "<spec>: name: required"


def test_more_errors_are_counted() -> None:
    data = with_({"translate.version": DEL, "sink": DEL, "nmae": "x"})
    message = str(error_of(data))
    assert message.startswith("spec.yaml: nmae: unknown field; allowed: name, description, source")
    assert message.endswith("(+2 more)")


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (
            "nmae",
            "name, description, source, decode, translate, key, sink, merge, lineage, guards, "
            "live_groups, run, quarantine, verify, shadow",
        ),
        ("source.kafak", "kafka, history, table"),
        ("source.kafka.topic", "topics, from, to, declared_log_start, latest_per_key, snapshot"),
        ("decode.registry", "format, registry_url, schema_dir, reader_schema, subject, schema, null_value"),
        ("sink.iceberg.partition_by", "table, mode, window_column, window_from, window_to"),
        ("sink.postgress", "iceberg, postgres, kafka"),
        ("guards.max_rps", GUARD_FIELDS),
        ("run.workers", "work_unit_records, lease_ttl_s"),
        ("quarantine.tabel", "table"),
    ],
)
def test_unknown_fields_at_every_depth(path: str, allowed: str) -> None:
    data = with_({"decode": {"format": "json"}, path: 1})
    assert str(error_of(data)) == f"spec.yaml: {path}: unknown field; allowed: {allowed}"


def test_python_names_are_accepted_in_mappings_too() -> None:
    data = with_({"source.kafka.from_": "earliest", "source.kafka.from": DEL})
    assert kafka(parse_spec(data)).from_ == "earliest"


ERRORS: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [
    # (changes to the example, field named, texts the message must hold)
    ({"name": "Repair Orders"}, "name", ("not a slug", "'Repair Orders'", "lowercase letters")),
    ({"name": 7}, "name", ("not a string", "(got 7)")),
    ({"source": {}}, "source", ("no source given", "exactly one of: kafka")),
    ({"source": "orders"}, "source", ("not a mapping", "'orders'", "fields: kafka")),
    ({"source.kafka.topics": []}, "source.kafka.topics", ("no topic", "(got [])")),
    (
        {"source.kafka.topics": ["orders", "payments", "orders"]},
        "source.kafka.topics",
        ("'orders' is listed twice", '(got ["orders", "payments", "orders"])', "list each topic once"),
    ),
    ({"source.kafka.topics": ["or ders"]}, "source.kafka.topics.0", ("not a topic name", "'or ders'")),
    ({"source.kafka.topics": "orders"}, "source.kafka.topics", ("not a list", "'orders'")),
    (
        {"source.kafka.to": "earliest"},
        "source.kafka.to",
        ("can't end at earliest", "(got 'earliest')", '"latest"'),
    ),
    (
        {"source.kafka.from": "2026-10-01T00:00:00"},
        "source.kafka.from",
        ("without a time zone", "(got '2026-10-01T00:00:00')", "add Z or an offset"),
    ),
    (
        {"source.kafka.from": datetime(2026, 10, 1)},
        "source.kafka.from",
        ("without a time zone", "(got 2026-10-01T00:00:00)", "add Z or an offset"),
    ),
    (
        {"source.kafka.to": "2026-10-08"},
        "source.kafka.to",
        ("without a time zone", "(got '2026-10-08')", "add Z or an offset, like 2026-10-08T00:00:00Z"),
    ),
    ({"source.kafka.from": "yesterday"}, "source.kafka.from", ("not a window bound", "'yesterday'", "epoch")),
    ({"source.kafka.from": True}, "source.kafka.from", ("not a window bound", "(got true)")),
    (
        {"source.kafka.from": OCT_1 // 1000},
        "source.kafka.from",
        ("too small for epoch milliseconds", f"(got {OCT_1 // 1000})", "13 digits"),
    ),
    (
        {"source.kafka.from": "2026-10-01T00:00:00.000500Z"},
        "source.kafka.from",
        ("finer than a millisecond", "'2026-10-01T00:00:00.000500Z'"),
    ),
    (
        {"source.kafka.from": "1969-12-31T23:59:59Z"},
        "source.kafka.from",
        ("before 1970", "'1969-12-31T23:59:59Z'"),
    ),
    (
        {"source.kafka.from": '{"orders": {"0": 1'},
        "source.kafka.from",
        ("not valid JSON", """'{"orders": {"0": 1'"""),
    ),
    (
        {"source.kafka.from": {"orders": {"zero": 1}}},
        "source.kafka.from.orders.zero",
        ("not a partition number", "(got 'zero')"),
    ),
    (
        {"source.kafka.from": {"orders": {"0": "1200"}}},
        "source.kafka.from.orders.0",
        ("not an offset", "(got '1200')"),
    ),
    (
        {"source.kafka.from": {"orders": {"0": -3}}},
        "source.kafka.from.orders.0",
        ("a negative offset", "(got -3)", "-2 for earliest"),
    ),
    (
        {"source.kafka.from": "latest", "source.kafka.to": {"orders": {"0": -2}}},
        "source.kafka.to.orders.0",
        ("can't end at earliest (-2)", "(got -2)"),
    ),
    (
        {"source.kafka.from": {"orders": {"0": 1}, "payments": {"0": 1}}},
        "source.kafka.from.payments",
        ("topic is not in topics", "(got 'payments')", "(orders)"),
    ),
    (
        {"source.kafka.topics": ["orders", "payments"], "source.kafka.from": {"orders": {"0": 1}}},
        "source.kafka.from",
        ("names no partition of topic 'payments'", '(got {"orders": {"0": 1}})', "every partition"),
    ),
    (
        {"source.kafka.from": {"orders": {"0": 1, "1": 2}}, "source.kafka.to": {"orders": {"0": 5}}},
        "source.kafka.to",
        ("names no partition 1 of orders", "the same partitions"),
    ),
    (
        {"source.kafka.declared_log_start": {"payments": {"0": 5}}},
        "source.kafka.declared_log_start.payments",
        ("topic is not in topics", "(got 'payments')"),
    ),
    (
        {"source.kafka.declared_log_start": {"orders": {"0": -1}}},
        "source.kafka.declared_log_start.orders.0",
        ("negative log start", "(got -1)"),
    ),
    ({"source.kafka.since": "earliest"}, "source.kafka.since", ("unknown field", "allowed: topics, from")),
    ({"decode": "xml"}, "decode", ("unknown format", "(got 'xml')", "json, avro, raw")),
    (
        {"decode": {"format": "xml"}},
        "decode.format",
        ("not allowed", "(got 'xml')", "allowed: json, avro, raw"),
    ),
    ({"decode": {"schema": {"a": "long"}}}, "decode.format", ("required",)),
    (
        {"decode": {"format": "json", "subject": "orders-value"}},
        "decode.subject",
        ("not used by format json", "(got 'orders-value')", "only format avro"),
    ),
    (
        {"decode": {"format": "avro", "schema": {"a": "long"}}},
        "decode.schema",
        ("not used by format avro", "only format json reads schema"),
    ),
    (
        {"decode": {"format": "avro", "registry_url": "http://r:8081", "schema_dir": "s"}},
        "decode.schema_dir",
        ("given with registry_url", "not both"),
    ),
    (
        {"decode": {"format": "avro", "registry_url": "registry:8081"}},
        "decode.registry_url",
        ("not an http(s) URL", "(got 'registry:8081')"),
    ),
    (
        {"decode": {"format": "json", "schema": {"total": "money"}}},
        "decode.schema.total",
        ("not a JSON decode type", "(got 'money')", "string, int, long"),
    ),
    (
        {"decode": {"format": "json", "schema": {"_src_topic": "string"}}},
        "decode.schema._src_topic",
        ("are reserved", "(got '_src_topic')", "format raw"),
    ),
    (
        {"decode": {"format": "json", "null_value": "drop"}},
        "decode.null_value",
        ("allowed: quarantine, skip, keep",),
    ),
    (
        {"decode": {"format": "json", "null_value": "keep"}},
        "decode.null_value",
        ("not used by format json", "(got 'keep')", "quarantine or skip"),
    ),
    (
        {"translate.output_schema": {"order_id": "money"}},
        "translate.output_schema.order_id",
        ("not a Spark type", "(got 'money')", "decimal(p,s)"),
    ),
    (
        {"translate.output_schema": {"order_id": "decimal(40,2)"}},
        "translate.output_schema.order_id",
        ("precision <= 38", "(got 'decimal(40,2)')"),
    ),
    (
        {"translate.output_schema": {"order_id": "array<string"}},
        "translate.output_schema.order_id",
        ("not a Spark type", "(got 'array<string')"),
    ),
    (
        {"translate.output_schema": {"order_id": "struct<a int, b>"}},
        "translate.output_schema.order_id",
        ("not a Spark type",),
    ),
    (
        {"translate.sql": "SELECT 1 FROM events"},
        "translate",
        ("both function and sql given", "exactly one of: function, sql"),
    ),
    ({"translate.function": DEL}, "translate", ("neither function nor sql given",)),
    (
        {"translate.function": "my_pkg.orders.to_order_total"},
        "translate.function",
        ("not a function reference", "'my_pkg.orders.to_order_total'", "package.module:callable"),
    ),
    (
        {"translate.function": DEL, "translate.sql": "SELECT * FROM events_v2"},
        "translate.sql",
        ("does not read the view events", "'SELECT * FROM events_v2'", "FROM events"),
    ),
    ({"translate.version": ""}, "translate.version", ("empty", "(got '')", "event ids")),
    ({"translate.version": "2/3"}, "translate.version", ("not allowed", "(got '2/3')")),
    ({"translate.version": 1.1}, "translate.version", ("(got 1.1)", 'quote it, like version: "1.10"')),
    ({"translate.name": "to total"}, "translate.name", ("(got 'to total')",)),
    (
        {"translate.output_schema": {"order_total": "double"}},
        "key.0",
        ("not a column of translate.output_schema", "(got 'order_id')", "order_total"),
    ),
    ({"key": ["order_id", "order_id"]}, "key", ("'order_id' is listed twice",)),
    ({"key": [""]}, "key.0", ("empty column name",)),
    ({"key": "order_id"}, "key", ("not a list", "(got 'order_id')")),
    (
        {"sink.postgres": {"table": "public.totals"}},
        "sink",
        ("more than one sink given", "(got iceberg, postgres)", "exactly one of: iceberg, postgres, kafka"),
    ),
    ({"sink": {}}, "sink", ("no sink given",)),
    (
        {"sink.iceberg.table": "order_totals"},
        "sink.iceberg.table",
        ("not a namespace.table", "'order_totals'"),
    ),
    (
        {"sink.iceberg.mode": "overwrite"},
        "sink.iceberg.mode",
        ("(got 'overwrite')", "append, replace-window"),
    ),
    ({"sink.iceberg.window_column": "ts"}, "sink.iceberg.window_column", ("only by mode replace-window",)),
    ({"sink": {"iceberg": {"mode": "append"}}}, "sink.iceberg.table", ("required",)),
    ({"sink": {"postgres": {"table": "a.b.c"}}}, "sink.postgres.table", ("not a schema.table", "'a.b.c'")),
    ({"sink": {"postgres": {"table": "t" * 64}}}, "sink.postgres.table", ("at most 63",)),
    (
        {"sink": {"postgres": {"table": "t", "mode": "merge"}}},
        "sink.postgres.mode",
        ("allowed: upsert, append",),
    ),
    ({"sink": {"kafka": {"topic": "orders"}}}, "sink.kafka.topic", ("is a source topic", "(got 'orders')")),
    ({"sink": {"kafka": {"topic": "a b"}}}, "sink.kafka.topic", ("not a topic name",)),
    ({"sink": {"kafka": {"partitions": 0}}}, "sink.kafka.partitions", ("out of range", "(got 0)", "> 0")),
    ({"sink": {"kafka": {"transactional": "maybe"}}}, "sink.kafka.transactional", ("not a boolean",)),
    ({"guards.max_records": 0}, "guards.max_records", ("out of range", "(got 0)", "must be > 0")),
    ({"guards.max_records": "many"}, "guards.max_records", ("not an integer", "(got 'many')")),
    ({"guards.max_records_per_second": -1}, "guards.max_records_per_second", ("(got -1)", "must be > 0")),
    ({"guards.max_records_per_second": "inf"}, "guards.max_records_per_second", ("not a finite number",)),
    ({"guards.max_bytes": "10 zb"}, "guards.max_bytes", ("not a size", "(got '10 zb')", "10GiB")),
    ({"guards": [1]}, "guards", ("not a mapping", GUARD_FIELDS)),
    ({"run.work_unit_records": 1.5}, "run.work_unit_records", ("not a whole number", "(got 1.5)")),
    ({"run.lease_ttl_s": 0}, "run.lease_ttl_s", ("must be > 0",)),
    ({"quarantine.table": "rejects"}, "quarantine.table", ("not a namespace.table",)),
    (
        {"quarantine.table": "analytics.order_totals"},
        "quarantine.table",
        ("the sink table is the quarantine table",),
    ),
    ({"verify": 3}, "verify", ("not a mapping", "(got 3)")),
]


@pytest.mark.parametrize(("changes", "field", "texts"), ERRORS, ids=[e[1] for e in ERRORS])
def test_every_error_is_one_line_naming_field_value_and_fix(
    changes: dict[str, Any], field: str, texts: tuple[str, ...]
) -> None:
    error = error_of(with_(changes))
    message = str(error)
    assert message.startswith(f"spec.yaml: {field}: "), message
    assert error.field == field
    for text in texts:
        assert text in message, f"{text!r} not in {message!r}"
    assert isinstance(error, RewindError)


def test_window_end_before_start_times() -> None:
    message = str(error_of(with_({"source.kafka.from": "2026-10-08T00:00:00Z", "source.kafka.to": OCT_1})))
    assert message == (
        "spec.yaml: source.kafka.to: is before from (got 2026-10-01T00:00:00Z, from is "
        "2026-10-08T00:00:00Z); the window is [from, to): to must be after from"
    )
    same = str(error_of(with_({"source.kafka.to": "2026-10-01T02:00:00+02:00"})))
    assert same.startswith("spec.yaml: source.kafka.to: is equal to from")


def test_window_end_before_start_offsets() -> None:
    data = with_(
        {
            "source.kafka.from": {"orders": {"0": 100, "1": 1300, "2": -2}},
            "source.kafka.to": {"orders": {"0": 100, "1": 900, "2": 5}},
        }
    )
    message = str(error_of(data))
    assert message == (
        "spec.yaml: source.kafka.to.orders.1: is before from's offset 1300 (got 900); "
        "the window is [from, to): each partition's to must be >= its from"
    )


def test_secrets_stay_out_of_errors() -> None:
    url = "postgresql://svc:s3cr3t@db/app"
    bad_table = with_({"sink": {"postgres": {"table": "a.b.c", "url": url}}})
    assert "s3cr3t" not in str(error_of(bad_table))
    bad_url = with_({"sink": {"postgres": {"table": "t", "url": "mysql://svc:s3cr3t@db/app"}}})
    message = str(error_of(bad_url))
    assert "s3cr3t" not in message and "mysql://svc:***@db/app" in message
    bad_config = with_({"sink": {"kafka": {"configs": {"sasl.password": ["s3cr3t"]}}}})
    message = str(error_of(bad_config))
    assert "sink.kafka.configs.sasl.password" in message and "s3cr3t" not in message


def test_secrets_stay_out_of_reprs_and_public_data() -> None:
    url = "postgresql://svc:s3cr3t@db/app"
    spec = parse_spec(with_({"sink": {"postgres": {"table": "totals", "url": url}}}))
    assert spec.sink.postgres is not None and spec.sink.postgres.url == url  # clients need it
    assert "s3cr3t" not in repr(spec) and "s3cr3t" not in str(spec.sink)
    assert spec.public()["sink"]["postgres"]["url"] == "postgresql://svc:***@db/app"
    secret_config = parse_spec(with_({"sink": {"kafka": {"configs": {"sasl.password": "s3cr3t"}}}}))
    assert "s3cr3t" not in repr(secret_config)
    assert secret_config.public()["sink"]["kafka"]["configs"] == {"sasl.password": "***"}


def test_long_values_are_shortened_to_one_line() -> None:
    sql = "SELECT a,\n       b\nFROM orders\n" + "WHERE x = 1\n" * 40
    message = str(error_of(with_({"translate.function": DEL, "translate.sql": sql})))
    assert "\n" not in message and "..." in message and len(message) < 400


# -- files ------------------------------------------------------------------------------------


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: x\nsource:\n  kafka: {topics: [orders]\ndecode: json\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: line ") and "not valid YAML" in message


def test_tabs_are_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: x\nsource:\n\tkafka: {}\n")
    with pytest.raises(SpecError, match=r": line 3, column 1: not valid YAML"):
        load_spec(path)


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_YAML + "sink:\n  postgres: {table: totals}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert (
        str(info.value) == f"{path}: line 14: 'sink' is given twice (first at line 9); give each field once"
    )


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    text = SPEC_YAML.replace(
        "guards:\n  max_records_per_second: 50000\n  max_records: 50000000\n",
        "guards:\n  <<: {max_records: 10, max_bytes: 99}\n  max_records: 20\n",
    )
    assert "<<" in text
    path.write_text(text)
    assert load_spec(path).guards == Guards(max_records=20, max_bytes=99)


def test_missing_empty_and_odd_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    assert str(info.value) == f"{missing}: no such spec file; check the path"
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    with pytest.raises(
        SpecError, match=r"empty\.yaml: expected a mapping of fields at the top level \(got an empty file\)"
    ):
        load_spec(empty)
    listed = tmp_path / "list.yaml"
    listed.write_text("- name: x\n")
    with pytest.raises(SpecError, match=r"got \[\{\"name\": \"x\"\}\]\); allowed: name, description"):
        load_spec(listed)
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(SpecError, match="can't read the spec file"):
        load_spec(binary)


def test_load_spec_names_the_file_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("spec.yaml").write_text(SPEC_YAML.replace('version: "2"', "versoin: 2"))
    with pytest.raises(SpecError) as info:
        load_spec("spec.yaml")
    assert str(info.value).startswith("spec.yaml: translate.versoin: unknown field; allowed: ")


# -- the Python API ---------------------------------------------------------------------------


def python_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "name": "repair-order-totals",
        "source": Source(
            kafka=KafkaSource(
                topics=["orders"],
                from_=datetime(2026, 10, 1, 2, tzinfo=timezone(timedelta(hours=2))),
                to=datetime(2026, 10, 8, tzinfo=UTC),
            )
        ),
        "decode": "json",
        "translate": Translate(function="my_pkg.orders:to_order_total", version="2"),
        "key": ["order_id"],
        "sink": SinkConfig(iceberg=IcebergTarget(table="analytics.order_totals")),
        "guards": Guards(max_records_per_second=50000, max_records=50_000_000),
    }
    fields.update(overrides)
    return JobSpec(**fields)


def test_python_construction_equals_yaml() -> None:
    from_python = python_spec()
    from_yaml = parse_spec(base())
    assert from_python == from_yaml
    assert from_python.fingerprint() == from_yaml.fingerprint()
    assert JobSpec.model_validate(base()) == from_yaml


def test_python_construction_validates_the_same() -> None:
    loose = KafkaSource(topics=["orders"], from_="2026-10-01T00:00:00Z", to=OCT_8)  # type: ignore[arg-type]
    assert (loose.from_, loose.to) == (datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 8, tzinfo=UTC))
    with pytest.raises(ValidationError, match="a window can't end at earliest"):
        KafkaSource(topics=["orders"], to="earliest")
    with pytest.raises(ValidationError, match="more than one sink given"):
        SinkConfig(iceberg=IcebergTarget(table="a.b"), kafka=KafkaTarget())
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        JobSpec.model_validate(with_({"bogus": 1}))


def test_specs_are_frozen() -> None:
    spec = parse_spec(base())
    with pytest.raises(ValidationError):
        spec.name = "other"


def test_to_yaml_round_trips() -> None:
    for data in (
        base(),
        with_(
            {
                "source.kafka.from": {"orders": {"0": 5, "10": 7, "2": -2}},
                "source.kafka.to": {"orders": {"0": 9, "10": -1, "2": 100}},
                "source.kafka.declared_log_start": {"orders": {"0": 3}},
                "decode": {"format": "json", "schema": {"a": "int64"}},
                "translate.output_schema": {"order_id": "decimal(10,2)", "n": "struct<a:int>"},
                "sink": {"kafka": {"configs": {"retention.ms": 1}}},
                "verify": {"compare": ["a", "b"], "scope": {"from": OCT_1}},
                "description": "multi\nline",
            }
        ),
        with_({"source.kafka.from": OCT_1 + 123, "sink.iceberg.mode": "replace-window"}),
    ):
        spec = parse_spec(data)
        text = spec.to_yaml()
        again = parse_spec(yaml.safe_load(text))
        assert again == spec
        assert again.to_yaml() == text
        assert again.fingerprint() == spec.fingerprint()
    assert "from: '2026-10-01T00:00:00.123Z'" in text


# -- fingerprint ------------------------------------------------------------------------------


def reorder(value: Any) -> Any:
    """The same data with every mapping's keys in reverse order."""
    if isinstance(value, dict):
        return {k: reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(v) for v in value]
    return value


def test_fingerprint_is_stable() -> None:
    fingerprint = parse_spec(base()).fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", fingerprint), fingerprint  # sha-256, hex
    assert parse_spec(reorder(base())).fingerprint() == fingerprint
    spelled_out = with_(
        {
            "source.kafka.from": OCT_1,
            "source.kafka.to": "2026-10-08T02:00:00+02:00",
            "decode": {"format": "json", "null_value": "quarantine"},
            "translate.name": "to_order_total",
            "sink.iceberg.mode": "append",
            "run": {"work_unit_records": 250000, "lease_ttl_s": 60},
            "quarantine": {"table": "analytics.rewind_quarantine"},
            "key": ["order_id"],
            "description": "words do not change the job",
        }
    )
    assert parse_spec(spelled_out).fingerprint() == fingerprint
    assert python_spec().fingerprint() == fingerprint


@pytest.mark.parametrize(
    "changes",
    [
        {"source.kafka.to": OCT_8 + 1},
        {"translate.version": "3"},
        {"key": []},
        {"guards.max_records": 10},
        {"name": "other"},
        {"run.work_unit_records": 1000},
        {"verify": {"samples": 1}},
    ],
)
def test_fingerprint_changes_with_the_job(changes: dict[str, Any]) -> None:
    assert parse_spec(with_(changes)).fingerprint() != parse_spec(base()).fingerprint()


# -- window requests --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "spark"),
    [
        (
            {"from": "2026-10-01T00:00:00Z", "to": "2026-10-08T00:00:00Z"},
            {"startingTimestamp": str(OCT_1), "endingTimestamp": str(OCT_8)},
        ),
        ({}, {}),
        ({"from": "latest", "to": "latest"}, {"startingOffsets": "latest", "endingOffsets": "latest"}),
        ({"from": OCT_1}, {"startingTimestamp": str(OCT_1)}),
        (
            {"from": {"orders": {"0": 1200, "1": 1300}}, "to": {"orders": {"0": 2000, "1": -1}}},
            {
                "startingOffsets": '{"orders": {"0": 1200, "1": 1300}}',
                "endingOffsets": '{"orders": {"0": 2000, "1": -1}}',
            },
        ),
        (
            {"from": '{"orders": {"0": -2}}', "to": "2026-10-08T00:00:00Z"},
            {"startingOffsets": '{"orders": {"0": -2}}', "endingTimestamp": str(OCT_8)},
        ),
    ],
)
def test_window_request_matches_spark_options(window: dict[str, Any], spark: dict[str, str]) -> None:
    spec = parse_spec(with_({"source.kafka": {"topics": ["orders"], **window}}))
    request = spec.window_request()
    assert request == kafka(spec).window_request()
    assert stripped(request) == stripped(parse_spark_options({"subscribe": "orders", **spark}))
    assert (request.start.option, request.end.option) == ("source.kafka.from", "source.kafka.to")


def test_window_request_keeps_topic_order() -> None:
    spec = parse_spec(with_({"source.kafka": {"topics": ["payments", "orders"]}}))
    request = spec.window_request()
    assert request.subscribe == ("payments", "orders")
    assert request.start == BoundSpec(EARLIEST, option="source.kafka.from")
    assert request.end == BoundSpec(LATEST, option="source.kafka.to")


# -- reference --------------------------------------------------------------------------------


def test_reference_lists_every_field() -> None:
    text = spec_reference_markdown()
    models: list[type[BaseModel]] = [JobSpec, Source, KafkaSource, Decode, Translate, SinkConfig]
    models += [IcebergTarget, SqlTarget, KafkaTarget, Guards, RunSettings, Quarantine]
    for model in models:
        for name, info in model.model_fields.items():
            alias = info.validation_alias if isinstance(info.validation_alias, str) else name
            assert f"| `{alias}` |" in text, alias
            assert info.description, f"{model.__name__}.{name} has no description"
    for section in ("## `source.kafka`", "## `sink.iceberg`", "## `guards`", "## `quarantine`"):
        assert section in text
    assert "| `work_unit_records` | integer > 0 | `250000` |" in text
    assert "| `mode` | `append` \\| `replace-window` | `append` |" in text
    assert "| `version` | string | required |" in text
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert parse_spec(yaml.safe_load(example)).name == "repair-order-totals"


# -- properties -------------------------------------------------------------------------------

MS = st.integers(min_value=100_000_000_000, max_value=4_102_444_800_000)  # 1973 .. 2100


def time_forms(ms: int) -> st.SearchStrategy[Any]:
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    zones = st.integers(min_value=-12 * 60, max_value=14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
    iso: Callable[[datetime], str] = lambda d: d.isoformat(timespec="milliseconds")  # noqa: E731
    return st.one_of(
        st.just(ms),
        st.just(str(ms)),
        st.just(iso(moment).replace("+00:00", "Z")),
        zones.map(lambda z: iso(moment.astimezone(z))),
        zones.map(lambda z: moment.astimezone(z)),
    )


@st.composite
def time_windows(draw: st.DrawFn) -> tuple[int, int, Any, Any]:
    start, end = draw(MS), draw(MS)
    return start, end, draw(time_forms(start)), draw(time_forms(end))


@settings(max_examples=200, deadline=None)
@given(time_windows())
def test_time_windows_keep_their_order(window: tuple[int, int, Any, Any]) -> None:
    start, end, given_from, given_to = window
    data = with_({"source.kafka": {"topics": ["orders"], "from": given_from, "to": given_to}})
    if end <= start:
        error = error_of(data)
        assert error.field == "source.kafka.to"
        return
    request = parse_spec(data).window_request()
    assert request.start.default == Timestamp(start)
    assert request.end.default == Timestamp(end)
    assert request.start.default.ms < request.end.default.ms
    spark = parse_spark_options(
        {"subscribe": "orders", "startingTimestamp": str(start), "endingTimestamp": str(end)}
    )
    assert stripped(request) == stripped(spark)


OFFSET = st.integers(min_value=-2, max_value=10**12)


@st.composite
def offset_windows(draw: st.DrawFn) -> dict[int, tuple[int, int]]:
    count = draw(st.integers(min_value=1, max_value=6))
    return {p: (draw(OFFSET), draw(OFFSET.filter(lambda o: o != EARLIEST))) for p in range(count)}


@settings(max_examples=200, deadline=None)
@given(offset_windows())
def test_offset_windows_keep_their_order(window: dict[int, tuple[int, int]]) -> None:
    starts = {"orders": {str(p): s for p, (s, _) in window.items()}}
    ends = {"orders": {str(p): e for p, (_, e) in window.items()}}
    data = with_({"source.kafka": {"topics": ["orders"], "from": starts, "to": json.dumps(ends)}})
    reversed_ = [p for p, (s, e) in sorted(window.items()) if 0 <= e < s]
    if reversed_:
        assert error_of(data).field == f"source.kafka.to.orders.{reversed_[0]}"
        return
    request = parse_spec(data).window_request()
    assert request.start.default is None and request.end.default is None
    assert dict(request.start.overrides) == {("orders", p): s for p, (s, _) in window.items()}
    assert dict(request.end.overrides) == {("orders", p): e for p, (_, e) in window.items()}
    for tp, start in request.start.overrides.items():
        end = request.end.overrides[tp]
        assert isinstance(start, int) and isinstance(end, int)
        assert end in (LATEST,) or start < 0 or start <= end
    spark = parse_spark_options(
        {"subscribe": "orders", "startingOffsets": json.dumps(starts), "endingOffsets": json.dumps(ends)}
    )
    assert stripped(request) == stripped(spark)
