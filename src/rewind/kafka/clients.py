"""Thin constructors for confluent-kafka clients.

librdkafka's own log lines are routed into Python logging (``rewind.librdkafka``), so they
pass the secret filter and stay quiet unless ``--debug``; no client does I/O until used.

A broker that goes away (restarted, a network cut) makes every client of the process report
its reconnect attempts: every client gets an ``error_cb`` (:class:`OutageReporter`) that turns
them into at most one warning every :data:`OUTAGE_REPORT_EVERY_S` seconds per process on
``rewind.kafka.outage`` ("broker unreachable, retrying"), and the clients whose logs are not
routed (bulk reads in Spark tasks) print no log lines of their own below ``LOG_CRIT``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rewind.errors import BrokerUnreachable, ConfigError
from rewind.logs import to_stderr_unless_configured

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message, Producer
    from confluent_kafka.admin import AdminClient, ClusterMetadata, TopicMetadata

RDKAFKA_LOGGER = logging.getLogger("rewind.librdkafka")


CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 5000}
"""Under every client's own settings. librdkafka connects to a broker it has just learned from
metadata no sooner than half of ``reconnect.backoff.ms`` (default 100) after its last
connection: ~50 ms of every new client's first request (a watermark look-up, a bookkeeping
read, a re-produce unit's producer id), measured on loopback. A lost connection backs off
exponentially from there (about ten attempts in the first five seconds of an outage), up to one
attempt every ``reconnect.backoff.max.ms``: a restarted broker is found again within ~5 s."""


QUIET_LOG_LEVEL = 2
"""librdkafka's ``log_level`` (syslog: 2 = critical) of clients whose logs are not routed into
Python: their own stderr lines stop there (a lost broker printed ~145 a second of them from a
wave's tasks); errors still reach Python through the ``error_cb``. A ``log_level`` in the
settings wins."""

OUTAGE_REPORT_EVERY_S = 10.0
"""At most one outage warning per process in this many seconds."""

OUTAGE_LOG = logging.getLogger("rewind.kafka.outage")


class OutageReporter:
    """librdkafka's ``error_cb`` of every client: a rate-limited warning, then the caller's own.

    Connection errors (refused, reset, all brokers down, timed out) say the broker is
    unreachable and that the client retries (librdkafka reconnects by itself, backing off up
    to ``reconnect.backoff.max.ms``); any other non-fatal error is logged the same way, at most
    as often. Fatal errors are left to the client's own callback (the producer wrapper raises
    them). One instance per process, shared by its clients.
    """

    OUTAGE_CODES = ("_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE", "_MSG_TIMED_OUT")

    def __init__(self, every_s: float = OUTAGE_REPORT_EVERY_S) -> None:
        self.every_s = every_s
        self.last = float("-inf")
        self.suppressed = 0
        self._lock = threading.Lock()

    def callback(self, bootstrap: str, own: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def on_error(err: Any) -> None:
            if not err.fatal():
                self.report(bootstrap, err)
            if own is not None:
                own(err)

        return on_error

    def report(self, bootstrap: str, err: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self.last < self.every_s:
                self.suppressed += 1
                return
            self.last, suppressed, self.suppressed = now, self.suppressed, 0
        more = f" ({suppressed} similar in the last {self.every_s:.0f}s)" if suppressed else ""
        if err.name() in self.OUTAGE_CODES:
            message = f"Kafka broker {bootstrap} unreachable, retrying: {err.str()}{more}"
        else:
            message = f"Kafka client error from {bootstrap}: {err.str()}{more}"
        _outage_log().warning(message)


OUTAGE = OutageReporter()


def _outage_log() -> logging.Logger:
    """:data:`OUTAGE_LOG`, printing to stderr where nothing configured Rewind's logging.

    The CLI's driver configures it (warnings to ``rewind.log``, everything with ``--debug``);
    a Spark task's Python worker does not, and its stderr is the CLI's in local mode (the
    driver's log on a cluster): there the warning is printed like :data:`logging.lastResort`
    would, were it not for the library's ``NullHandler``.
    """
    return to_stderr_unless_configured(OUTAGE_LOG)


def _with_logger(conf: dict[str, Any]) -> dict[str, Any]:
    return {"logger": RDKAFKA_LOGGER, **conf}


def _build(kind: type[Any], conf: dict[str, Any]) -> Any:
    """Construct a client; a bad property becomes one line naming it, not a traceback."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaException

    settings = {**CLIENT_DEFAULTS, **conf}
    settings["error_cb"] = OUTAGE.callback(str(settings.get("bootstrap.servers")), settings.get("error_cb"))
    try:
        return kind(settings)
    except (KafkaException, ValueError, TypeError) as exc:
        detail = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise ConfigError(
            f"Kafka client configuration rejected: {detail}; check kafka.properties (REWIND_KAFKA__*) "
            "or the kafka.* options"
        ) from None


def admin(conf: dict[str, Any]) -> AdminClient:
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import AdminClient

    return _build(AdminClient, _with_logger(conf))


def producer(conf: dict[str, Any], **overrides: Any) -> Producer:
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import Producer

    return _build(Producer, _with_logger({**conf, **overrides}))


def private_consumer(
    conf: dict[str, Any],
    purpose: str = "read",
    overrides: Mapping[str, Any] | None = None,
    *,
    route_logs: bool = True,
    **extra: Any,
) -> Consumer:
    """A consumer for ``assign`` only: a throw-away group id, no commits, ever.

    Rewind reads never join or commit to a group, so a live consumer group's offsets
    cannot be touched; the group id is only there because librdkafka requires one.
    ``route_logs=False`` does not route librdkafka's logs into Python: that costs about a
    third of the fetch rate (measured), too much for bulk reads in tasks; such a client logs
    nothing below :data:`QUIET_LOG_LEVEL` itself, and its errors come through the ``error_cb``.
    """
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import Consumer

    settings = {
        **conf,
        "group.id": f"rewind-{purpose}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
        **(overrides or {}),
        **extra,
    }
    quiet = {"log_level": QUIET_LOG_LEVEL, **settings}
    return _build(Consumer, _with_logger(settings) if route_logs else quiet)


def consumer(conf: dict[str, Any]) -> Consumer:
    """A consumer of a group the caller names (a reconsume's live and temporary sides).

    As the bulk readers: librdkafka prints nothing of its own below ``LOG_CRIT`` (a restarting
    broker made each consumer print ~10 lines a second), and a lost broker is one warning every
    :data:`OUTAGE_REPORT_EVERY_S` through the :class:`OutageReporter`. The caller's
    ``log_level`` and ``logger`` win, and its own ``error_cb`` still runs.
    """
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import Consumer

    return _build(Consumer, {"log_level": QUIET_LOG_LEVEL, **conf})


def ready_messages(client: Consumer, timeout_s: float, limit: int) -> list[Message]:
    """Up to ``limit`` messages (end-of-partition events included): waits at most
    ``timeout_s`` for the first, then takes only what has already arrived. ``consume(limit,
    timeout_s)`` instead waits until it holds ``limit`` or the timeout passes, so a loop that
    reads to the end of a partition waited out the whole timeout on its last call."""
    first = client.poll(timeout_s)
    if first is None:
        return []
    return [first, *client.consume(num_messages=limit - 1, timeout=0)] if limit > 1 else [first]


def cluster_metadata(conf: dict[str, Any], timeout_s: float = 10.0) -> ClusterMetadata:
    """Metadata of the cluster, or :class:`BrokerUnreachable` naming the address."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaException

    client = admin({**conf, "socket.connection.setup.timeout.ms": int(timeout_s * 1000)})
    try:
        return client.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise BrokerUnreachable(str(conf.get("bootstrap.servers")), exc.args[0].str()) from None


def topic_metadata(conf: dict[str, Any], topic: str, timeout_s: float = 10.0) -> TopicMetadata | None:
    """``topic``'s metadata, or None when the cluster has no such topic; never creates it.

    A metadata request that names a topic carries librdkafka's ``allow.auto.create.topics``,
    which is true by default for producer and admin clients: a broker with auto-creation on
    (the default of Apache Kafka, tansu and noida-db, measured) then creates the topic it was
    asked about. This asks with auto-creation off. :class:`BrokerUnreachable` as
    :func:`cluster_metadata`."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaException

    client = admin(
        {
            **conf,
            "allow.auto.create.topics": False,
            "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
        }
    )
    try:
        meta = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException as exc:
        raise BrokerUnreachable(str(conf.get("bootstrap.servers")), exc.args[0].str()) from None
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    return meta
