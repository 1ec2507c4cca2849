"""Leases: one live run per staging target, across processes and hosts.

A lease row names the target, the run holding it (``holder``), the process doing the work
(``owner``, ``host:pid``) and when it expires. The decision to grant a lease is one
conditional upsert — ``INSERT ... ON CONFLICT (target) DO UPDATE ... WHERE <may take it>`` —
so two processes racing for a target cannot both win on SQLite or PostgreSQL. The row is
read first only to word errors and audit a takeover; on PostgreSQL that read locks the row
(``FOR UPDATE``), on SQLite the transaction holds the write lock from its start.

A caller may take a target when:

1. nobody holds it;
2. it already holds it from the same process (re-entrant: the lease is renewed);
3. the lease has expired (a takeover, recorded in the audit log);
4. it holds it as the same run from another process that is provably dead (same host, pid
   gone) — this is how ``rewind resume`` picks up a killed run without waiting for expiry.

The same run held by another *live* process is refused: two processes must never write one
run's output. Times come from the database clock on PostgreSQL, so hosts with skewed clocks
agree on expiry.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, and_, case, delete, or_, select, update

from rewind.ledger._common import current_owner, db_now, insert_audit, owner_is_dead, upsert
from rewind.ledger.exceptions import LeaseHeld, LeaseLost
from rewind.ledger.models import Lease
from rewind.ledger.schema import leases

if TYPE_CHECKING:
    from rewind.ledger.outage import Outage

log = logging.getLogger(__name__)


def _lease(row: Any) -> Lease:
    m = row._mapping
    return Lease(m["target"], m["holder"], m["owner"], m["acquired_at"], m["heartbeat_at"], m["expires_at"])


def _ttl(ttl_s: float) -> timedelta:
    if not ttl_s > 0:
        raise ValueError(f"a lease ttl must be positive, got {ttl_s!r}")
    return timedelta(seconds=ttl_s)


def read_lease(conn: Connection, target: str, *, lock: bool = False) -> Lease | None:
    query = select(leases).where(leases.c.target == target)
    if lock:
        query = query.with_for_update()  # rendered on PostgreSQL, ignored by SQLite
    row = conn.execute(query).first()
    return _lease(row) if row else None


def acquire(conn: Connection, target: str, holder: str, ttl_s: float, owner: str, user: str) -> Lease:
    """Take or renew the lease on ``target`` inside the caller's write transaction.

    Steps: 1. read the clock and the current row (locked); 2. decide whether the current
    owner is a dead process of the same run; 3. upsert with the full condition in its WHERE,
    so the database, not step 1, decides; 4. no row back means someone else holds it:
    raise :class:`LeaseHeld`; 5. a row taken from another holder or owner is audited.
    """
    ttl = _ttl(ttl_s)
    now = db_now(conn)
    prior = read_lease(conn, target, lock=True)
    dead_owner = (
        prior.owner
        if prior is not None
        and prior.holder == holder
        and prior.owner != owner
        and prior.expires_at > now
        and owner_is_dead(prior.owner)
        else None
    )

    ins = upsert(conn, leases).values(
        target=target, holder=holder, owner=owner, acquired_at=now, heartbeat_at=now, expires_at=now + ttl
    )
    ex = ins.excluded
    same = and_(leases.c.holder == ex.holder, leases.c.owner == ex.owner)
    may_take = [same, leases.c.expires_at <= ex.heartbeat_at]
    if dead_owner is not None:
        may_take.append(and_(leases.c.holder == ex.holder, leases.c.owner == dead_owner))
    stmt = ins.on_conflict_do_update(
        index_elements=[leases.c.target],
        set_={
            "holder": ex.holder,
            "owner": ex.owner,
            "acquired_at": case((same, leases.c.acquired_at), else_=ex.acquired_at),
            "heartbeat_at": ex.heartbeat_at,
            "expires_at": ex.expires_at,
        },
        where=or_(*may_take),
    ).returning(*leases.c)
    row = conn.execute(stmt).first()

    if row is None:
        current = read_lease(conn, target) or prior
        assert current is not None  # the upsert met a row, so there is one
        raise LeaseHeld(
            target, current.holder, current.owner, current.expires_at, same_run=current.holder == holder
        )

    lease = _lease(row)
    if prior is not None and (prior.holder, prior.owner) != (holder, owner):
        reason = "owner-dead" if dead_owner is not None and prior.expires_at > now else "expired"
        insert_audit(
            conn,
            holder,
            "lease-takeover",
            user,
            {
                "target": target,
                "reason": reason,
                "previous_holder": prior.holder,
                "previous_owner": prior.owner,
                "previous_expires_at": prior.expires_at,
                "owner": owner,
            },
            at=now,
        )
        log.warning(
            "run %s (%s) took over %s from run %s (%s, %s)",
            holder,
            owner,
            target,
            prior.holder,
            prior.owner,
            reason,
        )
    return lease


def heartbeat(conn: Connection, target: str, holder: str, ttl_s: float, owner: str) -> Lease:
    """Extend a lease this holder and owner hold; :class:`LeaseLost` when they no longer do.

    An expired lease nobody has taken yet is still extended: no one else wrote meanwhile.
    """
    ttl = _ttl(ttl_s)
    now = db_now(conn)
    stmt = (
        update(leases)
        .where(leases.c.target == target, leases.c.holder == holder, leases.c.owner == owner)
        .values(heartbeat_at=now, expires_at=now + ttl)
        .returning(*leases.c)
    )
    row = conn.execute(stmt).first()
    if row is None:
        current = read_lease(conn, target)
        raise LeaseLost(
            target, holder, current.holder if current else None, current.owner if current else None
        )
    return _lease(row)


def release(conn: Connection, target: str, holder: str, owner: str) -> bool:
    """Drop the lease if this holder and owner hold it; False (and nothing done) otherwise."""
    result = conn.execute(
        delete(leases).where(leases.c.target == target, leases.c.holder == holder, leases.c.owner == owner)
    )
    return bool(result.rowcount)


class LeaseLedger(Protocol):
    """What a :class:`LeaseKeeper` needs of the ledger (:class:`~rewind.ledger.Ledger` is one).

    A protocol rather than the ledger itself: the ledger's repository takes leases through this
    module's functions and builds the keepers (:meth:`~rewind.ledger.Ledger.keeper`), so leases
    sit below it and never import it.
    """

    outage: Outage

    def acquire(self, target: str, holder: str, ttl_s: float, *, owner: str | None = None) -> Lease: ...

    def heartbeat(self, target: str, holder: str, ttl_s: float, *, owner: str | None = None) -> Lease: ...

    def release(self, target: str, holder: str, *, owner: str | None = None) -> bool: ...


class LeaseKeeper:
    """Hold a lease for the life of a ``with`` block, heartbeating from a daemon thread.

    ``__enter__`` acquires (raising :class:`LeaseHeld`), a thread renews every ``ttl/3``,
    and ``__exit__`` stops it and releases the lease if this process still holds it. When a
    heartbeat finds the lease gone, or heartbeats keep failing until the lease would have
    expired, :attr:`lost` is set: the runner must stop writing (check it between stages, or
    call :meth:`check`). This is the fencing that keeps a paused process from writing after
    another took over. While held, the ledger's first write after an outage also calls
    :meth:`verify` inside its own transaction (:mod:`rewind.ledger.outage`).
    """

    def __init__(
        self,
        ledger: LeaseLedger,
        target: str,
        holder: str,
        ttl_s: float,
        *,
        interval_s: float | None = None,
        owner: str | None = None,
    ) -> None:
        _ttl(ttl_s)
        self.ledger = ledger
        self.target = target
        self.holder = holder
        self.ttl_s = ttl_s
        self.interval_s = interval_s if interval_s is not None else ttl_s / 3
        self.owner = owner
        self.lost = threading.Event()
        self.error: LeaseLost | None = None
        self.lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._deadline = 0.0  # time.monotonic() after which the lease may be someone else's

    def __enter__(self) -> LeaseKeeper:
        began = time.monotonic()
        self.lease = self.ledger.acquire(self.target, self.holder, self.ttl_s, owner=self.owner)
        self._deadline = began + self.ttl_s
        self.ledger.outage.watch(self)
        self._thread = threading.Thread(target=self._beat, name=f"rewind-lease-{self.target}", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self.ledger.outage.unwatch(self)
        if self._thread is not None:
            self._thread.join(timeout=max(self.ttl_s, 5.0))
        try:  # even when lost: release only deletes a row this holder and owner still hold
            released = self.ledger.release(self.target, self.holder, owner=self.owner)
        except Exception:  # the lease expires by itself; do not hide the block's own error
            log.warning(
                "could not release the lease on %s; it expires at %s",
                self.target,
                self.lease.expires_at if self.lease else "?",
                exc_info=True,
            )
            return
        if not released and not self.lost.is_set():
            log.warning("the lease on %s was gone when run %s released it", self.target, self.holder)

    @property
    def expires_at(self) -> datetime | None:
        return self.lease.expires_at if self.lease else None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is lost or may have expired unrenewed."""
        if not self.lost.is_set() and self._deadline and time.monotonic() >= self._deadline:
            self._lose(LeaseLost(self.target, self.holder))
        if self.lost.is_set():
            raise self.error or LeaseLost(self.target, self.holder)

    def verify(self, conn: Connection) -> float:
        """Inside the caller's write transaction, raise :class:`LeaseLost` (and stay lost) unless
        the lease is still ours: :meth:`check`, then a compare-and-set renewal of the row by this
        holder and owner. Returns when the renewal began, for :meth:`renewed` once it committed
        (not before: the caller's transaction may yet roll back).
        """
        self.check()
        began = time.monotonic()
        try:
            heartbeat(conn, self.target, self.holder, self.ttl_s, self.owner or current_owner())
        except LeaseLost as exc:
            self._lose(exc)
            log.error("%s", exc)
            raise
        return began

    def renewed(self, began: float) -> None:
        """A renewal that began at ``began`` (``time.monotonic()``) has committed."""
        self._deadline = max(self._deadline, began + self.ttl_s)

    def _lose(self, error: LeaseLost) -> None:
        if self.error is None:
            self.error = error
        self.lost.set()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s) and not self.lost.is_set():
            began = time.monotonic()
            try:
                self.lease = self.ledger.heartbeat(self.target, self.holder, self.ttl_s, owner=self.owner)
                self._deadline = began + self.ttl_s
            except LeaseLost as exc:
                self._lose(exc)  # fenced first: whoever reads the log line finds check() raising
                log.error("%s", exc)
                return
            except Exception as exc:  # a flaky database: retry until the lease would run out
                if time.monotonic() >= self._deadline:
                    self._lose(LeaseLost(self.target, self.holder))
                    log.error("lease on %s not renewed before it expired: %s", self.target, exc)
                    return
                log.warning("lease heartbeat on %s failed, retrying: %s", self.target, exc)
