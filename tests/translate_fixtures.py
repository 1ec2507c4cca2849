"""Example translate functions, loaded by reference ("tests.translate_fixtures:name") in tests.

Each one is what a user might write; together they cover the shapes the translate contract
allows (a frame, a TranslateResult with rejects, 1→n rows, filtering, raising) and the ways a
function can break it.
"""

from __future__ import annotations

import pandas as pd

from rewind.translate import TranslateResult

NOT_CALLABLE = 42


def to_total(df: pd.DataFrame) -> pd.DataFrame:
    """In place: a new column on the input frame (keeps _rewind_row)."""
    df["total"] = df["amount"] * df["qty"]
    return df


def project(df: pd.DataFrame) -> pd.DataFrame:
    """A column selection without _rewind_row: the index tells where rows came from."""
    return df[["order_id", "amount"]]


def fresh_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Breaks the contract: a new frame with neither _rewind_row nor the input's index."""
    return pd.DataFrame({"order_id": df["order_id"].to_numpy()})


def reset_index(df: pd.DataFrame) -> pd.DataFrame:
    """Breaks the contract: drops both the column and the index."""
    return df[["order_id"]].reset_index(drop=True)


def returns_list(df: pd.DataFrame) -> list[int]:
    return [1, 2, 3]


def returns_none(df: pd.DataFrame) -> None:
    df["x"] = 1


def reject_negative(df: pd.DataFrame) -> TranslateResult:
    """Rejects records with a negative amount, with a reason."""
    bad = df["amount"] < 0
    rejects = df.loc[bad, ["_rewind_row"]].assign(reason="amount is negative")
    return TranslateResult(rows=df[~bad], rejects=rejects)


def raise_on_negative(df: pd.DataFrame) -> pd.DataFrame:
    """Raises on the whole batch when any record is bad (the retry isolates it)."""
    if (df["amount"] < 0).any():
        raise ValueError(f"negative amount {df.loc[df['amount'] < 0, 'amount'].iloc[0]}")
    return df


def always_raise(df: pd.DataFrame) -> pd.DataFrame:
    if len(df) == 0:
        return df
    raise KeyError("no_such_column")


def explode_items(df: pd.DataFrame) -> pd.DataFrame:
    """1→n: one row per item of the order (0 items → no row: filtered)."""
    out = df[["_rewind_row", "order_id", "items"]].explode("items").dropna(subset=["items"])
    out["sku"] = out["items"].map(lambda item: item["sku"])
    out["qty"] = out["items"].map(lambda item: item["qty"]).astype("int64")
    return out.drop(columns=["items"])


def filter_small(df: pd.DataFrame) -> pd.DataFrame:
    """Drops orders under 10 on purpose (filtered, not quarantined)."""
    return df[df["amount"] >= 10]


def mixed(df: pd.DataFrame) -> TranslateResult:
    """Driven by the 'kind' field, for the property test.

    raise → the function raises (for that record, on retry); reject → rejected; filter → no
    row; nullkey → a row whose key is null; multi → ``n`` rows; valid → one row.
    """
    if (df["kind"] == "raise").any():
        raise RuntimeError("record asked to raise")
    rejects = df.loc[df["kind"] == "reject", ["_rewind_row"]].assign(reason="asked to be rejected")
    keep = df[~df["kind"].isin(["reject", "filter"])]
    repeat = keep["n"].where(keep["kind"] == "multi", 1).astype("int64").to_numpy()
    rows = keep.loc[keep.index.repeat(repeat), ["_rewind_row", "id", "kind"]]
    rows["id"] = rows["id"].astype("object").where(rows["kind"] != "nullkey", None)
    return TranslateResult(rows=rows, rejects=rejects)
