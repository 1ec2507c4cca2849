"""Admin helpers of the Kafka topic sink: topic creation, configs copied from the source, watermarks.

Why ``retention.ms`` and ``message.timestamp.type`` are not copied: see :mod:`rewind.sinks.kafka.sink`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rewind.core.windows import WindowRequest
from rewind.kafka.clients import cluster_metadata
from rewind.kafka.resolve import resolve
from rewind.sinks.kafka.exceptions import KafkaSinkError, short_error

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient, ClusterMetadata

log = logging.getLogger(__name__)

DEFAULT_TOPIC_CONFIGS = {"retention.ms": "-1", "message.timestamp.type": "CreateTime"}
"""Set on a created topic unless ``sink.kafka.configs`` says otherwise (see the module docstring)."""
NOT_COPIED = frozenset(
    {
        "retention.ms",
        "retention.bytes",
        "message.timestamp.type",
        "message.timestamp.difference.max.ms",
        "message.timestamp.before.max.ms",
        "message.timestamp.after.max.ms",
        "local.retention.ms",
        "local.retention.bytes",
    }
)
COPIED_ANY_SOURCE = frozenset(
    {"cleanup.policy", "max.message.bytes", "compression.type", "min.insync.replicas"}
)
"""Copied even when the broker calls them defaults (tansu labels every config it returns so)."""
TIMEOUT_S = 30.0
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def partition_watermarks(
    conf: dict[str, Any], topic: str, partitions: tuple[int, ...] | None = None
) -> dict[int, tuple[int, int]]:
    """(low, true high) watermarks; the high one from a fetch (ListOffsets ``latest`` is a hint)."""
    request = (
        WindowRequest(assign=tuple((topic, p) for p in partitions))
        if partitions is not None
        else WindowRequest(subscribe=(topic,))
    )
    plan = resolve(conf, request, timeout_s=TIMEOUT_S)
    return {p.partition: (p.low, p.high) for p in plan.partitions}


def high_watermarks(conf: dict[str, Any], topic: str) -> dict[int, int]:
    return {p: high for p, (_low, high) in partition_watermarks(conf, topic).items()}


def record_count(conf: dict[str, Any], topic: str) -> int:
    """Offsets between the low and the true high watermark of every partition (0: empty)."""
    return sum(high - low for low, high in partition_watermarks(conf, topic).values())


def topic_is_there(conf: dict[str, Any], topic: str) -> bool:
    md = cluster_metadata(conf)
    meta = md.topics.get(topic)
    return meta is not None and meta.error is None


def replication_of(md: ClusterMetadata, source_topics: list[str]) -> int:
    """The source topic's replication factor (-1, the broker's default, when unknown)."""
    for topic in source_topics:
        meta = md.topics.get(topic)
        if meta is not None and meta.partitions:
            replicas = next(iter(meta.partitions.values())).replicas
            if replicas:
                return len(replicas)
    return -1


def create_topics(admin: AdminClient, topics: list[Any]) -> None:
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, KafkaException

    for name, fut in admin.create_topics(topics, operation_timeout=TIMEOUT_S).items():
        try:
            fut.result(timeout=TIMEOUT_S)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # a concurrent prepare (or a retried one) created it
            raise KafkaSinkError(f"could not create topic {name}: {exc.args[0].str()}") from exc


def wait_for_topic(conf: dict[str, Any], topic: str, partitions: int) -> None:
    def ready() -> bool:
        meta = cluster_metadata(conf).topics.get(topic)
        return (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        )

    wait_until(ready, f"topic {topic} with {partitions} partitions in metadata")


def wait_until(ready: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    raise KafkaSinkError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def source_configs(admin: AdminClient, source_topics: list[str]) -> dict[str, str]:
    """The source topic's own configs worth copying (see the module docstring)."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import ConfigResource, ConfigSource

    if not source_topics:
        return {}
    try:
        futures = admin.describe_configs([ConfigResource("topic", source_topics[0])])
        entries = next(iter(futures.values())).result(timeout=TIMEOUT_S)
    except Exception as exc:
        log.warning(
            "could not read the configs of %s (%s); the topic gets broker defaults",
            source_topics[0],
            short_error(exc),
        )
        return {}
    out: dict[str, str] = {}
    for name, entry in entries.items():
        if name in NOT_COPIED or entry.value is None or entry.is_read_only or entry.is_sensitive:
            continue
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value or name in COPIED_ANY_SOURCE:
            out[name] = str(entry.value)
    return out


def create_topic(
    conf: dict[str, Any],
    admin: AdminClient,
    topic: str,
    partitions: int,
    replication: int,
    configs: dict[str, str],
) -> None:
    """Create ``topic`` and wait until its partitions show in the metadata."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import NewTopic

    create_topics(admin, [NewTopic(topic, partitions, replication_factor=replication, config=configs)])
    wait_for_topic(conf, topic, partitions)
