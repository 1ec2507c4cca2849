"""The demo's one error, shared by the story and the scene it sets up."""

from __future__ import annotations

from rewind.errors import RewindError


class DemoFailed(RewindError):
    """A step of the demo did not give the result the story expects."""
