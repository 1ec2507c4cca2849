"""Thin constructors for confluent-kafka clients.

librdkafka's own log lines are routed into Python logging (``rewind.librdkafka``), so they
pass the secret filter and stay quiet unless ``--debug``; no client does I/O until used.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewind.errors import BrokerUnreachable, ConfigError

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, ClusterMetadata, TopicMetadata

RDKAFKA_LOGGER = logging.getLogger("rewind.librdkafka")


CLIENT_DEFAULTS: dict[str, Any] = {"reconnect.backoff.ms": 10}
"""Under every client's own settings. librdkafka connects to a broker it has just learned from
metadata no sooner than half of ``reconnect.backoff.ms`` (default 100) after its last
connection: ~50 ms of every new client's first request (a watermark look-up, a bookkeeping
read, a re-produce unit's producer id), measured on loopback. A lost connection still backs
off exponentially, up to ``reconnect.backoff.max.ms``."""


def _with_logger(conf: dict[str, Any]) -> dict[str, Any]:
    return {"logger": RDKAFKA_LOGGER, **conf}


def _build(kind: type[Any], conf: dict[str, Any]) -> Any:
    """Construct a client; a bad property becomes one line naming it, not a traceback."""
    from confluent_kafka import KafkaException

    try:
        return kind({**CLIENT_DEFAULTS, **conf})
    except (KafkaException, ValueError, TypeError) as exc:
        detail = exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else str(exc)
        raise ConfigError(
            f"Kafka client configuration rejected: {detail}; check kafka.properties (REWIND_KAFKA__*) "
            "or the kafka.* options"
        ) from None


def admin(conf: dict[str, Any]) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    return _build(AdminClient, _with_logger(conf))


def producer(conf: dict[str, Any], **overrides: Any) -> Producer:
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
    ``route_logs=False`` leaves librdkafka's logs on stderr: routing them into Python
    costs about a third of the fetch rate (measured), too much for bulk reads in tasks.
    """
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
    return _build(Consumer, _with_logger(settings) if route_logs else settings)


def cluster_metadata(conf: dict[str, Any], timeout_s: float = 10.0) -> ClusterMetadata:
    """Metadata of the cluster, or :class:`BrokerUnreachable` naming the address."""
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
