"""Errors of the history package: archive passes, history plans and reads."""

from __future__ import annotations

from rewind.errors import RewindError


class HistoryError(RewindError):
    """Base of the history package's errors."""


class ArchiveTableError(HistoryError):
    """The archive table is missing, or is not a Rewind archive (wrong schema or spec)."""


class ArchiveConflictError(HistoryError):
    """Another writer committed to the archive during this pass; nothing of this pass was committed."""


class ArchiveLossError(HistoryError):
    """Offsets the archive has not copied yet are no longer in Kafka (``allow_loss`` not set)."""


class ArchivePositionError(HistoryError):
    """The archive's high-water and the broker (or a stream's batch) disagree: nothing was committed."""


class HistoryGapError(HistoryError):
    """Part of the requested window is in neither the archive nor Kafka (``allow_gaps`` not set)."""


class CoverageError(HistoryError):
    """A read returned other records than its plan promised (an archive file missing or altered)."""
