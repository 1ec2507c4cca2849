"""``spark.readStream.format("rewind-kafka")``: micro-batches over Kafka offsets.

Offsets are Spark's Kafka source JSON shape, ``{"topic": {"0": 42, "1": 17}}``: the next
offset to read per partition. Spark checkpoints them, so a restarted query resumes exactly
where the last committed batch ended, neither losing nor repeating a record.

Admission control: ``maxOffsetsPerTrigger`` caps how far each batch's end moves past the
previous end, split over partitions in proportion to their backlog, as Spark's source does.
PySpark 4.1's Python stream API does not hand ``latestOffset`` the start of the next batch,
so the reader remembers it: the end it last answered, or, after a restart, the end of the
batch Spark replays from its offset log or commits first (the same contract PySpark's own
``SimpleDataSourceStreamReader`` wrapper relies on).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from rewind.kafka.ranges import OffsetRange
from rewind.spark.kafka_fetch import fetch_ranges
from rewind.spark.kafka_options import client_conf, flag, lower_keys, positive_float, positive_int

if TYPE_CHECKING:
    import pyarrow as pa

Offsets = dict[str, dict[str, int]]

_STREAM_ONLY_BATCH_OPTIONS = ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")


class StreamRangesPartition(InputPartition):
    """One task of a micro-batch: ranges of distinct partitions read by one consumer."""

    def __init__(self, ranges: list[OffsetRange]) -> None:
        super().__init__([r.to_dict() for r in ranges])
        self.ranges = ranges


class KafkaStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        lowered = lower_keys(options)
        for name in _STREAM_ONLY_BATCH_OPTIONS:
            if name in lowered:
                from rewind.spark.kafka_options import KafkaOptionError

                raise KafkaOptionError(f"option {name} is for batch reads only; remove it from readStream")
        self.options = options
        self.conf = client_conf(options)
        self.include_headers = flag(options, "includeHeaders")
        self.max_per_trigger = positive_int(options, "maxOffsetsPerTrigger")
        self.ranges_per_task = positive_int(options, "rangesPerTask") or 4
        self.poll_timeout_s = (positive_float(options, "kafkaConsumer.pollTimeoutMs") or 120_000) / 1000
        self.position: Offsets | None = None

    # -- offsets --------------------------------------------------------------------------

    def _resolve(self, starting_only: bool) -> list[tuple[str, int, int, int]]:
        """(topic, partition, start, high) for every partition, start from the options."""
        from rewind.kafka.offsets import parse_spark_options, resolve

        opts = {k: v for k, v in self.options.items() if k.lower() not in _STREAM_ONLY_BATCH_OPTIONS}
        if not starting_only:
            opts = {k: v for k, v in opts.items() if not k.lower().startswith("starting")}
            opts["startingOffsets"] = "earliest"
        opts["endingOffsets"] = "latest"
        plan = resolve(self.conf, parse_spark_options(opts))
        return [(p.topic, p.partition, p.start, p.high) for p in plan.partitions]

    def initialOffset(self) -> Offsets:
        offsets: Offsets = {}
        for topic, partition, start, _high in self._resolve(starting_only=True):
            offsets.setdefault(topic, {})[str(partition)] = start
        return offsets

    def latestOffset(self) -> Offsets:
        if self.position is None:
            self.position = self.initialOffset()
        position = self.position
        latest: Offsets = {}
        backlog: dict[tuple[str, str], int] = {}
        for topic, partition, start, high in self._resolve(starting_only=False):
            current = position.get(topic, {}).get(str(partition), start)  # new partition: from its start
            latest.setdefault(topic, {})[str(partition)] = max(high, current)
            backlog[topic, str(partition)] = max(0, high - current)
            position.setdefault(topic, {}).setdefault(str(partition), current)
        if self.max_per_trigger is not None:
            latest = _admit(position, backlog, self.max_per_trigger)
        self.position = latest
        return latest

    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        if self.position is None:  # restart: Spark replays the last planned batch first
            self.position = end
        ranges = []
        for topic, parts in end.items():
            for part, stop in parts.items():
                begin = start.get(topic, {}).get(part, stop)
                if stop > begin:
                    ranges.append(OffsetRange(topic, int(part), begin, stop))
        ranges.sort(key=lambda r: -r.size)
        tasks: list[list[OffsetRange]] = []
        for rng in ranges:  # one range per partition here, so any grouping is valid
            if tasks and len(tasks[-1]) < self.ranges_per_task:
                tasks[-1].append(rng)
            else:
                tasks.append([rng])
        return [StreamRangesPartition(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ranges = getattr(partition, "ranges", None) or [OffsetRange.from_dict(d) for d in partition.value]
        yield from fetch_ranges(self.conf, ranges, self.include_headers, self.poll_timeout_s)

    def commit(self, end: Offsets) -> None:
        if self.position is None:
            self.position = end


def _admit(position: Offsets, backlog: dict[tuple[str, str], int], limit: int) -> Offsets:
    """End offsets that move at most ``limit`` offsets in total, shared by backlog size."""
    total = sum(backlog.values())
    out: Offsets = {t: dict(parts) for t, parts in position.items()}
    if total == 0:
        return out
    granted = 0
    shares = {}
    for key, waiting in backlog.items():
        share = min(waiting, limit * waiting // total)
        shares[key] = share
        granted += share
    # hand out the rounding remainder to the largest backlogs, never past a backlog
    for key in sorted(backlog, key=lambda k: -backlog[k]):
        if granted >= min(limit, total):
            break
        extra = min(backlog[key] - shares[key], min(limit, total) - granted)
        shares[key] += extra
        granted += extra
    for (topic, part), share in shares.items():
        out.setdefault(topic, {})[part] = out.get(topic, {}).get(part, 0) + share
    return out
