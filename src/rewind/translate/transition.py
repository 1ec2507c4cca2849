"""Event reconstruction: the states of whole entities in, their events out, with counts that add up.

:func:`reconstruct_batch` is what a task of a reconstruction runs for each batch of complete
entities (every state of each of its entities; :mod:`rewind.translate.states` orders and
pairs them):

1. order and pair the states; a state whose business time is null or not a time → quarantine
   (stage ``decode``), a state that cannot be paired (an unknown snapshot, a second state of a
   key in one snapshot) → quarantine (``translate-reject``);
2. call ``translate.transition`` ONCE with a frame of every pair (:func:`pair_frame`): the
   current state's columns under their names, the previous state's as ``prev_<column>`` (null
   for none), ``_rewind_change`` (``appeared``, ``changed``, ``disappeared``), ``_rewind_time``
   and ``_rewind_prev_time`` (UTC), ``_rewind_row`` the pair. It returns events (zero or more
   per pair, each carrying its pair's ``_rewind_row``), or a ``TranslateResult`` with rejects;
   a pair it raises on is isolated as for a translate (halves, down to single pairs);
3. check the events: a type (``reconstruct.type_column``) on every event (a pair with an event
   without one is quarantined), the entity key (filled in from the pair when the transition
   leaves it out);
4. account per state: consumed (a pair of it went through the transition), quarantined (a pair
   of it was rejected: all of the state's events are dropped) or filtered (unchanged in the next
   snapshot); each state exactly one of them;
5. the events in business order (pair by pair, a pair's in the order the transition gave them),
   with the lineage columns: the source row is the state (``<label>/<range>/<position in
   business order>``), plus ``_rewind_source_system`` and ``_rewind_effective_time`` (the
   pair's business time); the quarantine rows hold the entity and both states as JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rewind.core.columns import EFFECTIVE_TIME, ROW, ROW_INDEX, SOURCE_SYSTEM
from rewind.core.counts import ConservationError, RecordCounts
from rewind.core.json_fallback import json_default
from rewind.translate.columns import user_columns
from rewind.translate.exceptions import TranslateOutputError
from rewind.translate.failures import Failure
from rewind.translate.functions import apply_translate
from rewind.translate.lineage import LINEAGE_SCHEMA, TIMESTAMP, lineage_arrays
from rewind.translate.process import ProcessContext, _reason_counts, _to_arrow
from rewind.translate.quarantine import quarantine_table
from rewind.translate.rows_decoder import pandas_column
from rewind.translate.states import (
    CHANGES,
    Pairs,
    StateOrder,
    business_micros,
    business_order,
    history_pairs,
    snapshot_pairs,
)

PREV_PREFIX = "prev_"
CHANGE = "_rewind_change"
TIME = "_rewind_time"
PREV_TIME = "_rewind_prev_time"
PAIR_COLUMNS: tuple[str, ...] = (CHANGE, TIME, PREV_TIME)
"""Columns of the transition's input besides the states' and ``_rewind_row``."""


@dataclass(frozen=True)
class ReconstructContext:
    """What the lineage of a unit's events carries besides the data."""

    process: ProcessContext
    label: str
    range_number: int
    source_system: str
    output_key: str
    """The output column that is the record key: the entity id (filled in when the transition
    leaves it out)."""


@dataclass(frozen=True)
class ReconstructedBatch:
    rows: pa.Table
    quarantine: pa.Table
    counts: RecordCounts
    types: dict[str, int] = field(default_factory=dict)
    """Events per type."""


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _pandas(column: pa.Array) -> Any:
    """A column as the transition gets it: as ``decode: rows`` types it, nullable integers and
    booleans built from the values and the mask (no Python object per value)."""
    if column.null_count and pa.types.is_integer(column.type):
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return pd.arrays.IntegerArray(values, pc.is_null(column).to_numpy(zero_copy_only=False))
    if column.null_count and pa.types.is_boolean(column.type):
        values = pc.fill_null(column, False).to_numpy(zero_copy_only=False)
        return pd.arrays.BooleanArray(values, pc.is_null(column).to_numpy(zero_copy_only=False))
    return pandas_column(column)


def _times(micros: np.ndarray) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(micros.view("datetime64[us]")).tz_localize("UTC")


def pair_frame(states: pa.Table, pairs: Pairs) -> pd.DataFrame:
    """The transition's input: one row per pair (see the module docstring)."""
    cur = states.take(pa.array(pairs.cur, mask=pairs.cur < 0, type=pa.int64()))
    prev = states.take(pa.array(pairs.prev, mask=pairs.prev < 0, type=pa.int64()))
    data: dict[str, Any] = {}
    for name in states.column_names:
        data[name] = _pandas(_array(cur.column(name)))
    for name in states.column_names:
        data[PREV_PREFIX + name] = _pandas(_array(prev.column(name)))
    data[CHANGE] = pd.Categorical.from_codes(pairs.change.astype(np.int8), categories=list(CHANGES))
    data[TIME] = _times(pairs.time)
    data[PREV_TIME] = _times(pairs.prev_time)
    n = len(pairs)
    data[ROW] = np.arange(n, dtype=np.int64)
    return pd.DataFrame(data, index=pd.Index(np.arange(n, dtype=np.int64), name=ROW_INDEX), copy=False)


def _state_json(states: pa.Table, position: int) -> dict[str, Any] | None:
    if position < 0:
        return None
    return dict(states.slice(position, 1).to_pylist()[0])


def reconstruct_batch(
    states: pa.Table,
    transition: Callable[..., Any],
    order: StateOrder,
    ctx: ReconstructContext,
    first_offset: int,
    *,
    output_schema: pa.Schema | None = None,
    name: str | None = None,
) -> ReconstructedBatch:
    """Steps 1-5 of the module docstring for ``states`` (complete entities, any order)."""
    n = states.num_rows
    micros, valid = business_micros(_array(states.column(order.time)), order.time)
    sorted_rows = business_order(states, order, micros, valid)  # 1.
    pair = (history_pairs if order.mode == "history" else snapshot_pairs)(states, order, sorted_rows, micros)
    rank = np.empty(n, dtype=np.int64)
    rank[np.concatenate([sorted_rows, np.flatnonzero(~valid)])] = np.arange(n, dtype=np.int64)
    failed: dict[int, tuple[Failure, int, int]] = {}  # row → (failure, prev, cur)
    for row in np.flatnonzero(~valid).tolist():
        value = states.column(order.time)[row].as_py()
        reason = f"business time {order.time} is {'null' if value is None else f'not a time: {value!r}'}"
        failed[row] = (Failure(row, "decode", reason, "business time"), -1, row)
    for row, reason in pair.failures.items():
        failed[row] = (Failure(row, "translate-reject", reason, "unpaired state"), -1, row)

    frame = pair_frame(states, pair)  # 2.
    # the transition gets the frame itself; a retry after it raised starts from a new one
    events, rejects, errors = apply_translate(
        transition, frame, name, retry_events=lambda: pair_frame(states, pair)
    )

    def fail(pairs_at: np.ndarray, stage: Any, reasons: list[str], kind: str) -> None:
        for at, reason in zip(pairs_at.tolist(), reasons, strict=True):
            row = int(pair.source[at])
            if row not in failed:
                failed[row] = (Failure(row, stage, reason, kind), int(pair.prev[at]), int(pair.cur[at]))

    for f in [*rejects, *errors]:
        fail(np.array([f.row]), f.stage, [f.reason], f.kind)
    if len(events):  # 3.
        if order.type_column not in events.columns:
            raise TranslateOutputError(
                f"translate.transition {name or ''}: its events have no {order.type_column!r} column; "
                f"return each event's type there (source.table.reconstruct.type_column)"
            )
        types = events[order.type_column]
        untyped = types.isna().to_numpy(dtype=bool) | types.eq("").to_numpy(dtype=bool)
        if untyped.any():
            at = np.unique(events[ROW].to_numpy(dtype=np.int64)[untyped])
            fail(at, "translate-reject", ["an event without a type"] * len(at), "event without a type")
        if ctx.output_key not in events.columns:
            keys = _pandas(_array(states.column(order.key)).take(pa.array(pair.source)))
            events[ctx.output_key] = np.asarray(keys, dtype=object)[events[ROW].to_numpy(dtype=np.int64)]
        nulls = events[ctx.output_key].isna().to_numpy(dtype=bool)
        if nulls.any():
            at = np.unique(events[ROW].to_numpy(dtype=np.int64)[nulls])
            fail(
                at, "key-null", [f"key column {ctx.output_key!r} is null"] * len(at), f"null {ctx.output_key}"
            )

    # 4. per state: consumed, quarantined or filtered
    status = np.zeros(n, dtype=np.int8)  # 0 undecided, 1 consumed, 2 quarantined, 3 filtered
    status[pair.source] = 1
    bad = np.fromiter(failed, dtype=np.int64, count=len(failed))
    status[bad] = 2
    unchanged = pair.unchanged[status[pair.unchanged] == 0]
    status[unchanged] = 3
    if (status == 0).any():
        raise ConservationError(
            ctx.process.unit_id,
            records_read=n,
            emitted=int((status == 1).sum()),
            quarantined=len(failed),
            filtered=len(unchanged),
            detail=f"states at positions {np.flatnonzero(status == 0)[:5].tolist()} not accounted for",
        )
    pair_ids = events[ROW].to_numpy(dtype=np.int64) if len(events) else np.empty(0, dtype=np.int64)
    keep = status[pair.source[pair_ids]] != 2
    events = events[keep]
    events = events.iloc[np.argsort(events[ROW].to_numpy(dtype=np.int64), kind="stable")]  # 5.
    pair_ids = events[ROW].to_numpy(dtype=np.int64)
    failures = sorted((f for f, _, _ in failed.values()), key=lambda f: f.row)
    counts = RecordCounts(
        records_read=n,
        emitted=int((status == 1).sum()),
        rows_out=len(events),
        quarantined=len(failures),
        filtered=len(unchanged),
        reasons=_reason_counts(failures),
    )
    counts.check(ctx.process.unit_id)

    batch = _records(states, order.key, rank + first_offset, ctx)
    names = user_columns(events.columns)
    user_arrays, user_fields = _to_arrow(events.reset_index(drop=True), names, output_schema)
    p = ctx.process
    lineage = lineage_arrays(
        batch,
        pair.source[pair_ids],
        transform=p.transform,
        version=p.version,
        run_id=p.run_id,
        extracted_at=p.extracted_at,
        id_scheme="table",
    )
    extra = [
        pa.repeat(pa.scalar(ctx.source_system, pa.string()), len(events)),
        pa.array(pair.time[pair_ids], pa.int64()).cast(TIMESTAMP),
    ]
    schema = pa.schema(
        [
            *user_fields,
            *LINEAGE_SCHEMA,
            pa.field(SOURCE_SYSTEM, pa.string(), nullable=False),
            pa.field(EFFECTIVE_TIME, TIMESTAMP),
        ]
    )
    table = pa.Table.from_arrays([*user_arrays, *lineage, *extra], schema=schema)
    quarantine = quarantine_table(batch, failures, p.run_id, p.unit_id, p.extracted_at)
    if failures:
        values = [_quarantined_value(states, order.key, f.row, *failed[f.row][1:]) for f in failures]
        quarantine = quarantine.set_column(
            quarantine.schema.get_field_index("value"), "value", pa.array(values, pa.binary())
        )
    by_type: dict[str, int] = {}
    if len(events):
        by_type = {str(k): int(v) for k, v in events[order.type_column].value_counts(sort=False).items()}
    return ReconstructedBatch(table, quarantine, counts, by_type)


def _quarantined_value(states: pa.Table, key: str, row: int, prev: int, cur: int) -> bytes:
    """A quarantined state as JSON: the entity and both states of its pair."""
    entity = states.column(key)[row].as_py()
    data = {"entity": entity, "previous": _state_json(states, prev), "current": _state_json(states, cur)}
    options = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
    return orjson.dumps(data, default=json_default, option=options)


def _records(states: pa.Table, key: str, offsets: np.ndarray, ctx: ReconstructContext) -> pa.RecordBatch:
    """The states as Kafka-shaped records (lineage and quarantine read their coordinates):
    ``offset`` = the state's position in the unit's business order."""
    n = states.num_rows
    keys = _array(states.column(key))
    key_bytes = (
        keys.cast(pa.string()).cast(pa.binary())
        if pa.types.is_integer(keys.type) or pa.types.is_string(keys.type)
        else pa.array([None if v is None else str(v).encode() for v in keys.to_pylist()], pa.binary())
    )
    micros = int(ctx.process.extracted_at.timestamp() * 1_000_000)
    return pa.RecordBatch.from_arrays(
        [
            key_bytes,
            pa.nulls(n, pa.binary()),
            pa.repeat(pa.scalar(ctx.label, pa.string()), n),
            pa.repeat(pa.scalar(ctx.range_number, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pa.repeat(pa.scalar(micros, TIMESTAMP), n),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp"],
    )
