"""Lineage columns: where every output row came from, and a deterministic id for it.

``_rewind_event_id`` is the first 32 hex characters of
``sha256("<topic>/<partition>/<offset>/<transform>/<version>/<ordinal>")`` where ``ordinal``
is the row's position among the rows its source record produced (0 for a 1→1 translate), so
re-running the same transform version over the same records gives the same ids (idempotent
upserts, duplicate detection) and a new version gives new ones. The hashes are made one per row
by hashlib (there is no vectorised SHA-256 at hand) but their hex text is built for the whole
batch at once (:func:`hex_ids`), which halves their cost.

Rows of a table source (a re-produce, ``id_scheme="table"``) take a cheaper id, computed by
numpy for the whole batch (:func:`table_event_ids`, ~20x faster than a SHA-256 per row): their
coordinates (source label, key range, row position in the range) are Rewind's own, stable only
within one plan, and nothing looks them up by the SHA-256 formula (a re-produce unit is
produced whole in one transaction, never de-duplicated by event id). Still 32 hex characters.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rewind.core.arrow import is_constant
from rewind.core.columns import (
    EFFECTIVE_TIME,
    EVENT_ID,
    EXTRACTED_AT,
    LINEAGE_COLUMNS,
    ROW,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_SYSTEM,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    SRC_OFFSET,
    SRC_PARTITION,
    SRC_TIMESTAMP,
    SRC_TOPIC,
    SYNTHETIC,
    TRANSFORM,
    TRANSFORM_VERSION,
)
from rewind.translate.exceptions import TranslateOutputError

TIMESTAMP = pa.timestamp("us", tz="UTC")

IdScheme = Literal["sha256", "table"]
"""How event ids are made: the documented SHA-256, or a table source's (module docstring)."""

LINEAGE_SCHEMA = pa.schema(
    [
        pa.field(EVENT_ID, pa.string(), nullable=False),
        pa.field(SOURCE_TOPIC, pa.string(), nullable=False),
        pa.field(SOURCE_PARTITION, pa.int32(), nullable=False),
        pa.field(SOURCE_OFFSET, pa.int64(), nullable=False),
        pa.field(SOURCE_TIMESTAMP, TIMESTAMP),
        pa.field(EXTRACTED_AT, TIMESTAMP, nullable=False),
        pa.field(TRANSFORM, pa.string(), nullable=False),
        pa.field(TRANSFORM_VERSION, pa.string(), nullable=False),
        pa.field(RUN_ID, pa.string(), nullable=False),
        pa.field(SYNTHETIC, pa.bool_(), nullable=False),
    ]
)
assert tuple(LINEAGE_SCHEMA.names) == LINEAGE_COLUMNS


def event_id(topic: str, partition: int, offset: int, transform: str, version: str, ordinal: int) -> str:
    """The deterministic id of the ``ordinal``-th output row of one source record."""
    text = f"{topic}/{partition}/{offset}/{transform}/{version}/{ordinal}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def event_ids(
    topics: list[Any],
    partitions: list[Any],
    offsets: list[Any],
    ordinals: list[Any],
    transform: str,
    version: str,
) -> list[str]:
    """:func:`event_id` over aligned columns (one comprehension, no per-row function call)."""
    return event_id_array(topics, partitions, offsets, ordinals, transform, version).to_pylist()


def event_id_array(
    topics: list[Any],
    partitions: list[Any],
    offsets: list[Any],
    ordinals: list[Any],
    transform: str,
    version: str,
) -> pa.Array:
    """:func:`event_ids` as an Arrow string array."""
    sha = hashlib.sha256
    middle = f"/{transform}/{version}/"
    return hex_ids(
        b"".join(
            [
                sha(f"{t}/{p}/{o}{middle}{k}".encode()).digest()
                for t, p, o, k in zip(topics, partitions, offsets, ordinals, strict=True)
            ]
        ),
        32,
    )


def partition_event_ids(
    topic: str, partition: int, offsets: list[Any], ordinals: list[Any], transform: str, version: str
) -> pa.Array:
    """:func:`event_id_array` for rows that all come from one partition (a work unit's case): the
    text around the offset and ordinal is encoded once, the rest formatted as bytes."""
    sha = hashlib.sha256
    head = f"{topic}/{partition}/".encode()
    middle = f"/{transform}/{version}/".encode()
    return hex_ids(
        b"".join(
            [sha(b"%s%d%s%d" % (head, o, middle, k)).digest() for o, k in zip(offsets, ordinals, strict=True)]
        ),
        32,
    )


_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), dtype=np.uint16)
"""The two hex characters of each byte value, as one 16-bit word (a lookup of 2-byte items is
~10x faster than of 2 x 1 byte)."""


def hex_ids(digests: bytes, width: int) -> pa.Array:
    """The first 16 bytes of each ``width``-byte digest laid end to end, as 32-character lowercase
    hex strings: one Arrow string array built from one buffer (no Python string per row)."""
    raw = np.frombuffer(digests, dtype=np.uint8).reshape(-1, width)[:, :16]
    n = raw.shape[0]
    data = _HEX[raw].reshape(n * 16)
    offsets = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that spreads every input bit over the output."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def table_event_ids(
    topic: str, partition: int, offsets: np.ndarray, ordinals: np.ndarray, transform: str, version: str
) -> pa.Array:
    """The event ids of rows of a table source (see the module docstring), for one key range.

    ``s0..s3`` are the first 32 bytes of ``sha256("<topic>/<partition>/<transform>/<version>")``
    (so another source, range, transform or version seeds other ids); per row, with ``o`` the row's
    position and ``k`` its ordinal, the id is the hex of two 64-bit halves:
    ``hi = mix(mix(o ^ s0) ^ k ^ s3)`` and ``lo = mix(o ^ s1 ^ mix(k ^ s2))``, ``mix`` a bijection
    (SplitMix64's finaliser). Two rows of one range with the same position differ in ``hi``, with
    the same ordinal (every row of a 1→1 translate) in ``lo``: their ids are distinct by
    construction; other pairs collide only if both 64-bit halves do.
    """
    seed = np.frombuffer(
        hashlib.sha256(f"{topic}/{partition}/{transform}/{version}".encode()).digest(), dtype=">u8"
    ).astype(np.uint64)
    o = np.asarray(offsets, dtype=np.int64).astype(np.uint64)
    k = np.asarray(ordinals, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        hi = _mix64(_mix64(o ^ seed[0]) ^ k ^ seed[3])
        lo = _mix64(o ^ seed[1] ^ _mix64(k ^ seed[2]))
    both = np.empty((len(o), 2), dtype=">u8")
    both[:, 0] = hi
    both[:, 1] = lo
    return hex_ids(both.tobytes(), 16)


def ordinals(row_ids: np.ndarray) -> np.ndarray:
    """For each row, how many earlier rows (in order) came from the same source record."""
    n = len(row_ids)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    order = np.argsort(row_ids, kind="stable")
    ordered = row_ids[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    positions = np.arange(n, dtype=np.int64)
    group_start = np.maximum.accumulate(np.where(starts, positions, 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = positions - group_start
    return out


def utc(ts: datetime) -> datetime:
    """``ts`` as an aware UTC datetime (a naive one is taken to be UTC)."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def lineage_arrays(
    kafka_batch: pa.RecordBatch,
    row_ids: np.ndarray,
    *,
    transform: str,
    version: str,
    run_id: str,
    extracted_at: datetime,
    id_scheme: IdScheme = "sha256",
) -> list[pa.Array]:
    """The lineage columns (in :data:`LINEAGE_SCHEMA` order) for rows from ``kafka_batch``.

    ``row_ids`` are the rows' ``_rewind_row`` values, i.e. positions in ``kafka_batch``;
    ``id_scheme`` ``table``: the rows come from a table source (see the module docstring).
    """
    n = len(row_ids)
    topic, partition, offset, timestamp = (
        kafka_batch.column(c) for c in ("topic", "partition", "offset", "timestamp")
    )
    # one row per record, in order (a 1 -> 1 translate): the batch's own columns, no copies
    if n != kafka_batch.num_rows or not np.array_equal(row_ids, np.arange(n)):
        take = pa.array(row_ids, type=pa.int64())
        topic, partition, offset, timestamp = (c.take(take) for c in (topic, partition, offset, timestamp))
    one_partition = is_constant(topic) and is_constant(partition)
    if one_partition and id_scheme == "table":
        ids = table_event_ids(
            topic[0].as_py(),
            partition[0].as_py(),
            offset.to_numpy(zero_copy_only=False),
            ordinals(row_ids),
            transform,
            version,
        )
    elif one_partition:
        offsets = offset.to_numpy(zero_copy_only=False).tolist()
        ranks = ordinals(row_ids).tolist()
        ids = partition_event_ids(topic[0].as_py(), partition[0].as_py(), offsets, ranks, transform, version)
    else:
        partitions = partition.to_numpy(zero_copy_only=False).tolist()
        offsets = offset.to_numpy(zero_copy_only=False).tolist()
        ranks = ordinals(row_ids).tolist()
        ids = event_id_array(topic.to_pylist(), partitions, offsets, ranks, transform, version)
    return [
        ids,
        topic.cast(pa.string()),
        partition.cast(pa.int32()),
        offset.cast(pa.int64()),
        timestamp.cast(TIMESTAMP),
        pa.repeat(pa.scalar(utc(extracted_at), type=TIMESTAMP), n),
        pa.repeat(pa.scalar(transform, type=pa.string()), n),
        pa.repeat(pa.scalar(version, type=pa.string()), n),
        pa.repeat(pa.scalar(run_id, type=pa.string()), n),
        pa.repeat(pa.scalar(True, type=pa.bool_()), n),
    ]


def add_lineage(
    rows_df: pd.DataFrame,
    events_df: pd.DataFrame,
    transform: str,
    version: str,
    run_id: str,
    extracted_at: datetime,
) -> pd.DataFrame:
    """``rows_df`` with the lineage columns added, looked up from ``events_df`` by ``_rewind_row``.

    ``events_df`` is the frame the translator received (it has the ``_src_`` columns).
    """
    positions = pd.Index(events_df[ROW]).get_indexer(rows_df[ROW])
    if (positions < 0).any():
        missing = rows_df[ROW].to_numpy()[positions < 0][0]
        raise TranslateOutputError(f"output row with {ROW}={missing} has no source record among the events")
    topics = events_df[SRC_TOPIC].to_numpy(dtype=object)[positions]
    partitions = events_df[SRC_PARTITION].to_numpy()[positions]
    offsets = events_df[SRC_OFFSET].to_numpy()[positions]
    timestamps = events_df[SRC_TIMESTAMP].array.take(positions)
    n = len(rows_df)
    row_ids = rows_df[ROW].to_numpy(dtype=np.int64)
    ids = event_id_array(
        topics.tolist(), partitions.tolist(), offsets.tolist(), ordinals(row_ids).tolist(), transform, version
    ).to_numpy(zero_copy_only=False)
    at = pd.Timestamp(utc(extracted_at)).as_unit("us")
    columns: dict[str, Any] = {
        EVENT_ID: ids,
        SOURCE_TOPIC: topics,
        SOURCE_PARTITION: partitions.astype(np.int32),
        SOURCE_OFFSET: offsets.astype(np.int64),
        SOURCE_TIMESTAMP: pd.array(timestamps, dtype="datetime64[us, UTC]"),
        EXTRACTED_AT: pd.array([at] * n, dtype="datetime64[us, UTC]"),
        TRANSFORM: np.full(n, transform, dtype=object),
        TRANSFORM_VERSION: np.full(n, version, dtype=object),
        RUN_ID: np.full(n, run_id, dtype=object),
        SYNTHETIC: np.ones(n, dtype=bool),
    }
    out = rows_df.copy()
    for name, values in columns.items():
        out[name] = values
    return out


def optional_lineage(
    table: pa.Table, source_system: str | None, effective_time_column: str | None
) -> pa.Table:
    """``table`` with the spec's optional lineage columns appended: ``_rewind_source_system``
    (the same text on every row) and ``_rewind_effective_time`` (the business time column,
    a timestamp or date, as a UTC timestamp)."""
    n = table.num_rows
    if source_system is not None:
        table = table.append_column(
            pa.field(SOURCE_SYSTEM, pa.string(), nullable=False),
            pa.repeat(pa.scalar(source_system, pa.string()), n),
        )
    if effective_time_column is not None:
        if effective_time_column not in table.column_names:
            raise TranslateOutputError(
                f"lineage.effective_time_column {effective_time_column!r} is not an output column; "
                "name a column the translate returns"
            )
        column = table.column(effective_time_column)
        kind = column.type
        if not (pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_null(kind)):
            raise TranslateOutputError(
                f"lineage.effective_time_column {effective_time_column!r} is {kind}, not a time; "
                "return it as a timestamp or date (or type it so in translate.output_schema)"
            )
        if pa.types.is_timestamp(kind) and kind.tz is None:
            column = pc.assume_timezone(column, "UTC")
        table = table.append_column(pa.field(EFFECTIVE_TIME, TIMESTAMP), column.cast(TIMESTAMP))
    return table
