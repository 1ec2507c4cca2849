"""The entities a spec selects, as a :class:`~rewind.tables.readers.Selection`.

``ids`` come from the spec or from ``ids_file`` (one per line; blank lines and ``#`` comments
skipped; repeated ids counted once), and are checked against the key column's type: an id of
the wrong type is a one-line error naming it, never a silent non-match (SQLite would compare
``'12'`` with ``12`` as different and select nothing). A file's ids are pinned in the plan by
their digest, so a file edited between plan and run is refused rather than read differently.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rewind.tables.exceptions import SelectionChanged, TableSourceError
from rewind.tables.readers import Key, KeyType, Selection

if TYPE_CHECKING:
    from rewind.spec.table_source import TableSource

_INTEGER = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class Chosen:
    """A spec's selection and what the plan pins of it."""

    selection: Selection
    ids_digest: str | None = None
    repeated: int = 0


def _typed(value: Key, key_type: KeyType | None, where: str) -> Key:
    if key_type is None:
        return value
    if key_type == "integer":
        if isinstance(value, int):
            return value
        if where.startswith("source.table.ids_file") and _INTEGER.fullmatch(value.strip()):
            return int(value.strip())
        raise TableSourceError(
            where, f"{value!r} is not an integer, and the key column is integer; give ids of the key's type"
        )
    if isinstance(value, str):
        return value
    raise TableSourceError(
        where, f"{value!r} is an integer, and the key column is text; quote it (give '{value}')"
    )


def ids_digest(ids: list[Key]) -> str:
    return hashlib.sha256("\n".join(repr(i) for i in ids).encode()).hexdigest()[:16]


def read_ids_file(path: str, key_type: KeyType | None) -> tuple[list[Key], int]:
    """The file's ids (typed, first occurrence kept) and how many lines repeated one."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TableSourceError(
            "source.table.ids_file", f"cannot read {path}: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise TableSourceError("source.table.ids_file", f"{path} is not UTF-8 text") from None
    ids: dict[Key, None] = {}
    repeated = 0
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        value = _typed(text, key_type, f"source.table.ids_file: {path} line {number}")
        if value in ids:
            repeated += 1
        ids[value] = None
    if not ids:
        raise TableSourceError("source.table.ids_file", f"{path} holds no id (one per line)")
    return list(ids), repeated


def choose(table: TableSource, key_type: KeyType | None, pinned: str | None = None) -> Chosen:
    """The selection of ``table``; with ``pinned`` (the plan's digest of an ids file), a file
    that no longer has those ids is :class:`SelectionChanged`."""
    if table.ids is not None:
        ids = [_typed(v, key_type, f"source.table.ids.{i}") for i, v in enumerate(table.ids)]
        return Chosen(Selection(ids=tuple(ids)))
    if table.ids_file is not None:
        ids, repeated = read_ids_file(table.ids_file, key_type)
        digest = ids_digest(ids)
        if pinned is not None and digest != pinned:
            raise SelectionChanged(
                "source.table.ids_file",
                f"{table.ids_file} changed since the plan (its ids digest is {digest}, the plan's {pinned}); "
                "plan again to re-produce what it holds now",
            )
        return Chosen(Selection(ids=tuple(ids)), digest, repeated)
    return Chosen(Selection(where=table.where))
