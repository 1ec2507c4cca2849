"""Rows of a table as Kafka-shaped records, so they take the translate path of every record.

One row becomes one record of the Kafka source schema (:func:`rewind.core.arrow.kafka_record_schema`):
``key`` = the entity id's bytes (:func:`rewind.tables.placement.key_bytes`), ``value`` = the
row as a compact JSON object (orjson: timestamps and dates in ISO-8601, decimals and UUIDs as
strings, bytes in base64), ``topic`` = the source label (``postgres:public.accounts``),
``partition`` = the key range's number, ``offset`` = the row's position in its range (key
order), ``timestamp`` = when the range was read (the extraction time). ``decode: json`` then
hands the translate one column per table column, and lineage, event ids and quarantine rows
work as for Kafka records: a quarantined row keeps its JSON and its coordinates.
"""

from __future__ import annotations

import base64
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.tables.placement import key_bytes

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.tables.readers import Rows


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, Decimal):
        return str(value)
    return str(value)


def as_records(
    rows: Rows, key_column: str, label: str, range_number: int, first_offset: int, extracted_at: datetime
) -> pa.RecordBatch:
    """``rows`` (in key order) as a Kafka-shaped batch whose offsets start at ``first_offset``."""
    import numpy as np
    import orjson
    import pyarrow as pa

    from rewind.core.arrow import kafka_record_schema

    n = len(rows.rows)
    at = rows.columns.index(key_column)
    names = rows.columns
    dumps = orjson.dumps
    options = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
    values = [
        dumps(dict(zip(names, row, strict=True)), default=_default, option=options) for row in rows.rows
    ]
    keys = [key_bytes(row[at]) for row in rows.rows]
    micros = int(extracted_at.timestamp() * 1_000_000)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(label, pa.string()), n),
            pa.repeat(pa.scalar(range_number, pa.int32()), n),
            pa.array(np.arange(first_offset, first_offset + n, dtype=np.int64)),
            pa.repeat(pa.scalar(micros, pa.timestamp("us", tz="UTC")), n),
            pa.repeat(pa.scalar(0, pa.int32()), n),
        ],
        schema=kafka_record_schema(False),
    )
