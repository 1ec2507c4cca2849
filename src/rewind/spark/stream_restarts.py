"""Rewind's streaming queries restart themselves: a query that fails is started again from its
checkpoint, after a bounded exponential backoff, until too many restarts fall in a window.

A continuous archive or a shadow's tail is a Spark streaming query whose micro-batches commit
exactly once (the archive's high-water, the tail's unit ids ride in each commit): started again
from the same checkpoint, Spark replays the batch that failed and the commit skips what is
already there. So a transient failure (a Python worker that did not connect back under load,
a broker or catalog that was unreachable for a moment) costs a restart, not the stream.

:class:`StreamSupervisor` watches one query from a daemon thread of the driver. Each restart is
logged with its cause (WARNING, one line), counted in the Prometheus counter
``rewind_stream_restarts_total{stream=...}`` of the process, and told to ``on_restart`` (a
shadow records it in the ledger, where ``rewind shadow status`` shows it). After
``max_restarts`` restarts within ``window_s`` the supervisor gives up: :meth:`error` returns a
one-line :class:`StreamGaveUp` naming the last cause.

Starting the query can fail for the same transient reason: a Python worker that Spark starts
while the query is set up (the data source's planner; under Spark Connect, the foreachBatch
runner) must connect back within a fixed 10 s, and a loaded machine misses that. Such a
start is retried under the same policy; any other failed start (bad options, a missing table)
is raised at once, since no restart would cure it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.errors import RewindError

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from rewind.config import Settings

log = logging.getLogger(__name__)


class StreamGaveUp(RewindError):
    """A streaming query failed more often than its restart policy allows."""


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    """Wait before the first restart; doubled for each further restart in the window."""
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    """Restarts allowed within ``window_s``; one more failure gives up."""
    window_s: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RestartPolicy:
        s = settings.streams
        return cls(s.restart_backoff_s, s.restart_max_backoff_s, s.max_restarts, s.restart_window_s)


@dataclass
class Restarts:
    """The restarts of one stream, and whether it may restart once more."""

    stream: str
    policy: RestartPolicy
    at: list[float] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)

    def after_failure(self, error: object, now: float | None = None) -> float:
        """Record a failure: the seconds to wait before restarting, or :class:`StreamGaveUp`."""
        now = time.monotonic() if now is None else now
        cause = first_line(error)
        recent = [t for t in self.at if now - t < self.policy.window_s]
        if len(recent) >= self.policy.max_restarts:
            raise StreamGaveUp(
                f"{self.stream} stopped: it failed again after {len(recent)} restarts within "
                f"{self.policy.window_s:g} s ({cause}); fix the cause and start it again"
            )
        self.at.append(now)
        self.causes.append(cause)
        wait = min(self.policy.max_backoff_s, self.policy.backoff_s * 2 ** len(recent))
        _counter().labels(stream=self.stream).inc()
        n = len(self.at)
        log.warning("%s failed (%s); restart %d from its checkpoint in %.1f s", self.stream, cause, n, wait)
        return wait


_QUALIFIED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\.(?=[A-Za-z_]\w*(?::|$))")


def first_line(error: object) -> str:
    """The cause in one line: the Python error at the end of a batch's traceback (Spark wraps
    it in "An exception was raised by the Python Proxy..."), else the text's first line."""
    text = str(error).strip()
    lines = text.splitlines()
    line = lines[0] if text else type(error).__name__
    if "Traceback (most recent call last):" in text:
        # a Python traceback's error is its first line after the frames (which are indented)
        at = max(i for i, x in enumerate(lines) if "Traceback (most recent call last):" in x)
        line = next((x.strip() for x in lines[at + 1 :] if x.strip() and not x[:1].isspace()), line)
        line = _QUALIFIED.sub("", line)  # the error's class without its module
    return line if len(line) <= 500 else line[:497] + "..."


class StreamSupervisor:
    """Keeps one streaming query running (see the module docstring)."""

    def __init__(
        self,
        stream: str,
        start: Callable[[], StreamingQuery],
        policy: RestartPolicy,
        on_restart: Callable[[int, str], None] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.restarts = Restarts(stream, policy)
        self._start, self._on_restart, self._poll_s = start, on_restart, poll_s
        self._stopping = threading.Event()
        self._gave_up: StreamGaveUp | None = None
        self.query: StreamingQuery = self._first_start()
        self._restart_error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name=f"restart {stream}", daemon=True)
        self._thread.start()

    def _first_start(self) -> StreamingQuery:
        """The query, started again after a start that failed only transiently (see the module
        docstring); raises the first other failure, or :class:`StreamGaveUp`."""
        while True:
            try:
                return self._start()
            except Exception as exc:
                if not transient(exc):
                    raise
                time.sleep(self.restarts.after_failure(exc))

    @property
    def count(self) -> int:
        return len(self.restarts.at)

    def error(self) -> StreamGaveUp | None:
        """The one-line error once the supervisor gave up; None while the stream runs."""
        return self._gave_up

    @property
    def running(self) -> bool:
        return self._gave_up is None and not self._stopping.is_set()

    def _watch(self) -> None:
        while not self._stopping.wait(self._poll_s):
            failure = self._restart_error or _failure(self.query)
            if failure is None:
                continue
            try:
                wait = self.restarts.after_failure(failure)
            except StreamGaveUp as exc:
                self._gave_up = exc
                log.error("%s", exc)
                return
            if self._stopping.wait(wait):
                return
            try:
                self.query = self._start()
                self._restart_error = None
            except Exception as exc:  # the restart itself failed (the broker is still down...)
                log.warning("%s: restart failed (%s)", self.restarts.stream, first_line(exc))
                self._restart_error = exc  # counted as a failure on the next poll
                continue
            if self._on_restart is not None:
                try:
                    self._on_restart(self.count, self.restarts.causes[-1])
                except Exception as exc:  # recording it must not stop the stream
                    log.warning("%s: could not record restart (%s)", self.restarts.stream, first_line(exc))

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=30)
        if self.query.isActive:
            self.query.stop()


TRANSIENT_CAUSES = ("Python worker failed to connect back",)
"""Failures of a query's start that a later start does not repeat."""


def transient(error: BaseException) -> bool:
    """Whether a failed start is worth starting again (:data:`TRANSIENT_CAUSES`)."""
    text = str(error)
    return any(cause in text for cause in TRANSIENT_CAUSES)


def _failure(query: StreamingQuery) -> object | None:
    """The query's error if it ended with one (a query stopped on purpose has none)."""
    if query.isActive:
        return None
    return query.exception()


_COUNTER: Any = None


def _counter() -> Any:
    global _COUNTER
    if _COUNTER is None:
        # lazy: avoids prometheus_client at import
        from prometheus_client import Counter

        _COUNTER = Counter("rewind_stream_restarts", "Restarts of a Rewind streaming query", ["stream"])
    return _COUNTER
