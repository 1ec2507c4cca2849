"""Avro in → Avro out: the Kafka sink's ``encode: avro`` (the "ETL bridge").

What is checked:

* the values are the bytes fastavro's own ``schemaless_writer`` writes, with the 5-byte
  Confluent header, for every supported type (and, by hypothesis, for random rows);
* the plan's gate refuses output that does not fit the schema in one line naming the column,
  the field and the types; values the plan cannot see (a null where the field has none, a
  string that is no enum symbol, bytes of the wrong size) are refused by the commit before it
  produces anything, naming the source record;
* a schema folder writes with its highest ``<id>.avsc``, which must be ``latest.avsc``;
* the registry path, with confluent-kafka's in-process ``mock://`` registry and no Spark
  (the registry is only used on the driver): the subject's latest version is pinned at
  prepare and written, ``register_schema`` registers decode's reader schema under
  ``<topic>-value`` when the run starts and not at plan time, an unknown subject is one line
  and creates nothing — against each test broker;
* end to end with a schema folder, on each test broker: a history written with three schema
  versions is decoded to the latest, translated and written to a backfill topic; a consumer
  that knows only the latest schema (fastavro, schemaless) reads every record exactly, and the
  sink's own read-back gives the output rows; output that does not fit is refused by the plan
  in one line and no topic is created.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from rewind.config import load_settings
from rewind.core.parquet import write_parquet
from rewind.sinks.kafka.avro_fit import AvroSchemaMismatch
from rewind.sinks.kafka.avro_target import AvroTarget
from rewind.sinks.kafka.avro_values import AvroValues
from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.translate.avro_schemas import LocalSchemaSource, WriterSchema, _registry_client
from rewind.translate.lineage import LINEAGE_SCHEMA
from tests import avro_fixtures as af
from tests.kafka_util import create_topic, produce
from tests.test_sink_kafka import SCHEMA, counts_extra, output_rows, read_topic, topic_exists, unit

# -- the spec ------------------------------------------------------------------------------------

AVRO_DECODE = {"format": "avro", "schema_dir": "schemas"}
SPEC_ERRORS = [
    (
        {"schema_dir": "s"},
        "json",
        "sink.kafka.schema_dir: used only by encode: avro (got 's'); remove it or set",
    ),
    ({"register_schema": True}, "json", "sink.kafka.register_schema: used only by encode: avro (got true)"),
    (
        {"encode": "avro", "schema_dir": "s", "registry_url": "http://r:8081"},
        "json",
        "sink.kafka.schema_dir: given with registry_url (got 's'); give a registry_url or a schema_dir",
    ),
    ({"encode": "avro", "registry_url": "r:8081"}, "json", "sink.kafka.registry_url: not an http(s) URL"),
    (
        {"encode": "avro"},
        "json",
        "sink.kafka.encode: needs a schema folder or a registry (got 'avro'); give sink.kafka.schema_dir or "
        "sink.kafka.registry_url (decode: avro lends its own)",
    ),
    (
        {"encode": "avro", "subject": "orders-value"},
        AVRO_DECODE,
        "sink.kafka.subject: not used with a schema folder (got 'orders-value'); the folder's highest "
        "<id>.avsc is the schema",
    ),
    (
        {"encode": "avro", "registry_url": "http://r:8081", "register_schema": True},
        "json",
        "sink.kafka.register_schema: registers decode's reader schema, and decode is not avro (got true)",
    ),
]


@pytest.mark.parametrize(("kafka", "decode", "message"), SPEC_ERRORS)
def test_the_specs_avro_fields_are_checked_in_one_line(
    kafka: dict[str, Any], decode: Any, message: str
) -> None:
    from rewind.errors import SpecError
    from rewind.spec import parse_spec

    data = {
        "name": "bridge",
        "source": {"kafka": {"topics": ["orders"]}},
        "decode": decode,
        "translate": {"function": "tests.avro_fixtures:order_fields", "version": "1"},
        "sink": {"kafka": kafka},
    }
    with pytest.raises(SpecError) as err:
        parse_spec(data, "spec.yaml")
    assert str(err.value).startswith(f"spec.yaml: {message}") and "\n" not in str(err.value)


def test_a_table_source_writes_avro_with_its_own_schema_folder() -> None:
    """A re-produce decodes rows, so nothing lends a schema: sink.kafka names its folder."""
    from rewind.errors import SpecError
    from rewind.spec import parse_spec

    table = {"sqlite": {"url": "sqlite:///x.db", "table": "accounts"}, "key": "id", "where": "TRUE"}
    data = {
        "name": "reproduce",
        "source": {"table": table},
        "decode": "rows",
        "translate": {"function": "tests.reproduce_fixtures:account_state", "version": "1"},
        "sink": {"kafka": {"topic": "accounts", "encode": "avro", "schema_dir": "s"}},
    }
    spec = parse_spec(data, "spec.yaml")
    assert spec.sink.kafka is not None and (spec.sink.kafka.encode, spec.sink.kafka.schema_dir) == (
        "avro",
        "s",
    )
    data["sink"] = {"kafka": {"topic": "accounts", "encode": "avro"}}
    with pytest.raises(SpecError) as err:
        parse_spec(data, "spec.yaml")
    assert str(err.value) == (
        "spec.yaml: sink.kafka.encode: needs a schema folder or a registry (got 'avro'); give "
        "sink.kafka.schema_dir or sink.kafka.registry_url (decode: avro lends its own)"
    )


def test_the_sink_borrows_decodes_schemas_and_subject_defaults_to_the_topic() -> None:
    from rewind.spec import parse_spec

    base = {
        "name": "bridge",
        "source": {"kafka": {"topics": ["orders"]}},
        "translate": {"function": "tests.avro_fixtures:order_fields", "version": "1"},
    }
    spec = parse_spec({**base, "decode": AVRO_DECODE, "sink": {"kafka": {"encode": "avro"}}})
    assert spec.sink.kafka is not None and spec.sink.kafka.schema_dir == "schemas"
    registry = {"format": "avro", "registry_url": "https://u:pw@r:8081", "subject": "orders-value"}
    spec = parse_spec(
        {**base, "decode": registry, "sink": {"kafka": {"encode": "avro", "register_schema": True}}}
    )
    assert spec.sink.kafka is not None and spec.sink.kafka.registry_url == "https://u:pw@r:8081"
    assert spec.public()["sink"]["kafka"]["registry_url"] == "https://u:***@r:8081"
    assert (
        AvroTarget(registry_url="http://r").subject_for("orders.backfill.r-1") == "orders.backfill.r-1-value"
    )
    assert parse_spec(spec.canonical()) == spec


# -- the encoder ---------------------------------------------------------------------------------

WIDE: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "small", "type": "long"},
        {"name": "ratio", "type": "float"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "paid", "type": "boolean"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "note", "type": ["string", "null"], "default": "x"},
        {"name": "raw", "type": "bytes"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "at_us",
            "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}],
            "default": None,
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {
            "name": "addr",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Addr",
                    "fields": [
                        {"name": "city", "type": "string"},
                        {"name": "zip", "type": ["null", "string"], "default": None},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "addr2", "type": ["null", "Addr"], "default": None},
        {"name": "currency", "type": "string", "default": "EUR"},
        {"name": "big", "type": "long", "default": -123456789012},
        {"name": "status2", "type": "Status", "default": "SHIPPED"},
    ],
}
DEFAULTS = {"currency": "EUR", "big": -123456789012, "status2": "SHIPPED"}
ADDR = pa.struct([("city", pa.string()), ("zip", pa.string())])


def wide_table() -> pa.Table:
    utc = UTC
    return pa.table(
        {
            "order_id": pa.array([0, -1, 2**62, -(2**63), 127], pa.int64()),
            "qty": pa.array([1, 2, 3, -64, 64], pa.int32()),
            "small": pa.array([1, 2, 3, 4, 5], pa.int16()),
            "ratio": pa.array([0.5, 1.5, 2.25, 3.0, -1.0], pa.float32()),
            "amount": pa.array([1.5, None, 3.25, None, 1e300], pa.float64()),
            "paid": pa.array([True, False, True, False, True]),
            "status": pa.array(["NEW", "PAID", "SHIPPED", "NEW", "PAID"]),
            "note": pa.array(["a", None, "ü" * 200, "", None]),
            "raw": pa.array([b"", b"\x00\x01", b"x" * 300, b"y", b"z"], pa.binary()),
            "at": pa.array(
                [datetime(2024, 1, 1, 0, 0, 0, 999_000, tzinfo=utc)] * 5, pa.timestamp("us", "UTC")
            ),
            "at_us": pa.array(
                [
                    datetime(2024, 1, 1, 1, 2, 3, 456789, tzinfo=utc),
                    None,
                    None,
                    None,
                    datetime(1969, 12, 31, tzinfo=utc),
                ],
                pa.timestamp("us", "UTC"),
            ),
            "day": pa.array(
                [date(2024, 2, 29), date(1970, 1, 1), date(1969, 1, 1), date(2100, 1, 1), date(2000, 1, 1)]
            ),
            "price": pa.array(
                [Decimal("12.50"), Decimal("-0.01"), Decimal("0"), Decimal("99999999.99"), Decimal("1")],
                pa.decimal128(10, 2),
            ),
            "tags": pa.array([["a"], [], ["b", "c"], ["d"], []], pa.list_(pa.string())),
            "attrs": pa.array(
                [[("k", 1)], [], [("a", 2), ("b", 3)], [], []], pa.map_(pa.string(), pa.int64())
            ),
            "addr": pa.array([{"city": "X", "zip": None}, None, {"city": "Y", "zip": "1"}, None, None], ADDR),
            "addr2": pa.array([None, {"city": "Z"}, None, None, None], pa.struct([("city", pa.string())])),
        }
    )


def fastavro_bytes(schema: Any, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_values_are_fastavros_bytes_for_every_supported_type() -> None:
    table = wide_table()
    values = AvroValues(WriterSchema(7, WIDE, "test"), table.schema, table.column_names)
    assert [c.name for c in values.codecs if c.column is None] == list(DEFAULTS)
    encoded = values.encode(table.to_batches()[0])
    for value, row in zip(encoded, table.to_pylist(), strict=True):
        assert value[:5] == b"\x00\x00\x00\x00\x07"
        record = {**row, "attrs": dict(row["attrs"]), **DEFAULTS}
        assert value[5:] == fastavro_bytes(WIDE, record)
    back = values.decode(encoded)
    assert back[1]["addr2"] == {"city": "Z", "zip": None} and back[1]["status2"] == "SHIPPED"
    assert [r["order_id"] for r in back] == table.column("order_id").to_pylist()


FLAT: dict[str, Any] = {
    "type": "record",
    "name": "Row",
    "fields": [
        {"name": "a", "type": "long"},
        {"name": "b", "type": ["null", "int"], "default": None},
        {"name": "c", "type": "double"},
        {"name": "d", "type": ["null", "string"], "default": None},
        {"name": "e", "type": "boolean"},
        {"name": "f", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}},
        {"name": "g", "type": "bytes"},
        {"name": "h", "type": "float"},
        {"name": "z", "type": ["null", "long"], "default": None},
    ],
}
FLAT_ARROW = pa.schema(
    [
        ("a", pa.int64()),
        ("b", pa.int32()),
        ("c", pa.float64()),
        ("d", pa.string()),
        ("e", pa.bool_()),
        ("f", pa.string()),
        ("g", pa.binary()),
        ("h", pa.float32()),
    ]
)
rows = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.none() | st.integers(-(2**31), 2**31 - 1),
        st.floats(allow_nan=False),
        st.none() | st.text(max_size=300),
        st.booleans(),
        st.sampled_from(["X", "Y", "Z"]),
        st.binary(max_size=200),
        st.floats(width=32, allow_nan=False),
    ),
    min_size=1,
    max_size=60,
)


@hypothesis_settings(max_examples=150, deadline=None)
@given(rows)
def test_values_match_fastavro_on_random_rows(data: list[tuple[Any, ...]]) -> None:
    """Varint lengths (1 to 10 bytes), negative numbers, unions with and without nulls,
    multi-byte UTF-8 and empty strings all meet in one batch."""
    table = pa.Table.from_pylist([dict(zip(FLAT_ARROW.names, row, strict=True)) for row in data], FLAT_ARROW)
    values = AvroValues(WriterSchema(2**31 - 1, FLAT, "test"), FLAT_ARROW, FLAT_ARROW.names)
    encoded = values.encode(table.to_batches()[0]) if table.num_rows else []
    assert [v[:5] for v in encoded] == [b"\x00\x7f\xff\xff\xff"] * len(data)
    expected = [
        fastavro_bytes(FLAT, {**dict(zip(FLAT_ARROW.names, r, strict=True)), "z": None}) for r in data
    ]
    assert [v[5:] for v in encoded] == expected


SMALL: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "int"},
        {"name": "status", "type": "string"},
        {"name": "amount", "type": "double"},
    ],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {},
            "sink.kafka: output column order_id (int64) does not fit Avro field order_id (int) of the writer "
            "schema (test); cast the column in the translate or write with a schema whose field takes it",
        ),
        (
            {"order_id": "long", "drop": "status"},
            "sink.kafka: output column status (string) has no field in the writer schema (test; fields: "
            "order_id, amount); drop the column in the translate or use a schema that has it",
        ),
        (
            {"order_id": "long", "add": {"name": "region", "type": "string"}},
            "sink.kafka: Avro field region (string) of the writer schema (test) has no output column and no "
            "default; add the column to the output or a default to the field",
        ),
        (
            {"order_id": "long", "amount": "float"},
            "sink.kafka: output column amount (double) does not fit Avro field amount (float) of the writer "
            "schema (test); cast the column in the translate or write with a schema whose field takes it",
        ),
        (
            {"order_id": {"type": "long", "logicalType": "timestamp-millis"}},
            "sink.kafka: output column order_id (int64) does not fit Avro field order_id (long "
            "(timestamp-millis)) of the writer schema (test)",
        ),
    ],
)
def test_the_gate_refuses_output_that_does_not_fit_in_one_line(change: dict[str, Any], message: str) -> None:
    fields = [dict(f) for f in SMALL["fields"] if f["name"] != change.get("drop")]
    for f in fields:
        f["type"] = change.get(f["name"], f["type"])
    if "add" in change:
        fields.append(change["add"])
    with pytest.raises(AvroSchemaMismatch) as err:
        AvroValues(
            WriterSchema(1, {**SMALL, "fields": fields}, "test"), SCHEMA, ["order_id", "status", "amount"]
        )
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_promotions_fit_and_are_written_as_the_field_type() -> None:
    """int32 → long/double and float → double are Avro promotions; string → bytes too."""
    schema = {
        "type": "record",
        "name": "P",
        "fields": [
            {"name": "a", "type": "long"},
            {"name": "b", "type": "double"},
            {"name": "c", "type": "double"},
            {"name": "d", "type": "bytes"},
        ],
    }
    table = pa.table(
        {
            "a": pa.array([-5, 7], pa.int32()),
            "b": pa.array([3, -4], pa.int32()),
            "c": pa.array([0.5, 2.5], pa.float32()),
            "d": ["é", ""],
        }
    )
    encoded = AvroValues(WriterSchema(1, schema, "t"), table.schema, table.column_names).encode(
        table.to_batches()[0]
    )
    assert [v[5:] for v in encoded] == [
        fastavro_bytes(schema, {"a": -5, "b": 3.0, "c": 0.5, "d": "é".encode()}),
        fastavro_bytes(schema, {"a": 7, "b": -4.0, "c": 2.5, "d": b""}),
    ]


def lineage_batch(user: dict[str, pa.Array], offsets: list[int]) -> pa.RecordBatch:
    base = output_rows("orders", 2, offsets[0], offsets[-1] + 1, "r-1")
    columns = {**user, **{name: base.column(name) for name in LINEAGE_SCHEMA.names}}
    return pa.table(columns).to_batches()[0]


def test_values_the_plan_cannot_see_are_refused_naming_the_source_record() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "state", "type": {"type": "enum", "name": "S", "symbols": ["ON", "OFF"]}},
            {"name": "tag", "type": {"type": "fixed", "name": "F", "size": 2}},
        ],
    }
    batch = lineage_batch(
        {"id": pa.array([1, None, 3]), "state": ["ON", "OFF", "ON"], "tag": pa.array([b"ab", b"cd", b"ef"])},
        [40, 41, 42],
    )
    values = AvroValues(WriterSchema(5, schema, "5.avsc in s"), batch.schema, ["id", "state", "tag"])
    with pytest.raises(AvroSchemaMismatch) as err:
        values.check(batch)
    assert str(err.value) == (
        "sink.kafka: output column id is null in the row of orders/2/41, and Avro field id (long) of the "
        'writer schema (5.avsc in s) has no null; make the field nullable (["null", ...] with default null) '
        "or fill the column in the translate"
    )
    with pytest.raises(AvroSchemaMismatch, match="column id is null in the row of orders/2/41"):
        values.encode(batch)  # encode refuses it too, with the same line
    batch = lineage_batch(
        {"id": [1, 2, 3], "state": ["ON", "DIM", "ON"], "tag": [b"ab", b"cd", b"ef"]}, [7, 8, 9]
    )
    with pytest.raises(AvroSchemaMismatch) as err:
        values.check(batch)
    assert str(err.value) == (
        "sink.kafka: value 'DIM' of output column state (row of orders/2/8) is not a symbol of Avro enum "
        "state (ON, OFF); map it in the translate or add the symbol"
    )
    batch = lineage_batch({"id": [1, 2], "state": ["ON", "OFF"], "tag": [b"ab", b"abc"]}, [3, 4])
    with pytest.raises(
        AvroSchemaMismatch, match=r"column tag holds 3 bytes in the row of orders/2/4, .* fixed of 2"
    ):
        values.check(batch)
    good = lineage_batch({"id": [1, 2], "state": ["ON", "OFF"], "tag": [b"ab", b"cd"]}, [3, 4])
    values.check(good)
    assert values.decode(values.encode(good)) == [
        {"id": 1, "state": "ON", "tag": b"ab"},
        {"id": 2, "state": "OFF", "tag": b"cd"},
    ]


def test_a_schema_folder_writes_with_its_highest_id(tmp_path: Path) -> None:
    folder = af.write_schemas(tmp_path / "schemas", {1: af.V1, 2: af.V2, 10: af.V3})
    writer = LocalSchemaSource(folder).latest_writer()
    assert (writer.schema_id, writer.schema, writer.where) == (10, af.V3, f"10.avsc in {folder}")
    (folder / "latest.avsc").write_text(json.dumps(af.V2))
    target = AvroTarget(schema_dir=str(folder))
    with pytest.raises(KafkaSinkError) as err:
        target.resolve("orders.backfill", register=False)
    assert str(err.value) == (
        f"sink.kafka: {folder / 'latest.avsc'} is not the same schema as 10.avsc, the highest id; readers "
        "evolve to latest.avsc and the sink writes with 10.avsc: make them one schema"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KafkaSinkError, match=r"has no <id>.avsc file; name each version by its schema id"):
        AvroTarget(schema_dir=str(empty)).resolve(None, register=False)


# -- the registry path (mock://, no Spark), on each broker --------------------------------------------


def mock_registry() -> tuple[str, Any]:
    """A fresh in-process registry: the sink's client for the URL is this very object."""
    url = f"mock://{uuid.uuid4().hex[:8]}"
    return url, _registry_client(url, {})


def register(client: Any, subject: str, schema: dict[str, Any]) -> int:
    from confluent_kafka.schema_registry import Schema

    return int(client.register_schema(subject, Schema(json.dumps(schema), "AVRO")))


ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "order_id", "type": "long"}, {"name": "amount", "type": "double"}],
}
ORDER_V2 = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "status", "type": "string", "default": ""},
        {"name": "amount", "type": "double"},
        {"name": "channel", "type": "string", "default": "web"},
    ],
}


def commit_rows(sink: KafkaTopicSink, staging: Any, rows: pa.Table, name: str) -> dict[str, Any]:
    path = write_parquet(sink.data_folder(staging), rows, name)
    partition = rows.column("_rewind_source_partition")[0].as_py()
    offsets = rows.column("_rewind_source_offset").to_pylist()
    uid = unit(sink.source_topics[0], partition, offsets[0], offsets[-1] + 1)
    return sink.commit(staging, staging.run_id, [uid], [path], counts_extra([uid]))


def test_the_registry_subjects_latest_version_is_pinned_and_written(
    broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    url, client = mock_registry()
    register(client, "orders-value", ORDER_V1)
    v2 = register(client, "orders-value", ORDER_V2)
    conf = dict(broker_conf)
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 1)
    target = AvroTarget(registry_url=url, subject="orders-value")
    sink = KafkaTopicSink(conf, source_topics=[src], key=["order_id"], spool_dir=tmp_path, avro=target)
    detail = sink.check(SCHEMA)
    assert detail == (
        f"a new topic {src}.backfill.<run id> with 1 partitions is created: records keep their source "
        "partition; "
        f"values Avro with subject orders-value version 2 (schema id {v2}) in schema registry {url}, "
        "defaults for channel"
    )
    staging = sink.prepare("r-1", SCHEMA)
    assert staging.value_format is not None and staging.value_format["schema_id"] == v2
    register(client, "orders-value", {**ORDER_V2, "doc": "v3, after the run started"})
    out = commit_rows(sink, staging, output_rows(src, 0, 0, 300, "r-1"), "u0")
    assert out["produced"] == 300
    records, _ = read_topic(conf, staging.topic)
    assert {r.value[:5] for r in records if r.value} == {b"\x00" + v2.to_bytes(4, "big")}  # pinned
    # a consumer with only the schema: every record, exactly
    parsed = fastavro.parse_schema(ORDER_V2)
    got = [fastavro.schemaless_reader(io.BytesIO(r.value[5:]), parsed, None) for r in records if r.value]
    expected = output_rows(src, 0, 0, 300, "r-1").select(["order_id", "status", "amount"]).to_pylist()
    assert got == [{**e, "channel": "web"} for e in expected]
    assert [r.key for r in records] == [str(e["order_id"]).encode() for e in expected]
    assert records[0].headers["rewind.source"] == f"{src}/0/0".encode()


def test_register_schema_registers_decodes_reader_schema_when_the_run_starts(
    broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    url, client = mock_registry()
    folder = af.write_schemas(tmp_path / "schemas")
    conf = dict(broker_conf)
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 1)
    target = AvroTarget(registry_url=url, register_schema=True, registered_from=LocalSchemaSource(folder))
    schema = output_schema()
    sink = KafkaTopicSink(conf, source_topics=[src], key=["order_id"], spool_dir=tmp_path, avro=target)
    assert sink.check(schema).endswith(
        "values Avro with decode's reader schema, registered under <topic>-value by the run"
    )
    assert client.get_subjects() == []  # the plan changes nothing
    staging = sink.prepare("r-2", schema)
    subject = f"{src}.backfill.r-2-value"
    assert client.get_subjects() == [subject]
    registered = client.get_latest_version(subject)
    assert json.loads(registered.schema.schema_str) == af.V3
    assert staging.value_format is not None and staging.value_format["schema_id"] == registered.schema_id
    assert (
        staging.value_format["where"]
        == f"subject {subject} version 1 (schema id {registered.schema_id}) in schema registry {url}"
    )


def test_registry_refusals_are_one_line_and_create_nothing(
    broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    url, client = mock_registry()
    register(client, "orders-value", SMALL)  # order_id is an int: the output's int64 does not fit
    conf = dict(broker_conf)
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 1)
    topic = f"{src}-avro"
    cases = [
        (
            AvroTarget(registry_url=url, subject="payments-value"),
            f"sink.kafka: subject payments-value has no version in schema registry {url}; set "
            "sink.kafka.subject to the subject consumers read or register_schema: true",
        ),
        (
            AvroTarget(registry_url=url),
            f"sink.kafka: subject {topic}-value has no version in schema registry {url}; set",
        ),
        (
            AvroTarget(registry_url=url, subject="orders-value"),
            "sink.kafka: output column order_id (int64) does not fit Avro field order_id (int) of the writer "
            f"schema (subject orders-value version 1 (schema id 1) in schema registry {url})",
        ),
    ]
    for target, message in cases:
        sink = KafkaTopicSink(
            conf, source_topics=[src], topic=topic, key=["order_id"], spool_dir=tmp_path, avro=target
        )
        for step in (lambda s=sink: s.check(SCHEMA), lambda s=sink: s.prepare("r-3", SCHEMA)):
            with pytest.raises(KafkaSinkError) as err:
                step()
            assert str(err.value).startswith(message) and "\n" not in str(err.value)
        assert not topic_exists(conf, topic)
    default = KafkaTopicSink(
        conf, source_topics=[src], key=["order_id"], spool_dir=tmp_path, avro=AvroTarget(registry_url=url)
    )
    with pytest.raises(
        KafkaSinkError, match=r"the default subject <topic>-value of a backfill topic named after its run"
    ):
        default.check(SCHEMA)


def test_a_null_where_the_schema_has_none_stops_the_commit_before_any_record(
    broker_conf: dict[str, Any], tmp_path: Path
) -> None:
    url, client = mock_registry()
    register(client, "orders-value", ORDER_V2)
    conf = dict(broker_conf)
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 1)
    target = AvroTarget(registry_url=url, subject="orders-value")
    sink = KafkaTopicSink(conf, source_topics=[src], key=["order_id"], spool_dir=tmp_path, avro=target)
    staging = sink.prepare("r-4", SCHEMA)
    good = output_rows(src, 0, 0, 500, "r-4")
    bad = output_rows(src, 0, 500, 900, "r-4")
    status = bad.column("status").to_pylist()
    status[333] = None
    bad = bad.set_column(bad.schema.get_field_index("status"), "status", pa.array(status, pa.string()))
    folder = sink.data_folder(staging)
    files = [write_parquet(folder, good, "good"), write_parquet(folder, bad, "bad")]
    units = [unit(src, 0, 0, 500), unit(src, 0, 500, 900)]
    with pytest.raises(KafkaSinkError) as err:
        sink.commit(staging, "r-4", units, files, counts_extra(units))
    assert str(err.value) == (
        f"sink.kafka: output column status is null in the row of {src}/0/833, and Avro field status (string) "
        "of the writer schema (subject orders-value version 1 (schema id 1) in schema registry "
        f"{url}) has no "
        'null; make the field nullable (["null", ...] with default null) or fill the column in the translate'
    )
    records, highs = read_topic(conf, staging.topic)
    assert records == [] and highs == {0: 0}
    assert sink.committed_units(staging, "r-4") == set()


# -- end to end with a schema folder (Spark), on each broker ----------------------------------------


def output_schema() -> pa.Schema:
    """The output of ``order_fields`` as the plan learns it (every column nullable)."""
    user = pa.schema(
        [
            ("order_id", pa.int64()),
            ("amount", pa.float64()),
            ("currency", pa.string()),
            ("note", pa.string()),
            ("status", pa.string()),
            ("placed_at", pa.timestamp("us", "UTC")),
        ]
    )
    return pa.schema(list(user) + list(LINEAGE_SCHEMA))


def backfill_topics(conf: dict[str, Any], src: str) -> list[str]:
    topics = AdminClient(dict(conf)).list_topics(timeout=10).topics
    return sorted(t for t in topics if t.startswith(f"{src}.backfill."))


ORDERS = 240


@pytest.fixture(scope="module")
def history(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An order topic of 2 partitions written with schema versions 1, 2 and 3 in turn."""
    tmp = tmp_path_factory.mktemp("avro-history")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    conf = settings.kafka_config()
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(conf, src, 2)
    produce(
        conf, src, [(i % 2, str(1000 + i).encode(), af.wire(i), 1_790_000_000_000 + i) for i in range(ORDERS)]
    )
    return {
        "settings": settings,
        "conf": conf,
        "src": src,
        "schemas": af.write_schemas(tmp / "schemas"),
        "tmp": tmp,
    }


def spec_of(history: dict[str, Any], **sink: Any) -> Any:
    from rewind.spec import parse_spec

    return parse_spec(
        {
            "name": "orders-avro-bridge",
            "source": {"kafka": {"topics": [history["src"]]}},
            "decode": {"format": "avro", "schema_dir": str(history["schemas"])},
            "translate": {"function": "tests.avro_fixtures:order_fields", "version": "1"},
            "key": ["order_id"],
            "sink": {"kafka": {"encode": "avro", **sink}},
            "run": {"work_unit_records": 60},
        }
    )


def test_history_of_three_schema_versions_is_evolved_and_re_encoded(
    history: dict[str, Any], spark: Any
) -> None:
    from rewind.job.components import make_sink
    from rewind.job.service import run_job

    settings, conf = history["settings"], history["conf"]
    spec = spec_of(history, transactional=True)
    assert spec.sink.kafka.schema_dir == str(history["schemas"])  # lent by decode
    outcome = run_job(settings, spec)
    assert outcome.state == "succeeded" and outcome.counts.rows_out == ORDERS
    staging = make_sink(settings, spec).staging_from_dict(outcome.staging)
    assert staging.value_format is not None and staging.value_format["schema_id"] == 3

    records, _ = read_topic(conf, staging.topic)
    assert len(records) == ORDERS
    latest = fastavro.parse_schema(json.loads((history["schemas"] / "latest.avsc").read_text()))
    by_id: dict[int, dict[str, Any]] = {}
    for r in records:
        assert r.value is not None and r.value[:5] == b"\x00\x00\x00\x00\x03"
        body = io.BytesIO(r.value[5:])
        record = fastavro.schemaless_reader(body, latest, None)
        assert body.tell() == len(r.value) - 5
        by_id[record["order_id"]] = record
        assert r.key == str(record["order_id"]).encode()
        assert r.partition == (record["order_id"] - 1000) % 2  # same partition count: kept
    assert by_id == {1000 + i: af.evolved(i) for i in range(ORDERS)}

    rows = make_sink(settings, spec).read(spark, staging).orderBy("order_id").collect()
    assert [r["order_id"] for r in rows] == [1000 + i for i in range(ORDERS)]
    for i, row in enumerate(rows):
        data = row.asDict()
        expected = af.evolved(i)
        data["placed_at"] = data["placed_at"].replace(tzinfo=UTC)  # Spark's naive session-zone (UTC) time
        assert {k: data[k] for k in af.FIELDS} == expected
        assert data["_rewind_source_offset"] == i // 2 and data["_rewind_run_id"] == outcome.run_id


@pytest.mark.parametrize(
    ("sink_schema", "translate", "message"),
    [
        (
            {2: af.V2, 3: {**af.V3, "fields": [{"name": "order_id", "type": "int"}, *af.V3["fields"][1:]]}},
            "order_fields",
            "sink.kafka: output column order_id (int64) does not fit Avro field order_id (int) of the writer "
            "schema (3.avsc in {dir})",
        ),
        (
            {3: {**af.V3, "fields": [*af.V3["fields"], {"name": "region", "type": "string"}]}},
            "order_fields",
            "sink.kafka: Avro field region (string) of the writer schema (3.avsc in {dir}) has no output "
            "column and no default",
        ),
        (
            None,
            "order_id_as_text",
            "sink.kafka: output column order_id (string) does not fit Avro field order_id (long) of the "
            "writer schema (3.avsc in {dir})",
        ),
    ],
)
def test_the_plan_refuses_output_that_does_not_fit_and_creates_nothing(
    history: dict[str, Any], sink_schema: dict[int, Any] | None, translate: str, message: str, tmp_path: Path
) -> None:
    from rewind.job.plan import PlanRefused
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    folder = af.write_schemas(tmp_path / "sink-schemas", sink_schema) if sink_schema else history["schemas"]
    data = spec_of(history, schema_dir=str(folder)).canonical()
    data["translate"]["function"] = f"tests.avro_fixtures:{translate}"
    before = backfill_topics(history["conf"], history["src"])
    with pytest.raises(PlanRefused) as err:
        run_job(history["settings"], parse_spec(data))
    line = str(err.value)
    assert "refused by gate sink: " + message.format(dir=folder) in line and "\n" not in line
    assert backfill_topics(history["conf"], history["src"]) == before
