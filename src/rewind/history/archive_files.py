"""The task side of an archive pass: Kafka record batches in, archive Parquet files out.

Runs inside Spark tasks (``mapInArrow`` over the ``rewind-kafka`` reader, as
:mod:`rewind.spark.job_stage` does): no Spark import here, only pyarrow. Each task writes one
file per ``(topic, partition, day)`` it sees (a day is the partition of the archive table,
and a file of one Kafka partition sorted by offset keeps the offset statistics tight), and
returns one small row per file plus one per Kafka partition with the *runs* of offsets it
saw: the driver turns runs into gaps, the offsets the broker skipped inside a range read
contiguously. Nothing is visible until the driver commits the files; a failed or retried
task leaves orphan files, never data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.parquet import open_writer
from rewind.core.ranges import OffsetRange
from rewind.core.store import WarehouseStore, active_store
from rewind.history.schema import arrow_schema, tp_key
from rewind.spark.kafka_fetch import fetch_ranges, partitions_in

if TYPE_CHECKING:
    import pyarrow as pa

RESULT_SCHEMA = "kind string, topic string, partition int, payload string, rows long"

# rows buffered per file before a row group is written, and rows per file before rolling
_FLUSH_ROWS = 131_072
_FILE_ROWS = 4_000_000


@dataclass(frozen=True)
class TaskContext:
    """Everything a task needs, as plain data (pickled to every task).

    ``floors`` maps ``topic/partition`` to the first offset to keep: a replayed stream batch
    may hold records an earlier commit already archived.
    """

    pass_id: str
    data_folder: str
    archived_at_us: int
    floors: dict[str, int] = field(default_factory=dict)
    store: WarehouseStore = field(default_factory=active_store)
    """The warehouse's filesystem properties, captured in the driver (:mod:`rewind.core.store`)."""


class _File:
    def __init__(self, ctx: TaskContext, schema: pa.Schema, topic: str, partition: int, day: int) -> None:
        self.ctx, self.schema = ctx, schema
        self.topic, self.partition, self.day = topic, partition, day
        self.writer: Any = None
        self.path = ""
        self.rows = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.done: list[tuple[str, int]] = []

    def add(self, rows: pa.Table) -> None:
        self.pending.append(rows)
        self.pending_rows += rows.num_rows
        if self.pending_rows >= _FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if not self.pending_rows:
            return
        if self.writer is None:
            self._open()
        self.writer.write_table(pa.concat_tables(self.pending), row_group_size=_FLUSH_ROWS * 2)
        self.rows += self.pending_rows
        self.pending, self.pending_rows = [], 0
        if self.rows >= _FILE_ROWS:
            self.close()

    def _open(self) -> None:
        where = f"{self.topic}-{self.partition}-d{self.day}"
        prefix = f"archive-{self.ctx.pass_id}-{where}"
        self.writer, self.path = open_writer(self.ctx.data_folder, prefix, self.schema, self.ctx.store)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.done.append((self.path, self.rows))
        self.writer, self.path, self.rows = None, "", 0

    def finish(self) -> list[tuple[str, int]]:
        self.flush()
        self.close()
        return self.done


def to_archive_rows(batch: pa.Table, archived_at_us: int) -> pa.Table:
    """Kafka source columns (Spark's schema, with or without headers) to the archive schema."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema()
    n = batch.num_rows
    ts = batch["timestamp"].cast(pa.timestamp("us", tz="UTC"))
    headers = (
        batch["headers"].cast(schema.field("headers").type)
        if "headers" in batch.column_names
        else pa.nulls(n, schema.field("headers").type)
    )
    columns = [
        batch["key"].cast(pa.binary()),
        batch["value"].cast(pa.binary()),
        headers,
        batch["topic"].cast(pa.string()),
        batch["partition"].cast(pa.int32()),
        batch["offset"].cast(pa.int64()),
        ts,
        batch["timestampType"].cast(pa.int32()),
        pc.cast(ts, pa.date32()),
        pa.array(np.full(n, archived_at_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


class ArchiveFiles:
    """The ``mapInArrow`` function of an archive pass; see the module docstring."""

    def __init__(self, ctx: TaskContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids numpy, pyarrow at import
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = arrow_schema()
        files: dict[tuple[str, int, int], _File] = {}
        offsets_seen: dict[tuple[str, int], list[Any]] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            for topic, partition in partitions_in(table):
                part = table.filter(
                    pc.and_(pc.equal(table["topic"], topic), pc.equal(table["partition"], partition))
                )
                floor = self.ctx.floors.get(tp_key(topic, partition))
                if floor is not None:
                    part = part.filter(pc.greater_equal(part["offset"], floor))
                if part.num_rows == 0:
                    continue
                rows = to_archive_rows(part, self.ctx.archived_at_us)
                offsets_seen.setdefault((topic, partition), []).append(rows["offset"].to_numpy())
                days = rows["event_date"].cast(pa.int32())
                unique_days = pc.unique(days).to_pylist()
                for day in unique_days:
                    in_day = rows if len(unique_days) == 1 else rows.filter(pc.equal(days, day))
                    key = (topic, partition, day)
                    out = files.get(key) or files.setdefault(
                        key, _File(self.ctx, schema, topic, partition, day)
                    )
                    out.add(in_day)
        result: list[dict[str, Any]] = []
        for (topic, partition, _day), out in sorted(files.items()):
            for path, count in out.finish():
                result.append(
                    {"kind": "file", "topic": topic, "partition": partition, "payload": path, "rows": count}
                )
        for (topic, partition), chunks in sorted(offsets_seen.items()):
            offsets = np.sort(np.concatenate(chunks))
            result.append(
                {
                    "kind": "runs",
                    "topic": topic,
                    "partition": partition,
                    "payload": json.dumps(_runs(offsets)),
                    "rows": int(offsets.size),
                }
            )
        if result:
            yield pa.RecordBatch.from_pylist(result, schema=result_arrow_schema())


class FetchAndArchive:
    """The ``mapInArrow`` function of a pass read inside its tasks: ids of tasks in, results out.

    Each id names one task's ranges (distinct Kafka partitions, read together by one consumer
    with :func:`rewind.spark.kafka_fetch.fetch_ranges`, the hot loop of the ``rewind-kafka``
    reader), and the records go straight into :class:`ArchiveFiles`. Records never cross into
    the JVM and back, which the reader + ``mapInArrow`` path costs (measured about twice as
    slow, see ``bench/history.py``).
    """

    def __init__(
        self, ctx: TaskContext, conf: dict[str, Any], tasks: list[list[dict[str, Any]]], poll_timeout_s: float
    ) -> None:
        self.ctx, self.conf, self.tasks, self.poll_timeout_s = ctx, conf, tasks, poll_timeout_s

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for task_id in batch.column(0).to_pylist():
                faults.pause("archive-task-read")  # tests: the broker goes away here
                ranges = [OffsetRange.from_dict(d) for d in self.tasks[task_id]]
                records = fetch_ranges(
                    self.conf, ranges, include_headers=True, poll_timeout_s=self.poll_timeout_s
                )
                yield from ArchiveFiles(self.ctx)(records)


def _runs(offsets: Any) -> list[list[int]]:
    """``[[start, end), ...]`` runs of consecutive offsets, from a sorted numpy array."""
    # lazy: avoids numpy at import
    import numpy as np

    if offsets.size == 0:
        return []
    breaks = np.nonzero(np.diff(offsets) != 1)[0]
    starts = np.concatenate([[offsets[0]], offsets[breaks + 1]])
    ends = np.concatenate([offsets[breaks] + 1, [offsets[-1] + 1]])
    return [[int(s), int(e)] for s, e in zip(starts, ends, strict=True)]


def result_arrow_schema() -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return pa.schema(
        [
            ("kind", pa.string()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("payload", pa.string()),
            ("rows", pa.int64()),
        ]
    )
