"""The existing side: the live group's consumer loop, wrapped so the reconsume can share it.

The live group keeps its own consumers, subscription and rebalancing (``subscribe``); the
wrapper only decides, per message, whether the existing handler sees it, and records what
the temporary side needs to know. What each mode does per batch, in this order:

**handover** (every message handled exactly once, by exactly one side)

1. consume a batch;
2. split it: messages of partitions outside the reconsume, below the partition's start
   offset, or at or after its known handover offset are the existing side's; messages
   between the start and a known handover are skipped; for partitions not handed over yet,
   ONE ledger transaction records "skipped up to ``b``" (``b`` = the batch's last offset there,
   a compare-and-set that holds only while the partition is not handed over: see
   :mod:`rewind.ledger.handover`). Where it holds, those messages are skipped, and the
   temporary side will handle them; where it does not, the handover just made splits them;
3. call the handler on the owned messages, in offset order per partition;
4. commit the consumed positions, synchronously.

Step 2 comes before step 4, so no position past a skipped message is committed before the
skip is recorded. Once every partition this process consumes is past its handover, a batch
is a bare loop again: no ledger, no per-message check.

**parallel** (the existing side handles everything; the temporary side stops where it is)

1. consume; 2. call the handler on every message; 3. commit; 4. ONE ledger transaction
recording, per partition not handed over yet, the last offset handled (from the consumer's
positions, so nothing is counted per message), at most every ``record_interval_s`` (default
1 s) and when the side closes: an older record is safe here, see :meth:`_record_parallel`.
A partition found handed over is no longer recorded.

Crash semantics: a process killed between step 2 (or 3) and the commit handles its last
batch again after a restart, by the same side and with the same decisions (the record of
step 2 is idempotent, and a handover made meanwhile lies above it). A handler that raises
leaves the batch uncommitted in the same way. A rebalance moves a partition to another
member of the live group, which reads the same row: ownership is per offset, not per process.

Offsets below a partition's start offset are the existing side's in both modes (the
reconsume re-reads from the start offset on; when the live group is behind the start, it
handles those itself).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rewind.core.windows import TP
from rewind.kafka import clients
from rewind.ledger import Ledger
from rewind.reconsume.base import Side, message_error

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message


class ExistingSide(Side):
    """Wrap the live group's handler; ``consumer`` is a configuration (the side builds the
    consumer as the live group and subscribes to the reconsume's topics) or a consumer the
    service built and subscribed itself, with ``enable.auto.commit`` false."""

    role = "existing"

    def _prepare(self, ledger: Ledger) -> None:
        assert self.record is not None
        self._start: dict[TP, int] = {tp: r.start_offset for tp, r in self.rows.items()}
        self._h: dict[TP, int] = {
            tp: r.handover_offset for tp, r in self.rows.items() if r.handover_offset is not None
        }
        # partitions whose messages need a look: not handed over, or handed over but the
        # consumer may still be below the handover (it skips [start, handover) there)
        self._watch: set[TP] = set(self.rows)
        self._recorded: dict[TP, int] = {
            tp: r.existing_last_offset for tp, r in self.rows.items() if r.existing_last_offset is not None
        }
        self._parallel = self.record.mode == "parallel"
        self._dirty = False  # parallel: handled more than is recorded
        self._recorded_at = float("-inf")

    def _build_consumer(self, conf: dict[str, Any]) -> Consumer:
        assert self.record is not None
        return clients.consumer(self._group_conf(conf, self.record.live_group))

    def _attach(self, consumer: Consumer) -> None:
        if self._given_consumer is None:
            assert self.record is not None
            consumer.subscribe(list(self.record.topics))

    def _batch(self, messages: list[Message]) -> None:
        if self._parallel:
            self._parallel_batch(messages)
        elif self._watch:
            self._handover_batch(messages)
        else:  # every partition is past its handover: the bare loop
            handler, n = self.handler, 0
            for m in messages:
                if m.error() is not None and message_error(m):
                    continue
                handler(m)
                n += 1
            if n:
                self._commit()
            self.handled += n

    def _handover_batch(self, messages: list[Message]) -> None:
        owned: list[Message] = []
        pending: dict[TP, list[Message]] = {}
        watch, start, known = self._watch, self._start, self._h
        skipped = 0
        for m in messages:
            if m.error() is not None and message_error(m):
                continue
            tp: TP = (m.topic(), m.partition())  # type: ignore[assignment]  # a record has both
            if tp not in watch:
                owned.append(m)
                continue
            offset: int = m.offset()  # type: ignore[assignment]
            if offset < start[tp]:
                owned.append(m)
                continue
            h = known.get(tp)
            if h is None:
                pending.setdefault(tp, []).append(m)
            elif offset >= h:
                owned.append(m)
            else:
                skipped += 1
        if pending:  # step 2: one transaction for every partition not handed over yet
            assert self.table is not None
            answers = self.table.claim({tp: ms[-1].offset() or 0 for tp, ms in pending.items()})
            for tp, h in answers.items():
                if h is None:
                    skipped += len(pending[tp])
                    continue
                known[tp] = h
                mine = [m for m in pending[tp] if (m.offset() or 0) >= h]
                skipped += len(pending[tp]) - len(mine)
                owned.extend(mine)
        handler = self.handler
        for m in owned:  # step 3
            handler(m)
        if messages:
            self._commit()  # step 4
        self.handled += len(owned)
        self.skipped += skipped
        self._unwatch()

    def _unwatch(self) -> None:
        """Stop looking at partitions whose consumer position is at or past their handover."""
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        assert self.consumer is not None
        done = [tp for tp in self._watch if tp in self._h]
        if not done:
            return
        for tp in self.consumer.position([TopicPartition(t, p) for t, p in done]):
            key = (tp.topic, tp.partition)
            if tp.error is None and tp.offset >= self._h[key]:
                self._watch.discard(key)

    def _parallel_batch(self, messages: list[Message]) -> None:
        handler, n = self.handler, 0
        for m in messages:
            if m.error() is not None and message_error(m):
                continue
            handler(m)
            n += 1
        if n:
            self._commit()
            self.handled += n
            self._dirty = True
        if self._dirty and self._watch and time.monotonic() - self._recorded_at >= self.record_interval_s:
            self._record_parallel()

    def _record_parallel(self) -> None:
        """Step 4 of parallel mode: the last offset handled per partition, one transaction.

        At most every ``record_interval_s``: a record older than the truth only makes the
        temporary side stop earlier, where this side has handled more than it says, so
        nothing is left unhandled (the temporary side stops at the recorded offset + 1 and
        this side has handled every offset from its first one up to the truth).
        """
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import TopicPartition

        assert self.consumer is not None and self.table is not None
        self._recorded_at = time.monotonic()
        self._dirty = False
        pending = self._watch
        mine = [TopicPartition(t.topic, t.partition) for t in self.consumer.assignment()
                if (t.topic, t.partition) in pending]
        last: dict[TP, int] = {}
        for tp in self.consumer.position(mine) if mine else []:
            key = (tp.topic, tp.partition)
            if tp.error is None and tp.offset >= 0 and tp.offset - 1 > self._recorded.get(key, -1):
                last[key] = tp.offset - 1
        if not last:
            return
        for key, h in self.table.claim(last).items():
            if h is None:
                self._recorded[key] = last[key]
            else:
                self._h[key] = h
                pending.discard(key)

    def _before_close(self) -> None:
        if self._parallel and self._dirty and self._watch:
            self._record_parallel()
