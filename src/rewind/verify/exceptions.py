"""Errors of verification: one line each, naming the side, the column or the reference."""

from __future__ import annotations

from rewind.errors import RewindError


class VerifyError(RewindError):
    """Verification cannot run as configured (a missing column, a bad type, a bad scope)."""


class ReferenceUnreachable(VerifyError):
    """The reference (a PostgreSQL server, an Iceberg table, a SQL query) cannot be read."""
