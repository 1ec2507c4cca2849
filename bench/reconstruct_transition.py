"""The transition of the reconstruction benchmark: consecutive policy states → domain events."""

from __future__ import annotations

import numpy as np
import pandas as pd


def policy_events(pairs: pd.DataFrame) -> pd.DataFrame:
    """``PolicyBound`` for a first state, ``PremiumChanged`` when the premium moved, ``PolicyCancelled``
    when the status became cancelled, ``PolicyStatusChanged`` for another status change: one event
    per state (the benchmark's histories change one thing at a time)."""
    first = (pairs["_rewind_change"] == "appeared").to_numpy()
    premium = ~first & (
        pairs["premium"].to_numpy() != pairs["prev_premium"].to_numpy(dtype=float, na_value=np.nan)
    )
    status = pairs["status"].to_numpy(dtype=object)
    cancelled = ~first & ~premium & (status == "cancelled")
    kind = np.where(
        first,
        "PolicyBound",
        np.where(premium, "PremiumChanged", np.where(cancelled, "PolicyCancelled", "PolicyStatusChanged")),
    )
    return pd.DataFrame(
        {
            "_rewind_row": pairs["_rewind_row"].to_numpy(),
            "type": kind,
            "policy_id": pairs["policy_id"].to_numpy(),
            "status": status,
            "premium": pairs["premium"].to_numpy(),
            "effective_at": pairs["_rewind_time"],
        }
    )
