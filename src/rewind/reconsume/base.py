"""What both sides of a reconsume share: the ledger, the consumer, the loop, the counters.

A side does no I/O in ``__init__``: :meth:`Side.open` (called by the first
:meth:`Side.poll_once`, or by ``with``) reads the reconsume and its handover rows from the
ledger and builds or adopts the consumer. Each side processes *batches*:
``consumer.consume(batch_size, timeout_s)``, then the side's steps, in the order each
side's docstring lists them. A batch is the unit of everything that costs a round trip:
one offset commit, at most one ledger transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rewind.core.windows import TP
from rewind.ledger import Ledger
from rewind.ledger.handover import HandoverTable
from rewind.ledger.reconsumes import HandoverRow, ReconsumeRecord, ReconsumeStore
from rewind.reconsume.exceptions import ReconsumeError, ReconsumeNotStarted

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

log = logging.getLogger(__name__)

Handler = Callable[["Message"], object]
"""Called once per message the side owns, in offset order per partition."""


COMMIT_TIMEOUT_S = 120.0
"""How long a side tries a commit again while the broker is away (as long as a read waits)."""

_RETRIABLE_COMMIT = (
    "_WAIT_COORD", "_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN",
    "REQUEST_TIMED_OUT", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
)
"""Commit errors (``KafkaError`` names) of a broker that is away, tried again by :meth:`Side._commit`."""


class Side(ABC):
    """One side of a reconsume around a confluent-kafka consumer.

    ``ledger`` is the ledger's URL (SQLite for one host, PostgreSQL for services on several)
    or an open :class:`rewind.ledger.Ledger` (not closed by the side). ``handler`` is called
    per owned message; when it raises, the batch is not committed and the error propagates
    out of :meth:`poll_once` (after a restart the same side handles that batch again).
    """

    role = "side"

    def __init__(
        self,
        consumer: Consumer | Mapping[str, Any],
        handler: Handler,
        *,
        reconsume: str,
        ledger: str | Ledger,
        batch_size: int = 500,
        timeout_s: float = 1.0,
        record_interval_s: float = 1.0,
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if record_interval_s < 0:
            raise ValueError(f"record_interval_s must be >= 0, got {record_interval_s}")
        self.reconsume_id = reconsume
        self.handler = handler
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.record_interval_s = record_interval_s
        """Progress records that only inform (never the ones ownership rests on) are written at
        most this often; 0 writes them with every batch."""
        self.commit_timeout_s = commit_timeout_s
        """A commit is tried again this long while the broker is away (see :meth:`_commit`)."""
        self.handled = 0
        """Messages given to the handler (counted per batch)."""
        self.skipped = 0
        """Messages consumed and left to the other side."""
        self.batches = 0
        self._given_consumer = None if isinstance(consumer, Mapping) else consumer
        self._conf = dict(consumer) if isinstance(consumer, Mapping) else None
        self._ledger_arg = ledger
        self._ledger: Ledger | None = None
        self.consumer: Consumer | None = None
        self.record: ReconsumeRecord | None = None
        self.table: HandoverTable | None = None
        self.rows: dict[TP, HandoverRow] = {}

    # -- life --------------------------------------------------------------------------------

    def open(self) -> None:
        """Read the reconsume and its rows, then build (or adopt) the consumer; once."""
        if self.consumer is not None:
            return
        ledger = self._ledger_arg if isinstance(self._ledger_arg, Ledger) else Ledger.open(self._ledger_arg)
        self._ledger = ledger
        try:
            record = ReconsumeStore(ledger.engine).get(self.reconsume_id)
            if record.state == "planned":
                raise ReconsumeNotStarted(self.reconsume_id)
            self.record = record
            self.table = HandoverTable(ledger.engine, self.reconsume_id)
            self.rows = self.table.load()
            self._prepare(ledger)
            consumer = self._given_consumer or self._build_consumer(self._conf or {})
            self.consumer = consumer
            self._attach(consumer)
        except BaseException:
            self.close()
            raise

    def _prepare(self, ledger: Ledger) -> None:  # noqa: B027 - a hook, empty by default
        """Anything a side needs from the ledger before its consumer starts."""

    @abstractmethod
    def _build_consumer(self, conf: dict[str, Any]) -> Consumer:
        """The side's own consumer when it was given a configuration."""

    @abstractmethod
    def _attach(self, consumer: Consumer) -> None:
        """Subscribe or assign, as the side needs."""

    @abstractmethod
    def _batch(self, messages: list[Message]) -> None:
        """The side's steps for one consumed batch (possibly empty)."""

    def poll_once(self) -> int:
        """Consume one batch and run the side's steps on it; returns the messages consumed."""
        self.open()
        assert self.consumer is not None
        messages = self.consumer.consume(self.batch_size, self.timeout_s)
        self._batch(messages)
        self.batches += 1
        return len(messages)

    @property
    def done(self) -> bool:
        """True when this side has nothing left to do (only the temporary side ever finishes)."""
        return False

    def run(self, stop: threading.Event | None = None, *, max_batches: int | None = None) -> None:
        """Poll batches until ``stop`` is set, ``max_batches`` ran, or the side is done.

        Stops between batches: every batch handled has been committed and recorded.
        """
        count = 0
        while not (stop is not None and stop.is_set()) and not self.done:
            if max_batches is not None and count >= max_batches:
                break
            self.poll_once()
            count += 1

    def _before_close(self) -> None:  # noqa: B027 - a hook, empty by default
        """Write what is still unwritten while the consumer is open (its positions are needed)."""

    def close(self) -> None:
        """Record what is unrecorded, close the consumer this side built (one it was given stays
        open), release what the side holds, close the ledger."""
        try:
            if self.consumer is not None:
                try:
                    self._before_close()
                except Exception:  # closing must go on; what was not recorded is only progress
                    log.warning("%s side of reconsume %s: the last progress was not recorded",
                                self.role, self.reconsume_id, exc_info=True)
                if self._given_consumer is None:
                    self.consumer.close()
        finally:
            self.consumer = None
            try:
                self._release()
            finally:
                self._close_ledger()

    def _release(self) -> None:  # noqa: B027 - a hook, empty by default
        """Give back what the side holds in the ledger (after the consumer is closed)."""

    def _close_ledger(self) -> None:
        if self._ledger is not None and not isinstance(self._ledger_arg, Ledger):
            self._ledger.close()
        self._ledger = None

    def __enter__(self) -> Side:
        self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- helpers -----------------------------------------------------------------------------

    def _group_conf(self, conf: dict[str, Any], group: str, **overrides: Any) -> dict[str, Any]:
        given = conf.get("group.id")
        if given is not None and given != group:
            raise ReconsumeError(
                f"the {self.role} side of reconsume {self.reconsume_id} consumes as group '{group}', "
                f"but its configuration says group.id '{given}'; drop group.id or set it to '{group}'"
            )
        return {**conf, "group.id": group, "enable.auto.commit": False, **overrides}

    def _commit(self, offsets: list[Any] | None = None) -> None:
        """A synchronous commit (of ``offsets``, or of every consumed position).

        A broker that is away (restarting, a failover) makes librdkafka give up a commit after
        ~45 s without a coordinator: the commit is tried again until ``commit_timeout_s`` has
        passed, so a side rides out an outage as Rewind's reads do. Beyond it, one line; the
        batch was handled and not committed, so this side handles it again after a restart.
        A rebalance's errors are not retried: the partitions may be another member's now.
        """
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaError, KafkaException

        assert self.consumer is not None
        if offsets is not None and not offsets:
            return
        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            try:
                if offsets is None:
                    self.consumer.commit(asynchronous=False)
                else:
                    self.consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                code = err.code() if isinstance(err, KafkaError) else None
                if code == KafkaError._NO_OFFSET:
                    return  # nothing consumed since the last commit
                retriable = code in {getattr(KafkaError, n) for n in _RETRIABLE_COMMIT}
                if not retriable or time.monotonic() >= deadline:
                    detail = err.str() if isinstance(err, KafkaError) else str(exc)
                    raise ReconsumeError(
                        f"the {self.role} side of reconsume {self.reconsume_id} could not commit its "
                        f"batch ({detail}); restart it: it handles that batch again, nothing is skipped"
                    ) from None
                log.info("%s side of reconsume %s: commit failed (%s), retrying",
                         self.role, self.reconsume_id, err.str() if err else exc)
                time.sleep(1.0)


def message_error(message: Message) -> bool:
    """True when ``message`` is an event, not a record: end of partition is expected, any
    other error is fatal only when librdkafka says so (the rest it retries by itself)."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, KafkaException

    err = message.error()
    if err is None:
        return False
    if err.code() != KafkaError._PARTITION_EOF:
        if err.fatal():
            raise KafkaException(err)
        log.warning("consumer event: %s", err.str())
    return True
