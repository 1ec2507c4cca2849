"""Errors of shadow migrations, each one line naming what to do."""

from __future__ import annotations

from rewind.errors import RewindError


class ShadowError(RewindError):
    """A shadow operation was refused; nothing was changed."""
