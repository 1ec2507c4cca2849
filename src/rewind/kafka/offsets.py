"""Turn a requested read window into exact per-partition offset ranges ``[start, end)``.

A window is asked for the way Spark's Kafka source asks for it (:func:`parse_spark_options`
takes the very same options) or built directly as a :class:`WindowRequest`. :func:`resolve`
asks the broker and returns a frozen, JSON-serializable :class:`ReadPlan`; a Spark batch
reader turns the plan's :meth:`ReadPlan.chunks` into tasks.

The broker is never trusted blindly, because a wrong answer here silently loses or
duplicates records in a backfill:

* **High watermark.** ListOffsets ``latest`` is only a hint: some brokers (the embedded
  tansu) answer the base offset of the last batch plus one. The real high watermark comes
  from a fetch response: one private consumer is assigned to every partition at once, just
  before the listed end, and the watermark it caches after the first record or
  end-of-partition event is used. A disagreement is written into the plan.
* **Time lookups.** ListOffsets by timestamp (``offsets_for_times``) answers "the first
  offset whose timestamp is >= T". The answer is checked by reading the record at it
  (timestamp must be >= T) and the last record below it (timestamp must be < T); "below"
  skips gaps left by transaction markers, aborted or compacted records. A wrong answer (tansu
  answers 0 for every timestamp) is replaced by a binary search over record timestamps in
  ``[low, high)`` and the plan says so and why.

Timestamps and order. Kafka defines the time lookup for CreateTime as *the first offset whose
timestamp is >= T*, whatever the order of timestamps. The check and the search both assume
timestamps do not decrease along a partition (always true for LogAppendTime, and for
CreateTime when producers stamp records in order). When they do decrease, the check only
looks at the two neighbouring records and the search finds *a* place where timestamps cross
T, not necessarily the first: records on either side may belong to the other side of T.
Out-of-order timestamps seen during the probes are written into the plan; a window over such
a partition should be read by offsets, or filtered by timestamp after reading.

Policies (each one is tested):

* a timestamp with no record at or after it resolves to the partition's end (``high``);
  ``startingOffsetsByTimestampStrategy=error`` makes that an error for starting bounds, as
  in Spark (Spark's default is ``error``; Rewind's is ``latest``, because an empty window is
  a normal outcome of a backfill);
* an empty partition gives the empty range ``[high, high)``;
* a window entirely after the log gives ``[high, high)``; an explicit start offset above the
  high watermark is clamped to it with a note;
* an explicit start offset below the low watermark starts the range at ``low`` and reports
  ``missing_below_low = [start, min(end, low))``: data no longer in Kafka, never silently
  skipped (a lake archive can read it);
* ``earliest`` with ``low > 0`` starts at ``low`` and reports ``missing_below_low =
  [0, min(end, low))``: a log start above 0 means retention (or DeleteRecords) removed those
  records, and "from the beginning" includes them. Unlike a missing explicit range this is
  not a loss caused by the request; ``start_method`` tells the two apart, so a reader can
  fail on one (``failOnDataLoss``) and only report the other;
* a timestamp start whose first record still in Kafka is the very first one (``low``) while
  ``low > 0`` reports ``missing_below_low = [0, min(end, low))``: the records that left
  Kafka may belong to the window; this is an upper bound, to be filtered by timestamp;
* an end offset above ``high`` is clamped to ``high`` with a note;
* explicit offsets with start > end, or timestamps with end < start, are a :class:`PlanError`;
  a mixed window (one offset, one timestamp) that resolves to start > end is an empty range
  at ``start`` with a note;
* ``declared_log_start`` (per partition) acts as the low watermark when it is above the
  broker's: it simulates retention on brokers that cannot expire records;
* JSON offsets or timestamps must name every partition of the subscription, as in Spark.

Offsets are positions, not visibility: ``high`` is the high watermark (not the last stable
offset), probes read uncommitted, and a reader in ``read_committed`` mode skips aborted
records and markers inside a range.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from rewind.core.ranges import OffsetRange
from rewind.core.windows import EARLIEST, LATEST, TP, Bound, BoundSpec, Timestamp, WindowRequest
from rewind.errors import PlanError
from rewind.kafka import clients

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import ClusterMetadata

logger = logging.getLogger(__name__)

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "BoundSpec",
    "PartitionPlan",
    "PlanError",
    "ReadPlan",
    "Timestamp",
    "WindowRequest",
    "parse_spark_options",
    "resolve",
]

Method = Literal["earliest", "latest", "offset", "list-offsets", "search"]


# -- Spark options --------------------------------------------------------------------------

_START_OFFSETS_HELP = (
    'expected "earliest", "latest" or JSON like {"topic":{"0":23,"1":-2}} (-2 earliest, -1 latest)'
)
_END_OFFSETS_HELP = 'expected "latest" or JSON like {"topic":{"0":23,"1":-1}} (-1 latest)'
_BY_TIMESTAMP_HELP = 'expected JSON like {"topic":{"0":1700000000000}} (milliseconds since the epoch)'
_TIMESTAMP_HELP = "expected milliseconds since the epoch, like 1700000000000"
_ASSIGN_HELP = 'expected JSON like {"topic":[0,1]}'


def _show(value: str, limit: int = 120) -> str:
    """The value on one line, shortened: it goes into a one-line error message."""
    text = str(value)
    flat = " ".join(text.split()) if any(c in text for c in "\r\n\t\v\f") else text
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _bad(option: str, value: str, why: str, allowed: str) -> PlanError:
    return PlanError(f"bad {option} '{_show(value)}': {why}; {allowed}", option=option)


class _Options:
    """Spark's options, looked up case-insensitively (as Spark's CaseInsensitiveMap does)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.values: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        for key, value in options.items():
            low = str(key).lower()
            text = value if isinstance(value, str) else str(value)
            if low in self.values and self.values[low] != text:
                raise PlanError(
                    f"option {key} is given twice with different values "
                    f"({self.keys[low]}='{_show(self.values[low])}', {key}='{_show(text)}')",
                    option=str(key),
                )
            self.values[low] = text
            self.keys[low] = str(key)

    def get(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def given(self, name: str) -> bool:
        return name.lower() in self.values


def _parse_json(option: str, raw: str, allowed: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        why = (
            f"not valid JSON ({exc.msg} at column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else "not valid JSON"
        )
        raise _bad(option, raw, why, allowed) from None


def _parse_int(option: str, raw: str, *, minimum: int, allowed: str) -> int:
    text = raw.strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise _bad(option, raw, "not an integer", allowed)
    number = int(text)
    if number < minimum:
        raise _bad(option, raw, f"must be >= {minimum}", allowed)
    return number


def _partition_key(option: str, raw: str, topic: str, key: object, allowed: str) -> int:
    if not isinstance(key, str) or not re.fullmatch(r"\d+", key.strip()):
        raise _bad(option, raw, f"partition {key!r} of topic {topic!r} is not a partition number", allowed)
    return int(key)


def _parse_partition_map(
    option: str, raw: str, allowed: str, *, kind: Literal["start", "end", "time"]
) -> dict[TP, Bound]:
    """``{"topic":{"0":value}}`` into per-partition bounds, validating every value."""
    data = _parse_json(option, raw, allowed)
    if not isinstance(data, dict):
        raise _bad(option, raw, "not a JSON object of topics", allowed)
    out: dict[TP, Bound] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise _bad(option, raw, f"topic {topic!r} must map partitions to values", allowed)
        for key, value in parts.items():
            partition = _partition_key(option, raw, topic, key, allowed)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(option, raw, f"{topic}/{partition}: {value!r} is not an integer", allowed)
            if kind == "time":
                if value < 0:
                    raise _bad(option, raw, f"{topic}/{partition}: timestamp {value} is negative", allowed)
                out[(topic, partition)] = Timestamp(value)
                continue
            if kind == "end" and value == EARLIEST:
                raise _bad(
                    option, raw, f"{topic}/{partition}: an ending offset can't be earliest (-2)", allowed
                )
            if value < EARLIEST:
                raise _bad(option, raw, f"{topic}/{partition}: offset {value} is negative", allowed)
            out[(topic, partition)] = value
    return out


def _parse_side(opts: _Options, side: Literal["starting", "ending"], notes: list[str]) -> BoundSpec:
    """One side of the window with Spark's precedence: timestamp > by-timestamp JSON > offsets."""
    ts_opt, by_opt, off_opt = f"{side}Timestamp", f"{side}OffsetsByTimestamp", f"{side}Offsets"
    chosen = next((o for o in (ts_opt, by_opt, off_opt) if opts.given(o)), None)
    for other in (ts_opt, by_opt, off_opt):
        if chosen and other != chosen and opts.given(other):
            notes.append(f"{other} is ignored: {chosen} takes precedence")
    if chosen == ts_opt:
        ts_raw = opts.get(ts_opt) or ""
        return BoundSpec(
            Timestamp(_parse_int(ts_opt, ts_raw, minimum=0, allowed=_TIMESTAMP_HELP)), option=ts_opt
        )
    if chosen == by_opt:
        by_raw = opts.get(by_opt) or ""
        return BoundSpec(
            None, _parse_partition_map(by_opt, by_raw, _BY_TIMESTAMP_HELP, kind="time"), option=by_opt
        )
    raw = opts.get(off_opt)
    if side == "starting":
        if raw is None or raw.strip().lower() == "earliest":
            return BoundSpec(EARLIEST, option=off_opt)
        if raw.strip().lower() == "latest":
            return BoundSpec(LATEST, option=off_opt)
        return BoundSpec(
            None, _parse_partition_map(off_opt, raw, _START_OFFSETS_HELP, kind="start"), option=off_opt
        )
    if raw is None or raw.strip().lower() == "latest":
        return BoundSpec(LATEST, option=off_opt)
    if raw.strip().lower() == "earliest":
        raise _bad(off_opt, raw, "a window can't end at earliest", _END_OFFSETS_HELP)
    return BoundSpec(None, _parse_partition_map(off_opt, raw, _END_OFFSETS_HELP, kind="end"), option=off_opt)


def _parse_subscription(opts: _Options) -> dict[str, Any]:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if opts.given(name)]
    if len(given) != 1:
        which = "none was given" if not given else f"got {' and '.join(given)}"
        raise PlanError(
            f"exactly one of the options subscribe, subscribePattern, assign is required; {which}",
            option="subscribe",
        )
    [name] = given
    raw = opts.get(name) or ""
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise _bad(
                name, raw, "no topic named", "expected comma-separated topic names, like orders,payments"
            )
        return {"subscribe": topics}
    if name == "subscribePattern":
        if not raw.strip():
            raise _bad(name, raw, "the pattern is empty", "expected a regular expression, like orders-.*")
        try:
            re.compile(raw.strip())
        except re.error as exc:
            raise _bad(
                name, raw, f"not a regular expression ({exc})", "expected a regular expression"
            ) from None
        return {"subscribe_pattern": raw.strip()}
    data = _parse_json(name, raw, _ASSIGN_HELP)
    if not isinstance(data, dict) or not data:
        raise _bad(name, raw, "no topic named", _ASSIGN_HELP)
    pairs: list[TP] = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not parts:
            raise _bad(name, raw, f"topic {topic!r} needs a non-empty list of partitions", _ASSIGN_HELP)
        for part in parts:
            if isinstance(part, bool) or not isinstance(part, int) or part < 0:
                raise _bad(
                    name,
                    raw,
                    f"partition {part!r} of topic {topic!r} is not a partition number",
                    _ASSIGN_HELP,
                )
            pairs.append((topic, part))
    return {"assign": tuple(sorted(set(pairs)))}


def parse_spark_options(options: Mapping[str, str]) -> WindowRequest:
    """A :class:`WindowRequest` from the options of Spark's Kafka source, with Spark's semantics.

    Keys are case-insensitive. Exactly one of ``subscribe``, ``subscribePattern``, ``assign``;
    ``startingOffsets`` (default ``earliest``), ``endingOffsets`` (default ``latest``),
    ``startingTimestamp``/``endingTimestamp`` and ``startingOffsetsByTimestamp``/
    ``endingOffsetsByTimestamp``, where a global timestamp wins over the JSON by timestamp,
    which wins over offsets; ``startingOffsetsByTimestampStrategy``, ``minPartitions``,
    ``maxRecordsPerPartition``, ``failOnDataLoss`` and ``kafka.*`` are carried for the reader.
    Unknown options are ignored, as Spark does. Every bad value is a one-line
    :class:`PlanError` naming the option, the value and what is allowed.
    """
    opts = _Options(options)
    notes: list[str] = []
    subscription = _parse_subscription(opts)
    start = _parse_side(opts, "starting", notes)
    end = _parse_side(opts, "ending", notes)

    strategy_raw = opts.get("startingOffsetsByTimestampStrategy")
    strategy: Literal["latest", "error"] = "latest"
    if strategy_raw is not None:
        value = strategy_raw.strip().lower()
        if value not in ("latest", "error"):
            raise _bad(
                "startingOffsetsByTimestampStrategy",
                strategy_raw,
                "unknown strategy",
                'expected "error" or "latest"',
            )
        strategy = "error" if value == "error" else "latest"

    def positive(name: str) -> int | None:
        raw = opts.get(name)
        return (
            None if raw is None else _parse_int(name, raw, minimum=1, allowed="expected a positive integer")
        )

    fail_raw = opts.get("failOnDataLoss")
    fail_on_data_loss = True
    if fail_raw is not None:
        if fail_raw.strip().lower() not in ("true", "false"):
            raise _bad("failOnDataLoss", fail_raw, "not a boolean", 'expected "true" or "false"')
        fail_on_data_loss = fail_raw.strip().lower() == "true"

    kafka_params = {
        opts.keys[k][len("kafka.") :]: v for k, v in opts.values.items() if k.startswith("kafka.")
    }
    return WindowRequest(
        **subscription,
        start=start,
        end=end,
        start_timestamp_strategy=strategy,
        notes=tuple(notes),
        min_partitions=positive("minPartitions"),
        max_records_per_partition=positive("maxRecordsPerPartition"),
        fail_on_data_loss=fail_on_data_loss,
        kafka_params=kafka_params,
    )


# -- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionPlan:
    """The resolved window of one partition, with the broker facts it was resolved from.

    ``low`` is the effective low watermark (a declared log start when above the broker's),
    ``high`` the high watermark from a fetch response, ``listed_high`` what ListOffsets
    ``latest`` said. ``missing_below_low`` is the part of the window no longer in Kafka.
    """

    topic: str
    partition: int
    low: int
    high: int
    listed_high: int
    start: int
    end: int
    missing_below_low: OffsetRange | None = None
    start_method: Method = "earliest"
    end_method: Method = "latest"
    notes: tuple[str, ...] = ()

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "low": self.low,
            "high": self.high,
            "listed_high": self.listed_high,
            "start": self.start,
            "end": self.end,
            "missing_below_low": self.missing_below_low.to_dict() if self.missing_below_low else None,
            "start_method": self.start_method,
            "end_method": self.end_method,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PartitionPlan:
        missing = data.get("missing_below_low")
        return cls(
            topic=str(data["topic"]),
            partition=int(data["partition"]),
            low=int(data["low"]),
            high=int(data["high"]),
            listed_high=int(data["listed_high"]),
            start=int(data["start"]),
            end=int(data["end"]),
            missing_below_low=OffsetRange.from_dict(missing) if missing else None,
            start_method=data["start_method"],
            end_method=data["end_method"],
            notes=tuple(str(n) for n in data.get("notes", ())),
        )


@dataclass(frozen=True)
class ReadPlan:
    """Per-partition ranges in (topic, partition) order, and what was learnt resolving them."""

    partitions: tuple[PartitionPlan, ...]
    notes: tuple[str, ...] = ()

    def ranges(self) -> list[OffsetRange]:
        return [p.range for p in self.partitions]

    def missing(self) -> list[OffsetRange]:
        """Parts of the window that are no longer in Kafka (below the low watermark)."""
        return [p.missing_below_low for p in self.partitions if p.missing_below_low is not None]

    @property
    def total_offsets(self) -> int:
        """Offsets covered by the ranges: an upper bound of the records (markers take offsets)."""
        return sum(p.end - p.start for p in self.partitions)

    def chunks(
        self, max_records_per_partition: int | None = None, min_partitions: int | None = None
    ) -> list[OffsetRange]:
        """Ranges cut into Spark tasks, as Spark's Kafka source cuts them.

        Each non-empty range is divided evenly into ``ceil(size / max_records)`` pieces; then,
        while there are fewer pieces than ``min_partitions``, the range with the biggest
        pieces gets one piece more (pieces of one offset are not split). Empty ranges give no
        chunk. The result covers the ranges exactly, in (topic, partition, start) order.
        """
        if max_records_per_partition is not None and max_records_per_partition <= 0:
            raise PlanError(
                f"maxRecordsPerPartition must be positive, got {max_records_per_partition}",
                option="maxRecordsPerPartition",
            )
        if min_partitions is not None and min_partitions <= 0:
            raise PlanError(f"minPartitions must be positive, got {min_partitions}", option="minPartitions")
        ranges = [r for r in self.ranges() if r.size > 0]
        pieces = [
            math.ceil(r.size / max_records_per_partition) if max_records_per_partition else 1 for r in ranges
        ]
        if min_partitions is not None:
            heap = [(-math.ceil(r.size / k), i) for i, (r, k) in enumerate(zip(ranges, pieces, strict=True))]
            heapq.heapify(heap)
            count = sum(pieces)
            while count < min_partitions and heap:
                neg_size, i = heapq.heappop(heap)
                if -neg_size <= 1:
                    break
                pieces[i] += 1
                count += 1
                heapq.heappush(heap, (-math.ceil(ranges[i].size / pieces[i]), i))
        return [chunk for r, k in zip(ranges, pieces, strict=True) for chunk in _divide(r, k)]

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "partitions": [p.to_dict() for p in self.partitions], "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReadPlan:
        if data.get("version") != 1:
            raise PlanError(f"unknown read plan version {data.get('version')!r}; this Rewind reads version 1")
        return cls(
            tuple(PartitionPlan.from_dict(p) for p in data["partitions"]),
            tuple(str(n) for n in data.get("notes", ())),
        )

    @classmethod
    def from_json(cls, text: str) -> ReadPlan:
        return cls.from_dict(json.loads(text))


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``parts`` consecutive pieces of ``r`` whose sizes differ by at most one."""
    base, extra = divmod(r.size, parts)
    out: list[OffsetRange] = []
    lo = r.start
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.partition, lo, hi))
        lo = hi
    return out


# -- reading the broker ---------------------------------------------------------------------

_PROBE_SETTINGS: dict[str, Any] = {
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
class _Rec:
    offset: int
    ts: int


@dataclass(frozen=True)
class _Read:
    """Read from ``start``; stop after the first record at or above ``until`` or at the end."""

    start: int
    until: int


_Job: TypeAlias = Generator[_Read, list[_Rec], Any]


class _Prober:
    """Runs read jobs with ONE consumer, all partitions in parallel, one position per partition.

    A job is a generator that yields :class:`_Read` requests and receives the records read;
    jobs on the same partition run one after the other, jobs on different partitions share
    each round: one ``assign`` of every partition at its position, then polling until each
    has answered. The consumer never joins a group and never commits.
    """

    def __init__(self, consumer: Consumer, timeout_s: float) -> None:
        self.consumer = consumer
        self.timeout_s = timeout_s
        self.highs: dict[TP, int] = {}
        self.rounds = 0

    def read_round(self, reads: Mapping[TP, _Read]) -> dict[TP, list[_Rec]]:
        from confluent_kafka import KafkaError, TopicPartition

        self.consumer.assign([TopicPartition(t, p, r.start) for (t, p), r in reads.items()])
        self.rounds += 1
        out: dict[TP, list[_Rec]] = {tp: [] for tp in reads}
        pending = set(reads)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            if time.monotonic() > deadline:
                names = ", ".join(f"{t}/{p}" for t, p in sorted(pending))
                raise PlanError(
                    f"the broker did not answer a fetch on {names} within {self.timeout_s:g}s "
                    "while planning offsets"
                )
            # poll() returns at the first message; consume() would wait out its whole timeout
            first = self.consumer.poll(0.05)
            batch = [first, *self.consumer.consume(num_messages=500, timeout=0)] if first is not None else []
            for msg in batch:
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
                out[tp].append(_Rec(offset, ts))
                if offset >= read.until:
                    pending.discard(tp)
        return out

    def run(self, jobs: Iterable[tuple[TP, _Job]]) -> list[Any]:
        """Run every job to completion; their return values, in the order given."""
        job_list = list(jobs)
        results: list[Any] = [None] * len(job_list)
        queues: dict[TP, deque[int]] = {}
        for index, (tp, _job) in enumerate(job_list):
            queues.setdefault(tp, deque()).append(index)

        def advance(tp: TP, index: int | None, records: list[_Rec] | None) -> tuple[int, _Read] | None:
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

        current: dict[TP, tuple[int, _Read]] = {}
        for tp in queues:
            step = advance(tp, None, None)
            if step is not None:
                current[tp] = step
        while current:
            records = self.read_round({tp: read for tp, (_i, read) in current.items()})
            following: dict[TP, tuple[int, _Read]] = {}
            for tp, (index, _read) in current.items():
                step = advance(tp, index, records[tp])
                if step is not None:
                    following[tp] = step
            current = following
        return results


def _probe_high(start: int) -> Generator[_Read, list[_Rec], None]:
    """Fetch once near the end so that the consumer caches the fetch's high watermark."""
    yield _Read(start, start)


@dataclass(frozen=True)
class _TimeAnswer:
    offset: int
    method: Method
    notes: tuple[str, ...] = ()


def _time_job(
    tp: TP, option: str, ts: int, listed: int, low: int, high: int
) -> Generator[_Read, list[_Rec], _TimeAnswer]:
    """Check ListOffsets' answer for ``ts`` by reading records; search when it is wrong.

    Steps: (1) clamp the answer into ``[low, high]`` (no answer means ``high``); (2) read the
    record at or after it and the last record below it, widening the look-back over gaps;
    (3) if the first has timestamp < ``ts`` or the second >= ``ts``, binary-search.
    """
    name = f"{tp[0]}/{tp[1]}"
    if low >= high:
        return _TimeAnswer(high, "list-offsets")
    seen: list[_Rec] = []
    candidate = high if listed < 0 else min(max(listed, low), high)
    at: _Rec | None = None
    before: _Rec | None = None
    back = 1
    first = True
    while True:
        begin = max(low, candidate - back)
        records = yield _Read(begin, candidate)
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
        return _TimeAnswer(at.offset if at else high, "list-offsets", _order_notes(name, seen))

    lo, hi, answer, probes = low, high, high, 0
    while lo < hi:
        mid = (lo + hi) // 2
        records = yield _Read(mid, mid)
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
    return _TimeAnswer(answer, "search", (note, *_order_notes(name, seen)))


def _order_notes(name: str, seen: list[_Rec]) -> tuple[str, ...]:
    """A note when the records read show timestamps going backwards along the partition."""
    by_offset = sorted({r.offset: r for r in seen}.values(), key=lambda r: r.offset)
    for prev, rec in itertools.pairwise(by_offset):
        if rec.ts < prev.ts:
            return (
                f"timestamps go backwards on {name} (offset {prev.offset}: {prev.ts}, offset {rec.offset}: "
                f"{rec.ts}); time bounds on this partition are approximate",
            )
    return ()


# -- resolve --------------------------------------------------------------------------------


def _requested_partitions(request: WindowRequest, metadata: ClusterMetadata) -> tuple[list[TP], list[str]]:
    topics = metadata.topics

    def partitions_of(topic: str, option: str) -> list[int]:
        meta = topics.get(topic)
        if meta is None or meta.error is not None:
            detail = f" ({meta.error.str()})" if meta is not None and meta.error is not None else ""
            raise PlanError(
                f"topic '{topic}' named in {option} does not exist{detail}", option=option, topic=topic
            )
        return sorted(meta.partitions)

    notes: list[str] = []
    if request.subscribe:
        found = [(t, p) for t in request.subscribe for p in partitions_of(t, "subscribe")]
    elif request.assign:
        found = []
        for topic, partition in request.assign:
            existing = partitions_of(topic, "assign")
            if partition not in existing:
                count = len(existing)
                raise PlanError(
                    f"partition {topic}/{partition} named in assign does not exist "
                    f"(the topic has {count} partitions)",
                    option="assign",
                    topic=topic,
                    partition=partition,
                )
            found.append((topic, partition))
    else:
        pattern = re.compile(request.subscribe_pattern or "")
        # Kafka's consumers leave internal topics out of pattern subscriptions.
        names = sorted(t for t in topics if pattern.fullmatch(t) and not t.startswith("__"))
        notes.append(
            f"subscribePattern {request.subscribe_pattern} matched {len(names)} topics"
            + (f": {', '.join(names)}" if names else "")
        )
        found = [(t, p) for t in names for p in partitions_of(t, "subscribePattern")]
    return sorted(set(found)), notes


def _check_named(spec: BoundSpec, partitions: list[TP]) -> None:
    wanted = set(partitions)
    extra = sorted(set(spec.overrides) - wanted)
    if extra:
        names = ", ".join(f"{t}/{p}" for t, p in extra)
        raise PlanError(
            f"{spec.option} names {names}, which is not part of the subscription", option=spec.option
        )
    if spec.default is None:
        missing = sorted(wanted - set(spec.overrides))
        if missing:
            names = ", ".join(f"{t}/{p}" for t, p in missing[:10]) + (" ..." if len(missing) > 10 else "")
            raise PlanError(
                f"{spec.option} does not name {names}; as in Spark, JSON bounds must name every "
                "partition of the subscription (-2 earliest, -1 latest)",
                option=spec.option,
            )


def _list_offsets(
    conf: dict[str, Any], specs: dict[str, dict[TP, int]], timeout_s: float
) -> dict[str, dict[TP, int]]:
    """ListOffsets for several specs, one batched request per spec.

    Each spec maps partitions to a ListOffsets timestamp: -2 (earliest), -1 (latest) or
    milliseconds. It goes through a consumer's ``offsets_for_times``, which sends the
    timestamps as given, rather than ``AdminClient.list_offsets``: that call crashed the
    whole process (a segfault inside confluent-kafka 2.16.1) under memory pressure here.
    """
    from confluent_kafka import KafkaException, TopicPartition

    out: dict[str, dict[TP, int]] = {name: {} for name in specs}
    consumer = clients.private_consumer(conf, "list-offsets", {"isolation.level": "read_uncommitted"})
    try:
        for name, wanted in specs.items():
            if not wanted:
                continue
            request = [TopicPartition(t, p, ts) for (t, p), ts in sorted(wanted.items())]
            try:
                answers = consumer.offsets_for_times(request, timeout=timeout_s)
            except KafkaException as exc:
                raise PlanError(f"ListOffsets ({name}) failed: {exc.args[0].str()}") from exc
            for tp in answers:
                if tp.error is not None:
                    raise PlanError(
                        f"ListOffsets ({name}) failed on {tp.topic}/{tp.partition}: {tp.error.str()}",
                        topic=tp.topic,
                        partition=tp.partition,
                    )
                out[name][(tp.topic, tp.partition)] = tp.offset
    finally:
        consumer.close()
    return out


def resolve(
    conf: dict[str, Any],
    request: WindowRequest,
    *,
    timeout_s: float = 10.0,
    declared_log_start: Mapping[TP, int] | None = None,
) -> ReadPlan:
    """Resolve ``request`` against the broker into a :class:`ReadPlan`.

    Steps, in order: (1) the partitions, from the metadata of all topics (a Metadata request
    naming one topic creates it on some brokers); (2) ListOffsets earliest, latest and by
    timestamp, batched; (3) the true high watermarks, one fetch per partition with one
    consumer; (4) every time bound checked by reading records, searched when wrong; (5) the
    policies of the module docstring, per partition. Reads nothing else and changes nothing.
    """
    from confluent_kafka import TopicPartition

    metadata = clients.cluster_metadata(conf, timeout_s)
    partitions, plan_notes = _requested_partitions(request, metadata)
    plan_notes = [*request.notes, *plan_notes]
    _check_named(request.start, partitions)
    _check_named(request.end, partitions)
    declared = dict(declared_log_start or {})
    for topic, partition in declared:
        meta = metadata.topics.get(topic)
        if meta is None or partition not in meta.partitions:
            raise PlanError(
                f"declared log start names {topic}/{partition}, which does not exist",
                topic=topic,
                partition=partition,
            )
    if not partitions:
        return ReadPlan((), tuple(plan_notes))

    bounds = {tp: (request.start.for_partition(*tp), request.end.for_partition(*tp)) for tp in partitions}
    start_times = {tp: b[0].ms for tp, b in bounds.items() if isinstance(b[0], Timestamp)}
    end_times = {tp: b[1].ms for tp, b in bounds.items() if isinstance(b[1], Timestamp)}
    listed = _list_offsets(
        conf,
        {
            "earliest": dict.fromkeys(partitions, EARLIEST),
            "latest": dict.fromkeys(partitions, LATEST),
            "start": dict(start_times),
            "end": dict(end_times),
        },
        timeout_s,
    )
    broker_low = listed["earliest"]
    listed_high = listed["latest"]

    consumer = clients.private_consumer(conf, "plan", _PROBE_SETTINGS)
    try:
        prober = _Prober(consumer, timeout_s)
        prober.run((tp, _probe_high(max(broker_low[tp], listed_high[tp] - 1))) for tp in partitions)
        highs: dict[TP, int] = {}
        for topic, partition in partitions:
            _lo, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
            if high is None or high < 0:
                raise PlanError(
                    f"no high watermark for {topic}/{partition} after fetching it",
                    topic=topic,
                    partition=partition,
                )
            highs[(topic, partition)] = high
        prober.highs = highs

        lows: dict[TP, int] = {}
        low_notes: dict[TP, list[str]] = {tp: [] for tp in partitions}
        for tp in partitions:
            low = broker_low[tp]
            if tp in declared:
                d = declared[tp]
                if d > highs[tp]:
                    raise PlanError(
                        f"declared log start {d} of {tp[0]}/{tp[1]} is after its high watermark {highs[tp]}",
                        topic=tp[0],
                        partition=tp[1],
                    )
                if d > low:
                    low_notes[tp].append(
                        f"declared log start {d} on {tp[0]}/{tp[1]} is above the broker's low "
                        f"watermark {low}: offsets below {d} count as no longer in Kafka"
                    )
                    low = d
                elif d < low:
                    low_notes[tp].append(
                        f"declared log start {d} on {tp[0]}/{tp[1]} is below the broker's low "
                        f"watermark {low}: the broker's is used"
                    )
            lows[tp] = low

        jobs: list[tuple[TP, _Job]] = []
        keys: list[tuple[str, TP]] = []
        for side, times, option in (
            ("start", start_times, request.start.option or "startingTimestamp"),
            ("end", end_times, request.end.option or "endingTimestamp"),
        ):
            for tp, ms in times.items():
                jobs.append((tp, _time_job(tp, option, ms, listed[side][tp], lows[tp], highs[tp])))
                keys.append((side, tp))
        answers: dict[tuple[str, TP], _TimeAnswer] = dict(zip(keys, prober.run(jobs), strict=True))
        logger.debug("planned %d partitions in %d fetch rounds", len(partitions), prober.rounds)
    finally:
        consumer.close()

    plans = [
        _plan_partition(
            tp,
            request,
            bounds[tp],
            lows[tp],
            highs[tp],
            listed_high[tp],
            answers.get(("start", tp)),
            answers.get(("end", tp)),
            low_notes[tp],
        )
        for tp in partitions
    ]
    under = sum(p.listed_high < p.high for p in plans)
    if under:
        plan_notes.append(
            f"ListOffsets under-reported latest on {under} of {len(plans)} partitions; "
            "ends come from fetch responses"
        )
    searched = sum(a.method == "search" for a in answers.values())
    if searched:
        plan_notes.append(
            f"ListOffsets by timestamp answered wrongly {searched} of {len(answers)} times; "
            "those bounds were found by searching record timestamps"
        )
    return ReadPlan(tuple(plans), tuple(plan_notes))


def _plan_partition(
    tp: TP,
    request: WindowRequest,
    bounds: tuple[Bound | None, Bound | None],
    low: int,
    high: int,
    listed_high: int,
    start_answer: _TimeAnswer | None,
    end_answer: _TimeAnswer | None,
    notes: list[str],
) -> PartitionPlan:
    """Apply the policies of the module docstring to one partition."""
    topic, partition = tp
    name = f"{topic}/{partition}"
    start_bound, end_bound = bounds
    assert start_bound is not None and end_bound is not None  # _check_named saw to it
    start_option = request.start.option or "start"
    end_option = request.end.option or "end"
    notes = list(notes)
    if listed_high < high:
        notes.append(f"ListOffsets under-reported latest on {name}: {listed_high} < {high}")
    elif listed_high > high:
        notes.append(
            f"ListOffsets reported latest {listed_high} on {name}, above the fetched high watermark {high}"
        )

    start_method: Method
    if isinstance(start_bound, Timestamp):
        assert start_answer is not None
        raw_start, start_method = start_answer.offset, start_answer.method
        notes.extend(start_answer.notes)
        if raw_start >= high and request.start_timestamp_strategy == "error":
            raise PlanError(
                f"no record at or after {start_option} {start_bound.ms} on {name} "
                "(startingOffsetsByTimestampStrategy=error)",
                option=start_option,
                topic=topic,
                partition=partition,
            )
    elif start_bound == EARLIEST:
        raw_start, start_method = low, "earliest"
    elif start_bound == LATEST:
        raw_start, start_method = high, "latest"
    else:
        raw_start, start_method = start_bound, "offset"

    end_method: Method
    if isinstance(end_bound, Timestamp):
        assert end_answer is not None
        raw_end, end_method = end_answer.offset, end_answer.method
        notes.extend(end_answer.notes)
    elif end_bound == LATEST:
        raw_end, end_method = high, "latest"
    else:
        raw_end, end_method = end_bound, "offset"

    missing: OffsetRange | None = None
    if start_method == "offset" and raw_start < low:
        cut = min(raw_end, low)
        if cut > raw_start:
            missing = OffsetRange(topic, partition, raw_start, cut)
            notes.append(
                f"offsets [{raw_start}, {cut}) of {name} are no longer in Kafka (log starts at {low})"
            )
    elif start_method == "earliest" and low > 0:
        cut = min(raw_end, low)
        if cut > 0:
            missing = OffsetRange(topic, partition, 0, cut)
            notes.append(
                f"offsets [0, {cut}) of {name} are no longer in Kafka (log starts at {low}); "
                f"earliest starts at {low}"
            )
    elif isinstance(start_bound, Timestamp) and raw_start == low and low > 0:
        cut = min(raw_end, low)
        if cut > 0:
            missing = OffsetRange(topic, partition, 0, cut)
            notes.append(
                f"the first record of {name} still in Kafka (offset {low}) is already at or after "
                f"{start_option} {start_bound.ms}: offsets [0, {cut}) are no longer in Kafka and may "
                "hold part of the window (an upper bound: filter them by timestamp)"
            )

    start = min(max(raw_start, low), high)
    if start_method == "offset" and raw_start > high:
        notes.append(
            f"{start_option} offset {raw_start} on {name} is after the end of the log ({high}): empty range"
        )
    end = min(raw_end, high)
    if end_method == "offset" and raw_end > high:
        notes.append(
            f"{end_option} offset {raw_end} on {name} is after the high watermark {high}: clamped to {high}"
        )
    if end < start:
        if missing is None:
            notes.append(f"the window on {name} resolved to start {start} after end {end}: empty range")
        end = start
    return PartitionPlan(
        topic, partition, low, high, listed_high, start, end, missing, start_method, end_method, tuple(notes)
    )
