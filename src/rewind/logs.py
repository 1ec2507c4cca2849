"""Logging set-up with a filter that scrubs secrets from every record.

Core code logs through ``logging`` and never prints; the CLI decides the level and where
records go: without ``--debug``, Rewind's warnings go to ``<state_dir>/rewind.log`` and only
errors to stderr as well (a refused command prints one line, which names the file when
warnings went there); with ``--debug``, everything goes to stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

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


class _LogFile(logging.FileHandler):
    """The log file, opened (its folder made) at the first record: a command that logs nothing
    creates nothing. ``warnings`` is how many WARNING records it took."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)
        self.path = path
        self.warnings = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                self.handleError(record)
                return
        self.warnings += record.levelno == logging.WARNING
        super().emit(record)


def configure(
    level: int = logging.WARNING,
    secrets: list[str] | None = None,
    *,
    log_file: Path | None = None,
    stderr_level: int | None = None,
) -> None:
    """Send Rewind's logs at ``level`` to stderr, scrubbing ``secrets`` and URL passwords.

    With ``log_file``, every record at ``level`` goes to that file and only those at
    ``stderr_level`` (default ``level``) to stderr as well: the CLI keeps warnings off the one
    line a refused command prints (:func:`warnings_in_file` says how many went to the file).
    """
    root = logging.getLogger("rewind")
    root.setLevel(level)
    remove_handlers()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    handlers[0].setLevel(level if stderr_level is None else stderr_level)
    if log_file is not None:
        handlers.append(_LogFile(log_file))
    for handler in handlers:
        handler._rewind = True  # type: ignore[attr-defined]
        handler.setFormatter(formatter)
        handler.addFilter(SecretFilter(secrets or []))
        root.addHandler(handler)


def remove_handlers() -> None:
    """Take away the handlers :func:`configure_logging` added (the file is closed): the next
    command in the same process starts with no log file and no warnings counted."""
    root = logging.getLogger("rewind")
    for handler in list(root.handlers):
        if getattr(handler, "_rewind", False):
            root.removeHandler(handler)
            handler.close()


def warnings_in_file() -> tuple[int, Path | None]:
    """How many warnings the configured log file took so far, and its path (0, None: none)."""
    for handler in logging.getLogger("rewind").handlers:
        if isinstance(handler, _LogFile) and getattr(handler, "_rewind", False):
            return handler.warnings, handler.path
    return 0, None


def to_stderr_unless_configured(logger: logging.Logger) -> logging.Logger:
    """``logger`` (under ``rewind``), given a handler of its own that prints ``rewind: <message>``
    to stderr while :func:`configure` has not set up Rewind's logging, as in a Spark task's Python
    worker, where the library's ``NullHandler`` would swallow a warning; where it has, the own
    handler goes and records propagate to the configured ones."""
    configured = any(getattr(h, "_rewind", False) for h in logging.getLogger("rewind").handlers)
    own = [h for h in logger.handlers if getattr(h, "_rewind_stderr", False)]
    if not configured and not own:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("rewind: %(message)s"))
        handler._rewind_stderr = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    elif configured and own:
        for old in own:
            logger.removeHandler(old)
        logger.propagate = True
    return logger
