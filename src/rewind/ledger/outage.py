"""Riding out a lost ledger database: bounded retries, and fencing once it is back.

A PostgreSQL ledger restarted, failed over or cut off for a moment must not fail a run with
hours of work behind it, and must never let two processes write one target. Every
transaction of :class:`~rewind.ledger.Ledger` goes through :class:`Outage`:

1. A transaction that loses the database (SQLAlchemy's ``OperationalError`` or
   ``InterfaceError``: refused, reset, terminated by a restart, SQLite's lock) raises
   :class:`LedgerUnavailable`, and the whole ledger method runs again, in a new
   transaction, after a backoff (0.5 s, doubling up to 8 s). The pool's pre-ping replaces the
   dead connections.
2. The retries stop when the outage, counted from its first failure in any thread of the
   process (the lease keeper's heartbeat included), is older than ``retry_s``
   (``ledger_retry_s``, default 60 s): the method then fails in one line and the run with it;
   ``rewind resume`` finishes it once the database is back.
3. A database this process has never reached is a wrong URL or a server that is not there:
   that fails at once, with no waiting.
4. Running a method again is safe because every write is idempotent or checked-and-set:
   units already done with the same counts are skipped, a run already in the state a retry
   asks for counts as moved, leases are conditional upserts. Only an audit entry whose commit
   was cut off in flight may be written twice.
5. Fencing: after an outage, the first write transaction of a process holding a lease (its
   :class:`~rewind.ledger.LeaseKeeper`, registered by :meth:`Outage.watch`) first checks, in
   that same transaction, that the lease is still its own: the keeper's deadline has not
   passed, and a compare-and-set renewal of the lease row by holder and owner finds it.
   Otherwise :class:`~rewind.ledger.LeaseLost` is raised and nothing is written. Within the
   lease's TTL nobody else can take the target (the lease row lives in the same database, out
   of everyone's reach meanwhile); past it the keeper has already fenced its run.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import InterfaceError, OperationalError

from rewind.ledger.exceptions import LedgerUnavailable
from rewind.secrets import mask_url

log = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

RETRY_S = 60.0
"""Default of ``ledger_retry_s``: how long an outage of the ledger's database is ridden out."""
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 8.0


def retried(method: F) -> F:
    """Decorate a method of an object with an ``outage`` (a :class:`~rewind.ledger.Ledger`):
    after losing the database the whole method runs again, in a new transaction."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        outage: Outage = self.outage
        return outage.call(method.__name__, lambda: method(self, *args, **kwargs))

    return call  # type: ignore[return-value]


class Fence(Protocol):
    """What :meth:`Outage.watch` needs of a lease keeper."""

    def verify(self, conn: Connection) -> float:
        """Raise :class:`~rewind.ledger.LeaseLost` unless the lease is still this holder's;
        renew it in ``conn`` and return when the renewal began."""

    def renewed(self, began: float) -> None:
        """The transaction of :meth:`verify` committed."""


class Outage:
    """The connection state of one ledger: when it was lost, the retry budget, the fences."""

    def __init__(self, engine: Engine, writer: Engine, retry_s: float) -> None:
        if not retry_s >= 0:
            raise ValueError(f"ledger_retry_s must be 0 or more seconds, got {retry_s!r}")
        self.engine = engine
        self.writer = writer
        self.retry_s = retry_s
        self.reached = False
        """A transaction of this process has reached the database (only then is a failure an outage)."""
        self.down_since: float | None = None
        self.failures = 0
        """Transactions that lost the database, in any thread."""
        self._fenced = 0  # failures a committed, fenced write has accounted for
        self._fences: list[Fence] = []
        self._local = threading.local()

    # -- fences --------------------------------------------------------------------------------

    def watch(self, fence: Fence) -> None:
        """Fence this process's writes after an outage on ``fence`` (a lease keeper) until :meth:`unwatch`."""
        self._fences.append(fence)

    def unwatch(self, fence: Fence) -> None:
        if fence in self._fences:
            self._fences.remove(fence)

    # -- retries -------------------------------------------------------------------------------

    @property
    def retrying(self) -> bool:
        """True while a method runs again after losing the database (its first run may have committed)."""
        return bool(getattr(self._local, "attempt", 0))

    def call(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one ledger method), again after a backoff while the outage is within budget."""
        if getattr(self._local, "depth", 0):  # inside another retried method: that one retries
            return fn()
        self._local.depth, self._local.attempt = 1, 0
        wait = FIRST_WAIT_S
        try:
            while True:
                try:
                    return fn()
                except LedgerUnavailable as exc:
                    left = self._left()
                    if left is None:  # never reached: a wrong URL or no server, fail at once
                        raise
                    if left <= 0:
                        raise LedgerUnavailable(
                            f"{exc}; unreachable for {self.retry_s - left:.0f} s, beyond ledger_retry_s "
                            f"({self.retry_s:g} s)"
                        ) from exc
                    pause = min(wait, left)
                    log.warning("ledger %s: %s; retrying in %.1f s (%.0f s left)", name, exc, pause, left)
                    time.sleep(pause)
                    wait = min(wait * 2, MAX_WAIT_S)
                    self._local.attempt += 1
        finally:
            self._local.depth, self._local.attempt = 0, 0

    def _left(self) -> float | None:
        if not self.reached:
            return None
        since = self.down_since if self.down_since is not None else time.monotonic()
        return self.retry_s - (time.monotonic() - since)

    # -- transactions --------------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, write: bool, fenced: bool) -> Iterator[Connection]:
        """One transaction; losing the database becomes a one-line :class:`LedgerUnavailable`.

        A ``fenced`` write after an outage first verifies every watched lease in the same
        transaction (step 5 of the module's docstring).
        """
        fence_upto, verified = 0, []
        try:
            with (self.writer if write else self.engine).begin() as conn:
                if write and fenced and self._fences and self.failures > self._fenced:
                    fence_upto = self.failures
                    verified = [(fence, fence.verify(conn)) for fence in list(self._fences)]
                yield conn
        except (OperationalError, InterfaceError) as exc:
            self.failures += 1
            if self.down_since is None:
                self.down_since = time.monotonic()
            detail = str(exc.orig) if exc.orig is not None else str(exc)
            raise LedgerUnavailable(
                f"ledger at {mask_url(str(self.engine.url))} failed: "
                f"{mask_url(detail).strip().splitlines()[0] if detail.strip() else type(exc).__name__}"
            ) from exc
        self.reached = True
        self.down_since = None
        if fence_upto:
            self._fenced = max(self._fenced, fence_upto)
            for fence, began in verified:
                fence.renewed(began)
