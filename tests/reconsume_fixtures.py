"""Shared pieces of the reconsume tests: the brokers they run on, settings, a live group.

Group membership (``subscribe``) is quick on noida-db and takes ~20 s per join on the
embedded tansu, so these tests run on noida-db, and on the broker named by
``REWIND_TEST_BOOTSTRAP`` when set; one test of test_reconsume_tansu.py runs a whole handover
on tansu.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from rewind.config import Settings
from rewind.kafka import groups as kg
from tests.brokers import TANSU, broker_names
from tests.kafka_util import create_topic, produce

GROUP_BROKERS = [n for n in broker_names() if n != TANSU]
FIXTURES = {"noida-db": "noida_broker", "external": "external_broker", "tansu": "tansu_broker"}


def broker_settings_for(settings: Settings, bootstrap: str, ledger_url: str) -> Settings:
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})
    return settings.model_copy(update={"kafka": kafka, "ledger_url": ledger_url})


def sqlite_url(tmp: Path) -> str:
    return f"sqlite:///{tmp / 'ledger.db'}"


def new_names() -> tuple[str, str, str]:
    """A topic, a live group and a reconsume id, fresh for one test."""
    tag = uuid.uuid4().hex[:8]
    return f"orders-{tag}", f"orders-svc-{tag}", f"rc-{tag}"


def fill(conf: dict[str, Any], topic: str, partitions: int, per_partition: int, base_ms: int = 0) -> None:
    """``per_partition`` records in each partition, values ``p:i``, timestamps from ``base_ms``."""
    records = [
        (p, b"k", f"{p}:{i}".encode(), base_ms + i * 1000 if base_ms else None)
        for i in range(per_partition)
        for p in range(partitions)
    ]
    produce(conf, topic, records)


def live_group(conf: dict[str, Any], group: str, offsets: dict[tuple[str, int], int]) -> None:
    """A live group that has consumed up to ``offsets`` (as a service that ran would have)."""
    kg.alter_offsets(conf, group, offsets)


def topic_with_group(
    conf: dict[str, Any], partitions: int, per_partition: int, live_at: int, base_ms: int = 0
) -> tuple[str, str, str]:
    topic, group, rid = new_names()
    create_topic(conf, topic, partitions)
    fill(conf, topic, partitions, per_partition, base_ms)
    live_group(conf, group, {(topic, p): live_at for p in range(partitions)})
    return topic, group, rid


class Recorder:
    """A handler that records (partition, offset) of each message, thread-safe."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.seen: list[tuple[int, int]] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self, m: Message) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            self.seen.append((m.partition(), m.offset()))  # type: ignore[arg-type]

    def of(self, partition: int) -> list[int]:
        return [o for p, o in self.seen if p == partition]


def group_broker(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(FIXTURES[request.param])


Handler = Callable[[Message], None]
