"""States of entities in business order, and the consecutive pairs an event reconstruction reads.

Pure Arrow, numpy and pandas, no Spark and no Python loop per entity: a work unit's rows
(every state of its entities, in any order) go through

1. :func:`business_micros`: the business time column as UTC microseconds (a timestamp, a date
   or ISO-8601 text; a naive time is UTC), with a mask of the rows whose time is null or not a
   time (those are quarantined);
2. :func:`business_order`: the rows sorted by entity key, business time and the tie columns,
   with the read order as the last tie-breaker (a stable sort), so the order is the business's,
   never the extraction's;
3. :func:`history_pairs` or :func:`snapshot_pairs`: for each state its predecessor of the same
   entity (a history table), or the diff of successive snapshots per key (appeared, changed,
   disappeared; an unchanged state makes no pair). A pair names the row it comes from
   (``source``), the two rows (``prev``, ``cur``, -1 for none), its change and its time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rewind.translate.exceptions import TranslateOutputError

APPEARED, CHANGED, DISAPPEARED = "appeared", "changed", "disappeared"
CHANGES: tuple[str, ...] = (APPEARED, CHANGED, DISAPPEARED)
"""The values of a pair's change, in the order of their codes."""

NAT = np.iinfo(np.int64).min
"""A missing time among microseconds (numpy's NaT when viewed as ``datetime64``)."""


class NotATime(TranslateOutputError):
    """The business time column holds values that are not times (numbers, booleans...)."""


@dataclass(frozen=True)
class StateOrder:
    """How a unit's states are ordered and paired (``source.table.reconstruct``, plain data)."""

    key: str
    time: str
    tie: tuple[str, ...] = ()
    mode: Literal["history", "snapshots"] = "history"
    compare: tuple[str, ...] | None = None
    type_column: str = "type"
    snapshots: tuple[int, ...] = ()
    """Snapshots mode: every snapshot's time (UTC microseconds, sorted), as the plan found them."""


@dataclass
class Pairs:
    """Consecutive states of entities, in business order (aligned arrays, one item per pair)."""

    source: np.ndarray
    """The row each pair comes from (its current state, or the previous one for a disappearance)."""
    prev: np.ndarray
    cur: np.ndarray
    change: np.ndarray
    """Codes into :data:`CHANGES`."""
    time: np.ndarray
    prev_time: np.ndarray
    unchanged: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    """Rows whose state equals the previous snapshot's: no pair, counted as filtered."""
    failures: dict[int, str] = field(default_factory=dict)
    """Rows that cannot be paired (their snapshot is unknown, or repeated) and why."""

    def __len__(self) -> int:
        return len(self.source)


def business_micros(column: pa.Array | pa.ChunkedArray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``column`` as UTC microseconds and a mask of valid values (null or unparseable: invalid).

    Raises :class:`NotATime` for a column of another type (numbers, booleans, bytes)."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        micros = column.cast(pa.timestamp("us", kind.tz), safe=False).cast(pa.int64())
    elif pa.types.is_date(kind):
        micros = column.cast(pa.timestamp("us")).cast(pa.int64())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = pd.Series(column.to_numpy(zero_copy_only=False), dtype=object)
        parsed = pd.to_datetime(text, utc=True, errors="coerce", format="ISO8601")
        values = parsed.to_numpy(dtype="datetime64[us]").view(np.int64)
        return values.copy(), ~parsed.isna().to_numpy()
    elif pa.types.is_null(kind):
        return np.full(len(column), NAT, dtype=np.int64), np.zeros(len(column), dtype=bool)
    else:
        raise NotATime(
            f"source.table.reconstruct.time {name!r} is {kind}, not a time; give a timestamp or date column "
            f"(or ISO-8601 text), or convert it in a query (SELECT ..., CAST(... AS TIMESTAMP) AS {name})"
        )
    valid = pc.is_valid(micros).to_numpy(zero_copy_only=False)
    values = pc.fill_null(micros, NAT).to_numpy(zero_copy_only=False).astype(np.int64, copy=True)
    return values, valid


def _codes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Sortable integer codes of a column (nulls first), for a lexicographic sort."""
    values = column.to_numpy(zero_copy_only=False)
    codes, _ = pd.factorize(values, sort=True, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64)


def business_order(states: pa.Table, order: StateOrder, micros: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Positions of the valid rows of ``states`` sorted by (key, business time, tie columns, read
    position): the entity's history as it happened in the business."""
    rows = np.flatnonzero(valid)
    if not len(rows):
        return rows
    taken = states.take(pa.array(rows))
    keys: list[np.ndarray] = [_codes(taken.column(c)) for c in reversed(order.tie)]
    keys.append(micros[rows])
    keys.append(_codes(taken.column(order.key)))
    return rows[np.lexsort(keys)]  # the last key is the primary one; lexsort is stable


def _same_entity(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``out[i]``: row ``i`` has the key of row ``i - 1`` (``out[0]`` False)."""
    n = len(keys)
    out = np.zeros(n, dtype=bool)
    if n > 1:
        codes = _codes(keys)
        out[1:] = codes[1:] == codes[:-1]
    return out


def history_pairs(states: pa.Table, order: StateOrder, sorted_rows: np.ndarray, micros: np.ndarray) -> Pairs:
    """One pair per state of a history table: (its predecessor of the same entity, the state)."""
    keys = states.column(order.key).take(pa.array(sorted_rows, type=pa.int64()))
    same = _same_entity(keys)
    prev = np.where(same, np.roll(sorted_rows, 1), -1)
    change = np.where(same, CHANGES.index(CHANGED), CHANGES.index(APPEARED)).astype(np.int8)
    time = micros[sorted_rows]
    prev_time = np.where(same, np.roll(time, 1), NAT)
    return Pairs(sorted_rows.copy(), prev, sorted_rows.copy(), change, time, prev_time)


def _differs(states: pa.Table, columns: list[str], prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """Per pair of rows, whether any of ``columns`` differs (null equals null)."""
    out = np.zeros(len(cur), dtype=bool)
    if not len(cur):
        return out
    left, right = pa.array(prev, type=pa.int64()), pa.array(cur, type=pa.int64())
    for name in columns:
        column = states.column(name)
        a, b = column.take(left), column.take(right)
        ne = pc.fill_null(pc.not_equal(a, b), False)
        one_null = pc.xor(pc.is_null(a), pc.is_null(b))
        out |= pc.or_(ne, one_null).to_numpy(zero_copy_only=False)
    return out


def snapshot_pairs(states: pa.Table, order: StateOrder, sorted_rows: np.ndarray, micros: np.ndarray) -> Pairs:
    """Successive snapshots diffed per key: a key's first state ``appeared``; a state of the next
    snapshot ``changed`` when a compared column differs (else no pair: unchanged); a key missing
    from the snapshot after one of its states ``disappeared`` there (and ``appeared`` again when it
    comes back). A state whose snapshot the plan did not find, or a second state of one key in one
    snapshot, cannot be paired."""
    snaps = np.asarray(order.snapshots, dtype=np.int64)
    failures: dict[int, str] = {}
    index = np.searchsorted(snaps, micros[sorted_rows])
    if len(snaps):
        known = (index < len(snaps)) & (snaps[np.minimum(index, len(snaps) - 1)] == micros[sorted_rows])
    else:
        known = np.zeros(len(sorted_rows), dtype=bool)
    for row in sorted_rows[~known].tolist():
        failures[row] = "its snapshot time is not among the snapshots the plan found; plan again"
    rows, index = sorted_rows[known], index[known]
    keys = states.column(order.key).take(pa.array(rows, type=pa.int64()))
    same = _same_entity(keys)
    repeated = np.zeros(len(rows), dtype=bool)
    repeated[1:] = same[1:] & (index[1:] == index[:-1])
    for row in rows[repeated].tolist():
        failures[row] = "a second state of the entity in one snapshot"
    rows, index, same = rows[~repeated], index[~repeated], same[~repeated]
    if repeated.any():  # a removed row's successor now follows the row before it
        keys = states.column(order.key).take(pa.array(rows, type=pa.int64()))
        same = _same_entity(keys)
    n = len(rows)
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same[1:]
    prev_index = np.roll(index, 1)
    follows = same & (index == prev_index + 1)
    gap = same & ~follows
    position = np.arange(n, dtype=np.int64) * 3
    parts: list[tuple[Any, ...]] = []  # (sequence, source, prev, cur, change, time)
    # a gap: the key disappeared at the snapshot after its previous state (order 3i + 0) ...
    g = np.flatnonzero(gap)
    parts.append(
        (position[g], rows[g - 1], rows[g - 1], np.full(len(g), -1), DISAPPEARED, snaps[prev_index[g] + 1])
    )
    # ... and the state itself appeared (first of its key, or back after a gap) or changed (3i + 1)
    a = np.flatnonzero(~same | gap)
    parts.append((position[a] + 1, rows[a], np.full(len(a), -1), rows[a], APPEARED, snaps[index[a]]))
    c = np.flatnonzero(follows)
    differs = _differs(states, _compared(states, order), rows[c - 1], rows[c])
    unchanged = rows[c[~differs]]
    c = c[differs]
    parts.append((position[c] + 1, rows[c], rows[c - 1], rows[c], CHANGED, snaps[index[c]]))
    # the last state of a key missing from a later snapshot disappeared at the next one (3i + 2)
    d = np.flatnonzero(last & (index < len(snaps) - 1))
    parts.append((position[d] + 2, rows[d], rows[d], np.full(len(d), -1), DISAPPEARED, snaps[index[d] + 1]))
    sequence = np.concatenate([p[0] for p in parts])
    source = np.concatenate([p[1] for p in parts]).astype(np.int64)
    prev = np.concatenate([p[2] for p in parts]).astype(np.int64)
    cur = np.concatenate([p[3] for p in parts]).astype(np.int64)
    change = np.concatenate([np.full(len(p[0]), CHANGES.index(p[4]), dtype=np.int8) for p in parts])
    time = np.concatenate([p[5] for p in parts]).astype(np.int64)
    ranked = np.argsort(sequence, kind="stable")
    source, prev, cur, change, time = source[ranked], prev[ranked], cur[ranked], change[ranked], time[ranked]
    prev_time = np.where(prev >= 0, micros[np.maximum(prev, 0)], NAT)
    return Pairs(source, prev, cur, change, time, prev_time, unchanged, failures)


def _compared(states: pa.Table, order: StateOrder) -> list[str]:
    if order.compare is not None:
        return list(order.compare)
    return [c for c in states.column_names if c not in (order.key, order.time)]
