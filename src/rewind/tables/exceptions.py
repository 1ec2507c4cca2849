"""Errors of a table source: one line naming the spec field and what to do."""

from __future__ import annotations

from rewind.errors import RewindError


class TableSourceError(RewindError):
    """The table source cannot be read as the spec says; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class SourceUnreachable(TableSourceError):
    """The database does not answer (or the SQLite file does not exist)."""


class SelectionChanged(TableSourceError):
    """What the plan pinned (an ids file) changed before the run read it."""
