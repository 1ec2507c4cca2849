"""The temporary side: a second handler re-reads a live group's partitions from a start offset.

Rewind names the temporary group (``rewind-reconsume-<id>``) and commits its start offsets
(``rewind reconsume start``). The temporary side reads with ``assign`` at the group's
committed offsets, not ``subscribe``: exactly one process may run it, fenced by a lease in
the ledger (a second one gets :class:`rewind.ledger.LeaseHeld`; one on the same host whose
holder died takes over at once), so there is no rebalance in which two processes handle
the same offsets, and no wait for a group assignment.

It owns ``[start, handover)`` of each partition. Per batch, in this order:

1. consume a batch (end-of-partition events on);
2. call the handler on the messages it owns (in parallel mode only those at or below the
   existing side's recorded offset, read once per batch);
3. commit the new positions to the temporary group, synchronously;
4. at most ONE ledger transaction: the handover where due, and the positions reached (these
   only inform ``status``, so at most every ``record_interval_s``); the existing side's
   record is read at most that often too, and a handover is only tried when it can hold:

   * handover mode: as soon as the position passes the existing side's recorded offset
     ("caught up": a compare-and-set against the existing side's record, so the two sides
     can never both own an offset, see :mod:`rewind.ledger.handover`);
   * parallel mode: as soon as the position passes the existing side's recorded offset (the
     existing side handles everything, there is nothing to race with);
   * either mode: when the partition's lag has been zero (end of partition reached and no
     message since) for ``idle_handover_s`` — a partition that never gets a new message
     would otherwise never see the existing side record anything;

5. stop reading the partitions handed over; when none is left, :attr:`done` is true and
   :meth:`run` returns.

Crash semantics: killed after step 2 and before step 3, the side handles that batch again
after a restart (the same side, never the other: the handover is recorded only after the
commit, at the committed position). Killed between steps 3 and 4, nothing is lost: the
next batch or idle check records it.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC
from typing import TYPE_CHECKING, Any

from rewind.core.windows import TP
from rewind.kafka import clients
from rewind.ledger import LeaseHeld, Ledger
from rewind.ledger._common import current_owner
from rewind.ledger.handover import Reason, TempStep
from rewind.ledger.leases import LeaseKeeper
from rewind.reconsume.base import COMMIT_TIMEOUT_S, Handler, Side, message_error
from rewind.reconsume.exceptions import ReconsumeError, TemporarySideRunning

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

DEFAULT_IDLE_HANDOVER_S = 30.0

_RUNNING: set[str] = set()
"""Reconsumes whose temporary side runs in this process: the ledger's lease is re-entrant
within one process (its owner is ``host:pid``), so a second side here is refused here."""
_RUNNING_LOCK = threading.Lock()


def lease_target(reconsume_id: str) -> str:
    """The ledger lease that keeps a second temporary side of one reconsume from running."""
    return f"reconsume:{reconsume_id}:temporary"


class TemporarySide(Side):
    """Run ``handler`` over the temporary group's partitions until each is handed over.

    ``consumer`` is the Kafka client configuration (bootstrap servers, security); the group
    id is the reconsume's temporary group. ``idle_handover_s`` defaults to the plan's.
    """

    role = "temporary"

    def __init__(
        self,
        consumer: Consumer | dict[str, Any],
        handler: Handler,
        *,
        reconsume: str,
        ledger: str | Ledger,
        batch_size: int = 500,
        timeout_s: float = 1.0,
        idle_handover_s: float | None = None,
        lease_ttl_s: float = 30.0,
        record_interval_s: float = 1.0,
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        super().__init__(consumer, handler, reconsume=reconsume, ledger=ledger, batch_size=batch_size,
                         timeout_s=timeout_s, record_interval_s=record_interval_s,
                         commit_timeout_s=commit_timeout_s)
        self.idle_handover_s = idle_handover_s
        self.lease_ttl_s = lease_ttl_s
        self.handed_over: dict[TP, int] = {}
        """Partitions this process handed over, and where."""
        self._keeper: LeaseKeeper | None = None
        self._pos: dict[TP, int] = {}  # next offset to handle, per partition still owned
        self._idle_since: dict[TP, float] = {}
        self._e: dict[TP, int | None] = {}
        self._e_read_at = float("-inf")
        self._unrecorded: dict[TP, int] = {}  # positions reached but not yet in the ledger
        self._recorded_at = float("-inf")

    def _prepare(self, ledger: Ledger) -> None:
        assert self.record is not None
        if self.idle_handover_s is None:
            self.idle_handover_s = float(self.record.plan.get("idle_handover_s", DEFAULT_IDLE_HANDOVER_S))
        self._parallel = self.record.mode == "parallel"
        with _RUNNING_LOCK:
            if self.reconsume_id in _RUNNING:
                raise TemporarySideRunning(self.reconsume_id, f"{current_owner()} (this process)", "it stops")
            keeper = ledger.keeper(lease_target(self.reconsume_id), self.reconsume_id, self.lease_ttl_s)
            try:
                keeper.__enter__()
            except LeaseHeld as exc:
                until = exc.expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
                raise TemporarySideRunning(self.reconsume_id, exc.owner, until) from None
            _RUNNING.add(self.reconsume_id)
        self._keeper = keeper

    def _build_consumer(self, conf: dict[str, Any]) -> Consumer:
        assert self.record is not None
        settings = self._group_conf(
            conf, self.record.temp_group, **{"enable.partition.eof": True, "auto.offset.reset": "error"}
        )
        return clients.consumer(settings)

    def _attach(self, consumer: Consumer) -> None:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        assert self.record is not None
        owned = sorted(tp for tp, r in self.rows.items() if r.handover_offset is None)
        if not owned:
            return
        committed = consumer.committed([TopicPartition(t, p) for t, p in owned], timeout=30)
        missing = [f"{c.topic}/{c.partition}" for c in committed if c.error is not None or c.offset < 0]
        if missing:
            raise ReconsumeError(
                f"temporary group '{self.record.temp_group}' has no committed offset for "
                f"{', '.join(missing[:5])}; run `rewind reconsume start {self.reconsume_id}`"
            )
        self._pos = {(c.topic, c.partition): c.offset for c in committed}
        consumer.assign(committed)

    @property
    def done(self) -> bool:
        return self.consumer is not None and not self._pos

    def _existing_offsets(self, now: float) -> dict[TP, int | None]:
        """The existing side's recorded offsets, read at most every ``record_interval_s``.

        A stale value is safe: it only ever grows, so an old one can make the side try a
        handover that the compare-and-set then refuses (and the value is read again), or stop
        a parallel re-read early where the existing side has handled more than it says.
        """
        assert self.table is not None
        if now - self._e_read_at >= self.record_interval_s:
            self._e = {tp: e for tp, (e, _h) in self.table.existing(self._pos).items()}
            self._e_read_at = now
        return self._e

    def _batch(self, messages: list[Message]) -> None:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        assert self.consumer is not None and self.table is not None and self._keeper is not None
        self._keeper.check()  # a lost lease: another process may own these partitions now
        if not self._pos:
            return
        now = time.monotonic()
        known = self._existing_offsets(now)
        cutoff = {tp: e for tp, e in known.items() if e is not None} if self._parallel else {}
        handler, n, cut = self.handler, 0, 0
        eof: dict[Any, int | None] = {}
        for m in messages:  # step 2
            if m.error() is not None:
                if message_error(m):
                    eof[(m.topic(), m.partition())] = m.offset()
                continue
            if cutoff:
                e = cutoff.get((m.topic(), m.partition()))  # type: ignore[arg-type]
                if e is not None and (m.offset() or 0) > e:
                    cut += 1
                    continue
            handler(m)
            n += 1
        self.handled += n
        self.skipped += cut

        commits: list[Any] = []
        steps: dict[TP, TempStep] = {}
        for tp in self.consumer.position([TopicPartition(t, p) for t, p in self._pos]):
            key = (tp.topic, tp.partition)
            old = self._pos[key]
            new = tp.offset if tp.error is None and tp.offset >= 0 else old
            e = known.get(key)
            reason: Reason | None = None
            if e is not None and self._parallel and new >= max(old, e + 1):
                new, reason = max(old, e + 1), "now"  # reached what the existing side handled
            elif e is not None and not self._parallel and e < new:
                reason = "caught_up"  # past everything the existing side skipped
            if new > old:
                self._idle_since.pop(key, None)
                commits.append(TopicPartition(key[0], key[1], new))
                self._unrecorded[key] = new
            if eof.get(key) == new:  # lag zero: the end of the partition, nothing after it
                self._idle_since.setdefault(key, now)
            since = self._idle_since.get(key)
            if reason is None and since is not None and now - since >= (self.idle_handover_s or 0.0):
                reason = "idle"
                self._idle_since[key] = now  # not every batch, should the existing side be ahead
            if reason is not None:
                steps[key] = TempStep(last=new - 1, position=new, handover=reason)
            self._pos[key] = new
        self._commit(commits)  # step 3
        if not steps and (not self._unrecorded or now - self._recorded_at < self.record_interval_s):
            return
        for key, position in self._unrecorded.items():  # progress rides along, at most so often
            steps.setdefault(key, TempStep(last=position - 1, position=position))
        self._unrecorded.clear()
        self._recorded_at = now
        handed = self.table.record_temp(steps)  # step 4
        if any(s.handover == "caught_up" and tp not in handed for tp, s in steps.items()):
            self._e_read_at = float("-inf")  # the existing side moved on: read it again
        if handed:  # step 5
            self.consumer.incremental_unassign([TopicPartition(t, p) for t, p in handed])
            for key, h in handed.items():
                self.handed_over[key] = h
                del self._pos[key]
                self._idle_since.pop(key, None)

    def _before_close(self) -> None:
        if self._unrecorded and self.table is not None:
            self.table.record_temp({k: TempStep(last=p - 1, position=p) for k, p in self._unrecorded.items()})
            self._unrecorded.clear()

    def _release(self) -> None:
        """Give the lease back once the consumer is closed: another process may take over."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            with _RUNNING_LOCK:
                _RUNNING.discard(self.reconsume_id)
            keeper.__exit__(None, None, None)
