"""The record-processing core (rewind.translate): decode, translate, lineage, quarantine, counts.

Pure Python: Kafka-shaped Arrow batches are built here; no Spark, no broker. The schema
registry tests talk to a tiny HTTP server that answers the two Confluent REST calls the
client makes (no registry is installable offline), and to a closed port.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import fastavro
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.core.arrow import kafka_record_schema
from rewind.core.columns import INPUT_COLUMNS, LINEAGE_COLUMNS, ROW, ROW_INDEX
from rewind.core.counts import ConservationError, RecordCounts
from rewind.errors import RewindError
from rewind.translate import (
    LINEAGE_SCHEMA,
    QUARANTINE_SCHEMA,
    AvroDecoder,
    Decoded,
    Decoder,
    DecoderConfigError,
    Failure,
    JsonDecoder,
    LocalSchemaSource,
    OutputSchemaUnknown,
    ProcessContext,
    RawDecoder,
    RegistrySchemaSource,
    SchemaRegistryUnavailable,
    SchemaSourceError,
    TranslateLoadError,
    TranslateOutputError,
    add_lineage,
    apply_translate,
    event_id,
    infer_output_schema,
    load_callable,
    process_batch,
)
from rewind.translate.lineage import ordinals

TS0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
EXTRACTED = datetime(2024, 6, 1, 8, 30, tzinfo=UTC)


def fixture(name: str) -> Any:
    return load_callable(f"tests.translate_fixtures:{name}")


def kafka_batch(
    values: Sequence[bytes | None],
    keys: list[bytes | None] | None = None,
    topic: str = "orders",
    partition: int = 3,
    start: int = 100,
) -> pa.RecordBatch:
    """A batch shaped like the rewind-kafka reader's (Spark's Kafka schema)."""
    n = len(values)
    return pa.RecordBatch.from_pydict(
        {
            "key": keys if keys is not None else [f"k{i}".encode() for i in range(n)],
            "value": list(values),
            "topic": [topic] * n,
            "partition": [partition] * n,
            "offset": list(range(start, start + n)),
            "timestamp": [TS0.replace(second=i % 60) for i in range(n)],
            "timestampType": [0] * n,
        },
        schema=kafka_record_schema(False),
    )


def js(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def order(i: int, amount: float = 10.0, qty: int = 2, **extra: Any) -> bytes:
    return js({"order_id": i, "amount": amount, "qty": qty, **extra})


def ctx(version: str = "v1", unit: str = "orders/3/100-200") -> ProcessContext:
    return ProcessContext(
        run_id="run-1", unit_id=unit, transform="orders", version=version, extracted_at=EXTRACTED
    )


def reasons(decoded: Decoded) -> dict[int, str]:
    return {f.row: f.reason for f in decoded.failures}


# -- JSON -------------------------------------------------------------------------------------


def test_json_fields_become_columns_after_the_input_columns_are_added() -> None:
    batch = kafka_batch([js({"order_id": 1, "customer": {"id": "c1"}, "tags": ["a"]}), js({"order_id": 2})])
    decoded = JsonDecoder().decode(batch)
    ev = decoded.events
    assert decoded.failures == [] and decoded.skipped == []
    assert list(ev.columns) == ["order_id", "customer", "tags", *INPUT_COLUMNS]
    assert ev.index.name == ROW_INDEX and ev.index.tolist() == [0, 1]
    assert ev[ROW].tolist() == [0, 1] and ev[ROW].dtype == np.int64
    assert str(ev["order_id"].dtype) == "Int64"
    assert ev["customer"].iloc[0] == {"id": "c1"} and pd.isna(ev["customer"].iloc[1])  # nested stays a dict
    assert ev["tags"].iloc[0] == ["a"]
    assert ev["_src_topic"].tolist() == ["orders", "orders"]
    assert ev["_src_partition"].tolist() == [3, 3]
    assert ev["_src_offset"].tolist() == [100, 101]
    assert ev["_src_key"].tolist() == [b"k0", b"k1"]
    assert str(ev["_src_timestamp"].dtype) == "datetime64[us, UTC]"


def test_json_malformed_non_object_bad_utf8_are_quarantined_with_reasons() -> None:
    batch = kafka_batch(
        [order(1), b'{"a": 1 "b": 2}', js([1, 2]), b"42", b'"text"', b"\xff\xfe{}", b"", b"null", order(2)]
    )
    decoded = JsonDecoder().decode(batch)
    assert reasons(decoded) == {
        1: "invalid JSON: Expecting ',' delimiter at char 8",
        2: "JSON value is a list, expected an object",
        3: "JSON value is a number, expected an object",
        4: "JSON value is a string, expected an object",
        5: "invalid UTF-8: invalid start byte at byte 0",
        6: "invalid JSON: Expecting value at char 0",
        7: "JSON value is null, expected an object",
    }
    assert {f.stage for f in decoded.failures} == {"decode"}
    assert decoded.events[ROW].tolist() == [0, 8]
    assert decoded.events.index.tolist() == [0, 8]


def test_json_tombstones_are_quarantined_or_skipped() -> None:
    batch = kafka_batch([order(1), None, order(2)])
    quarantined = JsonDecoder(null_value="quarantine").decode(batch)
    assert reasons(quarantined) == {1: "null value (tombstone)"} and quarantined.skipped == []
    skipped = JsonDecoder(null_value="skip").decode(batch)
    assert skipped.failures == [] and skipped.skipped == [1]
    assert skipped.events["order_id"].tolist() == [1, 2]
    with pytest.raises(DecoderConfigError, match="null_value 'keep'"):
        JsonDecoder(null_value="keep")  # type: ignore[arg-type]


def test_json_keys_differing_between_records_make_the_union_of_columns() -> None:
    decoded = JsonDecoder().decode(kafka_batch([js({"a": 1}), js({"b": "x", "a": 2.5}), js({"c": True})]))
    ev = decoded.events
    assert [c for c in ev.columns if c not in INPUT_COLUMNS] == ["a", "b", "c"]
    assert ev["a"].dtype == np.float64 and np.isnan(ev["a"].iloc[2])
    assert str(ev["c"].dtype) == "boolean"


def test_json_reserved_field_names_are_quarantined() -> None:
    decoded = JsonDecoder().decode(kafka_batch([js({"a": 1}), js({"a": 2, "_rewind_row": 9})]))
    assert "reserved name" in reasons(decoded)[1]
    assert decoded.events["a"].tolist() == [1]


def test_json_schema_casts_fields_and_names_the_field_that_does_not_cast() -> None:
    schema = {"order_id": "long", "amount": "double", "paid": "boolean", "at": "timestamp", "note": "string"}
    batch = kafka_batch(
        [
            js({"order_id": "7", "amount": 3, "paid": "true", "at": "2024-01-02T03:04:05Z", "extra": 1}),
            js({"order_id": "seven", "amount": 1.0}),
            js({"order_id": 8, "amount": "lots"}),
            js({"order_id": 9}),
            js({"order_id": 2**64}),
        ]
    )
    decoded = JsonDecoder(schema=schema).decode(batch)
    assert reasons(decoded) == {
        1: "field 'order_id': cannot cast 'seven' to long",
        2: "field 'amount': cannot cast 'lots' to double",
        4: "field 'order_id': cannot cast 18446744073709551616 to long",
    }
    ev = decoded.events
    assert [c for c in ev.columns if c not in INPUT_COLUMNS] == list(schema)  # "extra" is not in the schema
    assert ev["order_id"].tolist() == [7, 9] and str(ev["order_id"].dtype) == "Int64"
    assert ev["amount"].iloc[0] == 3.0 and np.isnan(ev["amount"].iloc[1])
    assert ev["paid"].iloc[0] is np.True_ or ev["paid"].iloc[0] == True  # noqa: E712
    assert ev["at"].iloc[0] == pd.Timestamp("2024-01-02T03:04:05Z")
    assert pd.isna(ev["note"].iloc[0])


def test_json_schema_with_an_unknown_type_is_a_config_error() -> None:
    with pytest.raises(DecoderConfigError, match=r"decode.schema.amount: unknown type 'money'"):
        JsonDecoder(schema={"amount": "money"})
    with pytest.raises(DecoderConfigError, match="reserved"):
        JsonDecoder(schema={"_src_topic": "string"})


# -- raw --------------------------------------------------------------------------------------


def test_raw_decoder_keeps_bytes_and_tombstones() -> None:
    batch = kafka_batch([b"\x00\x01", None], keys=[b"a", None])
    ev = RawDecoder().decode(batch).events
    assert ev["value"].tolist() == [b"\x00\x01", None]
    assert ev["key"].tolist() == [b"a", None]
    assert reasons(RawDecoder(null_value="quarantine").decode(batch)) == {1: "null value (tombstone)"}
    assert RawDecoder(null_value="skip").decode(batch).skipped == [1]


# -- Avro -------------------------------------------------------------------------------------

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "order_id", "type": "long"}, {"name": "amount", "type": "double"}],
}
V2 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string", "default": "EUR"},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}


def confluent(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


@pytest.fixture
def schema_dir(tmp_path: Path) -> Path:
    (tmp_path / "1.avsc").write_text(json.dumps(V1))
    (tmp_path / "2.avsc").write_text(json.dumps(V2))
    (tmp_path / "latest.avsc").write_text(json.dumps(V2))
    return tmp_path


def test_avro_records_of_an_old_version_are_evolved_to_the_latest(schema_dir: Path) -> None:
    batch = kafka_batch(
        [
            confluent(1, V1, {"order_id": 1, "amount": 2.5}),
            confluent(2, V2, {"order_id": 2, "amount": 3.5, "currency": "USD", "coupon": "X"}),
        ]
    )
    decoded = AvroDecoder(LocalSchemaSource(schema_dir)).decode(batch)
    assert decoded.failures == []
    ev = decoded.events
    assert [c for c in ev.columns if c not in INPUT_COLUMNS] == ["order_id", "amount", "currency", "coupon"]
    assert ev["order_id"].tolist() == [1, 2] and str(ev["order_id"].dtype) == "Int64"
    assert ev["currency"].tolist() == ["EUR", "USD"]  # v1 gets the default
    assert ev["coupon"].tolist() == [None, "X"]


def test_avro_bad_records_are_quarantined_with_reasons(schema_dir: Path) -> None:
    good = confluent(1, V1, {"order_id": 1, "amount": 2.5})
    batch = kafka_batch(
        [
            good,
            confluent(42, V1, {"order_id": 1, "amount": 2.5}),
            js({"order_id": 1}),
            good[:8],
            good + b"\x00\x00",
            b"\x00\x00\x00",
            None,
        ]
    )
    decoded = AvroDecoder(LocalSchemaSource(schema_dir)).decode(batch)
    got = reasons(decoded)
    assert got[1] == "unknown schema id 42"
    assert got[2] == "no magic byte"
    assert got[3].startswith("Avro decode failed: ")
    assert (
        got[4] == "Avro decode failed: 2 bytes left after the record (schema id 1 does not match the payload)"
    )
    assert got[5].startswith("Avro decode failed: shorter than the 5-byte header")
    assert got[6] == "null value (tombstone)"
    assert decoded.events[ROW].tolist() == [0]


def test_avro_explicit_reader_schema_and_missing_schemas(tmp_path: Path, schema_dir: Path) -> None:
    reader = tmp_path / "reader.avsc"
    reader.write_text(json.dumps(V1))
    no_latest = tmp_path / "no-latest"
    no_latest.mkdir()
    (no_latest / "2.avsc").write_text(json.dumps(V2))
    batch = kafka_batch([confluent(2, V2, {"order_id": 2, "amount": 1.0, "currency": "USD", "coupon": None})])

    ev = AvroDecoder(LocalSchemaSource(no_latest, reader)).decode(batch).events  # v2 read as v1
    assert [c for c in ev.columns if c not in INPUT_COLUMNS] == ["order_id", "amount"]

    with pytest.raises(SchemaSourceError, match=r"put latest\.avsc in"):
        AvroDecoder(LocalSchemaSource(no_latest)).decode(batch)
    with pytest.raises(SchemaSourceError, match="does not exist"):
        AvroDecoder(LocalSchemaSource(tmp_path / "nowhere")).decode(batch)
    (schema_dir / "1.avsc").write_text("{not json")
    with pytest.raises(SchemaSourceError, match=r"1.avsc: cannot read it"):
        AvroDecoder(LocalSchemaSource(schema_dir)).decode(
            kafka_batch([confluent(1, V1, {"order_id": 1, "amount": 1})])
        )


def test_avro_schema_errors_name_fields_the_spec_has(tmp_path: Path) -> None:
    """Every spec field an Avro schema error points to exists in ``decode:`` (it said translate.avro.*)."""
    import re

    from rewind.spec.transform import Decode

    batch = kafka_batch([confluent(2, V2, {"order_id": 2, "amount": 1.0, "currency": "USD", "coupon": None})])
    (tmp_path / "empty").mkdir()
    messages = []
    for source in (
        LocalSchemaSource(tmp_path / "nowhere"),
        LocalSchemaSource(tmp_path / "empty"),
        LocalSchemaSource(tmp_path / "empty", tmp_path / "missing.avsc"),
    ):
        with pytest.raises(SchemaSourceError) as caught:
            AvroDecoder(source).decode(batch)
        messages.append(str(caught.value))
    named = [m for text in messages for m in re.findall(r"\b(\w+)\.(\w+)\b(?!\.avsc)", text)
             if m[0] in {"decode", "translate"}]
    assert len(named) == 3, messages
    for section, field in named:
        assert section == "decode" and field in Decode.model_fields, (section, field, messages)


def test_avro_empty_events_has_the_reader_fields_typed(schema_dir: Path) -> None:
    empty = AvroDecoder(LocalSchemaSource(schema_dir)).empty_events()
    assert list(empty.columns) == ["order_id", "amount", "currency", "coupon", *INPUT_COLUMNS]
    assert str(empty["order_id"].dtype) == "Int64" and empty["amount"].dtype == np.float64


class _Registry(BaseHTTPRequestHandler):
    """Answers GET /schemas/ids/<id> and GET /subjects/<s>/versions/latest like a Confluent registry."""

    schemas: ClassVar[dict[int, dict[str, Any]]] = {1: V1, 2: V2}

    def do_GET(self) -> None:
        path = self.path.split("?")[0].strip("/").split("/")
        body: dict[str, Any]
        if path[:2] == ["schemas", "ids"] and int(path[2]) in self.schemas:
            body, status = {"schema": json.dumps(self.schemas[int(path[2])])}, 200
        elif path[0] == "subjects" and path[1] == "orders-value" and path[3] == "latest":
            body, status = {"subject": "orders-value", "id": 2, "version": 2, "schema": json.dumps(V2)}, 200
        else:
            body, status = {"error_code": 40403, "message": "Schema not found"}, 404
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def registry_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_avro_from_a_registry_evolves_records_and_quarantines_unknown_ids(registry_url: str) -> None:
    source = RegistrySchemaSource(registry_url, subject="orders-value", config={"max.retries": 0})
    batch = kafka_batch(
        [confluent(1, V1, {"order_id": 1, "amount": 2.5}), confluent(99, V1, {"order_id": 2, "amount": 1.0})]
    )
    decoded = AvroDecoder(source).decode(batch)
    assert reasons(decoded) == {1: "unknown schema id 99"}
    assert decoded.events["currency"].tolist() == ["EUR"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_registry_fails_the_task_instead_of_quarantining_everything(schema_dir: Path) -> None:
    """An outage is operational: quarantining every record would turn a retry into mass loss."""
    url = f"http://127.0.0.1:{free_port()}"
    source = RegistrySchemaSource(url, subject="orders-value", config={"max.retries": 0})
    decoder = AvroDecoder(source, reader_schema=V2)
    batch = kafka_batch([confluent(1, V1, {"order_id": 1, "amount": 2.5})] * 3)
    with pytest.raises(SchemaRegistryUnavailable) as err:
        process_batch(batch, decoder, None, [], ctx())
    message = str(err.value)
    assert message.startswith(f"schema registry at {url}: cannot fetch schema id 1 (ConnectError")
    assert "\n" not in message and isinstance(err.value, RewindError)
    with pytest.raises(
        SchemaRegistryUnavailable, match="cannot fetch the latest version of subject orders-value"
    ):
        AvroDecoder(source).decode(batch)


# -- loading and applying translate functions -------------------------------------------------


def test_load_callable_finds_functions_and_explains_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import translate_fixtures

    assert load_callable("tests.translate_fixtures:to_total") is translate_fixtures.to_total
    with pytest.raises(TranslateLoadError) as err:
        load_callable("my_pkg.orders:to_total")
    assert str(err.value) == (
        "translate.function my_pkg.orders:to_total: module my_pkg.orders not found "
        "(No module named 'my_pkg'); check the name and that it is installed where Spark runs"
    )
    with pytest.raises(TranslateLoadError, match=r"module tests\.translate_fixtures has no attribute nope"):
        load_callable("tests.translate_fixtures:nope")
    with pytest.raises(TranslateLoadError, match=r"NOT_CALLABLE is not callable \(it is a int\)"):
        load_callable("tests.translate_fixtures:NOT_CALLABLE")
    with pytest.raises(TranslateLoadError, match=r"expected 'module\.path:callable'"):
        load_callable("tests.translate_fixtures.to_total")
    (tmp_path / "needs_dep.py").write_text("import not_installed_dep\n\ndef f(df):\n    return df\n")
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        TranslateLoadError, match=r"importing module needs_dep failed \(No module named 'not_inst"
    ):
        load_callable("needs_dep:f")
    with pytest.raises(
        TranslateLoadError, match="importing module broken_mod raised RuntimeError: boom at import"
    ):
        load_callable("broken_mod:f")


def events_of(values: list[bytes | None]) -> pd.DataFrame:
    return JsonDecoder().decode(kafka_batch(values)).events


def test_translate_returning_a_frame_changed_in_place() -> None:
    events = events_of([order(1, 2.0, 3), order(2, 1.5, 2)])
    rows, rejects, errors = apply_translate(fixture("to_total"), events)
    assert rows["total"].tolist() == [6.0, 3.0] and rows[ROW].tolist() == [0, 1]
    assert rejects == [] and errors == []
    assert "total" not in events.columns  # the function got a copy


def test_translate_dropping_rewind_row_keeps_the_index_and_is_restored() -> None:
    rows, _, _ = apply_translate(fixture("project"), events_of([order(1), b"bad", order(2)]))
    assert rows[ROW].tolist() == [0, 2]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fresh_frame", "have no _rewind_row column and their index is not the input's"),
        ("reset_index", "have no _rewind_row column and their index is not the input's"),
        ("returns_list", "returned a list; expected a pandas DataFrame or a TranslateResult"),
        ("returns_none", "returned None; return the output frame"),
    ],
)
def test_translate_breaking_the_contract_is_one_clear_error(name: str, message: str) -> None:
    with pytest.raises(TranslateOutputError, match=message) as err:
        apply_translate(fixture(name), events_of([order(1)]))
    assert f"translate.function tests.translate_fixtures:{name}" in str(err.value)


def test_translate_rows_with_foreign_row_ids_are_an_error() -> None:
    def invent(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(_rewind_row=df["_rewind_row"] + 1000)

    with pytest.raises(TranslateOutputError, match="not in its input"):
        apply_translate(invent, events_of([order(1)]))


def test_translate_result_with_rejects() -> None:
    rows, rejects, errors = apply_translate(
        fixture("reject_negative"), events_of([order(1, 5.0), order(2, -1.0), order(3, 7.0)])
    )
    assert rows["order_id"].tolist() == [1, 3]
    assert rejects == [Failure(1, "translate-reject", "amount is negative", "amount is negative")]
    assert errors == []


def test_translate_raising_on_some_records_quarantines_only_those() -> None:
    rows, rejects, errors = apply_translate(
        fixture("raise_on_negative"),
        events_of([order(1, 5.0), order(2, -1.0), order(3, 7.0), order(4, -2.0)]),
    )
    assert rows["order_id"].tolist() == [1, 3]
    assert [(e.row, e.stage, e.reason, e.kind) for e in errors] == [
        (1, "translate-error", "ValueError: negative amount -1.0", "ValueError"),
        (3, "translate-error", "ValueError: negative amount -2.0", "ValueError"),
    ]
    assert rejects == []


def test_translate_raising_on_every_record_quarantines_every_record() -> None:
    """Per-record exceptions are data problems: quarantined, never a silent drop. A run-level
    quarantine ratio gate (the runner's) is what stops a buggy function."""
    rows, _, errors = apply_translate(fixture("always_raise"), events_of([order(1), order(2)]))
    assert rows.empty
    assert [e.reason for e in errors] == ["KeyError: 'no_such_column'"] * 2


def test_translate_one_record_to_many_rows_and_to_none() -> None:
    events = events_of(
        [
            js({"order_id": 1, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}),
            js({"order_id": 2, "items": []}),
            js({"order_id": 3, "items": [{"sku": "c", "qty": 5}]}),
        ]
    )
    rows, _, _ = apply_translate(fixture("explode_items"), events)
    assert rows[[ROW, "sku", "qty"]].values.tolist() == [[0, "a", 1], [0, "b", 2], [2, "c", 5]]


def test_translate_filtering_rows() -> None:
    rows, rejects, errors = apply_translate(
        fixture("filter_small"), events_of([order(1, 5.0), order(2, 50.0)])
    )
    assert rows["order_id"].tolist() == [2] and rejects == [] and errors == []


def test_infer_output_schema_from_an_empty_frame() -> None:
    decoder = JsonDecoder(schema={"order_id": "long", "amount": "double", "qty": "long"})
    learnt = infer_output_schema(fixture("to_total"), decoder.empty_events())
    assert learnt.columns == ("order_id", "amount", "qty", "total")
    assert learnt.arrow_schema() == pa.schema(
        [("order_id", pa.int64()), ("amount", pa.float64()), ("qty", pa.int64()), ("total", pa.float64())]
    )
    exploded = infer_output_schema(fixture("explode_items"), {"order_id": "Int64", "items": object})
    assert exploded.columns == ("order_id", "sku", "qty") and exploded.unknown == ("sku",)
    with pytest.raises(OutputSchemaUnknown, match="sku"):
        exploded.arrow_schema()

    def first_row_only(df: pd.DataFrame) -> pd.DataFrame:
        return df.iloc[[0]]

    with pytest.raises(
        OutputSchemaUnknown, match=r"raised IndexError.* on an empty frame .*give translate\.output_schema"
    ):
        infer_output_schema(first_row_only, decoder.empty_events())
    with pytest.raises(TranslateOutputError, match="returned a list"):
        infer_output_schema(fixture("returns_list"), decoder.empty_events())


# -- lineage ----------------------------------------------------------------------------------


def test_event_id_is_the_documented_hash() -> None:
    expected = hashlib.sha256(b"orders/3/100/orders/v1/0").hexdigest()[:32]
    assert event_id("orders", 3, 100, "orders", "v1", 0) == expected
    assert len(expected) == 32


def test_ordinals_count_rows_per_source_record_in_order() -> None:
    assert ordinals(np.array([5, 5, 2, 5, 2, 7])).tolist() == [0, 1, 0, 2, 1, 0]
    assert ordinals(np.array([], dtype=np.int64)).tolist() == []


def test_add_lineage_columns_and_ids() -> None:
    events = events_of([js({"order_id": 1, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}]})])
    rows, _, _ = apply_translate(fixture("explode_items"), events)
    out = add_lineage(rows, events, "orders", "v1", "run-1", EXTRACTED)
    assert list(out.columns) == [*rows.columns, *LINEAGE_COLUMNS]
    assert out["_rewind_event_id"].tolist() == [
        event_id("orders", 3, 100, "orders", "v1", 0),
        event_id("orders", 3, 100, "orders", "v1", 1),
    ]
    assert out["_rewind_source_offset"].tolist() == [100, 100]
    assert out["_rewind_source_timestamp"].iloc[0] == pd.Timestamp(TS0)
    assert out["_rewind_extracted_at"].iloc[0] == pd.Timestamp(EXTRACTED)
    assert out["_rewind_synthetic"].all() and set(out["_rewind_run_id"]) == {"run-1"}


# -- process_batch ----------------------------------------------------------------------------


def test_process_batch_outputs_user_then_lineage_columns_and_counts() -> None:
    batch = kafka_batch([order(1, 5.0, 2), b"{oops", None, order(2, 3.0, 1)])
    out = process_batch(batch, JsonDecoder(), fixture("to_total"), ["order_id"], ctx())
    assert out.rows.schema.names == ["order_id", "amount", "qty", "total", *LINEAGE_COLUMNS]
    assert out.rows.schema.field("order_id").type == pa.int64()
    assert out.rows.schema.remove(0).remove(0).remove(0).remove(0) == LINEAGE_SCHEMA
    assert out.rows.column("total").to_pylist() == [10.0, 3.0]
    assert out.rows.column("_rewind_source_offset").to_pylist() == [100, 103]
    assert out.counts == RecordCounts(
        records_read=4,
        emitted=2,
        rows_out=2,
        quarantined=2,
        filtered=0,
        reasons={"decode: invalid JSON": 1, "decode: tombstone": 1},
    )


def test_quarantine_rows_carry_raw_bytes_coordinates_stage_and_reason() -> None:
    batch = kafka_batch([b"{oops", order(1, -1.0)], keys=[b"key-a", None])
    out = process_batch(batch, JsonDecoder(), fixture("reject_negative"), [], ctx())
    assert out.quarantine.schema == QUARANTINE_SCHEMA
    assert out.quarantine.to_pylist() == [
        {
            "run_id": "run-1",
            "unit_id": "orders/3/100-200",
            "topic": "orders",
            "partition": 3,
            "offset": 100,
            "timestamp": TS0,
            "key": b"key-a",
            "value": b"{oops",
            "stage": "decode",
            "reason": "invalid JSON: Expecting property name enclosed in double quotes at char 1",
            "at": EXTRACTED,
        },
        {
            "run_id": "run-1",
            "unit_id": "orders/3/100-200",
            "topic": "orders",
            "partition": 3,
            "offset": 101,
            "timestamp": TS0.replace(second=1),
            "key": None,
            "value": order(1, -1.0),
            "stage": "translate-reject",
            "reason": "amount is negative",
            "at": EXTRACTED,
        },
    ]
    assert out.rows.num_rows == 0 and out.counts.quarantined == 2


def test_null_key_quarantines_the_whole_source_record() -> None:
    def split(df: pd.DataFrame) -> pd.DataFrame:
        a = df[[ROW, "order_id"]].assign(part="a")
        b = df[[ROW, "order_id"]].assign(part="b", order_id=df["order_id"].where(df["order_id"] != 2, None))
        return pd.concat([a, b])

    out = process_batch(
        kafka_batch([order(1), order(2), order(3)]), JsonDecoder(), split, ["order_id", "part"], ctx()
    )
    assert sorted(out.rows.column("order_id").to_pylist()) == [1, 1, 3, 3]
    assert [(q["offset"], q["stage"], q["reason"]) for q in out.quarantine.to_pylist()] == [
        (101, "key-null", "key column 'order_id' is null")
    ]
    assert (out.counts.emitted, out.counts.rows_out, out.counts.quarantined) == (2, 4, 1)
    assert out.counts.reasons == {"key-null: null order_id": 1}
    with pytest.raises(TranslateOutputError, match=r"key column\(s\) id are not among the output columns"):
        process_batch(kafka_batch([order(1)]), JsonDecoder(), None, ["id"], ctx())


def test_same_input_gives_same_ids_and_a_new_version_new_ones() -> None:
    batch = kafka_batch([order(1), order(2)])

    def ids(version: str) -> list[str]:
        out = process_batch(batch, JsonDecoder(), None, [], ctx(version))
        return out.rows.column("_rewind_event_id").to_pylist()

    first, again, newer = ids("v1"), ids("v1"), ids("v2")
    assert first == again and len(set(first)) == 2
    assert not set(first) & set(newer)


def test_output_schema_fixes_columns_and_types() -> None:
    schema = pa.schema(
        [("order_id", pa.int64()), ("amount", pa.float32()), ("qty", pa.int32()), ("note", pa.string())]
    )
    out = process_batch(kafka_batch([order(1)]), JsonDecoder(), None, [], ctx(), output_schema=schema)
    assert out.rows.schema.names[:4] == ["order_id", "amount", "qty", "note"]
    assert out.rows.schema.field("qty").type == pa.int32()
    assert out.rows.column("note").to_pylist() == [None]
    empty = process_batch(kafka_batch([b"bad"]), JsonDecoder(), None, [], ctx(), output_schema=schema)
    assert empty.rows.schema == out.rows.schema and empty.rows.num_rows == 0
    narrow = pa.schema([("order_id", pa.int64())])
    with pytest.raises(TranslateOutputError, match=r"amount, qty are not in translate.output_schema"):
        process_batch(kafka_batch([order(1)]), JsonDecoder(), None, [], ctx(), output_schema=narrow)


def test_mixed_types_in_one_column_are_a_clear_error() -> None:
    with pytest.raises(TranslateOutputError, match="output column 'v' cannot be converted to Arrow"):
        process_batch(kafka_batch([js({"v": 1}), js({"v": "x"})]), JsonDecoder(), None, [], ctx())


class _DoubleCounting(Decoder):
    """A broken decoder: reports record 0 as decoded and as failed."""

    def field_dtypes(self) -> dict[str, Any]:
        return {}

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        decoded = JsonDecoder().decode(batch)
        decoded.failures.append(Failure(0, "decode", "also failed"))
        return decoded


def test_a_record_counted_twice_breaks_the_conservation_law() -> None:
    with pytest.raises(ConservationError) as err:
        process_batch(
            kafka_batch([order(1), order(2)]), _DoubleCounting(), None, [], ctx(unit="orders/3/0-2")
        )
    assert str(err.value).startswith(
        "unit orders/3/0-2: conservation law broken: records_read=2 but "
        "emitted=2 + quarantined=1 + filtered=0 = 3"
    )
    assert "[0] counted more than once" in str(err.value)


def test_batch_counts_merge() -> None:
    a = RecordCounts(10, 7, 9, 2, 1, {"decode: invalid JSON": 2})
    b = RecordCounts(5, 5, 5, 0, 0, {})
    c = RecordCounts(3, 0, 0, 3, 0, {"decode: invalid JSON": 1, "key-null: null id": 2})
    total = a.merge(b).merge(c)
    assert total == RecordCounts(18, 12, 14, 5, 1, {"decode: invalid JSON": 3, "key-null: null id": 2})
    assert total.balanced


# -- property: every record lands in exactly one place ----------------------------------------

KINDS = ("valid", "malformed", "tombstone", "reject", "raise", "filter", "multi", "nullkey", "notobject")


def record_value(kind: str, i: int, n: int) -> bytes | None:
    if kind == "malformed":
        return b'{"kind": "valid", "id": ' + str(i).encode()
    if kind == "tombstone":
        return None
    if kind == "notobject":
        return js([kind, i])
    return js({"kind": kind, "id": i, "n": n})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 3)), max_size=40),
    skip_tombstones=st.booleans(),
)
def test_every_record_is_emitted_quarantined_or_filtered_exactly_once(
    records: list[tuple[str, int]], skip_tombstones: bool
) -> None:
    values = [record_value(kind, i, n) for i, (kind, n) in enumerate(records)]
    batch = kafka_batch(values, start=1000)
    decoder = JsonDecoder(null_value="skip" if skip_tombstones else "quarantine")
    out = process_batch(batch, decoder, fixture("mixed"), ["id"], ctx())

    expect_q: set[int] = set()
    expect_e: set[int] = set()
    expect_f: set[int] = set()
    expect_rows = 0
    for i, (kind, n) in enumerate(records):
        offset = 1000 + i
        if kind in ("malformed", "notobject", "reject", "raise", "nullkey"):
            expect_q.add(offset)
        elif kind == "tombstone":
            (expect_f if skip_tombstones else expect_q).add(offset)
        elif kind == "filter" or (kind == "multi" and n == 0):
            expect_f.add(offset)
        else:
            expect_e.add(offset)
            expect_rows += n if kind == "multi" else 1

    quarantined = out.quarantine.column("offset").to_pylist()
    emitted = set(out.rows.column("_rewind_source_offset").to_pylist())
    assert sorted(quarantined) == sorted(expect_q)  # each quarantined once
    assert emitted == expect_e
    c = out.counts
    assert c.records_read == len(records) == c.emitted + c.quarantined + c.filtered
    assert (c.emitted, c.quarantined, c.filtered, c.rows_out) == (
        len(expect_e),
        len(expect_q),
        len(expect_f),
        expect_rows,
    )
    assert sum(c.reasons.values()) == c.quarantined
    assert len(set(out.rows.column("_rewind_event_id").to_pylist())) == out.rows.num_rows
    stages = {q["offset"]: q["stage"] for q in out.quarantine.to_pylist()}
    for i, (kind, _) in enumerate(records):
        want = {"reject": "translate-reject", "raise": "translate-error", "nullkey": "key-null"}.get(kind)
        if want:
            assert stages[1000 + i] == want


# -- orjson only accelerates JSON decoding, it never changes a result -------------------------


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 and 1.0 differ; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ensure_ascii=st.booleans(), noise=st.binary(max_size=3))
def test_orjson_fast_path_agrees_with_the_stdlib(value: Any, ensure_ascii: bool, noise: bytes) -> None:
    orjson = pytest.importorskip("orjson")
    from rewind.translate.json_decoder import _LONG_DIGITS

    text = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    for raw in (text, text + noise, noise + text):
        if _LONG_DIGITS(raw):
            continue  # the decoder leaves these to the stdlib
        try:
            fast = orjson.loads(raw)
        except Exception:
            continue  # the decoder asks the stdlib again
        assert same_value(fast, json.loads(raw.decode("utf-8"))), raw


def test_json_decoding_is_the_same_with_and_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewind.translate.json_decoder as decode_module

    tricky = [
        js({"big": 2**64, "neg": -(2**63) - 1, "f": 1.5, "s": "\u00e9\ud83d\ude00"}),
        b'{"n": NaN, "i": Infinity}',
        b'{"s": "\\ud800"}',
        b"\xef\xbb\xbf{}",
        b'{"a": "\x01"}',
        b'{"a": 1, "a": 2}',
        b'{"a": 1} x',
        b'  {"a": -0}  ',
        b'{"id": "12345678901234567890123"}',
    ]
    batch = kafka_batch(tricky)
    with_fast = JsonDecoder().decode(batch)
    monkeypatch.setattr(decode_module, "_fast_json_loads", lambda: None)
    stdlib = JsonDecoder().decode(batch)
    assert with_fast.failures == stdlib.failures
    pd.testing.assert_frame_equal(with_fast.events, stdlib.events)
    for column in with_fast.events.columns:
        for a, b in zip(with_fast.events[column], stdlib.events[column], strict=True):
            assert (a is pd.NA and b is pd.NA) or same_value(a, b), (column, a, b)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), st.binary(max_size=30), st.text("0123456789x", max_size=30).map(str.encode))
    )
)
def test_the_batch_digit_scan_never_misses_a_long_number(values: list[bytes | None]) -> None:
    from rewind.translate.json_decoder import _LONG_DIGITS, _has_long_digits

    batch = pa.RecordBatch.from_pydict({"value": pa.array(values, type=pa.binary())})
    if any(v is not None and _LONG_DIGITS(v) for v in values):
        assert _has_long_digits(batch)
    if _has_long_digits(batch):
        assert _LONG_DIGITS(b"".join(v for v in values if v is not None))


def test_the_retry_isolates_a_bad_record_in_few_calls() -> None:
    calls = []

    def picky(df: pd.DataFrame) -> pd.DataFrame:
        calls.append(len(df))
        if (df["order_id"] == 777).any():
            raise ValueError("777 is cursed")
        return df

    events = events_of([order(i) for i in range(2000)])
    rows, _, errors = apply_translate(picky, events)
    assert [e.row for e in errors] == [777]
    assert rows[ROW].tolist() == [i for i in range(2000) if i != 777]  # input order kept
    assert len(calls) <= 1 + 2 * 11


def test_decoders_survive_pickling_after_use(schema_dir: Path, registry_url: str) -> None:
    """Decoders are built on the driver (plan-time gates use them) and shipped to Spark tasks."""
    import pickle

    avro = confluent(1, V1, {"order_id": 1, "amount": 2.5})
    registry = AvroDecoder(
        RegistrySchemaSource(registry_url, subject="orders-value", config={"max.retries": 0})
    )
    cases: list[tuple[Decoder, bytes]] = [
        (JsonDecoder(schema={"order_id": "long"}), order(1)),
        (RawDecoder(), b"raw"),
        (AvroDecoder(LocalSchemaSource(schema_dir)), avro),
        (registry, avro),
    ]
    for decoder, value in cases:
        batch = kafka_batch([value])
        before = decoder.decode(batch).events
        copy = pickle.loads(pickle.dumps(decoder))
        pd.testing.assert_frame_equal(copy.decode(batch).events, before)


def test_reason_counters_are_bounded() -> None:
    from rewind.core.counts import MAX_REASON_KEYS, OTHER_REASONS

    def reject_all(df: pd.DataFrame) -> Any:
        from rewind.translate import TranslateResult

        reasons = "order " + df["order_id"].astype(str) + " is odd"
        return TranslateResult(rows=df.iloc[0:0], rejects=df[[ROW]].assign(reason=reasons))

    out = process_batch(kafka_batch([order(i) for i in range(150)]), JsonDecoder(), reject_all, [], ctx())
    assert len(out.counts.reasons) == MAX_REASON_KEYS + 1
    assert out.counts.reasons[OTHER_REASONS] == 150 - MAX_REASON_KEYS
    assert (
        out.quarantine.column("reason").to_pylist()[120] == "order 120 is odd"
    )  # the table keeps every reason


def test_a_chunked_table_is_processed_like_one_batch() -> None:
    batch = kafka_batch([order(1), b"bad", order(2), order(3)])
    table = pa.Table.from_batches([batch.slice(0, 2), batch.slice(2)])
    assert table.column("value").num_chunks == 2
    from_table = process_batch(table, JsonDecoder(), None, [], ctx())
    from_batch = process_batch(batch, JsonDecoder(), None, [], ctx())
    assert from_table.rows.equals(from_batch.rows) and from_table.quarantine.equals(from_batch.quarantine)
    assert from_table.counts == from_batch.counts
