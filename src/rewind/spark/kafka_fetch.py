"""Reading one offset range of one partition into Arrow record batches.

This is the hot loop of every Kafka read in Rewind (batch reader, stream reader, archive).
It runs inside a Spark task: the consumer is created here and closed in ``finally``.

Exactness: only offsets in ``[start, end)`` are yielded, each once, in offset order. Gaps
(transaction markers, compaction, aborted records under ``read_committed``) are skipped by
the broker and the loop simply sees the next offset. The range is finished when a record at
or beyond ``end`` arrives, or when the partition's end-of-file offset reaches ``end`` (a
partition that ends on a control marker never delivers a record at ``end - 1``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from rewind.core.arrow import kafka_record_schema
from rewind.core.ranges import OffsetRange
from rewind.errors import RewindError
from rewind.kafka.clients import private_consumer

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.spark.ratelimit import Pacer

# librdkafka settings tuned for bulk reads of a bounded range; a user's kafka.* wins.
FETCH_DEFAULTS: dict[str, Any] = {
    "isolation.level": "read_committed",
    # measured on the embedded broker: responses of ~1 MiB per partition fetch fastest
    "fetch.max.bytes": 4 * 1024 * 1024,
    "max.partition.fetch.bytes": 1024 * 1024,
    "fetch.wait.max.ms": 50,
    "enable.partition.eof": True,
}

BATCH_MESSAGES = 20_000


class RangeReadError(RewindError):
    """A planned range could not be read completely."""


def fetch_range(
    conf: dict[str, Any],
    rng: OffsetRange,
    include_headers: bool = False,
    poll_timeout_s: float = 120.0,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of one range; see :func:`fetch_ranges`."""
    return fetch_ranges(conf, [rng], include_headers, poll_timeout_s)


def fetch_ranges(
    conf: dict[str, Any],
    ranges: Sequence[OffsetRange],
    include_headers: bool = False,
    poll_timeout_s: float = 120.0,
    batch_messages: int = BATCH_MESSAGES,
    pacer: Pacer | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of several ranges (distinct partitions) read at once by one consumer.

    ``pacer`` (optional) holds the read to a job-wide rate: every response is paid for
    before it is handed on, so downstream work never runs ahead of the limit.

    One consumer fetching several partitions keeps the broker busy while Python turns the
    previous response into Arrow; one partition per consumer is bound by fetch latency
    (measured on the embedded broker: 110k rec/s for one partition, 280k rec/s for four).

    Raises :class:`RangeReadError` when no progress is made for ``poll_timeout_s`` (the
    partition ends before the planned end, e.g. the topic was recreated, or an open
    transaction holds the last stable offset back).
    """
    ends = {(r.topic, r.partition): r.end for r in ranges if r.size > 0}
    if len(ends) != len([r for r in ranges if r.size > 0]):
        raise ValueError("fetch_ranges needs ranges of distinct partitions")
    if not ends:
        return
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, TopicPartition

    schema = kafka_record_schema(include_headers)
    consumer = private_consumer({**FETCH_DEFAULTS, **conf}, "read", route_logs=False)
    eof_code = KafkaError._PARTITION_EOF
    positions = {(r.topic, r.partition): r.start for r in ranges if r.size > 0}
    try:
        consumer.assign([TopicPartition(t, p, positions[(t, p)]) for (t, p) in ends])
        open_parts = set(ends)
        topics = {t for t, _p in ends}
        single_topic = next(iter(topics)) if len(topics) == 1 else None
        last_progress = time.monotonic()
        while open_parts:
            messages = consumer.consume(_wanted(open_parts, positions, ends, batch_messages), 1.0)
            if not messages:
                if time.monotonic() - last_progress > poll_timeout_s:
                    stuck = ", ".join(f"{t}/{p} at {positions[t, p]} of {ends[t, p]}" for t, p in open_parts)
                    raise RangeReadError(
                        f"no records for {poll_timeout_s:.0f}s before the planned end ({stuck}); the "
                        "partition is shorter than planned (topic recreated?) or an open transaction "
                        "holds read_committed back"
                    )
                continue
            last_progress = time.monotonic()
            # Columns are built for the whole response at once (_to_batch): this loop is what
            # bounds a task's read rate.
            good = [m for m in messages if m.error() is None]
            if len(good) != len(messages):
                for msg in messages:
                    err = msg.error()
                    if err is None:
                        continue
                    tp = (str(msg.topic()), int(msg.partition() or 0))
                    if err.code() != eof_code:
                        raise RangeReadError(f"{tp[0]}/{tp[1]} at offset {positions.get(tp)}: {err.str()}")
                    # end of the log as the broker sees it now: the range is complete when it
                    # reached the planned end (a partition may end on control markers)
                    if tp in open_parts and int(msg.offset() or 0) >= ends[tp]:
                        open_parts.discard(tp)
                        consumer.pause([TopicPartition(*tp)])
            if not good:
                continue
            batch = _to_batch(schema, good, include_headers, single_topic)
            last, mask = _last_and_mask(batch, single_topic, ends)
            if mask is not None:
                # a range ends inside this response: keep only offsets below each range's end
                for tp, off in last.items():
                    if tp in open_parts and off + 1 >= ends[tp]:
                        open_parts.discard(tp)
                        consumer.pause([TopicPartition(*tp)])
                batch = batch.filter(mask)
            for tp, off in last.items():
                positions[tp] = off + 1
            if batch.num_rows:
                if pacer is not None:
                    pacer.acquire(batch.num_rows, batch.nbytes, time.sleep)
                yield batch
    finally:
        consumer.close()


def _wanted(
    open_parts: set[tuple[str, int]],
    positions: dict[tuple[str, int], int],
    ends: dict[tuple[str, int], int],
    batch_messages: int,
) -> int:
    """How many messages to ask ``consume`` for: it returns when it has that many or when its
    timeout passes. Asked for a whole batch, the read of a range smaller than one waited out
    the timeout at its end (1 s per range, however small). What is still to come is at most
    the offsets left plus one end-of-partition event per open partition; where gaps (markers,
    aborted or compacted records) make it fewer, the call still ends at its timeout, as
    before, and a partition that goes on past its range's end fills the count with records
    the mask drops."""
    left = sum(ends[tp] - positions[tp] for tp in open_parts) + len(open_parts)
    return max(1, min(batch_messages, left))


def _last_and_mask(
    batch: pa.RecordBatch, single_topic: str | None, ends: dict[tuple[str, int], int]
) -> tuple[dict[tuple[str, int], int], pa.Array | None]:
    """The last offset per partition in a response, and (when a range ends inside it) the mask
    of the records below their range's end; None: every record is inside its range."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    if single_topic is None:
        keys = list(zip(batch.column(2).to_pylist(), batch.column(3).to_pylist(), strict=True))
        offsets = batch.column(4).to_pylist()
        last = dict(zip(keys, offsets, strict=True))
        if not any(off + 1 >= ends.get(tp, 0) for tp, off in last.items()):
            return last, None
        mask = [tp in ends and off < ends[tp] for tp, off in zip(keys, offsets, strict=True)]
        return last, pa.array(mask, type=pa.bool_())
    # one topic: numpy over the columns (a Python tuple and dict entry per record cost about as
    # much as building the batch); a partition's records arrive in offset order, in runs
    parts = batch.column(3).to_numpy()
    offs = batch.column(4).to_numpy()
    run_ends = np.append(np.flatnonzero(parts[1:] != parts[:-1]), len(parts) - 1)
    last = {}
    for p, off in zip(parts[run_ends].tolist(), offs[run_ends].tolist(), strict=True):
        last[(single_topic, p)] = off  # a later run of a partition holds later offsets
    if not any(off + 1 >= ends.get(tp, 0) for tp, off in last.items()):
        return last, None
    keep = np.zeros(len(parts), dtype=bool)
    for (_t, p), _off in last.items():
        end = ends.get((single_topic, p))
        if end is not None:
            keep |= (parts == p) & (offs < end)
    return last, pa.array(keep)


def _to_batch(
    schema: pa.Schema, messages: list[Any], include_headers: bool, topic: str | None = None
) -> pa.RecordBatch:
    """The messages as one batch in Kafka's schema; ``topic``: all of them are of that topic.

    Each field is taken with ``map`` over the unbound method and numeric columns go through
    numpy: about 1.5x faster than a comprehension per column (measured, ``bench/RESULTS.md``
    "#18.1"), and this is most of a task's read cost."""
    # lazy: avoids confluent_kafka, numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    from confluent_kafka import Message

    n = len(messages)
    # (type, ms) pairs, flattened: librdkafka says 1 / 2 where Kafka (and Spark) say
    # CreateTime 0 / LogAppendTime 1
    stamps = np.fromiter(
        itertools.chain.from_iterable(map(Message.timestamp, messages)), dtype=np.int64, count=2 * n
    )
    columns = [
        _binary(list(map(Message.key, messages))),
        _binary(list(map(Message.value, messages))),
        pa.repeat(pa.scalar(topic, pa.string()), n)
        if topic is not None
        else pa.array(list(map(Message.topic, messages)), type=pa.string()),
        pa.array(np.fromiter(map(Message.partition, messages), dtype=np.int32, count=n)),
        pa.array(np.fromiter(map(Message.offset, messages), dtype=np.int64, count=n)),
        pa.array(stamps[1::2] * 1000, type=pa.timestamp("us", tz="UTC")),
        pa.array((stamps[0::2] - 1).astype(np.int32)),
    ]
    if include_headers:
        # as Spark's Kafka source: null when a record has no headers
        columns.append(
            pa.array(
                [[{"key": k, "value": v} for k, v in h] if (h := m.headers()) else None for m in messages],
                type=schema.field("headers").type,
            )
        )
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _binary(items: list[bytes | None]) -> pa.Array:
    """A binary array from one joined buffer and the lengths (pyarrow's conversion checks every
    item); pyarrow's own when an item is null (a tombstone) or the batch passes 2 GiB."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    present = cast("list[bytes]", items)
    try:
        data = b"".join(present)  # a TypeError on a None
    except TypeError:
        return pa.array(items, type=pa.binary())
    if len(data) >= 2**31:
        return pa.array(items, type=pa.binary())
    offsets = np.zeros(len(items) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, present), dtype=np.int32, count=len(items)), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(items), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def partitions_in(table: pa.Table) -> list[tuple[str, int]]:
    """The distinct (topic, partition) pairs of a table in Kafka's schema, sorted."""
    pairs = table.select(["topic", "partition"]).group_by(["topic", "partition"]).aggregate([])
    return sorted(zip(pairs["topic"].to_pylist(), pairs["partition"].to_pylist(), strict=True))


def partition_counts(batch: pa.RecordBatch) -> dict[tuple[str, int], int]:
    """Records per (topic, partition) of a batch in Kafka's schema."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    counts = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate([([], "count_all")])
    return {
        (t, p): n
        for t, p, n in zip(
            counts["topic"].to_pylist(),
            counts["partition"].to_pylist(),
            counts["count_all"].to_pylist(),
            strict=True,
        )
    }
