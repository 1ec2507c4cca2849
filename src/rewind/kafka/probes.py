"""Reading the broker to check its answers: true high watermarks and checked time lookups.

Why the broker is not trusted blindly is in :mod:`rewind.kafka.resolve`. Probes are written as
generators that ask for reads, so one consumer serves every partition's probe in rounds.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from rewind.core.windows import TP
from rewind.errors import PlanError
from rewind.kafka.clients import ready_messages
from rewind.kafka.read_plan import Method

if TYPE_CHECKING:
    from confluent_kafka import Consumer

logger = logging.getLogger(__name__)


PROBE_SETTINGS: dict[str, Any] = {
    # Bounds are positions: markers and aborted records occupy offsets either way.
    "isolation.level": "read_uncommitted",
    # An end-of-partition answer takes about two fetch waits; the default 500 ms makes every
    # probe round of an empty or exhausted partition slow.
    "fetch.wait.max.ms": 20,
    # Each probe reads one record or a few: small fetches, and no 1 s back-off after a
    # re-assign finds the previous assignment's queue full (librdkafka's default).
    "queued.min.messages": 1000,
    "max.partition.fetch.bytes": 65536,
    "fetch.queue.backoff.ms": 10,
}


@dataclass(frozen=True)
class ProbeRecord:
    offset: int
    ts: int


@dataclass(frozen=True)
class ProbeRead:
    """Read from ``start``; stop after the first record at or above ``until`` or at the end."""

    start: int
    until: int


ProbeJob: TypeAlias = Generator[ProbeRead, list[ProbeRecord], Any]


class Prober:
    """Runs read jobs with ONE consumer, all partitions in parallel, one position per partition.

    A job is a generator that yields :class:`ProbeRead` requests and receives the records read;
    jobs on the same partition run one after the other, jobs on different partitions share
    each round: one ``assign`` of every partition at its position, then polling until each
    has answered. The consumer never joins a group and never commits.
    """

    def __init__(self, consumer: Consumer, timeout_s: float) -> None:
        self.consumer = consumer
        self.timeout_s = timeout_s
        self.highs: dict[TP, int] = {}
        self.rounds = 0

    def read_round(self, reads: Mapping[TP, ProbeRead]) -> dict[TP, list[ProbeRecord]]:
        # lazy: avoids confluent_kafka at import
        from confluent_kafka import KafkaError, TopicPartition

        self.consumer.assign([TopicPartition(t, p, r.start) for (t, p), r in reads.items()])
        self.rounds += 1
        out: dict[TP, list[ProbeRecord]] = {tp: [] for tp in reads}
        pending = set(reads)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            if time.monotonic() > deadline:
                names = ", ".join(f"{t}/{p}" for t, p in sorted(pending))
                raise PlanError(
                    f"the broker did not answer a fetch on {names} within {self.timeout_s:g}s "
                    "while planning offsets"
                )
            for msg in ready_messages(self.consumer, 0.05, 501):
                err = msg.error()
                tp = (msg.topic(), msg.partition())
                if tp not in pending:
                    if err is not None and tp[0] is None and err.fatal():
                        raise PlanError(f"Kafka client failed while planning offsets: {err.str()}")
                    continue
                read = reads[tp]
                offset = msg.offset()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if offset is None or offset >= read.start:
                            pending.discard(tp)
                        continue
                    raise PlanError(
                        f"reading {tp[0]}/{tp[1]} at offset {read.start} failed: {err.str()}",
                        topic=tp[0],
                        partition=tp[1],
                    )
                if offset is None or offset < read.start:
                    continue  # fetched for an earlier position; librdkafka normally drops these
                high = self.highs.get(tp)
                if high is not None and offset >= high:
                    pending.discard(tp)  # appended after planning started: outside the snapshot
                    continue
                _kind, ts = msg.timestamp()
                if ts < 0:
                    raise PlanError(
                        f"record {tp[0]}/{tp[1]}@{offset} has no timestamp; "
                        "time bounds need records with timestamps",
                        topic=tp[0],
                        partition=tp[1],
                    )
                out[tp].append(ProbeRecord(offset, ts))
                if offset >= read.until:
                    pending.discard(tp)
        return out

    def run(self, jobs: Iterable[tuple[TP, ProbeJob]]) -> list[Any]:
        """Run every job to completion; their return values, in the order given."""
        job_list = list(jobs)
        results: list[Any] = [None] * len(job_list)
        queues: dict[TP, deque[int]] = {}
        for index, (tp, _job) in enumerate(job_list):
            queues.setdefault(tp, deque()).append(index)

        def advance(
            tp: TP, index: int | None, records: list[ProbeRecord] | None
        ) -> tuple[int, ProbeRead] | None:
            """Feed records to the current job; start the next job of the partition when done."""
            while True:
                if index is None:
                    if not queues[tp]:
                        return None
                    index, records = queues[tp].popleft(), None
                job = job_list[index][1]
                try:
                    request = next(job) if records is None else job.send(records)
                    return index, request
                except StopIteration as stop:
                    results[index] = stop.value
                    index = None

        current: dict[TP, tuple[int, ProbeRead]] = {}
        for tp in queues:
            step = advance(tp, None, None)
            if step is not None:
                current[tp] = step
        while current:
            records = self.read_round({tp: read for tp, (_i, read) in current.items()})
            following: dict[TP, tuple[int, ProbeRead]] = {}
            for tp, (index, _read) in current.items():
                step = advance(tp, index, records[tp])
                if step is not None:
                    following[tp] = step
            current = following
        return results


def probe_high(start: int) -> Generator[ProbeRead, list[ProbeRecord], None]:
    """Fetch once near the end so that the consumer caches the fetch's high watermark."""
    yield ProbeRead(start, start)


@dataclass(frozen=True)
class TimeAnswer:
    offset: int
    method: Method
    notes: tuple[str, ...] = ()


def time_job(
    tp: TP, option: str, ts: int, listed: int, low: int, high: int
) -> Generator[ProbeRead, list[ProbeRecord], TimeAnswer]:
    """Check ListOffsets' answer for ``ts`` by reading records; search when it is wrong.

    Steps: (1) clamp the answer into ``[low, high]`` (no answer means ``high``); (2) read the
    record at or after it and the last record below it, widening the look-back over gaps;
    (3) if the first has timestamp < ``ts`` or the second >= ``ts``, binary-search.
    """
    name = f"{tp[0]}/{tp[1]}"
    if low >= high:
        return TimeAnswer(high, "list-offsets")
    seen: list[ProbeRecord] = []
    candidate = high if listed < 0 else min(max(listed, low), high)
    at: ProbeRecord | None = None
    before: ProbeRecord | None = None
    back = 1
    first = True
    while True:
        begin = max(low, candidate - back)
        records = yield ProbeRead(begin, candidate)
        seen.extend(records)
        if first:
            at = next((r for r in records if r.offset >= candidate), None)
            first = False
        below = [r for r in records if r.offset < candidate]
        if below:
            before = below[-1]
            break
        if begin == low:
            break
        back *= 2  # a gap (markers, aborted or compacted records): look further back

    said = "no offset" if listed < 0 else f"offset {listed}"
    if at is not None and at.ts < ts:
        problem = f"the record at offset {at.offset} has timestamp {at.ts} < {ts}"
    elif before is not None and before.ts >= ts:
        which = "the last record" if candidate == high else "the record before it"
        problem = f"{which} (offset {before.offset}) has timestamp {before.ts} >= {ts}"
    else:
        return TimeAnswer(at.offset if at else high, "list-offsets", _order_notes(name, seen))

    lo, hi, answer, probes = low, high, high, 0
    while lo < hi:
        mid = (lo + hi) // 2
        records = yield ProbeRead(mid, mid)
        probes += 1
        rec = records[0] if records else None
        if rec is not None:
            seen.append(rec)
        if rec is None or rec.offset >= hi:
            hi = mid  # no record in [mid, hi): the same bound
        elif rec.ts >= ts:
            hi, answer = mid, rec.offset
        else:
            lo = rec.offset + 1
    note = (
        f"{option} {ts} on {name}: ListOffsets answered {said}, but {problem}; "
        f"found offset {answer} by a binary search over record timestamps ({probes} reads)"
    )
    logger.info("%s", note)
    return TimeAnswer(answer, "search", (note, *_order_notes(name, seen)))


def last_record_job(low: int, high: int) -> Generator[ProbeRead, list[ProbeRecord], ProbeRecord | None]:
    """The last record below ``high`` (None when ``[low, high)`` holds none), looking further
    back over offsets that hold no record (transaction markers, aborted or compacted records)."""
    back = 1
    while low < high:
        begin = max(low, high - back)
        records = yield ProbeRead(begin, high - 1)
        below = [r for r in records if r.offset < high]
        if below:
            return below[-1]
        if begin == low:
            return None
        back *= 2
    return None


def _order_notes(name: str, seen: list[ProbeRecord]) -> tuple[str, ...]:
    """A note when the records read show timestamps going backwards along the partition."""
    by_offset = sorted({r.offset: r for r in seen}.values(), key=lambda r: r.offset)
    for prev, rec in itertools.pairwise(by_offset):
        if rec.ts < prev.ts:
            return (
                f"timestamps go backwards on {name} (offset {prev.offset}: {prev.ts}, offset {rec.offset}: "
                f"{rec.ts}); time bounds on this partition are approximate",
            )
    return ()
