"""Checking the column names a translate returns against the reserved names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rewind.core.columns import LINEAGE_PREFIX, ROW
from rewind.translate.exceptions import TranslateOutputError


def user_columns(columns: Iterable[Any]) -> list[str]:
    """The output columns that are the user's: all but ``_rewind_row`` and the ``_src_`` inputs.

    Raises ``TranslateOutputError`` for a column that is not a string or that takes a
    lineage name (``_rewind_...``).
    """
    out: list[str] = []
    for name in columns:
        if not isinstance(name, str):
            raise TranslateOutputError(f"output column {name!r} is not a string; name every column")
        if name == ROW or name.startswith("_src_"):
            continue
        if name.startswith(LINEAGE_PREFIX):
            raise TranslateOutputError(
                f"output column {name!r} uses the prefix _rewind_, reserved for lineage; rename it"
            )
        out.append(name)
    return out
