"""Merge decisions: what becomes of each of a run's output rows when it meets live's rows.

Pure data (Arrow in, Arrow out, no I/O), so the Iceberg and SQL sinks decide alike and the
rules can be tested by properties. For each key of the run's rows:

1. **dedup**: the run keeps one row, its latest by (source time, topic, partition, offset);
   the others are ``deduplicated``. When several rows share the latest source time and their
   values differ, the policy cannot tell which is right: with ``ambiguous="route"`` they are
   all ``routed`` (to the quarantine, reason ``ambiguous``) and the key is left as it is.
2. **cut line**: a key whose live row comes from a source event at or after the cut line (a
   time, or an offset of the row's partition) is newer than anything the backfill knows:
   the run's row is ``rejected_stale``.
3. **collision**: the run's row meets a live row of its key: ``prefer-live`` keeps live's
   (the run's is ``superseded``), ``prefer-backfill`` writes the run's, ``latest-event-time``
   the later source event (a tie with different values is ambiguous, as in 1),
   ``latest-offset`` the later offset of the same partition (event time across partitions).
4. Everything else is ``applied``; the live rows of applied keys are ``replaced``.

Every row of the run gets exactly one decision, so the decisions add up to the rows given
(:attr:`RecordCounts.merge <rewind.core.counts.RecordCounts.merge>`, the law's second half).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.core.columns import (
    LINEAGE_COLUMNS,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
)
from rewind.core.counts import MERGE_DECISIONS
from rewind.core.merge_keys import key_codes, repeated
from rewind.core.merge_pairs import APPLIED, REJECTED_STALE, SUPERSEDED, UNDECIDED, decide_pairs
from rewind.core.merge_policy import MergePolicy

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

_NEVER = -(2**62)
"""Source time of a row without one: older than any event."""


@dataclass
class MergeResult:
    applied: pa.Table
    """The run's rows to write: at most one per key."""
    routed: pa.Table
    """The run's rows the policy could not decide (same key, same time, different values)."""
    replaced: pa.Table
    """The key columns of live rows that applied rows replace."""
    counts: dict[str, int] = field(default_factory=dict)
    applied_positions: Any = None
    """Where the applied rows are among the rows decided (sorted numpy int64)."""
    routed_positions: Any = None


def _frame(table: pa.Table, key: Sequence[str]) -> pd.DataFrame:
    """Key columns and the ordering lineage of ``table`` as a small pandas frame."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = table.column(SOURCE_TIMESTAMP)
    if pa.types.is_timestamp(ts.type):
        ts = pc.cast(pc.cast(ts, pa.timestamp("us", tz="UTC")), pa.int64())
    cols = {k: table.column(k) for k in key}
    cols["_ts"] = pc.fill_null(ts.cast(pa.int64()), _NEVER)
    cols["_topic"] = pc.fill_null(table.column(SOURCE_TOPIC).cast(pa.string()), "")
    cols["_part"] = pc.fill_null(table.column(SOURCE_PARTITION).cast(pa.int64()), -1)
    cols["_off"] = pc.fill_null(table.column(SOURCE_OFFSET).cast(pa.int64()), -1)
    frame = pa.table(cols).to_pandas()
    frame["_pos"] = range(len(frame))
    return frame


def _value_hash(table: pa.Table, positions: Sequence[int], key: Sequence[str]) -> pd.Series:
    """A hash of each given row's values (neither key nor lineage): equal values, equal hash."""
    # lazy: avoids pandas, pyarrow at import
    import pandas as pd
    import pyarrow as pa

    values = [c for c in table.column_names if c not in LINEAGE_COLUMNS and c not in key]
    if not values or not len(positions):
        return pd.Series(0, index=list(positions), dtype="uint64")
    part = table.select(values).take(pa.array(list(positions), type=pa.int64())).to_pandas()
    hashed = pd.util.hash_pandas_object(part.astype(str), index=False)
    hashed.index = list(positions)
    return hashed


def decide(rows: pa.Table, live: pa.Table | None, key: Sequence[str], policy: MergePolicy) -> MergeResult:
    """The decision for each of ``rows`` (the run's) against ``live`` (rows the run did not write).

    Only the contested rows (:func:`rewind.core.merge_keys.contested`: a key the run writes twice
    or live holds) are decided; every other row is applied as it is. A key the run and live
    each hold once is decided by comparing the two rows' lineage in numpy
    (:func:`rewind.core.merge_pairs.decide_pairs`); the rest go through the sort and join of
    :func:`_decide_all` with the live rows of their keys. Decisions are per key, so this is the
    same as deciding all (``tests/test_merge_policy.py`` checks it by properties).
    """
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa


    key = list(key)
    has_live = live is not None and live.num_rows > 0
    run_codes, live_codes = key_codes(key_array(rows, key), key_array(live, key) if has_live else None)
    twice = repeated(run_codes)
    met = np.isin(run_codes, live_codes) if has_live else np.zeros(rows.num_rows, dtype=bool)
    hard = twice | met
    counts = dict.fromkeys(MERGE_DECISIONS, 0)
    if not hard.any():
        counts["applied"] = rows.num_rows
        none = np.flatnonzero(hard)
        return MergeResult(
            rows, rows.slice(0, 0), rows.select(key).slice(0, 0), counts, np.arange(rows.num_rows), none
        )
    applied, replaced = [np.flatnonzero(~hard)], []
    single = met & ~twice
    if single.any():  # a key each side holds once: decided from the two rows' lineage
        assert live is not None
        live_twice = repeated(live_codes)
        if live_twice.any():
            single &= ~np.isin(run_codes, live_codes[live_twice])
        ours = np.flatnonzero(single)
        order = np.argsort(live_codes, kind="stable")
        theirs_at = order[np.searchsorted(live_codes[order], run_codes[ours])]
        outcome = decide_pairs(rows, live, ours, theirs_at, policy)
        hard[ours[outcome != UNDECIDED]] = False
        applied.append(ours[outcome == APPLIED])
        counts["rejected_stale"] += int((outcome == REJECTED_STALE).sum())
        counts["superseded"] += int((outcome == SUPERSEDED).sum())
        replaced.append(live.select(key).take(pa.array(theirs_at[outcome == APPLIED])))
    routed = np.zeros(0, dtype=np.int64)
    if hard.any():
        where = np.flatnonzero(hard)
        theirs = None
        if has_live:
            assert live is not None
            theirs = live.filter(pa.array(np.isin(live_codes, run_codes[where])))
        part = _decide_all(rows.take(pa.array(where)), theirs, key, policy)
        for name, n in part.counts.items():
            counts[name] += n
        applied.append(where[part.applied_positions])
        routed = where[part.routed_positions]
        if part.replaced.num_rows:
            replaced.append(part.replaced)
    counts["applied"] = sum(len(a) for a in applied)
    at = np.sort(np.concatenate(applied))
    if not replaced:
        gone = rows.select(key).slice(0, 0)
    else:
        try:  # the general path's keys came through pandas: back to the pairs' types
            gone = pa.concat_tables([replaced[0], *(r.cast(replaced[0].schema) for r in replaced[1:])])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _decide_all(rows, live, key, policy)
    return MergeResult(rows.take(pa.array(at)), rows.take(pa.array(routed)), gone, counts, at, routed)


def _decide_all(
    rows: pa.Table, live: pa.Table | None, key: Sequence[str], policy: MergePolicy
) -> MergeResult:
    """:func:`decide` on every row: sort, dedup, join with live, decide."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    key = list(key)
    counts = dict.fromkeys(MERGE_DECISIONS, 0)
    run = _frame(rows, key)
    order = [*key, "_ts", "_topic", "_part", "_off", "_pos"]
    run = run.sort_values(order, kind="stable")
    last = ~run.duplicated(key, keep="last")
    cand = run[last]
    counts["deduplicated"] = int((~last).sum())
    # 1. ties at the latest time of a key, with different values: ambiguous
    routed_pos: list[int] = []
    latest_ts = run.groupby(key, dropna=False, sort=False)["_ts"].transform("max")
    tied = run[(run["_ts"] == latest_ts)]
    tied = tied[tied.duplicated(key, keep=False)]
    if len(tied) and policy.ambiguous == "route":
        tied = tied.assign(_h=_value_hash(rows, tied["_pos"].tolist(), key).loc[tied["_pos"]].to_numpy())
        differ = tied.groupby(key, dropna=False, sort=False)["_h"].transform("nunique") > 1
        bad = tied[differ]
        if len(bad):
            routed_pos = bad["_pos"].tolist()
            bad_keys = bad[key].drop_duplicates()
            cand = cand.merge(bad_keys, on=key, how="left", indicator=True)
            cand = cand[cand["_merge"] == "left_only"].drop(columns="_merge")
            # the key's earlier rows were counted deduplicated, its latest were routed
            counts["deduplicated"] -= len(routed_pos) - len(bad_keys)
    counts["routed"] = len(routed_pos)
    applied = cand
    replaced = cand.iloc[0:0]
    if live is not None and live.num_rows:
        lv = _frame(live, key).sort_values(order, kind="stable")
        lv = lv[~lv.duplicated(key, keep="last")]
        both = cand.merge(lv, on=key, how="left", suffixes=("", "_live"), indicator=True)
        met = (both["_merge"] == "both").to_numpy()
        decision = np.full(len(both), "applied", dtype=object)
        stale = np.zeros(len(both), dtype=bool)
        if policy.cut_time_us is not None:
            stale |= met & (both["_ts_live"].to_numpy() >= policy.cut_time_us)
        if policy.cut_offsets is not None:
            cut = [
                policy.cut_offsets.get((t, int(p))) if m else None
                for t, p, m in zip(both["_topic_live"], both["_part_live"], met, strict=True)
            ]
            cut_arr = np.array([np.inf if c is None else c for c in cut], dtype=float)
            stale |= met & (both["_off_live"].to_numpy(dtype=float) >= cut_arr)
        decision[stale] = "rejected_stale"
        open_ = met & ~stale
        how = policy.on_collision
        if how == "prefer-live":
            decision[open_] = "superseded"
        elif how in ("latest-event-time", "latest-offset"):
            ts, lts = both["_ts"].to_numpy(), both["_ts_live"].to_numpy()
            later = ts > lts
            same = ts == lts
            if how == "latest-offset":
                same_tp = (both["_topic"] == both["_topic_live"]).to_numpy() & (
                    both["_part"] == both["_part_live"]
                ).to_numpy()
                off, loff = both["_off"].to_numpy(), both["_off_live"].to_numpy()
                later = np.where(same_tp, off >= loff, later)
                same = same & ~same_tp
            tie = open_ & same
            older = open_ & ~later & ~same
            decision[older] = "superseded"
            if tie.any():
                run_h = _value_hash(rows, both.loc[tie, "_pos"].tolist(), key).to_numpy()
                live_h = _value_hash(live, both.loc[tie, "_pos_live"].astype(int).tolist(), key).to_numpy()
                tie_idx = np.flatnonzero(tie)
                differ = run_h != live_h
                if policy.ambiguous == "route":
                    decision[tie_idx[differ]] = "routed"
                    routed_pos.extend(both.loc[tie, "_pos"][differ].tolist())
                # otherwise the later (topic, partition, offset) wins, which the run's row does
                # only if it sorts after live's
                else:
                    run_o = both.loc[tie, ["_topic", "_part", "_off"]].to_numpy()
                    live_o = both.loc[tie, ["_topic_live", "_part_live", "_off_live"]].to_numpy()
                    for i, (a, b) in enumerate(zip(run_o, live_o, strict=True)):
                        if tuple(a) < tuple(b):
                            decision[tie_idx[i]] = "superseded"
        for name in ("rejected_stale", "superseded"):
            counts[name] = int((decision == name).sum())
        counts["routed"] = len(routed_pos)
        keep = decision == "applied"
        applied = both[keep]
        replaced = both[keep & met]
    counts["applied"] = len(applied)
    take = np.sort(applied["_pos"].to_numpy(dtype=np.int64))
    routed_at = np.sort(np.asarray(routed_pos, dtype=np.int64))
    return MergeResult(
        applied=rows.take(pa.array(take, type=pa.int64())),
        routed=rows.take(pa.array(routed_at, type=pa.int64())),
        replaced=pa.Table.from_pandas(replaced[key], preserve_index=False)
        if len(replaced)
        else rows.select(key).slice(0, 0),
        counts=counts,
        applied_positions=take,
        routed_positions=routed_at,
    )


def key_array(table: pa.Table, key: Sequence[str]) -> Any:
    """One array naming each row's key (a composite key as its parts joined as text)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(key) == 1:
        return table.column(key[0]).combine_chunks()
    parts = [pc.fill_null(table.column(k).cast(pa.string()), "\x00null") for k in key]
    joined = pc.binary_join_element_wise(*parts, "\x1f")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined
