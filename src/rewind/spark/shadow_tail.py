"""A shadow's live tail: a streaming query over the live topic, one commit per micro-batch.

The query reads with the ``rewind-kafka`` stream reader from where the history run ended,
with its Spark checkpoint in the shadow's state folder. ``foreachBatch`` hands each
micro-batch to the caller as work units: the exact ``[start, end)`` per partition that Spark
planned, read from the checkpoint's offset log (batch N runs from the ends of batch N-1, or
from the history's end for batch 0). A unit's id is its range, so a batch that Spark replays
after a crash (planned and written, not yet marked committed in the checkpoint) has the same
ids, and the sink, which records unit ids in the same transaction as the rows, knows it has
them already: exactly once per micro-batch.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.core.counts import RecordCounts
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.spark.job_stage import (
    RESULT_SCHEMA,
    ProcessUnits,
    StageContext,
    StageError,
    UnitOutput,
    task_error,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]


class TailCheckpointError(RewindError):
    """The tail's checkpoint does not hold the offsets of a batch Spark is running."""


@dataclass(frozen=True)
class TailBatch:
    """One micro-batch: its id and the exact ranges it reads (partitions that moved)."""

    batch_id: int
    units: tuple[WorkUnit, ...]

    @property
    def ends(self) -> dict[tuple[str, int], int]:
        return {(u.topic, u.partition): u.end for u in self.units}


def offset_log(checkpoint: str | Path, batch_id: int) -> Offsets | None:
    """The source offsets Spark wrote for ``batch_id`` (``offsets/<id>``: version, metadata, offsets)."""
    path = Path(checkpoint) / "offsets" / str(batch_id)
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    if len(lines) < 3:
        raise TailCheckpointError(f"{path} holds no source offsets; remove the checkpoint and start again")
    data: Offsets = json.loads(lines[2])
    return data


_CUT_SHORT = re.compile(r"^\.\.?\d+\.[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.tmp(\.crc)?$")
"""A log entry Spark began and never put in place: ``.<batch>.<uuid>.tmp`` (and its checksum)."""


def drop_cut_short_writes(checkpoint: str | Path) -> list[Path]:
    """Remove what writes cut short left in the checkpoint's offset and commit logs; returns them.

    Spark writes each entry of those logs to a hidden temporary file and renames it into place,
    so a query stopped or killed between the two leaves the temporary file behind. It holds no
    batch (Spark reads only entries in place), but Spark refuses to start a query on a
    checkpoint whose ``offsets`` folder holds any file while it has no entry
    (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``): a tail stopped while it wrote its first
    batch's offsets could never start again, and each restart failed the same way. Call it only
    while no query runs on ``checkpoint`` (the shadow's lease holder, before it starts one)."""
    dropped = []
    for log_name in ("offsets", "commits"):
        folder = Path(checkpoint) / log_name
        if folder.is_dir():
            for entry in folder.iterdir():
                if _CUT_SHORT.match(entry.name):
                    entry.unlink(missing_ok=True)
                    dropped.append(entry)
    return dropped


def batch_units(
    checkpoint: str | Path, batch_id: int, first_start: Mapping[str, Mapping[str, int]]
) -> tuple[WorkUnit, ...]:
    """The ranges of ``batch_id``: from the previous batch's ends (or ``first_start``) to its own."""
    end = offset_log(checkpoint, batch_id)
    if end is None:
        raise TailCheckpointError(
            f"the checkpoint {checkpoint} has no offsets for batch {batch_id}, which Spark is running"
        )
    start = first_start if batch_id == 0 else offset_log(checkpoint, batch_id - 1)
    if start is None:
        raise TailCheckpointError(
            f"the checkpoint {checkpoint} lost the offsets of batch {batch_id - 1}; the ranges of batch "
            f"{batch_id} cannot be proven (abort the shadow and start again)"
        )
    units = []
    for topic, parts in end.items():
        for part, stop in parts.items():
            begin = int(start.get(topic, {}).get(part, 0))
            if stop > begin:
                units.append(WorkUnit(topic, int(part), begin, int(stop)))
    return tuple(sorted(units))


def process_batch_units(df: DataFrame, ctx: StageContext) -> dict[str, UnitOutput]:
    """Translate a micro-batch (Kafka's schema) into the units' Parquet files, as a wave does."""
    process: Any = ProcessUnits(ctx)
    try:
        results = df.mapInArrow(process, RESULT_SCHEMA).collect()
    except Exception as exc:
        if isinstance(exc, RewindError):
            raise
        raise StageError(f"a Spark task of the live tail failed: {task_error(exc)}") from exc
    outputs = {u.id: UnitOutput(u.id) for u in ctx.units}
    for row in results:
        out = outputs[row.unit_id]
        out.data_files += json.loads(row.data_file)
        out.quarantine_files += json.loads(row.quarantine_file)
        out.counts = out.counts.merge(RecordCounts.from_dict(json.loads(row.counts)))
    return outputs


def start_tail(
    spark: SparkSession,
    *,
    kafka_conf: Mapping[str, Any],
    topics: list[str],
    start: Mapping[str, Mapping[str, int]],
    checkpoint: str,
    trigger_s: float,
    max_offsets_per_trigger: int | None,
    on_batch: Callable[[DataFrame, TailBatch], None],
    name: str = "rewind-shadow",
) -> StreamingQuery:
    """Start the query; ``start`` is used by a new checkpoint only (a restart resumes from it)."""
    for entry in drop_cut_short_writes(checkpoint):
        log.info("removed %s, a checkpoint log entry whose write was cut short", entry)
    reader = (
        spark.readStream.format("rewind-kafka")
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", json.dumps({t: dict(p) for t, p in start.items()}))
    )
    for key, value in kafka_conf.items():
        reader = reader.option(f"kafka.{key}", str(value))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    first = {t: dict(p) for t, p in start.items()}

    def each(df: DataFrame, batch_id: int) -> None:
        on_batch(df, TailBatch(batch_id, batch_units(checkpoint, batch_id, first)))

    return (
        reader.load()
        .writeStream.queryName(name)
        .foreachBatch(each)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{max(trigger_s, 0.05)} seconds")
        .start()
    )
