"""The archive table: its fixed schema, its partitioning, and its state in snapshot summaries.

Schema (fixed; every archive has exactly these columns, in this order, whatever the topic):

=================  ==================================  ==========================================
column             Iceberg type                        meaning
=================  ==================================  ==========================================
``key``            binary (optional)                   the record key, raw bytes
``value``          binary (optional)                   the record value, raw bytes (null: tombstone)
``headers``        list<struct<key string,             the record headers in order, null when none
                   value binary>> (optional)           (as Spark's Kafka source; pyiceberg 0.12's
                                                       ``scan().to_arrow()`` shows null as [])
``topic``          string (required)                   coordinates of the record in Kafka
``partition``      int (required)
``offset``         long (required)
``timestamp``      timestamptz (required)              the record timestamp (microseconds, UTC)
``timestamp_type`` int (required)                      0 CreateTime, 1 LogAppendTime (Kafka's codes)
``event_date``     date (required)                     the UTC date of ``timestamp``
``archived_at``    timestamptz (required)              when the archive pass that copied it started
=================  ==================================  ==========================================

Partitioning: ``day(timestamp)``. A filter on ``timestamp`` (the way a window in time is
asked) prunes whole days through Iceberg's partition projection, with no extra column to
keep in step; ``event_date`` holds the same day as a plain column for engines and people
who filter by date. Files are written per ``(topic, partition, day)`` and sorted by offset
(the table's declared sort order is ``topic, partition, offset``), so the file statistics of
``topic``, ``partition`` and ``offset`` prune an offset-range read down to the files that
hold the range.

State, in the snapshot summary of every archive commit (the same commit as the data, so a
crash can neither duplicate nor skip records):

* ``rewind.archive.hw``: JSON ``{"topic/partition": next offset}``, the archived high-water
  of every partition archived so far: offsets below it were read contiguously and copied;
* ``rewind.archive.from``: JSON ``{"topic/partition": offset}``, where each partition's archive
  starts (the log start when it was first archived): offsets below it were never copied;
* ``rewind.archive.pass``, ``.mode``, ``.ranges`` (``{"topic/partition": [start, end]}`` read by
  this pass), ``.records``, ``.skipped`` (offsets the broker skipped in those ranges) and
  ``.lost`` (ranges gone from Kafka before they were copied, ``allow_loss`` only).

The current state is the summary of the newest archive commit found walking back from the
table's current snapshot (other commits, such as a compaction that forgot it, are skipped).

Gaps seen while reading (transaction markers, aborted records under ``read_committed``,
compacted-away records: offsets inside a contiguously read range that returned no record)
are rows of the companion table ``<table>__gaps`` (``topic, partition, start_offset,
end_offset, kind, pass_id, recorded_at``), written *before* the data commit: a gap is a fact
about the broker's log whether or not the pass that saw it committed, and readers merge the
ranges, so a retried pass recording the same gap again changes nothing. ``kind`` is
``skipped`` (the broker skipped the offsets) or ``lost`` (gone from Kafka before the archive
copied them; recorded only with ``allow_loss``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.history.exceptions import ArchiveTableError
from rewind.history.spans import merge

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

TP = tuple[str, int]

SCHEMA_VERSION = "1"
HW_PROPERTY = "rewind.archive.hw"
FROM_PROPERTY = "rewind.archive.from"
PASS_PROPERTY = "rewind.archive.pass"
MODE_PROPERTY = "rewind.archive.mode"
RANGES_PROPERTY = "rewind.archive.ranges"
RECORDS_PROPERTY = "rewind.archive.records"
SKIPPED_PROPERTY = "rewind.archive.skipped"
LOST_PROPERTY = "rewind.archive.lost"
TABLE_MARK = "rewind.archive.schema-version"
GAPS_SUFFIX = "__gaps"

COLUMNS = (
    "key",
    "value",
    "headers",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestamp_type",
    "event_date",
    "archived_at",
)


def tp_key(topic: str, partition: int) -> str:
    """``topic/partition``: unambiguous, as a topic name cannot hold ``/``."""
    return f"{topic}/{partition}"


def parse_tp(key: str) -> TP:
    topic, _, partition = key.rpartition("/")
    return topic, int(partition)


def iceberg_schema() -> Schema:
    # lazy: avoids pyiceberg at import
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        DateType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    header = StructType(
        NestedField(12, "key", StringType(), required=False),
        NestedField(13, "value", BinaryType(), required=False),
    )
    return Schema(
        NestedField(1, "key", BinaryType(), required=False),
        NestedField(2, "value", BinaryType(), required=False),
        NestedField(3, "headers", ListType(11, header, element_required=False), required=False),
        NestedField(4, "topic", StringType(), required=True),
        NestedField(5, "partition", IntegerType(), required=True),
        NestedField(6, "offset", LongType(), required=True),
        NestedField(7, "timestamp", TimestamptzType(), required=True),
        NestedField(8, "timestamp_type", IntegerType(), required=True),
        NestedField(9, "event_date", DateType(), required=True),
        NestedField(10, "archived_at", TimestamptzType(), required=True),
    )


def arrow_schema() -> pa.Schema:
    """The Arrow schema of the archive's Parquet files (required columns are not nullable)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("headers", pa.list_(pa.field("element", header))),
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("timestamp", ts, nullable=False),
            pa.field("timestamp_type", pa.int32(), nullable=False),
            pa.field("event_date", pa.date32(), nullable=False),
            pa.field("archived_at", ts, nullable=False),
        ]
    )


def gaps_schema() -> Schema:
    # lazy: avoids pyiceberg at import
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType, TimestamptzType

    return Schema(
        NestedField(1, "topic", StringType(), required=True),
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "start_offset", LongType(), required=True),
        NestedField(4, "end_offset", LongType(), required=True),
        NestedField(5, "kind", StringType(), required=True),
        NestedField(6, "pass_id", StringType(), required=True),
        NestedField(7, "recorded_at", TimestamptzType(), required=True),
    )


def gaps_arrow_schema() -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("start_offset", pa.int64(), nullable=False),
            pa.field("end_offset", pa.int64(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("pass_id", pa.string(), nullable=False),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


def split_name(identifier: str) -> tuple[str, str]:
    namespace, _, name = identifier.rpartition(".")
    if not namespace or not name:
        raise ArchiveTableError(
            f"archive table {identifier!r}: expected namespace.table, like lake.orders_archive"
        )
    return namespace, name


def gaps_table_name(identifier: str) -> str:
    return f"{identifier}{GAPS_SUFFIX}"


# Commits to the archive must never be rebased onto a concurrent commit: the high-water in a
# commit is only true on top of the snapshot the pass read it from. pyiceberg retries
# conflicting appends by default, so the archive turns that off.
_TABLE_PROPERTIES = {
    TABLE_MARK: SCHEMA_VERSION,
    "commit.retry.num-retries": "0",
    "write.parquet.compression-codec": "zstd",
}


def _load(catalog: Catalog, identifier: str) -> Table | None:
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def open_archive(catalog: Catalog, identifier: str, create: bool = False) -> Table:
    """The archive table, created with the fixed schema when ``create``; checked either way."""
    split_name(identifier)
    table = _load(catalog, identifier)
    if table is None:
        if not create:
            raise ArchiveTableError(
                f"archive table {identifier} does not exist; create it with `rewind archive TOPIC --table "
                f"{identifier}`"
            )
        table = _create(catalog, identifier)
    check_archive(table, identifier)
    if table.metadata.properties.get("commit.retry.num-retries") != "0":
        with table.transaction() as tx:
            tx.set_properties({"commit.retry.num-retries": "0"})
        table = catalog.load_table(identifier)
    return table


def _create(catalog: Catalog, identifier: str) -> Table:
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import DayTransform, IdentityTransform

    namespace, _ = split_name(identifier)
    catalog.create_namespace_if_not_exists(namespace)
    schema = iceberg_schema()
    spec = PartitionSpec(
        PartitionField(source_id=7, field_id=1000, transform=DayTransform(), name="timestamp_day")
    )
    order = SortOrder(
        SortField(source_id=4, transform=IdentityTransform()),
        SortField(source_id=5, transform=IdentityTransform()),
        SortField(source_id=6, transform=IdentityTransform()),
    )
    props = {**_TABLE_PROPERTIES, "schema.name-mapping.default": schema.name_mapping.model_dump_json()}
    try:
        return catalog.create_table(
            identifier, schema=schema, partition_spec=spec, sort_order=order, properties=props
        )
    except TableAlreadyExistsError:  # created concurrently by another archiver
        return catalog.load_table(identifier)


def check_archive(table: Table, identifier: str) -> None:
    """Refuse a table that is not a Rewind archive: reading it as one would be wrong."""
    have = [f.name for f in table.schema().fields]
    if have != list(COLUMNS):
        raise ArchiveTableError(
            f"{identifier} is not a Rewind archive: its columns are {have}, an archive has {list(COLUMNS)}"
        )


def open_gaps(catalog: Catalog, identifier: str, create: bool = False) -> Table | None:
    name = gaps_table_name(identifier)
    table = _load(catalog, name)
    if table is None and create:
        # lazy: avoids pyiceberg at import
        from pyiceberg.exceptions import TableAlreadyExistsError

        try:
            table = catalog.create_table(name, schema=gaps_schema(), properties={TABLE_MARK: SCHEMA_VERSION})
        except TableAlreadyExistsError:
            table = catalog.load_table(name)
    return table


# -- state ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveState:
    """Where the archive stands: per partition, ``[start, hw)`` was copied (gaps aside).

    ``snapshot_id`` is the table's current snapshot (the one a commit must build on), and
    ``state_snapshot_id`` the archive commit the state was read from.
    """

    hw: Mapping[TP, int] = field(default_factory=dict)
    start: Mapping[TP, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    state_snapshot_id: int | None = None

    def coverage(self, tp: TP) -> tuple[int, int] | None:
        """``(from, hw)`` of a partition, or None when it was never archived."""
        if tp not in self.hw:
            return None
        return self.start.get(tp, 0), self.hw[tp]

    def properties(self) -> dict[str, str]:
        return {
            HW_PROPERTY: dump_offsets(self.hw),
            FROM_PROPERTY: dump_offsets(self.start),
        }


def dump_offsets(offsets: Mapping[TP, int]) -> str:
    return json.dumps({tp_key(t, p): int(o) for (t, p), o in sorted(offsets.items())}, separators=(",", ":"))


def load_offsets(text: str | None) -> dict[TP, int]:
    if not text:
        return {}
    return {parse_tp(k): int(v) for k, v in json.loads(text).items()}


def summary_properties(snapshot: Snapshot | None) -> dict[str, str]:
    if snapshot is None or snapshot.summary is None:
        return {}
    return dict(snapshot.summary.additional_properties)


def archive_state(table: Table, snapshot_id: int | None = None) -> ArchiveState:
    """The archive's state at a snapshot (default: the current one), from snapshot summaries."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.table.snapshots import ancestors_of

    head = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else table.current_snapshot()
    if head is None:
        return ArchiveState()
    for snap in ancestors_of(head, table.metadata):
        props = summary_properties(snap)
        if HW_PROPERTY in props:
            return ArchiveState(
                load_offsets(props[HW_PROPERTY]),
                load_offsets(props.get(FROM_PROPERTY)),
                head.snapshot_id,
                snap.snapshot_id,
            )
    return ArchiveState(snapshot_id=head.snapshot_id)


def recorded_gaps(
    catalog: Catalog, identifier: str, partitions: list[TP] | None = None
) -> dict[tuple[TP, str], list[tuple[int, int]]]:
    """Gaps recorded by archive passes, merged, keyed by ``((topic, partition), kind)``."""
    table = open_gaps(catalog, identifier)
    if table is None or table.current_snapshot() is None:
        return {}
    # lazy: avoids pyiceberg at import
    import pyiceberg.expressions as ex

    # pyiceberg's predicates are pydantic models that mypy cannot call positionally
    e: Any = ex

    row_filter: Any = e.AlwaysTrue()
    if partitions:
        terms = [e.And(e.EqualTo("topic", t), e.EqualTo("partition", p)) for t, p in sorted(set(partitions))]
        row_filter = terms[0]
        for term in terms[1:]:
            row_filter = e.Or(row_filter, term)
    rows = table.scan(row_filter=row_filter).to_arrow().to_pylist()
    found: dict[tuple[TP, str], list[tuple[int, int]]] = {}
    for r in rows:
        found.setdefault(((r["topic"], r["partition"]), r["kind"]), []).append(
            (r["start_offset"], r["end_offset"])
        )
    return {key: merge(spans) for key, spans in found.items()}
