"""One thin wrapper over a confluent-kafka Producer, transactional or not, for every writer.

The Kafka sink's commit writer, the Spark writer's tasks and the demo produce through it.
It makes no network call until :meth:`TransactionalProducer.open`, keeps the first delivery
failures and a fatal error for the caller to report, and turns a failed transaction call into
the caller's own error type, naming the step and the transactional id.

A write goes, in order:

1. :meth:`~TransactionalProducer.open`: build the client; with a transactional id,
   ``init_transactions`` (which fences a zombie holding the same id and aborts what it left);
2. :meth:`~TransactionalProducer.begin` (transactional only);
3. ``client.produce(...)`` for each record, polling the delivery queue now and then;
4. :meth:`~TransactionalProducer.flush`: wait until every record is acknowledged, raising on
   the first refused record;
5. :meth:`~TransactionalProducer.commit` (transactional only);

and on any failure :meth:`~TransactionalProducer.abort` (purge what is queued, abort the open
transaction), then :meth:`~TransactionalProducer.close` either way.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from rewind.errors import RewindError
from rewind.kafka.clients import producer

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

# every broker connection down at once; a single connection's close (``_TRANSPORT``) is not
# counted: brokers close connections idle for 10 minutes, which a long transaction outlives
_BROKER_LOST = ("_ALL_BROKERS_DOWN",)


class ProducerFailed(RewindError):
    """The producer failed or Kafka refused records."""


class TransactionalProducer:
    """A producer with an optional transactional id; errors are raised as ``error``."""

    def __init__(
        self,
        conf: dict[str, Any],
        *,
        transactional_id: str | None = None,
        error: type[RewindError] = ProducerFailed,
        call_timeout_s: float = 60.0,
        keep_failures: int = 5,
        topic: str | None = None,
    ) -> None:
        self.conf = conf
        self.transactional_id = transactional_id
        self.topic = topic
        """An existing topic the producer writes to: its metadata connects a broker before
        ``init_transactions`` (see :func:`_connect`)."""
        self.error = error
        self.call_timeout_s = call_timeout_s
        self.keep_failures = keep_failures
        self.client: Producer | None = None
        self.in_transaction = False
        self.failures: list[tuple[KafkaError, str, int]] = []
        """The first refused records: (error, topic, partition or -1)."""
        self.failed = 0
        self.fatal: KafkaError | None = None
        self.broker_lost = False
        """The client lost every broker at once (librdkafka's ``_ALL_BROKERS_DOWN``) since the last
        :meth:`begin`: a writer may choose not to commit the open transaction."""

    def open(self) -> Producer:
        """Build the client (step 1); ``init_transactions`` when transactional."""
        conf: dict[str, Any] = {**self.conf, "on_delivery": self._on_delivery, "error_cb": self._on_error}
        if self.transactional_id is not None:
            conf["transactional.id"] = self.transactional_id
        else:
            conf.pop("transaction.timeout.ms", None)
        self.client = producer(conf)
        if self.transactional_id is not None:
            client = self.client
            if self.topic is not None:
                _connect(client, self.topic, self.call_timeout_s)
            self._step("init_transactions", lambda: client.init_transactions(self.call_timeout_s))
        return self.client

    def begin(self) -> None:
        """Step 2: a transaction starts (a no-op without a transactional id)."""
        if self.transactional_id is not None:
            self.broker_lost = False
            self._step("begin_transaction", self._opened().begin_transaction)
            self.in_transaction = True

    def flush(self, timeout_s: float | None = None, until_broker_lost: bool = False) -> None:
        """Step 4: every queued record acknowledged; raise on a refused one, a fatal error, or
        records still queued after ``timeout_s`` (None: wait as long as the broker needs).

        ``until_broker_lost``: stop waiting, records still queued, once the client has lost every
        broker inside the open transaction (:attr:`broker_lost`), so that the caller aborts and
        :meth:`abort` purges them. Records held through an outage go out when the broker is back;
        to a broker that came back without the transaction (noida-db after a kill) they are
        records of no transaction it knows, which no marker ever ends: the partition's last
        stable offset stays below them, and ``read_committed`` readers see nothing past it."""
        client = self._opened()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(client) > 0:
            client.flush(1.0)
            self.raise_failures()
            if until_broker_lost and self.in_transaction and self.broker_lost:
                return
            if deadline is not None and time.monotonic() > deadline and len(client) > 0:
                raise self.error(f"{len(client)} record(s) not delivered in {timeout_s:.0f}s")
        self.raise_failures()

    def commit(self) -> None:
        """Step 5: the open transaction commits (a no-op outside one)."""
        if self.in_transaction:
            client = self._opened()
            self._step("commit_transaction", lambda: client.commit_transaction(self.call_timeout_s))
            self.in_transaction = False

    def abort(self) -> None:
        """After a failure: drop what is queued and abort the open transaction, best effort."""
        client = self.client
        if client is None:
            return
        try:
            client.purge()
            client.poll(0)
            if self.in_transaction:
                client.abort_transaction(self.call_timeout_s)
                self.in_transaction = False
        except Exception as exc:  # the original error matters more; the next init_transactions aborts it
            log.warning("could not abort transaction %s: %s", self.transactional_id, exc)

    def close(self, flush_s: float = 0.0) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.flush(flush_s)
            with contextlib.suppress(Exception):
                client.close()

    def raise_failures(self, what: str = "") -> None:
        """Raise ``error`` for a fatal producer error or the first refused record (``what``: a
        few words on what was being written, e.g. ``" for topic t"``)."""
        if self.fatal is not None:
            raise self.error(f"the Kafka producer failed: {self.fatal.str()} ({self.fatal.name()})")
        if self.failures:
            err, topic, partition = self.failures[0]
            where = f"topic {topic} partition {partition if partition >= 0 else '(any)'}"
            raise self.error(
                f"Kafka refused {self.failed} record(s){what}; first: {where}: {err.str()} ({err.name()})"
            )

    def _opened(self) -> Producer:
        if self.client is None:
            raise RuntimeError("open() the producer first")
        return self.client

    def _step(self, name: str, call: Any) -> None:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaException

        try:
            call()
        except KafkaException as exc:
            raise self.error(
                f"{name} failed for transactional id {self.transactional_id}: {exc.args[0].str()}"
            ) from exc

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failed += 1
            if len(self.failures) < self.keep_failures:
                partition = msg.partition()
                self.failures.append((err, msg.topic() or "?", -1 if partition is None else partition))

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        else:
            log.debug("producer: %s", err.str())
        if err.name() in _BROKER_LOST:
            self.broker_lost = True


def _connect(client: Producer, topic: str, timeout_s: float) -> None:
    """Have a broker learned from metadata connected before ``init_transactions``.

    librdkafka (2.16) drops its bootstrap connection once metadata names the brokers; when the
    producer-id request comes in that gap, no broker is up, the transaction coordinator is not
    looked up again until its 500 ms timer (measured on tansu: 0.5 s in about one
    ``init_transactions`` in four, 0.015 s otherwise). Metadata answered by a broker of the
    cluster (not the bootstrap one, node id -1) means that broker is up. ``topic`` must exist (a
    producer's metadata request may create a missing topic). Best effort: a failed look-up
    leaves it to ``init_transactions``."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaException

    for _ in range(3):
        try:
            if client.list_topics(topic, timeout=min(timeout_s, 10.0)).orig_broker_id >= 0:
                return
        except KafkaException:
            return
