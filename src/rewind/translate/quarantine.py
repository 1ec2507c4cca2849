"""Quarantine rows: a source record that did not make it, kept whole, with where and why.

The raw key and value bytes come from the original Kafka batch, never from a decoded form, so
a quarantined record can be replayed to Kafka byte for byte once the cause is fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from rewind.translate.failures import Failure
from rewind.translate.lineage import TIMESTAMP, utc

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("at", TIMESTAMP, nullable=False),
    ]
)
"""docs/design-backfill.md, "Quarantine rows"; ``stage`` is one of ``failures.STAGES``."""


def quarantine_table(
    batch: pa.RecordBatch, failures: Sequence[Failure], run_id: str, unit_id: str, at: datetime
) -> pa.Table:
    """One quarantine row per failure, in the order given, with the record's coordinates and bytes."""
    n = len(failures)
    take = pa.array([f.row for f in failures], type=pa.int64())

    def column(name: str, type_: pa.DataType) -> pa.Array:
        return batch.column(name).take(take).cast(type_)

    arrays = [
        pa.repeat(pa.scalar(run_id, type=pa.string()), n),
        pa.repeat(pa.scalar(unit_id, type=pa.string()), n),
        column("topic", pa.string()),
        column("partition", pa.int32()),
        column("offset", pa.int64()),
        column("timestamp", TIMESTAMP),
        column("key", pa.binary()),
        column("value", pa.binary()),
        pa.array([f.stage for f in failures], type=pa.string()),
        pa.array([f.reason for f in failures], type=pa.string()),
        pa.repeat(pa.scalar(utc(at), type=TIMESTAMP), n),
    ]
    return pa.Table.from_arrays(arrays, schema=QUARANTINE_SCHEMA)
