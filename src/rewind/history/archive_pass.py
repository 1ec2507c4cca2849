"""One archive pass in its steps: plan the ranges, write them from Spark tasks, commit once.

The order of the steps and why a pass is exactly once are in :mod:`rewind.history.archive`,
whose :func:`~rewind.history.archive.archive_once` runs them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from rewind import faults
from rewind.core.ranges import OffsetRange, group_for_tasks
from rewind.core.windows import BoundSpec, WindowRequest
from rewind.history import spans
from rewind.history.archive_files import RESULT_SCHEMA, ArchiveFiles, FetchAndArchive, TaskContext
from rewind.history.exceptions import (
    ArchiveConflictError,
    ArchiveLossError,
    ArchivePositionError,
    HistoryError,
)
from rewind.history.schema import (
    LOST_PROPERTY,
    MODE_PROPERTY,
    PASS_PROPERTY,
    RANGES_PROPERTY,
    RECORDS_PROPERTY,
    SKIPPED_PROPERTY,
    TP,
    ArchiveState,
    archive_state,
    gaps_arrow_schema,
    open_gaps,
    tp_key,
)
from rewind.kafka import clients
from rewind.kafka.resolve import resolve
from rewind.spark.session import default_parallelism

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings


Mode = Literal["once", "continuous"]
ReadVia = Literal["tasks", "reader"]
CHUNK_RECORDS = 500_000
RANGES_PER_TASK = 4  # as the rewind-kafka reader: one consumer fetches several partitions at once
POLL_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ArchivePass:
    """A planned pass: what to read, on top of which state. Plain data, JSON-friendly."""

    pass_id: str
    table: str
    mode: Mode
    base: ArchiveState
    ranges: tuple[OffsetRange, ...]
    lost: tuple[OffsetRange, ...] = ()
    new_partitions: tuple[TP, ...] = ()
    started_at_us: int = 0
    notes: tuple[str, ...] = ()

    @property
    def offsets(self) -> int:
        return sum(r.size for r in self.ranges)


@dataclass
class Written:
    """What the tasks of a pass wrote: files with their row counts, and runs of offsets seen."""

    files: list[tuple[str, int]] = field(default_factory=list)
    runs: dict[TP, list[tuple[int, int]]] = field(default_factory=dict)
    rows: dict[TP, int] = field(default_factory=dict)


@dataclass
class PassResult:
    """The outcome of one pass (or one micro-batch of a continuous archive)."""

    pass_id: str
    table: str
    mode: Mode
    committed: bool
    snapshot_id: int | None
    records: int
    skipped_offsets: int
    gaps: int
    lost: list[dict[str, Any]]
    files: int
    partitions: dict[str, dict[str, int]]
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass_id": self.pass_id,
            "table": self.table,
            "mode": self.mode,
            "committed": self.committed,
            "snapshot_id": self.snapshot_id,
            "records": self.records,
            "skipped_offsets": self.skipped_offsets,
            "gaps": self.gaps,
            "lost": self.lost,
            "files": self.files,
            "partitions": self.partitions,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / self.seconds) if self.seconds > 0 else None,
            "notes": self.notes,
        }


def plan_pass(
    settings: Settings,
    topics: Sequence[str],
    table: Table,
    identifier: str,
    *,
    mode: Mode = "once",
    allow_loss: bool = False,
    declared_log_start: Mapping[TP, int] | None = None,
    max_offsets: int | None = None,
) -> ArchivePass:
    """Steps 1-2: the ranges ``[hw, high)`` per partition of ``topics`` on top of ``table``.

    ``max_offsets`` caps the offsets of the pass (shared over partitions in order), for
    passes of bounded size; the next pass continues where this one stops.
    """
    if not topics:
        raise HistoryError("name at least one topic to archive")
    state = archive_state(table)
    conf = settings.kafka_config()

    metadata = clients.cluster_metadata(conf)
    starts: dict[TP, int] = {}
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            raise HistoryError(f"topic '{topic}' does not exist; create it or check the name")
        for partition in meta.partitions:
            starts[(topic, partition)] = state.hw.get((topic, partition), -2)
    request = WindowRequest(
        subscribe=tuple(dict.fromkeys(topics)),
        start=BoundSpec(None, starts, option="archive high-water"),
    )
    plan = resolve(conf, request, declared_log_start=declared_log_start)
    ranges: list[OffsetRange] = []
    lost: list[OffsetRange] = []
    new: list[TP] = []
    notes: list[str] = list(plan.notes)
    budget = max_offsets
    for p in plan.partitions:
        tp = (p.topic, p.partition)
        hw = state.hw.get(tp)
        if hw is None:
            new.append(tp)
        else:
            if hw > p.high:
                raise ArchivePositionError(
                    f"the archive of {p.topic}/{p.partition} is at offset {hw}, after the end of the log "
                    f"({p.high}): the topic was recreated or the broker lost records; archive it into a "
                    "new table"
                )
            if p.missing_below_low is not None:
                gone = p.missing_below_low
                if not allow_loss:
                    raise ArchiveLossError(
                        f"offsets [{gone.start}, {gone.end}) of {p.topic}/{p.partition} left Kafka "
                        f"before they were archived (the log now starts at {p.low}); rerun with --allow-loss "
                        "to record them as lost and continue"
                    )
                lost.append(gone)
                notes.append(
                    f"{p.topic}/{p.partition}: offsets [{gone.start}, {gone.end}) lost before archiving"
                )
        end = p.end
        if budget is not None:
            end = min(end, p.start + budget)
            budget -= end - p.start
        ranges.append(OffsetRange(p.topic, p.partition, p.start, end))
    return ArchivePass(
        pass_id=f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}",
        table=identifier,
        mode=mode,
        base=state,
        ranges=tuple(ranges),
        lost=tuple(lost),
        new_partitions=tuple(new),
        started_at_us=int(time.time() * 1_000_000),
        notes=tuple(notes),
    )


def data_folder(table: Table) -> str:
    return f"{table.location().rstrip('/')}/data"


def write_ranges(
    spark: SparkSession,
    settings: Settings,
    archive_pass: ArchivePass,
    folder: str,
    *,
    chunk_records: int = CHUNK_RECORDS,
    via: ReadVia = "tasks",
    source: DataFrame | None = None,
    floors: Mapping[TP, int] | None = None,
) -> Written:
    """Step 3: read the pass's ranges and write archive files from Spark tasks.

    ``via="tasks"`` (default): each task reads its ranges itself with the ``rewind-kafka``
    reader's fetch loop and writes the records, which never cross into the JVM;
    ``via="reader"``: ``spark.read.format("rewind-kafka")`` with the ``ranges`` option, then
    ``mapInArrow``. Both cut the ranges into the same tasks (chunks of ``chunk_records``,
    grouped by :func:`rewind.core.ranges.group_for_tasks`). ``source`` replaces the read (a
    stream's micro-batch); ``floors`` drops records below a per-partition offset (a replayed
    micro-batch).
    """
    chunks = [c for r in archive_pass.ranges if r.size > 0 for c in r.split(chunk_records)]
    if source is None and not chunks:
        return Written()
    ctx = TaskContext(
        archive_pass.pass_id,
        folder,
        archive_pass.started_at_us,
        {tp_key(*tp): o for tp, o in (floors or {}).items()},
    )
    results: DataFrame
    if source is not None:
        results = source.mapInArrow(ArchiveFiles(ctx), RESULT_SCHEMA)
    elif via == "tasks":
        tasks = [
            [c.to_dict() for c in t]
            for t in group_for_tasks(chunks, RANGES_PER_TASK, default_parallelism(spark))
        ]
        fetch = FetchAndArchive(ctx, settings.kafka_config(), tasks, POLL_TIMEOUT_S)
        results = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fetch, RESULT_SCHEMA)
    else:
        reader = (
            spark.read.format("rewind-kafka")
            .option("ranges", json.dumps([c.to_dict() for c in chunks]))
            .option("includeHeaders", "true")
            .option("rangesPerTask", str(RANGES_PER_TASK))
            .option("minPartitions", str(default_parallelism(spark)))
        )
        for key, value in settings.kafka_config().items():
            reader = reader.option(f"kafka.{key}", str(value))
        results = reader.load().mapInArrow(ArchiveFiles(ctx), RESULT_SCHEMA)
    written = Written()
    for row in results.collect():
        tp = (row.topic, row.partition)
        if row.kind == "file":
            written.files.append((row.payload, int(row.rows)))
        else:
            written.runs.setdefault(tp, []).extend((int(s), int(e)) for s, e in json.loads(row.payload))
            written.rows[tp] = written.rows.get(tp, 0) + int(row.rows)
    written.runs = {tp: spans.merge(r) for tp, r in written.runs.items()}
    return written


def _check_written(archive_pass: ArchivePass, written: Written) -> dict[TP, list[tuple[int, int]]]:
    """The gaps of every range; raises when the tasks saw offsets outside the ranges or twice."""
    by_tp = {(r.topic, r.partition): r for r in archive_pass.ranges}
    gaps: dict[TP, list[tuple[int, int]]] = {}
    for tp, runs in written.runs.items():
        rng = by_tp.get(tp)
        if rng is None or spans.subtract(runs, [(rng.start, rng.end)]):
            raise ArchivePositionError(
                f"the pass read offsets of {tp[0]}/{tp[1]} outside its planned range; nothing was committed"
            )
        if spans.total(runs) != written.rows.get(tp, 0):
            raise ArchivePositionError(
                f"the pass read {written.rows.get(tp, 0)} records of {tp[0]}/{tp[1]} for "
                f"{spans.total(runs)} distinct offsets; nothing was committed"
            )
    for tp, rng in by_tp.items():
        if rng.size:
            gaps[tp] = spans.subtract([(rng.start, rng.end)], written.runs.get(tp, []))
    file_rows = sum(n for _p, n in written.files)
    if file_rows != sum(written.rows.values()):
        raise ArchivePositionError(
            f"the pass wrote {file_rows} rows into files for {sum(written.rows.values())} records read; "
            "nothing was committed"
        )
    return gaps


def _record_gaps(
    catalog: Catalog,
    archive_pass: ArchivePass,
    gaps: Mapping[TP, list[tuple[int, int]]],
) -> int:
    """Step 4: append the pass's gaps (skipped and lost) to ``<table>__gaps``; returns the count."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    for (topic, partition), found in sorted(gaps.items()):
        for start, end in found:
            rows.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "start_offset": start,
                    "end_offset": end,
                    "kind": "skipped",
                    "pass_id": archive_pass.pass_id,
                    "recorded_at": now,
                }
            )
    for gone in archive_pass.lost:
        rows.append(
            {
                "topic": gone.topic,
                "partition": gone.partition,
                "start_offset": gone.start,
                "end_offset": gone.end,
                "kind": "lost",
                "pass_id": archive_pass.pass_id,
                "recorded_at": now,
            }
        )
    if not rows:
        return 0
    table = open_gaps(catalog, archive_pass.table, create=True)
    assert table is not None
    table.append(pa.Table.from_pylist(rows, schema=gaps_arrow_schema()))
    return len(rows)


def commit_pass(
    catalog: Catalog,
    table: Table,
    archive_pass: ArchivePass,
    written: Written,
    *,
    ends: Mapping[TP, int] | None = None,
    started: float | None = None,
) -> PassResult:
    """Steps 4-5: record the gaps, then commit files and high-water together, once.

    ``table`` must be the table object the pass was planned on: its snapshot is the parent
    the commit asserts. ``ends`` overrides the new high-water per partition (a stream batch's
    end offsets, which equal its ranges' ends).
    """
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import CommitFailedException

    started = time.monotonic() if started is None else started
    gaps = _check_written(archive_pass, written)
    hw = dict(archive_pass.base.hw)
    start = dict(archive_pass.base.start)
    moved = False
    for rng in archive_pass.ranges:
        tp = (rng.topic, rng.partition)
        if tp not in hw:
            start[tp] = rng.start
        new_hw = max(hw.get(tp, rng.start), rng.end, (ends or {}).get(tp, 0))
        if hw.get(tp) != new_hw:
            moved = True
        hw[tp] = new_hw
    records = sum(n for _p, n in written.files)
    skipped = sum(spans.total(g) for g in gaps.values())
    partitions = {
        tp_key(r.topic, r.partition): {
            "from": r.start,
            "to": r.end,
            "records": written.rows.get((r.topic, r.partition), 0),
            "skipped": spans.total(gaps.get((r.topic, r.partition), [])),
        }
        for r in archive_pass.ranges
        if r.size
    }
    lost_dicts = [g.to_dict() for g in archive_pass.lost]

    def result(committed: bool, snapshot_id: int | None, gap_rows: int) -> PassResult:
        return PassResult(
            archive_pass.pass_id,
            archive_pass.table,
            archive_pass.mode,
            committed,
            snapshot_id,
            records,
            skipped,
            gap_rows,
            lost_dicts,
            len(written.files),
            partitions,
            time.monotonic() - started,
            list(archive_pass.notes),
        )

    if not moved and not written.files and not archive_pass.lost:
        return result(False, archive_pass.base.snapshot_id, 0)

    gap_rows = _record_gaps(catalog, archive_pass, gaps)
    faults.point("archive-before-commit")
    props = {
        **ArchiveState(hw, start).properties(),
        PASS_PROPERTY: archive_pass.pass_id,
        MODE_PROPERTY: archive_pass.mode,
        RANGES_PROPERTY: json.dumps(
            {tp_key(r.topic, r.partition): [r.start, r.end] for r in archive_pass.ranges if r.size},
            separators=(",", ":"),
        ),
        RECORDS_PROPERTY: str(records),
        SKIPPED_PROPERTY: str(skipped),
    }
    if archive_pass.lost:
        props[LOST_PROPERTY] = json.dumps(lost_dicts, separators=(",", ":"))
    tx = table.transaction()  # on the table the pass was planned on: its snapshot is asserted
    try:
        if written.files:
            tx.add_files(
                [p for p, _n in written.files], snapshot_properties=props, check_duplicate_files=False
            )
        else:
            # lazy: avoids pyarrow at import
            import pyarrow as pa

            tx.append(pa.Table.from_batches([], schema=table.schema().as_arrow()), snapshot_properties=props)
        tx.commit_transaction()
    except CommitFailedException as exc:
        raise ArchiveConflictError(
            f"another writer committed to {archive_pass.table} during pass {archive_pass.pass_id}; "
            f"nothing of this pass was committed (its files are orphans); run the pass again ({exc})"
        ) from exc
    faults.point("archive-after-commit")
    head = catalog.load_table(archive_pass.table).current_snapshot()
    return result(True, head.snapshot_id if head else None, gap_rows)
