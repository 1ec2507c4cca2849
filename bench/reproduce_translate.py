"""The translate of the re-produce benchmark: an accounts row → its current-state message."""

from __future__ import annotations

import pandas as pd


def account_state(events: pd.DataFrame) -> pd.DataFrame:
    """One message per account: id, name, balance in units, status, region."""
    return pd.DataFrame(
        {
            "_rewind_row": events["_rewind_row"],
            "account_id": events["id"].astype("int64"),
            "name": events["name"],
            "balance": events["balance_cents"].astype("float64") / 100,
            "status": events["status"],
            "region": events["region"],
        }
    )
