"""The simple JSON translate of the job benchmark (imported by name, as a user's would be)."""

from __future__ import annotations

import pandas as pd


def order_amount(events: pd.DataFrame) -> pd.DataFrame:
    """One row per event: order id, status and amount in cents."""
    return pd.DataFrame(
        {
            "_rewind_row": events["_rewind_row"],
            "order_id": events["order_id"].astype("int64"),
            "status": events["status"],
            "amount_cents": (events["amount"] * 100).round().astype("int64"),
        }
    )


def order_amount_kept(events: pd.DataFrame) -> pd.DataFrame:
    """What ``bench/sql_translate.py``'s query does: the orders not cancelled, amount in cents."""
    kept = events[events["status"] != "cancelled"]
    return pd.DataFrame(
        {
            "_rewind_row": kept["_rewind_row"],
            "order_id": kept["order_id"].astype("int64"),
            "status": kept["status"],
            "amount_cents": (kept["amount"] * 100).round().astype("int64"),
        }
    )
