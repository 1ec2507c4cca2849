"""Errors of the record-processing core.

Bad *records* are never errors: they are quarantined with a reason. These errors are about
bad *configuration or code* (a translate function that cannot be imported or returns the
wrong shape, a schema folder that does not exist, a registry that does not answer) and
about broken invariants; each one fails the task and says what to do.
"""

from __future__ import annotations

from rewind.errors import RewindError


class TranslateError(RewindError):
    """Base of the errors of ``rewind.translate``."""


class TranslateLoadError(TranslateError):
    """A ``module.path:callable`` reference cannot be turned into a callable."""

    def __init__(self, message: str, *, reference: str) -> None:
        self.reference = reference
        super().__init__(message)


class TranslateOutputError(TranslateError):
    """A translate function returned something that breaks the translate contract."""


class OutputSchemaUnknown(TranslateError):
    """The output columns of a translate function cannot be learnt from an empty frame."""


class DecoderConfigError(TranslateError):
    """A decoder was configured with a bad value (unknown type name, bad policy...)."""


class SchemaSourceError(TranslateError):
    """Avro schemas cannot be had: a missing folder, an unreadable ``.avsc``, no reader schema."""


class SchemaRegistryUnavailable(SchemaSourceError):
    """The schema registry did not answer, or answered with something other than 'not found'.

    An unreachable registry is an operational failure, not bad data: quarantining every record
    because the network blinked would turn a retryable outage into a silent mass reject. The
    task fails and Spark (or ``rewind resume``) retries it.
    """

    def __init__(self, url: str, detail: str, field: str = "decode.registry_url") -> None:
        self.url = url
        where = (
            "from where Spark runs (the task will be retried)"
            if field.startswith("decode.")
            else "from where Rewind runs"
        )
        super().__init__(
            f"schema registry at {url}: {detail}; check {field} and that the registry is reachable {where}"
        )
