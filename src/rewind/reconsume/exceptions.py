"""Errors of reconsumes: each one line, naming the reconsume, group or partition and what to do."""

from __future__ import annotations

from rewind.errors import RewindError


class ReconsumeError(RewindError):
    """Base of the errors of :mod:`rewind.reconsume`."""


class ReconsumeInputError(ReconsumeError):
    """The options of a plan do not make one reconsume (bad id, no start, two starts, bad JSON)."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        self.option = option
        super().__init__(message)


class ReconsumeNotStarted(ReconsumeError):
    """A side was opened for a reconsume that is only planned: nothing tells it what to skip."""

    def __init__(self, reconsume_id: str) -> None:
        self.reconsume_id = reconsume_id
        super().__init__(
            f"reconsume {reconsume_id} is planned but not started; run `rewind reconsume start "
            f"{reconsume_id}` before the services' wrappers"
        )


class TemporaryGroupTaken(ReconsumeError):
    """The temporary group's name already has committed offsets that are not this reconsume's."""

    def __init__(self, reconsume_id: str, group: str, detail: str) -> None:
        self.group = group
        super().__init__(
            f"temporary group '{group}' of reconsume {reconsume_id} {detail}; pick another reconsume id "
            "(or delete that group if it is a leftover)"
        )


class TemporarySideRunning(ReconsumeError):
    """A second temporary side of one reconsume: two would handle the same offsets."""

    def __init__(self, reconsume_id: str, owner: str, until: str) -> None:
        self.owner = owner
        super().__init__(
            f"the temporary side of reconsume {reconsume_id} already runs as {owner} (its lease lasts "
            f"until {until}); run one temporary side per reconsume, or wait until then if it is dead"
        )
