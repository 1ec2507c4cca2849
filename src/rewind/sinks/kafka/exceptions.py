"""Errors of the Kafka topic sink."""

from __future__ import annotations

from rewind.errors import RewindError


class KafkaSinkError(RewindError):
    """The Kafka topic sink cannot do what was asked; the message says what to do."""


def short_error(exc: BaseException) -> str:
    """The first line of an error, or librdkafka's own message of a KafkaException."""
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "str"):
        return str(args[0].str())
    return str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
