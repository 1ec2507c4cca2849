"""An order topic whose history was written with three Avro schema versions, and its translate.

v1: ``order_id`` and a ``float`` amount. v2: the amount becomes a ``double`` (float promotes
to double), adds ``currency`` (default EUR) and a nullable ``note``. v3: adds ``status``, an
enum with default NEW, and ``placed_at``, a timestamp-millis with default 0. Schema ids are
1, 2, 3 (``<id>.avsc``) and ``latest.avsc`` is v3.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "order_id", "type": "long"}, {"name": "amount", "type": "float"}],
}
V2: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string", "default": "EUR"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
V3: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        *V2["fields"],
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]},
            "default": "NEW",
        },
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
    ],
}
VERSIONS = {1: V1, 2: V2, 3: V3}
FIELDS = [f["name"] for f in V3["fields"]]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PLACED = datetime(2026, 10, 1, tzinfo=UTC)


def write_schemas(folder: Path, versions: dict[int, dict[str, Any]] = VERSIONS) -> Path:
    """``<id>.avsc`` for each version and ``latest.avsc`` (the highest)."""
    folder.mkdir(parents=True, exist_ok=True)
    for schema_id, schema in versions.items():
        (folder / f"{schema_id}.avsc").write_text(json.dumps(schema))
    (folder / "latest.avsc").write_text(json.dumps(versions[max(versions)]))
    return folder


def order(i: int) -> tuple[int, dict[str, Any]]:
    """The schema id order ``i`` was written with, and its record in that version."""
    version = 1 + (i % 3)
    record: dict[str, Any] = {"order_id": 1000 + i, "amount": i * 0.25}
    if version >= 2:
        record["currency"] = "USD" if i % 2 else "EUR"
        record["note"] = None if i % 4 == 1 else f"note {i}"
    if version == 3:
        record["status"] = ("NEW", "PAID", "SHIPPED")[(i // 3) % 3]
        record["placed_at"] = PLACED + timedelta(milliseconds=i)
    return version, record


def evolved(i: int) -> dict[str, Any]:
    """Order ``i`` as a reader of v3 sees it (defaults for the fields its version lacked)."""
    _, record = order(i)
    out = {"currency": "EUR", "note": None, "status": "NEW", "placed_at": EPOCH, **record}
    return {name: out[name] for name in FIELDS}


def wire(i: int) -> bytes:
    """Order ``i`` in the Confluent wire format of its version."""
    import fastavro

    version, record = order(i)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(VERSIONS[version]), record)
    return b"\x00" + version.to_bytes(4, "big") + body.getvalue()


def order_fields(events: pd.DataFrame) -> pd.DataFrame:
    """Every field of the latest schema, as decoded (the ETL bridge: the record itself)."""
    return events[["_rewind_row", *FIELDS]]


def order_id_as_text(events: pd.DataFrame) -> pd.DataFrame:
    """The order id as a string: does not fit the schema's long."""
    out = events[["_rewind_row", *FIELDS]].copy()
    out["order_id"] = out["order_id"].astype(str)
    return out
