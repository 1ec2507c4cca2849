"""History in bounded chunks without Spark: pyiceberg + pyarrow for the archive, confluent-kafka for Kafka.

:func:`iter_history` plans the window (:func:`rewind.history.plan.plan_history`) and yields
``pyarrow.Table`` chunks of at most ``chunk_rows`` rows in the Arrow form of Spark's Kafka
schema, so a service can process history at its own pace with bounded memory.

Orders:

* ``"offset"``: partition by partition (topic, partition order), each in offset order: the
  archive part, then the Kafka part. Exact and streaming.
* ``"event_time"``: a k-way merge of the partitions by ``(timestamp, partition, offset)``.
  Memory holds, per partition, the records not yet older than the slowest partition's
  newest record (bounded by the time skew between partitions). When every partition's
  timestamps grow along its offsets (always with LogAppendTime), the output is in global
  event-time order, and so in event-time order for every key. A record whose timestamp goes
  backwards within its partition is yielded with the next chunk instead (late); a key's
  records, which Kafka keeps in one partition, then stay in their offset order among
  themselves within a chunk's time ordering.

Every archive range is checked while read: the records yielded must be exactly the plan's
expected count, or :class:`CoverageError` is raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from rewind.catalog import load_catalog
from rewind.core.arrow import kafka_record_schema
from rewind.core.ranges import OffsetRange
from rewind.history.exceptions import CoverageError
from rewind.history.files import ArchiveFile, plan_files
from rewind.history.plan import plan_history
from rewind.history.schema import TP, open_archive
from rewind.spark.kafka_fetch import fetch_ranges

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from rewind.config import Settings
    from rewind.core.windows import WindowRequest
    from rewind.history.plan import HistoryPlan, PartitionHistory, Prefer

Order = Literal["offset", "event_time"]
_READ_BATCH = 65_536


def _to_kafka(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    arrays = []
    for f in schema:
        column = rows["timestamp_type" if f.name == "timestampType" else f.name]
        arrays.append(column.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _clusters(files: list[ArchiveFile]) -> list[list[ArchiveFile]]:
    """Files grouped so that groups do not overlap in offsets (files without bounds join all)."""
    out: list[list[ArchiveFile]] = []
    reach = -1
    for f in files:
        if f.offset_min is None or f.offset_max is None:
            return [files]
        if out and f.offset_min <= reach:
            out[-1].append(f)
        else:
            out.append([f])
        reach = max(reach, f.offset_max)
    return out


def _archive_batches(
    table: Table, snapshot_id: int | None, rng: OffsetRange, schema: pa.Schema
) -> Iterator[pa.Table]:
    """The archived records of one range in offset order, file by file (overlapping files merged)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = ["key", "value", "topic", "partition", "offset", "timestamp", "timestamp_type"]
    if "headers" in schema.names:
        columns.append("headers")

    def read(f: ArchiveFile) -> Iterator[pa.Table]:
        with table.io.new_input(f.path).open() as stream:
            for batch in pq.ParquetFile(stream).iter_batches(batch_size=_READ_BATCH, columns=columns):
                part = pa.Table.from_batches([batch])
                keep = pc.and_(
                    pc.and_(pc.equal(part["topic"], rng.topic), pc.equal(part["partition"], rng.partition)),
                    pc.and_(pc.greater_equal(part["offset"], rng.start), pc.less(part["offset"], rng.end)),
                )
                part = part.filter(keep)
                if part.num_rows:
                    yield _to_kafka(part, schema)

    for group in _clusters(plan_files(table, [rng], snapshot_id)):
        if len(group) == 1:
            yield from read(group[0])
            continue
        together = [t for f in group for t in read(f)]
        if together:
            merged = pa.concat_tables(together)
            yield merged.take(pc.sort_indices(merged, [("offset", "ascending")]))


def sample_ranges(table: Table, snapshot_id: int | None, ranges: Sequence[OffsetRange]) -> pa.Table | None:
    """The archived records of ``ranges`` in Kafka's Arrow shape (a plan's sample of a window
    that lies wholly in the archive); None when none are archived."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa


    schema = kafka_record_schema(False)
    parts = [part for rng in ranges for part in _archive_batches(table, snapshot_id, rng, schema)]
    return pa.concat_tables(parts) if parts else None


def _partition_stream(
    settings: Settings, table: Table, plan: HistoryPlan, p: PartitionHistory, schema: pa.Schema
) -> Iterator[pa.Table]:
    """One partition of the plan in offset order: archive ranges (checked), then Kafka ranges."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    sources = sorted(
        [("archive", r) for r in p.archive_ranges] + [("kafka", r) for r in p.kafka_ranges],
        key=lambda s: s[1].start,
    )
    archived = 0
    for source, rng in sources:
        if not rng.size:
            continue
        if source == "archive":
            for part in _archive_batches(table, plan.archive_snapshot_id, rng, schema):
                archived += part.num_rows
                yield part
        else:
            for batch in fetch_ranges(
                settings.kafka_config(), [rng], include_headers="headers" in schema.names
            ):
                yield pa.Table.from_batches([batch]).cast(schema)
    if p.archive_ranges and archived != p.expected_archive_records:
        raise CoverageError(
            f"the archive returned {archived} records of {p.topic}/{p.partition} in "
            f"{[(r.start, r.end) for r in p.archive_ranges]}, the plan expects {p.expected_archive_records}: "
            "an archive file is missing or was altered"
        )


class _Chunks:
    """Re-cut a stream of tables into tables of exactly ``size`` rows (the last one smaller)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.parts: list[pa.Table] = []
        self.rows = 0

    def add(self, part: pa.Table) -> Iterator[pa.Table]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if part.num_rows == 0:
            return
        self.parts.append(part)
        self.rows += part.num_rows
        while self.rows >= self.size:
            whole = pa.concat_tables(self.parts)
            yield whole.slice(0, self.size).combine_chunks()
            rest = whole.slice(self.size)
            self.parts, self.rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

    def flush(self) -> Iterator[pa.Table]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if self.rows:
            yield pa.concat_tables(self.parts).combine_chunks()
        self.parts, self.rows = [], 0


def _merge_by_time(streams: Mapping[TP, Iterator[pa.Table]], schema: pa.Schema) -> Iterator[pa.Table]:
    """k-way merge of offset-ordered partition streams by (timestamp, partition, offset)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    buffers: dict[TP, pa.Table] = {}
    live = dict(streams)
    while True:
        for tp in list(live):
            while tp not in buffers or buffers[tp].num_rows == 0:
                nxt = next(live[tp], None)
                if nxt is None:
                    del live[tp]
                    break
                buffers[tp] = pa.concat_tables([buffers[tp], nxt]) if tp in buffers else nxt
        pending = {tp: b for tp, b in buffers.items() if b.num_rows}
        if not pending:
            return
        limits = [pc.max(b["timestamp"]) for tp, b in pending.items() if tp in live]
        frontier = min(limits, key=lambda s: s.value) if limits else None
        ready: list[pa.Table] = []
        for tp, b in pending.items():
            if frontier is None:
                ready.append(b)
                buffers[tp] = b.slice(b.num_rows)
                continue
            mask = pc.less_equal(b["timestamp"], frontier)
            ready.append(b.filter(mask))
            buffers[tp] = b.filter(pc.invert(mask))
        merged = pa.concat_tables(ready)
        if merged.num_rows:
            order = pc.sort_indices(
                merged,
                [
                    ("timestamp", "ascending"),
                    ("topic", "ascending"),
                    ("partition", "ascending"),
                    ("offset", "ascending"),
                ],
            )
            yield merged.take(order)


def iter_plan(
    settings: Settings,
    plan: HistoryPlan,
    *,
    chunk_rows: int = 100_000,
    order: Order = "offset",
    include_headers: bool = False,
    catalog: Catalog | None = None,
) -> Iterator[pa.Table]:
    """Yield a planned history window in chunks; see the module docstring."""
    if chunk_rows <= 0:
        raise ValueError("chunk_rows must be positive")
    catalog = catalog or load_catalog(settings)
    table = open_archive(catalog, plan.archive_table)
    schema = kafka_record_schema(include_headers)
    streams = {
        (p.topic, p.partition): _partition_stream(settings, table, plan, p, schema) for p in plan.partitions
    }
    chunks = _Chunks(chunk_rows)
    source: Iterator[pa.Table]
    if order == "offset":
        source = (part for stream in streams.values() for part in stream)
    elif order == "event_time":
        source = _merge_by_time(streams, schema)
    else:
        raise ValueError(f"order must be 'offset' or 'event_time', got {order!r}")
    for part in source:
        yield from chunks.add(part)
    yield from chunks.flush()


def iter_history(
    settings: Settings,
    topics: Sequence[str],
    archive: str,
    window: WindowRequest | None = None,
    *,
    chunk_rows: int = 100_000,
    order: Order = "offset",
    include_headers: bool = False,
    declared_log_start: Mapping[TP, int] | None = None,
    allow_gaps: bool = False,
    prefer: Prefer = "kafka",
    catalog: Catalog | None = None,
) -> Iterator[pa.Table]:
    """Plan ``window`` over ``topics`` and ``archive``, then yield it in chunks (no Spark)."""
    catalog = catalog or load_catalog(settings)
    plan = plan_history(
        settings,
        topics,
        archive,
        window,
        declared_log_start=declared_log_start,
        allow_gaps=allow_gaps,
        prefer=prefer,
        catalog=catalog,
    )
    yield from iter_plan(
        settings, plan, chunk_rows=chunk_rows, order=order, include_headers=include_headers, catalog=catalog
    )
