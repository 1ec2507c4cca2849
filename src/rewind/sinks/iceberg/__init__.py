"""The Iceberg sink: a run stages on a branch of the target (or a new table), promoted by a ref swap.

``sink`` holds the sink and its protocol; ``staging`` the staging record and the snapshot
properties that record units; ``publish`` promotion, rebase and rollback; ``read`` reads a
table or branch into Spark.
"""

from __future__ import annotations

from rewind.sinks.iceberg.read import read_iceberg
from rewind.sinks.iceberg.sink import IcebergSink
from rewind.sinks.iceberg.staging import (
    FINALIZED_PROPERTY,
    FOLD_COUNTS_PROPERTY,
    RUN_PROPERTY,
    UNITS_PROPERTY,
    IcebergSinkError,
    IcebergStaging,
)

__all__ = [
    "FINALIZED_PROPERTY",
    "FOLD_COUNTS_PROPERTY",
    "RUN_PROPERTY",
    "UNITS_PROPERTY",
    "IcebergSink",
    "IcebergSinkError",
    "IcebergStaging",
    "read_iceberg",
]
