"""Names of the columns Rewind adds: translator input columns and lineage columns.

The prefixes ``_src_`` and ``_rewind_`` are reserved: a decoded field or a translate output
column may not use them (except ``_rewind_row``, which output rows carry back).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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

RESERVED_PREFIXES: tuple[str, ...] = ("_src_", "_rewind_")

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


def is_reserved(name: object) -> bool:
    """True for names a user field or output column may not take."""
    return isinstance(name, str) and name.startswith(RESERVED_PREFIXES)


def user_columns(columns: Iterable[Any]) -> list[str]:
    """The output columns that are the user's: all but ``_rewind_row`` and the ``_src_`` inputs.

    Raises ``TranslateOutputError`` for a column that is not a string or that takes a
    lineage name (``_rewind_...``).
    """
    from rewind.translate.exceptions import TranslateOutputError

    out: list[str] = []
    for name in columns:
        if not isinstance(name, str):
            raise TranslateOutputError(f"output column {name!r} is not a string; name every column")
        if name == ROW or name.startswith("_src_"):
            continue
        if name.startswith("_rewind_"):
            raise TranslateOutputError(
                f"output column {name!r} uses the prefix _rewind_, reserved for lineage; rename it"
            )
        out.append(name)
    return out
