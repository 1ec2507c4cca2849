"""Errors of the SQL sink."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.errors import RewindError

if TYPE_CHECKING:

    pass


class SqlSinkError(RewindError):
    """The SQL target or its staging cannot be used as asked."""


class TargetMoved(SqlSinkError):
    """The target changed since staging was cut from it: a swap would drop those writes."""


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else exc.__class__.__name__
