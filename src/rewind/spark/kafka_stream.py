"""``spark.readStream.format("rewind-kafka")``: micro-batches over Kafka offsets.

Offsets are Spark's Kafka source JSON shape, ``{"topic": {"0": 42, "1": 17}}``: the next
offset to read per partition, topics and partitions always in sorted order (Spark compares
offsets by their JSON text: the same position must always be the same text, or Spark runs
empty batches). Spark checkpoints them, so a restarted query resumes exactly where the last
committed batch ended, neither losing nor repeating a record.

What PySpark 4.1 calls, and when (observed on 4.1.1 with a recording source, and tested in
``tests/test_kafka_stream.py``):

* a new query: ``latestOffset()`` first, then ``initialOffset()``, then
  ``partitions(initial, latest)`` for batch 0;
* every later trigger: ``latestOffset()``, then ``commit(previous end)``, then
  ``partitions(previous end, latest)`` when the answer moved;
* a restart from a checkpoint: ``partitions(L, L)`` first, where ``L`` is the newest end in the
  offset log (Spark's ``AcceptsLatestSeenOffset.setLatestSeenOffset``, which PySpark forwards
  as an empty planning call), then the replay ``partitions(previous, L)`` of a batch that was
  planned but not committed, and only then ``latestOffset()``;
* ``Trigger.AvailableNow``: Spark wraps the source and asks ``latestOffset()`` once per run,
  so with ``maxOffsetsPerTrigger`` one run reads ONE batch of at most that many offsets (not
  everything available, as Spark's own Kafka source does). Run it again until a run reads
  nothing, or use a processing-time trigger.

Admission control: ``maxOffsetsPerTrigger`` caps how far each batch's end moves past the
previous end, split over partitions in proportion to their backlog, as Spark's source does.
PySpark 4.1's ``latestOffset()`` is not given the start of the next batch, so the reader keeps
it: the end of the last batch Spark planned (every ``partitions`` call names it, including the
restart call above), or the end it last answered. ``initialOffset()`` is resolved once per
reader, so the start of batch 0 and the position the first ``latestOffset()`` admitted from
are the same offsets even for ``startingOffsets=latest``.

Never re-read, never skip: a batch whose end is below its start on some partition means the
reader's position and Spark's checkpoint disagree; following it would read the same offsets
twice, so the reader raises instead. A log that shrank below the reader's position (topic
recreated) or whose start passed it (retention) is data loss: an error with
``failOnDataLoss=true`` (the default, as in Spark), a logged warning and a jump otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from rewind.core.ranges import OffsetRange, group_for_tasks
from rewind.errors import RewindError
from rewind.kafka.clients import private_consumer
from rewind.kafka.resolve import last_stable_offsets, resolve
from rewind.kafka.spark_options import parse_spark_options
from rewind.spark.kafka_fetch import fetch_ranges
from rewind.spark.kafka_options import (
    KafkaOptionError,
    client_conf,
    flag,
    positive_float,
    positive_int,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
Key = tuple[str, str]

# Options that bound a window's end make no sense for a stream (Spark rejects them too).
_BATCH_ONLY_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
# Options of Spark's Kafka stream source this reader does not implement: refused rather than
# silently ignored, because a user relying on them would get other batches than asked for.
_UNSUPPORTED_STREAM_OPTIONS = ("minOffsetsPerTrigger", "maxTriggerDelay")


class StreamDataLossError(RewindError):
    """Offsets the stream has not read yet are no longer in Kafka (``failOnDataLoss=true``)."""


class StreamPositionError(RewindError):
    """Spark asked for a batch that would re-read offsets: its checkpoint and the reader disagree."""


class StreamRangesPartition(InputPartition):
    """One task of a micro-batch: ranges of distinct partitions read by one consumer."""

    def __init__(self, ranges: list[OffsetRange]) -> None:
        super().__init__([r.to_dict() for r in ranges])
        self.ranges = ranges


@dataclass(frozen=True)
class _Log:
    """One partition as the broker sees it now.

    ``low`` is the first offset still in Kafka, ``high`` the high watermark and ``readable``
    where this reader can read to now: the last stable offset for a read_committed reader
    (an open transaction holds it back), else the high watermark.
    """

    topic: str
    partition: int
    low: int
    high: int
    readable: int


class KafkaStreamReader(DataSourceStreamReader):
    """Plans micro-batches on the driver; tasks read exactly the planned ranges."""

    def __init__(self, options: dict[str, str]) -> None:
        # Spark hands a Python source its option names in lower case: name them as documented
        given = {k.lower() for k in options}
        for name in _BATCH_ONLY_OPTIONS:
            if name.lower() in given:
                raise KafkaOptionError(
                    f"option {name} is for batch reads only: a stream has no end; "
                    "remove it from readStream, or read the window with spark.read"
                )
        for name in _UNSUPPORTED_STREAM_OPTIONS:
            if name.lower() in given:
                raise KafkaOptionError(
                    f"option {name} is not supported by rewind-kafka streams; "
                    "remove it (maxOffsetsPerTrigger is)"
                )
        self.options = options
        self.conf = client_conf(options)
        self.include_headers = flag(options, "includeHeaders")
        self.fail_on_data_loss = flag(options, "failOnDataLoss", default=True)
        self.max_per_trigger = positive_int(options, "maxOffsetsPerTrigger")
        self.ranges_per_task = positive_int(options, "rangesPerTask") or 4
        self.poll_timeout_s = (positive_float(options, "kafkaConsumer.pollTimeoutMs") or 120_000) / 1000
        self._initial: Offsets | None = None
        # the start of the next batch: the end of the last batch Spark planned or was offered
        self._position: Offsets | None = None
        # first offset still in Kafka per partition, as last seen by latestOffset
        self._lows: dict[Key, int] = {}

    # -- offsets --------------------------------------------------------------------------

    def _resolve(self, with_start: bool) -> list[tuple[_Log, int]]:
        """Every partition of the subscription now, with its start from the options (or low).

        A starting offset named explicitly below the first offset still in Kafka is data loss.
        """
        batch_only = {n.lower() for n in _BATCH_ONLY_OPTIONS}
        opts = {k: v for k, v in self.options.items() if k.lower() not in batch_only}
        if not with_start:
            opts = {k: v for k, v in opts.items() if not k.lower().startswith("starting")}
        opts["endingOffsets"] = "latest"
        plan = resolve(self.conf, parse_spark_options(opts))
        for p in plan.partitions:
            if with_start and p.start_method == "offset" and p.missing_below_low is not None:
                gone = p.missing_below_low
                self._data_loss(
                    f"startingOffsets names offset {gone.start} of {p.topic}/{p.partition}, but offsets "
                    f"[{gone.start}, {gone.end}) are no longer in Kafka; the stream starts at {p.start}"
                )
        readable = self._readable_ends(
            {(p.topic, p.partition): (p.high, p.listed_high) for p in plan.partitions}
        )
        return [
            (_Log(p.topic, p.partition, p.low, p.high, readable[p.topic, p.partition]), p.start)
            for p in plan.partitions
        ]

    def _readable_ends(self, highs: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], int]:
        """Where each partition can be read to now: the last stable offset under read_committed.

        A batch must never end past it: its tasks would wait for records a read_committed
        consumer cannot see until the transaction ends. The stable offset is believed only when
        ListOffsets says it is below its own ``latest``: a broker without transactions'
        visibility (tansu, which also under-reports ``latest``) answers the same for both, and
        there the fetched high watermark is the end.
        """
        ends = {tp: high for tp, (high, _listed) in highs.items()}
        if str(self.conf.get("isolation.level", "read_committed")) != "read_committed" or not highs:
            return ends

        for tp, stable in last_stable_offsets(self.conf, highs).items():
            high, listed = highs[tp]
            if 0 <= stable < listed:
                ends[tp] = min(high, stable)
        return ends

    def initialOffset(self) -> Offsets:
        """Where a new query starts (``startingOffsets`` / ``startingTimestamp``...), resolved once."""
        if self._initial is None:
            offsets: Offsets = {}
            for part, start in self._resolve(with_start=True):
                offsets.setdefault(part.topic, {})[str(part.partition)] = start
            self._initial = _normalized(offsets)
        return _copy(self._initial)

    def latestOffset(self) -> Offsets:
        """The end of the next batch: the high watermarks, or ``maxOffsetsPerTrigger`` past the start."""
        position = self._position if self._position is not None else self.initialOffset()
        current: dict[Key, int] = {}
        highs: dict[Key, int] = {}
        for part, _start in self._resolve(with_start=False):
            key = (part.topic, str(part.partition))
            self._lows[key] = part.low
            at = position.get(part.topic, {}).get(key[1])
            if at is None:  # a partition the query has not seen: from its first offset, as Spark
                at = part.low
            elif at < part.low:
                self._data_loss(
                    f"offsets [{at}, {part.low}) of {part.topic}/{part.partition} left Kafka before "
                    f"the stream read them (the log now starts at {part.low})"
                )
                at = part.low
            elif at > part.high:
                self._data_loss(
                    f"{part.topic}/{part.partition} ends at {part.high}, before the stream's position "
                    f"{at} (topic recreated, or the broker lost records); the stream continues at {part.high}"
                )
                at = part.high
            current[key] = at
            highs[key] = max(part.readable, at)  # never back: a batch ends at or after its start
        if self.max_per_trigger is None:
            ends = highs
        else:
            backlog = {key: highs[key] - at for key, at in current.items()}
            ends = _admit(current, backlog, self.max_per_trigger)
        latest = _copy(position)  # partitions no longer in the subscription keep their offsets
        for (topic, number), end in ends.items():
            latest.setdefault(topic, {})[number] = end
        self._position = _normalized(latest)
        return _copy(self._position)

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        """The tasks reading ``[start, end)``; also tells the reader where the next batch starts."""
        ranges = []
        new: list[Key] = []
        for topic, parts in end.items():
            for part, stop in parts.items():
                begin = start.get(topic, {}).get(part)
                if begin is None:
                    new.append((topic, part))
                    continue
                if stop < begin:
                    if self.fail_on_data_loss:
                        raise StreamPositionError(
                            f"a micro-batch would move {topic}/{part} back from offset {begin} to {stop}, "
                            f"and the next one would read [{stop}, {begin}) again: the reader's position "
                            "and the query's checkpoint disagree (does this Spark call the stream reader "
                            "in another order than PySpark 4.1?); nothing was read"
                        )
                    # the log shrank below the position (reported by latestOffset): as Spark's
                    # Kafka source with failOnDataLoss=false, skip it; the next batch starts at stop
                    log.warning(
                        "%s/%s moves back from %d to %d: skipped in this batch", topic, part, begin, stop
                    )
                    continue
                if not self.fail_on_data_loss and begin < self._lows.get((topic, part), 0):
                    begin = min(self._lows[topic, part], stop)
                if stop > begin:
                    ranges.append(OffsetRange(topic, int(part), begin, stop))
        if new:
            firsts = self._first_offsets(new)
            for topic, part in new:
                stop = end[topic][part]
                if stop > firsts[topic, part]:
                    ranges.append(OffsetRange(topic, int(part), firsts[topic, part], stop))
        self._position = _normalized(_copy(end))
        return [StreamRangesPartition(t) for t in group_for_tasks(ranges, self.ranges_per_task)]

    def _first_offsets(self, keys: list[Key]) -> dict[Key, int]:
        """First offsets of partitions new in this batch: remembered, or asked from the broker."""
        out = {key: self._lows[key] for key in keys if key in self._lows}
        unknown = [key for key in keys if key not in out]
        if unknown:
            # lazy: avoids confluent_kafka at import
            from confluent_kafka import TopicPartition

            consumer = private_consumer(self.conf, "stream-plan")
            try:
                for topic, part in unknown:
                    low, _high = consumer.get_watermark_offsets(TopicPartition(topic, int(part)), timeout=10)
                    out[topic, part] = low
            finally:
                consumer.close()
        return out

    def _data_loss(self, message: str) -> None:
        if self.fail_on_data_loss:
            raise StreamDataLossError(f"{message}; set failOnDataLoss=false to continue past it")
        log.warning("data loss: %s", message)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ranges = getattr(partition, "ranges", None) or [OffsetRange.from_dict(d) for d in partition.value]
        yield from fetch_ranges(self.conf, ranges, self.include_headers, self.poll_timeout_s)

    def commit(self, end: Offsets) -> None:
        """Nothing to release: the reader holds no broker state and commits no group offsets."""


def _copy(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {topic: dict(parts) for topic, parts in offsets.items()}


def _normalized(offsets: Offsets) -> Offsets:
    """Topics sorted by name, partitions by number: one position, one JSON text."""
    return {
        topic: {part: int(offsets[topic][part]) for part in sorted(offsets[topic], key=int)}
        for topic in sorted(offsets)
    }


def _admit(current: Mapping[Key, int], backlog: Mapping[Key, int], limit: int) -> dict[Key, int]:
    """End offsets that move at most ``limit`` offsets in total, shared by backlog size.

    When everything waiting fits, every partition moves to its end. Otherwise each partition
    gets ``floor(limit * backlog / total)`` and the rounding remainder (fewer offsets than
    partitions) goes one offset each to the largest backlogs, so exactly ``limit`` offsets
    are handed out and none past a backlog. ``current`` must name every partition of
    ``backlog``; partitions with no backlog stay where they are.
    """
    if limit <= 0:
        raise ValueError("limit must be positive")
    waiting = {key: max(0, n) for key, n in backlog.items()}
    total = sum(waiting.values())
    if total <= limit:
        return {key: current[key] + n for key, n in waiting.items()}
    shares = {key: limit * n // total for key, n in waiting.items()}
    remainder = limit - sum(shares.values())
    for key in sorted(waiting, key=lambda k: (-waiting[k], k))[:remainder]:
        shares[key] += 1
    return {key: current[key] + share for key, share in shares.items()}
