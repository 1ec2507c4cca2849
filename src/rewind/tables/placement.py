"""Where the selected entities land: partitions, key ranges, skipped and stuck partitions.

* :func:`key_bytes`: an entity id as the record key's bytes (its UTF-8 text: what Rewind's Kafka
  sink writes for an integer or text key, a Java ``StringSerializer``'s bytes);
* :func:`cut_ranges`: the sorted keys cut into ranges of about equal size, never between two
  equal keys (a query may repeat a key: every row of a key is in one range, so per-key order is
  one task's order);
* :func:`stuck_partitions`: partitions where a live consumer group's oldest unconsumed record
  is older than the threshold. A re-produced message lands behind it and waits; the plan
  names the selected entities there, and ``skip_partitions`` can leave them out. It is what
  the group's committed offsets and the log say now, nothing more.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rewind.kafka.clients import private_consumer, ready_messages
from rewind.kafka.groups import committed_offsets, log_bounds
from rewind.kafka.partitioner import Partitioner, partitions_for
from rewind.tables.readers import Key


def key_bytes(key: Key) -> bytes:
    return str(key).encode()


def placement(keys: list[Key], partitions: int, partitioner: Partitioner) -> list[int]:
    """The target partition of each key, in order."""
    return partitions_for([key_bytes(k) for k in keys], partitions, partitioner)


@dataclass(frozen=True)
class KeyRange:
    """``[lo, hi)`` of the sorted keys (None: unbounded) and how many selected rows it holds."""

    lo: Key | None
    hi: Key | None
    entities: int

    def to_dict(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "entities": self.entities}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyRange:
        return cls(data.get("lo"), data.get("hi"), int(data["entities"]))


def cut_ranges(keys: list[Key], ranges: int) -> list[KeyRange]:
    """``keys`` (sorted) in at most ``ranges`` ranges; the first is open below, the last above."""
    if not keys:
        return []
    step = max(1, -(-len(keys) // ranges))
    cuts: list[int] = []
    at = step
    while at < len(keys):
        while at < len(keys) and keys[at] == keys[at - 1]:  # equal keys stay together
            at += 1
        if at < len(keys):
            cuts.append(at)
        at += step
    bounds = [0, *cuts, len(keys)]
    out = []
    for i in range(len(bounds) - 1):
        lo = None if i == 0 else keys[bounds[i]]
        hi = None if i == len(bounds) - 2 else keys[bounds[i + 1]]
        out.append(KeyRange(lo, hi, bounds[i + 1] - bounds[i]))
    return out


def counts_by_partition(parts: list[int]) -> dict[int, int]:
    return dict(sorted(Counter(parts).items()))


def stuck_partitions(
    conf: dict[str, Any], topic: str, group: str, after_s: float, now_ms: int | None = None
) -> dict[int, dict[str, Any]]:
    """Partitions of ``topic`` where ``group`` has unconsumed records older than ``after_s``.

    Per such partition: the group's committed offset, the log end, the lag and the age of the
    oldest unconsumed record. A partition where the group committed nothing is not judged.
    """
    committed = committed_offsets(conf, group, [topic])
    bounds = log_bounds(conf, list(committed))
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    behind = {
        tp: offset
        for tp, offset in committed.items()
        if offset is not None and tp in bounds and offset < bounds[tp].high
    }
    stamps = _timestamps_at(conf, behind)
    out: dict[int, dict[str, Any]] = {}
    for (_topic, partition), offset in sorted(behind.items()):
        stamp = stamps.get((_topic, partition))
        if stamp is None:
            continue
        age_s = (now - stamp) / 1000
        if age_s > after_s:
            high = bounds[(_topic, partition)].high
            out[partition] = {
                "committed": offset,
                "end": high,
                "lag": high - offset,
                "oldest_age_s": round(age_s),
            }
    return out


def _timestamps_at(conf: dict[str, Any], offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """The timestamp of the first record at or after each offset (read with a bare consumer)."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import TopicPartition

    if not offsets:
        return {}
    consumer = private_consumer(conf, "stuck-check", route_logs=False)
    found: dict[tuple[str, int], int] = {}
    try:
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in offsets.items()])
        deadline = time.monotonic() + 10
        while len(found) < len(offsets) and time.monotonic() < deadline:
            for msg in ready_messages(consumer, 0.5, 100):
                tp = (msg.topic() or "", msg.partition() or 0)
                if msg.error() is not None:  # end of partition: a marker was the last "record"
                    continue
                if tp in offsets and tp not in found:
                    found[tp] = msg.timestamp()[1]
                    consumer.pause([TopicPartition(tp[0], tp[1])])
    finally:
        consumer.close()
    return found
