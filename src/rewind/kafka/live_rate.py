"""How fast topics are written now, and how long retention keeps a window's oldest records.

The live produce rate is the growth of the partitions' log ends (true high watermarks, from a
fetch: :func:`rewind.kafka.groups.log_bounds`) between two looks a known interval apart. The
other way, counting the records whose timestamps fall in the last seconds, was not taken: it
trusts producers' clocks and CreateTime (a topic re-produced with its original timestamps would
look idle) and the time index, which some brokers answer wrongly (tansu answers offset 0); the
log end is what the broker itself counts. A look costs one metadata request, ListOffsets and a
fetch per round (about 20 ms on loopback, measured on tansu and noida-db), so the plan takes its
first look before its own work (sample, schema, gates) and the second after it, and waits only
for what is left of ``live.interval_s``.

Offsets count whatever occupies the log: a transaction's commit or abort marker takes one
offset per partition, and is no record (a producer committing each record alone doubles the
growth). So the offsets' growth is scaled by the share of them that hold records
(:func:`record_share`), read from the newest offsets of the partitions that grew: at most
:data:`SHARE_OFFSETS` offsets of :data:`SHARE_PARTITIONS` partitions, the fastest; a topic
without transactions reads a share of 1. Aborted records are records here: they occupy the log
as a read_uncommitted reader sees it.

Retention comes from the topic's config (``retention.ms``, ``retention.bytes``; -1 infinite)
through the admin client, and the age of a window's oldest record from reading it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rewind.core.windows import TP
from rewind.kafka import clients
from rewind.kafka.groups import log_bounds
from rewind.kafka.probes import PROBE_SETTINGS, ProbeJob, Prober, ProbeRead, ProbeRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogEnds:
    """One look: each partition's high watermark, and when (monotonic seconds, mid-look)."""

    at: float
    highs: dict[TP, int]


def look(conf: Mapping[str, Any], partitions: Iterable[TP], timeout_s: float = 10.0) -> LogEnds:
    """The log ends of ``partitions`` now."""
    wanted = sorted(set(partitions))
    before = time.monotonic()
    bounds = log_bounds(conf, wanted, timeout_s=timeout_s) if wanted else {}
    return LogEnds((before + time.monotonic()) / 2, {tp: b.high for tp, b in bounds.items()})


@dataclass(frozen=True)
class LiveRate:
    """Records per second written to each partition over ``seconds``; ``record_share`` of the
    offsets written hold records (the rates are scaled by it already)."""

    seconds: float
    per_partition: dict[TP, float]
    record_share: float = 1.0

    @property
    def records_per_second(self) -> float:
        return sum(self.per_partition.values())

    def scaled(self, share: float) -> LiveRate:
        """The same growth, ``share`` of it records."""
        return LiveRate(self.seconds, {tp: r * share for tp, r in self.per_partition.items()}, share)

    def to_dict(self) -> dict[str, Any]:
        return {
            "records_per_second": round(self.records_per_second, 3),
            "interval_s": round(self.seconds, 3),
            "record_share": round(self.record_share, 4),
            "partitions": {f"{t}/{p}": round(r, 3) for (t, p), r in sorted(self.per_partition.items())},
        }


def rate_between(first: LogEnds, second: LogEnds) -> LiveRate:
    """The growth from ``first`` to ``second`` per second. A partition whose end went back (a
    topic deleted and made again, a broker that lost its memory) or is in one look only counts 0."""
    seconds = second.at - first.at
    if seconds <= 0:
        raise ValueError("the second look must come after the first")
    rates = {
        tp: max(0, second.highs[tp] - h) / seconds for tp, h in first.highs.items() if tp in second.highs
    }
    return LiveRate(seconds, rates)


SHARE_OFFSETS = 200
"""Offsets read per partition to find the share of them that hold records."""
SHARE_PARTITIONS = 8
"""Partitions read for it: those that grew the most."""


def record_share(conf: Mapping[str, Any], first: LogEnds, second: LogEnds, timeout_s: float = 5.0) -> float:
    """The share of the offsets written between two looks that hold records, from the newest
    :data:`SHARE_OFFSETS` offsets of the :data:`SHARE_PARTITIONS` partitions that grew the most
    (1.0 when none grew: there is nothing to scale)."""
    grown = sorted(
        ((second.highs[tp] - h, tp) for tp, h in first.highs.items() if second.highs.get(tp, h) > h),
        reverse=True,
    )[:SHARE_PARTITIONS]
    ranges = {
        tp: (max(first.highs[tp], second.highs[tp] - SHARE_OFFSETS), second.highs[tp]) for _n, tp in grown
    }
    if not ranges:
        return 1.0
    counts = _read_ranges(conf, "live-share", ranges, _records_in, timeout_s)
    offsets = sum(end - start for start, end in ranges.values())
    return min(1.0, sum(counts) / offsets)


def _records_in(start: int, end: int) -> ProbeJob:
    """How many of the offsets ``[start, end)`` hold records (the rest: transaction markers)."""
    records = yield ProbeRead(start, end - 1)
    return sum(1 for r in records if start <= r.offset < end)


class LiveRateProbe:
    """Two looks ``interval_s`` apart, around other work: :meth:`start`, work, :meth:`finish`."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        partitions: Iterable[TP],
        interval_s: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.conf, self.partitions = conf, sorted(set(partitions))
        self.interval_s, self.sleep = interval_s, sleep
        self.first: LogEnds | None = None
        self.last: LogEnds | None = None

    def start(self) -> None:
        self.first = look(self.conf, self.partitions)

    def finish(self) -> LiveRate:
        """Wait out what is left of the interval, look again, and the rate between the looks."""
        if self.first is None:
            self.start()
        assert self.first is not None
        left = self.first.at + self.interval_s - time.monotonic()
        if left > 0:
            self.sleep(left)
        self.last = look(self.conf, self.partitions)
        growth = rate_between(self.first, self.last)
        try:
            return growth.scaled(record_share(self.conf, self.first, self.last))
        except Exception as exc:  # the growth is still a measure, if high under transactions
            log.warning("the live rate counts every offset (records not read: %s)", exc)
            return growth


class LogEndMeter:
    """The live rate while a run runs: a look at most every ``every_s`` seconds when asked,
    the rate over the looks of about the last ``window_s`` seconds (None until two looks are at
    least ``every_s`` apart), scaled by ``share`` (the plan's :func:`record_share`: the meter
    reads no records). Thread-safe; a failed look is logged once and skipped: the rate is
    shown, never needed."""

    def __init__(
        self,
        conf: Mapping[str, Any],
        partitions: Iterable[TP],
        every_s: float,
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        share: float = 1.0,
    ) -> None:
        self.conf, self.partitions, self.share = conf, sorted(set(partitions)), share
        self.every_s, self.window_s, self.clock = every_s, max(window_s, 2 * every_s), clock
        self.looks: deque[LogEnds] = deque()
        self._tried = -float("inf")
        self._warned = False
        self._lock = threading.Lock()

    def rate(self) -> float | None:
        with self._lock:
            now = self.clock()
            if self.partitions and now - self._tried >= self.every_s:
                self._tried = now
                try:
                    self.looks.append(look(self.conf, self.partitions))
                except Exception as exc:  # a run must not fail for a number it only shows
                    if not self._warned:
                        self._warned = True
                        log.warning("the live rate is not measured: %s", exc)
            while len(self.looks) > 2 and self.looks[1].at <= now - self.window_s:
                self.looks.popleft()
            if len(self.looks) < 2 or self.looks[-1].at - self.looks[0].at < self.every_s:
                return None
            return rate_between(self.looks[0], self.looks[-1]).records_per_second * self.share


def topic_partitions(conf: Mapping[str, Any], topics: Iterable[str]) -> list[TP]:
    """Every partition of ``topics`` that exists (from the cluster's metadata)."""
    metadata = clients.cluster_metadata(dict(conf))
    found: list[TP] = []
    for topic in sorted(set(topics)):
        meta = metadata.topics.get(topic)
        if meta is not None and meta.error is None:
            found.extend((topic, p) for p in sorted(meta.partitions))
    return found


@dataclass(frozen=True)
class Retention:
    """A topic's retention: ``ms`` and ``bytes`` (per partition) as configured, -1 infinite,
    None when the broker did not say."""

    ms: int | None
    bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"ms": self.ms, "bytes": self.bytes}


def retention_of(
    conf: Mapping[str, Any], topics: Iterable[str], timeout_s: float = 10.0
) -> dict[str, Retention]:
    """Each topic's retention from its config (DescribeConfigs); unknown where the broker fails."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import ConfigResource

    names = sorted(set(topics))
    if not names:
        return {}
    admin = clients.admin(dict(conf))
    out: dict[str, Retention] = {}
    for topic, future in admin.describe_configs([ConfigResource("topic", t) for t in names]).items():
        name = topic.name
        try:
            entries = future.result(timeout=timeout_s)
        except Exception as exc:  # KafkaException, a timeout: the plan says retention is unknown
            log.warning("retention of %s unknown: %s", name, exc)
            out[name] = Retention(None, None)
            continue
        out[name] = Retention(_number(entries.get("retention.ms")), _number(entries.get("retention.bytes")))
    return out


def _number(entry: Any) -> int | None:
    try:
        return None if entry is None or entry.value is None else int(entry.value)
    except ValueError:
        return None


def first_timestamps(
    conf: Mapping[str, Any], ranges: Mapping[TP, tuple[int, int]], timeout_s: float = 10.0
) -> dict[TP, ProbeRecord | None]:
    """The first record (offset, timestamp) of each partition's ``[start, end)``, read from the
    log; None where the range holds no record (markers only, or empty)."""
    wanted = {tp: r for tp, r in ranges.items() if r[0] < r[1]}
    if not wanted:
        return {}
    found = _read_ranges(conf, "oldest", wanted, _first_record, timeout_s)
    return dict(zip(wanted, found, strict=True))


def _read_ranges(
    conf: Mapping[str, Any],
    purpose: str,
    ranges: Mapping[TP, tuple[int, int]],
    job: Callable[[int, int], ProbeJob],
    timeout_s: float,
) -> list[Any]:
    """``job(start, end)`` on each partition's ``[start, end)`` with one private consumer that
    never reads past ``end``; the jobs' results in the order of ``ranges``."""
    consumer = clients.private_consumer(dict(conf), purpose, PROBE_SETTINGS)
    try:
        prober = Prober(consumer, timeout_s)
        prober.highs = {tp: end for tp, (_start, end) in ranges.items()}
        return prober.run((tp, job(start, end)) for tp, (start, end) in ranges.items())
    finally:
        consumer.close()


def _first_record(start: int, end: int) -> ProbeJob:
    records = yield ProbeRead(start, start)
    return next((r for r in records if start <= r.offset < end), None)
