"""Logging set-up with a filter that scrubs secrets from every record.

Core code logs through ``logging`` and never prints; the CLI decides the level.
"""

from __future__ import annotations

import logging

from rewind.secrets import mask_text


class SecretFilter(logging.Filter):
    """Replaces known secret values and URL passwords in each formatted message."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = mask_text(message, self.secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:  # the traceback text can carry secrets too
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info), self.secrets)
        return True


def configure(level: int = logging.WARNING, secrets: list[str] | None = None) -> None:
    """Send Rewind's logs to stderr at ``level``, scrubbing ``secrets`` and URL passwords."""
    root = logging.getLogger("rewind")
    root.setLevel(level)
    for handler in list(root.handlers):
        if getattr(handler, "_rewind", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler()
    handler._rewind = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter(secrets or []))
    root.addHandler(handler)
