"""Names of the columns Rewind adds: translator input columns and lineage columns.

A leaf: the spec, the translate, the sinks and verify all name these columns from here.

The prefixes ``_src_`` and ``_rewind_`` are reserved: a decoded field or a translate output
column may not use them (except ``_rewind_row``, which output rows carry back).
"""

from __future__ import annotations

ROW = "_rewind_row"
"""Position of the source record within the batch being processed (int64)."""

ROW_INDEX = "_rewind_index"
"""Name of the events frame's index, whose labels are the ``_rewind_row`` values.

Named differently from the column on purpose: pandas refuses ``groupby``/``merge`` on a name
that is both a column and an index level. A translate function that drops ``_rewind_row`` but
keeps this index (``df[["a", "b"]]``, ``df[df.x > 0]``) still says where its rows came from.
"""

SRC_TOPIC = "_src_topic"
SRC_PARTITION = "_src_partition"
SRC_OFFSET = "_src_offset"
SRC_TIMESTAMP = "_src_timestamp"
SRC_KEY = "_src_key"

INPUT_COLUMNS: tuple[str, ...] = (ROW, SRC_TOPIC, SRC_PARTITION, SRC_OFFSET, SRC_TIMESTAMP, SRC_KEY)

LINEAGE_PREFIX = "_rewind_"
"""Every lineage column starts with it; a user column may not."""

RESERVED_PREFIXES: tuple[str, ...] = ("_src_", LINEAGE_PREFIX)

EVENT_ID = "_rewind_event_id"
SOURCE_TOPIC = "_rewind_source_topic"
SOURCE_PARTITION = "_rewind_source_partition"
SOURCE_OFFSET = "_rewind_source_offset"
SOURCE_TIMESTAMP = "_rewind_source_timestamp"
EXTRACTED_AT = "_rewind_extracted_at"
TRANSFORM = "_rewind_transform"
TRANSFORM_VERSION = "_rewind_transform_version"
RUN_ID = "_rewind_run_id"
SYNTHETIC = "_rewind_synthetic"

LINEAGE_COLUMNS: tuple[str, ...] = (
    EVENT_ID,
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    SOURCE_TIMESTAMP,
    EXTRACTED_AT,
    TRANSFORM,
    TRANSFORM_VERSION,
    RUN_ID,
    SYNTHETIC,
)


SOURCE_SYSTEM = "_rewind_source_system"
"""``lineage.source_system`` of the spec, on every row when given (the system the data came from)."""
EFFECTIVE_TIME = "_rewind_effective_time"
"""The business effective time (``lineage.effective_time_column``) as a UTC timestamp, when given."""
OPTIONAL_LINEAGE: tuple[str, ...] = (SOURCE_SYSTEM, EFFECTIVE_TIME)
"""Lineage columns a row carries only when the spec's ``lineage:`` asks for them (after
:data:`LINEAGE_COLUMNS`, so a target without them keeps working for specs that do not)."""


def is_reserved(name: object) -> bool:
    """True for names a user field or output column may not take."""
    return isinstance(name, str) and name.startswith(RESERVED_PREFIXES)
