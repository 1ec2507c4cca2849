"""Errors of the Kafka layer."""

from __future__ import annotations

from rewind.errors import RewindError


class PlanError(RewindError):
    """A read window cannot be planned: bad options, unknown topics, impossible bounds.

    The message is one line naming the option, topic or partition and what is allowed.
    """

    def __init__(
        self,
        message: str,
        *,
        option: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> None:
        self.option = option
        self.topic = topic
        self.partition = partition
        super().__init__(message)
