"""One error root for everything Rewind raises on purpose.

The CLI turns any :class:`RewindError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback (shown with ``--debug``).
"""

from __future__ import annotations


class RewindError(Exception):
    """Base of every error Rewind raises deliberately.

    The message is meant for a person: it names what is wrong and what to do.
    """


def error_line(exc: BaseException) -> str:
    """The class and first line of an error, at most 2,000 characters: what the ledger keeps of
    a failed run or unit."""
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0] if text else ''}"[:2000]


class ConfigError(RewindError):
    """A setting is missing or has a bad value."""


class StackError(RewindError):
    """The embedded stack could not be started, stopped or inspected."""


class BrokerUnreachable(RewindError):
    """No Kafka broker answered at the configured address."""

    def __init__(self, bootstrap: str, detail: str = "") -> None:
        self.bootstrap = bootstrap
        hint = "check kafka.bootstrap_servers (or REWIND_BOOTSTRAP_SERVERS), or run `rewind dev up`"
        suffix = f" ({detail})" if detail else ""
        super().__init__(f"no Kafka broker answered at {bootstrap}{suffix}; {hint}")


class SpecError(RewindError):
    """A job spec is missing, unreadable or invalid.

    The message is one line: the file, the dotted field, what is wrong, the bad value and
    what is allowed. ``field`` is the dotted path when the error is about one field.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


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
