"""The insurance policies of docs/runbook-reconstruct.md: the transition and the fold."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rewind.translate.functions import TranslateResult


def policy_events(pairs: pd.DataFrame) -> TranslateResult:
    """Consecutive states of a policy → PolicyBound, PremiumChanged, PolicyCancelled (zero or more
    per pair, vectorised); a negative premium is rejected (quarantined with both states)."""
    bad = pairs["premium"].fillna(0) < 0
    ok = pairs[~bad]
    change = ok["_rewind_change"]
    moved = change == "changed"
    parts = {
        "PolicyBound": ok[change == "appeared"],
        "PremiumChanged": ok[moved & (ok["premium"] != ok["prev_premium"])],
        "PolicyCancelled": ok[
            (moved & (ok["status"] == "cancelled") & (ok["prev_status"] != "cancelled"))
            | (change == "disappeared")
        ],
    }
    frames = [
        pd.DataFrame(
            {
                "_rewind_row": rows["_rewind_row"].to_numpy(),
                "type": kind,
                "policy_id": rows["policy_id"].fillna(rows["prev_policy_id"]).to_numpy(dtype=np.int64),
                "premium": rows["premium"].to_numpy(dtype=float) if kind != "PolicyCancelled" else np.nan,
                "effective_at": rows["_rewind_time"].to_numpy(),
            }
        )
        for kind, rows in parts.items()
        if len(rows)
    ]
    events = (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame({"_rewind_row": [], "type": [], "policy_id": [], "premium": [], "effective_at": []})
    )
    rejects = pd.DataFrame({"_rewind_row": pairs.loc[bad, "_rewind_row"], "reason": "negative premium"})
    return TranslateResult(rows=events, rejects=rejects)


def policy_state(events: pd.DataFrame) -> pd.DataFrame:
    """The fold: a policy's events (in business order) → its state."""
    cancelled = events["type"] == "PolicyCancelled"
    state = events.assign(status=np.where(cancelled, "cancelled", "active"))
    last = state.groupby("policy_id", sort=False).last()  # the last non-null of each column
    return last[["status", "premium"]].reset_index()
