"""The tasks of a ``translate.sql`` wave (:mod:`rewind.spark.sql_wave`): records tagged with
their unit, decoded into the view ``events``, and each unit finished with the query's rows by
the Python translate's own :func:`~rewind.translate.process.process_batch`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.columns import ROW, ROW_INDEX
from rewind.core.ranges import OffsetRange
from rewind.core.store import activate
from rewind.errors import RewindError
from rewind.spark.job_stage import StageContext, UnitFiles, result_arrow_schema, unit_result_rows
from rewind.spark.progress_channel import PROGRESS_OPTION
from rewind.spark.sql_translate import SqlTranslateError
from rewind.spec import JobSpec
from rewind.translate.factory import lineage_options, make_decoder, transform_name

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from rewind.core.units import WorkUnit
    from rewind.translate.decoder import Decoded, Decoder

UNIT = "_rewind_unit"
"""The column of the records and of the query's rows that names the unit (its ordinal)."""

ROW_BITS = 40
"""``_rewind_row`` = unit ordinal << ROW_BITS | (offset - unit start): a unit spans fewer than
2**40 offsets, a wave fewer than 2**23 units."""


def row_id(ordinal: int, offset_in_unit: int) -> int:
    return (ordinal << ROW_BITS) | offset_in_unit


class TagUnits:
    """``mapInArrow``: Kafka-schema batches in, the same with :data:`UNIT` (records outside
    the wave's units, which a range read never yields, are dropped)."""

    def __init__(self, units: tuple[WorkUnit, ...]) -> None:
        self.units = units

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids numpy, pyarrow at import
        import numpy as np
        import pyarrow as pa

        by_partition: dict[tuple[str, int], list[tuple[int, WorkUnit]]] = {}
        for ordinal, unit in enumerate(self.units):
            by_partition.setdefault((unit.topic, unit.partition), []).append((ordinal, unit))
        for batch in batches:
            if batch.num_rows == 0:
                continue
            topics = batch.column("topic").to_numpy(zero_copy_only=False)
            partitions = batch.column("partition").to_numpy(zero_copy_only=False)
            offsets = batch.column("offset").to_numpy(zero_copy_only=False)
            tags = np.full(batch.num_rows, -1, dtype=np.int32)
            for (topic, partition), units in by_partition.items():
                mine = (topics == topic) & (partitions == partition)
                if not mine.any():
                    continue
                for ordinal, unit in units:
                    tags[mine & (offsets >= unit.start) & (offsets < unit.end)] = ordinal
            keep = tags >= 0
            tagged = batch.append_column(UNIT, pa.array(tags, type=pa.int32()))
            yield tagged if keep.all() else tagged.filter(pa.array(keep))


class DecodeEvents:
    """``mapInArrow``: tagged records in, the view ``events`` out (decodable records only; the
    failures are found again, and quarantined, by :class:`FinishUnits`)."""

    def __init__(self, spec_json: str, units: tuple[WorkUnit, ...], schema: pa.Schema) -> None:
        self.spec_json, self.starts, self.schema = spec_json, [u.start for u in units], schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = make_decoder(JobSpec.model_validate_json(self.spec_json).decode)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            yield from self.view(batch, decoder.decode(batch.drop_columns([UNIT])))

    def view(self, batch: pa.RecordBatch, decoded: Decoded) -> Iterator[pa.RecordBatch]:
        """The view's rows of one tagged batch, given what its decoder made of it."""
        events = decoded.events
        if len(events) == 0:
            return
        units = batch.column(UNIT).to_numpy(zero_copy_only=False)[events[ROW].to_numpy()]
        yield from events_batches(events, units, self.starts, self.schema)


def events_batches(
    events: pd.DataFrame, units: Any, starts: list[int], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """Decoded events as the view's Arrow rows: ``_rewind_row`` made the wave's record id."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    offsets = events["_src_offset"].to_numpy(dtype=np.int64)
    ids = (units.astype(np.int64) << ROW_BITS) | (offsets - np.asarray(starts, dtype=np.int64)[units])
    frame = events.reset_index(drop=True).assign(**{ROW: ids})
    try:
        table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False, safe=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise SqlTranslateError(
            f"decoded events do not fit the view events' columns ({exc}); declare decode.schema so "
            "that every record's fields have one type"
        ) from exc
    yield from table.to_batches()


class QueryFailedOnRecord(RewindError):
    """The query failed on this record alone (Spark's message): quarantined as ``translate-error``."""


class QueryRows:
    """A unit's rows of the query, served as a translate function's output to
    :func:`~rewind.translate.process.process_batch`: the rows of the records it is given, and
    an error for a record the query failed on (which process_batch isolates and quarantines)."""

    def __init__(self, rows: pd.DataFrame, failed: dict[int, tuple[str, str]], whole: int) -> None:
        self.rows, self.failed, self.whole = rows, failed, whole
        """``whole``: how many events the unit decodes to (asked for all of them, all rows)."""
        self.__name__ = "translate.sql"

    def __call__(self, events: pd.DataFrame) -> pd.DataFrame:
        asked = events[ROW].to_numpy()
        if self.failed:
            for row in set(asked.tolist()) & self.failed.keys():
                kind, message = self.failed[row]
                # named as Spark named the error, as the record's quarantine reason says
                raise type(kind, (QueryFailedOnRecord,), {})(message)
        return self.rows if len(asked) == self.whole else self.rows[self.rows[ROW].isin(asked)]


@dataclass(frozen=True)
class WaveQuery:
    """What the finishing tasks need besides the stage context (pickled to every task)."""

    ctx: StageContext
    failed: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Wave record id → Spark's error (class name, message), for the records the query failed
    on alone."""
    fetch: dict[str, str] | None = None
    """The ``rewind-kafka`` reader's options when each finishing task reads its unit's records
    from Kafka itself (None: they come from the wave's persisted records)."""


class FinishUnits:
    """``cogroup.applyInArrow``: one unit's records and its query rows in, its result row out."""

    def __init__(self, wave: WaveQuery) -> None:
        self.wave = wave

    def __call__(self, key: tuple[Any, ...], records: pa.Table, rows: pa.Table) -> pa.Table:
        ordinal = int(key[0].as_py())
        if self.wave.fetch is not None:
            records = read_unit(self.wave.fetch, self.wave.ctx.units[ordinal])
        return finish_unit(self.wave, ordinal, records, rows)


def _ascending(values: Any) -> bool:
    return bool(len(values) < 2 or (values[1:] > values[:-1]).all())


def finish_unit(wave: WaveQuery, ordinal: int, records: pa.Table, rows: pa.Table) -> pa.Table:
    """One unit finished: its records (Kafka's columns) and the query's rows of them in, the
    unit's files written, its result row out (none when it held no record)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.spark.sql_fates import FATE, FATE_COLUMNS, Replayed
    from rewind.translate.process import ProcessContext, process_batch

    ctx = wave.ctx
    activate(ctx.store)  # a unit the task loads into the sink reads its files back
    unit = ctx.units[ordinal]
    schema = schema_from_b64(ctx.output_schema_b64)
    out = UnitFiles(ctx, unit, schema)
    if records.num_rows:
        spec = JobSpec.model_validate_json(ctx.spec_json)
        batch = records.drop_columns([c for c in (UNIT,) if c in records.column_names])
        if not _ascending(batch["offset"].to_numpy()):  # a read in offset order needs no copy
            batch = batch.sort_by("offset")
        if ctx.latest is not None:
            batch, left_out = ctx.latest.split(batch, unit.topic, unit.partition)
            out.counts = out.counts.merge(left_out)
        offsets = batch["offset"].to_numpy()
        frame = rows.drop_columns([c for c in (UNIT,) if c in rows.column_names]).to_pandas()
        wanted = (frame[ROW].to_numpy(dtype=np.int64) & ((1 << ROW_BITS) - 1)) + unit.start
        at = np.searchsorted(offsets, wanted)
        found = (at < len(offsets)) & (offsets[np.minimum(at, len(offsets) - 1)] == wanted)
        frame = frame[found].assign(**{ROW: at[found].astype(np.int64)})
        frame.index = frame[ROW].to_numpy()
        frame.index.name = ROW_INDEX
        base = ordinal << ROW_BITS
        failed = {
            int(np.searchsorted(offsets, (rid - base) + unit.start)): why
            for rid, why in wave.failed.items()
            if rid >> ROW_BITS == ordinal
        }
        pctx = ProcessContext(
            ctx.run_id, unit.id, transform_name(spec.translate), spec.translate.version, datetime.now(UTC)
        )
        decoder: Decoder
        if FATE in batch.column_names:  # spooled in place: the fates of the wave's decoding
            decoder = Replayed(batch)
            batch = batch.drop_columns(list(FATE_COLUMNS))
        else:
            decoder = make_decoder(spec.decode)
        decoded = len(decoder.decode(batch).events) if failed else -1
        result = process_batch(
            batch,
            decoder,
            QueryRows(frame, failed, decoded),
            spec.key,
            pctx,
            output_schema=pa.schema([f for f in schema if not f.name.startswith("_rewind_")]),
            translator_name="translate.sql",
            **lineage_options(spec),
        )
        out.write(result.rows, result.quarantine)
        out.counts = out.counts.merge(result.counts)
    elif rows.num_rows:
        raise SqlTranslateError(f"unit {unit.id}: the query gave rows for records it was not given")
    if out.counts.records_read == 0:
        return pa.Table.from_pylist([], schema=result_arrow_schema())
    return pa.Table.from_pylist(unit_result_rows(ctx, [out]), schema=result_arrow_schema())


class FetchDecode:
    """``mapInArrow`` over task ids: each task reads its ranges from Kafka (the ``rewind-kafka``
    reader's own fetch loop, rate limit and progress reports) and yields the view's rows, so the
    records themselves never cross into the JVM (:class:`TagUnits` + :class:`DecodeEvents`).

    With ``spool`` (a wave's token), each task also writes the records it read to a file on its
    own host (:func:`spool_file`), with what decoding made of each
    (:func:`rewind.spark.sql_fates.with_fates`), for :class:`FinishInPlace` further down the
    same task."""

    def __init__(
        self,
        ctx: StageContext,
        schema: pa.Schema,
        options: dict[str, str],
        tasks: list[list[dict[str, Any]]],
        spool: str | None = None,
    ) -> None:
        self.ctx, self.schema, self.options, self.tasks, self.spool = ctx, schema, options, tasks, spool

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyspark at import
        from rewind.spark.kafka_source import KafkaBatchReader, RangesPartition

        reader = KafkaBatchReader(self.options)
        decode = DecodeEvents(self.ctx.spec_json, self.ctx.units, self.schema)
        for batch in batches:
            for task_id in batch.column(0).to_pylist():
                ranges = [OffsetRange.from_dict(d) for d in self.tasks[task_id]]
                records = reader.read(RangesPartition(ranges))
                if self.spool is None:
                    yield from decode(TagUnits(self.ctx.units)(records))
                    continue
                decoder = make_decoder(JobSpec.model_validate_json(self.ctx.spec_json).decode)
                with SpoolWriter(spool_file(self.spool, task_id)) as spool:
                    for tagged in TagUnits(self.ctx.units)(records):
                        decoded = decoder.decode(tagged.drop_columns([UNIT]))
                        spool.write(tagged, decoded)
                        yield from decode.view(tagged, decoded)


def spool_dir(token: str) -> Path:
    """Where a wave's tasks keep the records they read until the same task finishes their units:
    the executor's local directory (Spark names it to its Python workers and deletes it when the
    executor stops: what a failed attempt leaves goes with it), else the temp dir. The finishing
    task deletes its own file."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return Path(local or tempfile.gettempdir()) / "rewind-sql-spool" / token


def spool_file(token: str, task_id: int) -> Path:
    """The file of one attempt of one task (a retried attempt writes its own)."""
    # lazy: avoids pyspark at import
    from pyspark import TaskContext

    task = TaskContext.get()
    attempt = task.attemptNumber() if task is not None else 0
    return spool_dir(token) / f"task-{task_id}-attempt-{attempt}.arrow"


class SpoolWriter:
    """A task's tagged records streamed to an Arrow file, each with its decoding's fate
    (:mod:`rewind.spark.sql_fates`); the
    file exists once the block ends, empty when no record passed (so a missing file means
    another task read the records)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: Any = None

    def __enter__(self) -> SpoolWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return self

    def write(self, batch: pa.RecordBatch, decoded: Decoded) -> None:
        """One tagged batch, with what the decoder made of each record (:func:`with_fates`)."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        # lazy: avoids pandas (the decoder's module) at import
        from rewind.spark.sql_fates import with_fates

        if not batch.num_rows:
            return
        batch = with_fates(batch, decoded)
        if self._writer is None:
            self._writer = pa.ipc.new_file(str(self.path), batch.schema)
        self._writer.write_batch(batch)

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
        else:
            self.path.touch()


class FinishInPlace:
    """``mapInArrow`` over the query's rows, in the task that read and decoded their records
    (the query has no shuffle: its rows stay in the task of the view's partition): the task's
    units finished with the records :class:`FetchDecode` spooled, read back from this host
    instead of from Kafka, and no shuffle of the rows to a unit's task."""

    def __init__(self, wave: WaveQuery, token: str, tasks: list[list[int]]) -> None:
        self.wave, self.token, self.tasks = wave, token, tasks
        """``tasks``: the unit ordinals of each task, by the view's partition id."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids numpy, pyarrow, pyspark at import
        import numpy as np
        import pyarrow as pa
        from pyspark import TaskContext

        task = TaskContext.get()
        assert task is not None
        task_id = task.partitionId()
        rows = [b for b in batches if b.num_rows]
        path = spool_file(self.token, task_id)
        try:
            if not path.exists():
                raise SqlTranslateError(
                    f"the query's rows of task {task_id} reached a task that did not read their records"
                )
            # mapped, not copied: a unit's rows are copied out of it one unit at a time
            records = (
                pa.ipc.open_file(pa.memory_map(str(path))).read_all() if path.stat().st_size else pa.table({})
            )
        finally:  # only its own attempt's: a speculative twin may be reading another
            path.unlink(missing_ok=True)
        query_rows = pa.Table.from_batches(rows) if rows else pa.table({ROW: pa.array([], pa.int64())})
        row_units = query_rows.column(UNIT).to_numpy() if rows else np.zeros(0, dtype=np.int32)
        read_units = records.column(UNIT).to_numpy() if records.num_rows else np.zeros(0, dtype=np.int32)
        for ordinal in self.tasks[task_id]:
            if len(self.tasks[task_id]) == 1 or not records.num_rows:
                mine = records
            else:
                mine = records.filter(pa.array(read_units == ordinal))
            its_rows = query_rows.filter(pa.array(row_units == ordinal)) if rows else query_rows
            yield from finish_unit(self.wave, ordinal, mine, its_rows).to_batches()


def read_unit(options: dict[str, str], unit: WorkUnit) -> pa.Table:
    """One unit's records, read from Kafka by the task that finishes it (no progress reports:
    the wave's first read counted them)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids pyspark at import
    from rewind.spark.kafka_source import KafkaBatchReader, RangesPartition

    reader = KafkaBatchReader({k: v for k, v in options.items() if k != PROGRESS_OPTION})
    batches = [b for b in reader.read(RangesPartition([unit.range])) if b.num_rows]
    if not batches:
        return pa.Table.from_pylist([])
    return pa.Table.from_batches(batches)
