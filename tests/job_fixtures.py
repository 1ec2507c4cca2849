"""Translate functions used by the job tests (imported by name, as a user's would be)."""

from __future__ import annotations

import pandas as pd

from rewind.translate.functions import TranslateResult


def order_amounts(events: pd.DataFrame) -> TranslateResult:
    """One row per order event; negative amounts are rejected, 'test' orders filtered."""
    events = events[events["status"] != "test"]
    bad = events["amount"] < 0
    rows = events.loc[~bad, ["_rewind_row", "order_id", "status", "amount"]]
    rows = rows.assign(order_id=rows["order_id"].astype("int64"), amount=rows["amount"].astype("float64"))
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "negative amount"})
    return TranslateResult(rows=rows, rejects=rejects)


def explode_on_seven(events: pd.DataFrame) -> pd.DataFrame:
    """Raises for any batch holding order 7 (so that record ends in quarantine)."""
    if (events["order_id"] == 7).any():
        raise ValueError("order 7 is cursed")
    return events[["_rewind_row", "order_id", "amount"]]
