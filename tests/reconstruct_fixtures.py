"""Insurance policies kept only as state, for the event reconstruction tests.

A history table ``policy_history`` (one row per change: ``policy_id, status, premium,
changed_at, effective_from, change_seq``) and monthly snapshots ``policy_snapshots`` (``snapshot_at,
policy_id, status, premium``); the transition that turns consecutive states into
``PolicyBound``, ``PremiumChanged``, ``PolicyCancelled`` and ``PolicyStatusChanged``; the fold that
replays them into the latest state. A negative premium is rejected by the transition.
"""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rewind.translate.functions import TranslateResult

BASE = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class State:
    policy_id: int
    status: str
    premium: float
    effective_from: datetime
    change_seq: int
    changed_at: datetime  # when the legacy system recorded it (the extraction order's time)


def policy_events(pairs: pd.DataFrame) -> TranslateResult:
    """Consecutive states of policies → domain events (zero or more per pair)."""
    change = pairs["_rewind_change"]
    bad = pairs["premium"].fillna(0) < 0
    ok = pairs[~bad]
    change = change[~bad]
    first = change == "appeared"
    gone = change == "disappeared"
    moved = change == "changed"
    bound = ok[first]
    premium = ok[moved & (ok["premium"] != ok["prev_premium"])]
    cancelled = ok[(moved & (ok["status"] == "cancelled") & (ok["prev_status"] != "cancelled")) | gone]
    status = ok[moved & (ok["status"] != ok["prev_status"]) & (ok["status"] != "cancelled")]

    parts = [
        (bound, "PolicyBound", True, True),
        (premium, "PremiumChanged", False, True),
        (cancelled, "PolicyCancelled", True, False),
        (status, "PolicyStatusChanged", True, False),
    ]
    # column by column (numpy), so that a kind of event without a column is no all-null frame
    out = pd.DataFrame(
        {
            "_rewind_row": np.concatenate([r["_rewind_row"].to_numpy(dtype=np.int64) for r, *_ in parts]),
            "type": np.concatenate([np.full(len(r), kind, dtype=object) for r, kind, *_ in parts]),
            "policy_id": np.concatenate(
                [r["policy_id"].fillna(r["prev_policy_id"]).to_numpy(dtype=np.int64) for r, *_ in parts]
            ),
            "status": np.concatenate(
                [
                    r["status"].fillna("cancelled").to_numpy(dtype=object)
                    if with_status
                    else np.full(len(r), None, dtype=object)
                    for r, _, with_status, _ in parts
                ]
            ),
            "premium": np.concatenate(
                [
                    r["premium"].to_numpy(dtype=np.float64) if with_premium else np.full(len(r), np.nan)
                    for r, _, _, with_premium in parts
                ]
            ),
            "effective_at": np.concatenate(
                [r["_rewind_time"].to_numpy(dtype="datetime64[us]") for r, *_ in parts]
            ),
        }
    )
    out["effective_at"] = out["effective_at"].dt.tz_localize("UTC")
    rejects = pd.DataFrame({"_rewind_row": pairs.loc[bad, "_rewind_row"], "reason": "negative premium"})
    return TranslateResult(rows=out, rejects=rejects)


def policy_state(events: pd.DataFrame) -> pd.DataFrame:
    """The fold: an entity's events (in business order) → its state (the last status and premium
    any event set); a policy whose last event is a disappearance is gone."""
    last = events.groupby("policy_id", sort=False).last()
    return last[["status", "premium"]].reset_index()


def random_history(rng: random.Random, entities: int, max_changes: int) -> list[State]:
    """Random histories: bound, then premium and status changes; ties on time broken by change_seq."""
    out: list[State] = []
    for pid in range(1, entities + 1):
        when = BASE + timedelta(days=rng.randrange(0, 300))
        status, premium = "active", float(rng.randrange(100, 1000))
        seq = 0
        out.append(State(pid, status, premium, when, seq, when))
        for _ in range(rng.randrange(0, max_changes)):
            seq += 1
            if rng.random() < 0.3:  # the same business time as the previous change: a tie
                pass
            else:
                when = when + timedelta(days=rng.randrange(1, 60))
            kind = rng.random()
            if kind < 0.5:
                premium = float(rng.randrange(100, 1000))
            elif kind < 0.8:
                status = rng.choice(["active", "lapsed", "suspended"])
            else:
                status = "cancelled"
            out.append(State(pid, status, premium, when, seq, when + timedelta(hours=rng.randrange(0, 5000))))
    return out


def latest(states: list[State]) -> dict[int, tuple[str, float]]:
    """The latest state of each policy in business order (effective_from, change_seq)."""
    out: dict[int, tuple[str, float]] = {}
    for s in sorted(states, key=lambda s: (s.policy_id, s.effective_from, s.change_seq)):
        out[s.policy_id] = (s.status, s.premium)
    return out


HISTORY_DDL = (
    "CREATE TABLE policy_history (row_id INTEGER PRIMARY KEY, policy_id BIGINT, status TEXT, premium REAL, "
    "changed_at TEXT, effective_from TEXT, change_seq INTEGER)"
)


def sqlite_history(path: Path, states: list[State], extraction_order: list[int] | None = None) -> str:
    """The history table, its rows inserted in ``extraction_order`` (default: as given)."""
    order = extraction_order if extraction_order is not None else list(range(len(states)))
    with sqlite3.connect(path) as db:
        db.execute(HISTORY_DDL)
        db.executemany(
            "INSERT INTO policy_history (policy_id, status, premium, changed_at, effective_from, change_seq) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    s.policy_id,
                    s.status,
                    s.premium,
                    s.changed_at.isoformat(),
                    s.effective_from.isoformat(),
                    s.change_seq,
                )
                for s in (states[i] for i in order)
            ],
        )
    return f"sqlite:///{path}"


def sqlite_snapshots(path: Path, snapshots: dict[str, list[tuple[int, str, float]]]) -> str:
    """Monthly snapshots in one table, each row naming its snapshot time."""
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE policy_snapshots (snapshot_at TEXT, policy_id BIGINT, status TEXT, premium REAL)"
        )
        for at, rows in snapshots.items():
            db.executemany("INSERT INTO policy_snapshots VALUES (?, ?, ?, ?)", [(at, *r) for r in rows])
    return f"sqlite:///{path}"


def spec(name: str, source: dict[str, Any], topic: str, **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "source": {"table": source},
        "decode": "rows",
        "translate": {"transition": "tests.reconstruct_fixtures:policy_events", "version": "1"},
        "key": ["policy_id"],
        "sink": {"kafka": {"topic": topic}},
    }
    data.update(sections)
    return data


def values(records: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(r.value)) for r in records]


def policy_row(rows: pd.DataFrame) -> pd.DataFrame:
    """A re-produce's translate (no reconstruction): a row of the history as a current-state message."""
    return pd.DataFrame(
        {
            "_rewind_row": rows["_rewind_row"],
            "policy_id": rows["policy_id"],
            "status": rows["status"],
            "effective_from": pd.to_datetime(rows["effective_from"], utc=True, format="ISO8601"),
        }
    )


def policy_events_premium_bug(pairs: pd.DataFrame) -> TranslateResult:
    """:func:`policy_events` with a bug in one type: every PremiumChanged carries one more."""
    out = policy_events(pairs)
    rows = out.rows
    wrong = rows["type"] == "PremiumChanged"
    rows.loc[wrong, "premium"] = rows.loc[wrong, "premium"] + 1
    return TranslateResult(rows=rows, rejects=out.rejects)
