"""Rows of a table as Kafka-shaped records, so they take the translate path of every record.

One row becomes one record of the Kafka source schema (:func:`rewind.core.arrow.kafka_record_schema`)
plus the row's columns, each named ``row:<column>`` (:data:`rewind.translate.rows_decoder.ROW_PREFIX`,
which ``decode: rows`` hands to the translate as they are): ``key`` = the entity id's bytes
(:func:`rewind.tables.placement.key_bytes`), ``topic`` = the source label
(``postgres:public.accounts``), ``partition`` = the key range's number, ``offset`` = the row's
position in its range (key order), ``timestamp`` = when the range was read (the extraction
time). So lineage, event ids and quarantine rows work as for Kafka records.

``value`` stays null: nothing needs the row serialized, except a row that ends in quarantine,
whose value :func:`with_row_values` fills with the row as a compact JSON object (orjson:
timestamps and dates ISO-8601, decimals and UUIDs as strings, bytes base64), so a quarantined
row keeps its content and its coordinates.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa

from rewind.core.arrow import kafka_record_schema
from rewind.core.json_fallback import json_default
from rewind.tables.placement import key_bytes
from rewind.translate.rows_decoder import ROW_PREFIX

if TYPE_CHECKING:
    from rewind.tables.readers import Rows


def _column(values: tuple[Any, ...] | list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types (SQLite is dynamically typed)
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _keys(column: pa.Array, values: tuple[Any, ...] | list[Any]) -> pa.Array:
    """The key bytes of each entity id: Arrow casts integer and text columns to their UTF-8 text
    at once (what :func:`key_bytes` gives one by one)."""
    if pa.types.is_integer(column.type) or pa.types.is_string(column.type):
        return column.cast(pa.string()).cast(pa.binary())
    if not values and len(column):
        values = column.to_pylist()
    return pa.array([None if v is None else key_bytes(v) for v in values], pa.binary())


def as_records(
    rows: Rows, key_column: str, label: str, range_number: int, first_offset: int, extracted_at: datetime
) -> pa.RecordBatch:
    """``rows`` (in key order) as a Kafka-shaped batch whose offsets start at ``first_offset``."""
    n = len(rows)
    at = rows.columns.index(key_column)
    if rows.batch is not None:  # columns already: an all-null column is typed null, as from tuples
        values = [c if c.null_count < n or n == 0 else pa.nulls(n) for c in rows.batch.columns]
        key_array = _keys(values[at], ())
    else:
        columns = list(zip(*rows.rows, strict=True)) if n else [() for _ in rows.columns]
        values = [_column(c) for c in columns]
        key_array = _keys(values[at], columns[at])
    micros = int(extracted_at.timestamp() * 1_000_000)
    record = kafka_record_schema(False)
    arrays = [
        key_array,
        pa.nulls(n, pa.binary()),
        pa.repeat(pa.scalar(label, pa.string()), n),
        pa.repeat(pa.scalar(range_number, pa.int32()), n),
        pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        pa.repeat(pa.scalar(micros, pa.timestamp("us", tz="UTC")), n),
        pa.repeat(pa.scalar(0, pa.int32()), n),
    ]
    names = list(record.names)
    for name, column in zip(rows.columns, values, strict=True):
        arrays.append(column)
        names.append(ROW_PREFIX + name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def row_values(rows: Rows, positions: list[int]) -> list[bytes]:
    """The rows at ``positions`` as compact JSON objects."""
    options = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
    names = rows.columns
    return [
        orjson.dumps(dict(zip(names, rows.row(i), strict=True)), default=json_default, option=options)
        for i in positions
    ]


def with_row_values(quarantine: pa.Table, rows: Rows, first_offset: int) -> pa.Table:
    """Quarantine rows of a batch of ``rows`` with their ``value``: the row as JSON."""
    if quarantine.num_rows == 0:
        return quarantine
    positions = [o - first_offset for o in quarantine.column("offset").to_pylist()]
    index = quarantine.schema.get_field_index("value")
    return quarantine.set_column(index, "value", pa.array(row_values(rows, positions), pa.binary()))
