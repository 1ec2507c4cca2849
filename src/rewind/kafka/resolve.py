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

import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rewind.core.ranges import OffsetRange
from rewind.core.windows import EARLIEST, LATEST, TP, Bound, BoundSpec, Timestamp, WindowRequest
from rewind.errors import PlanError
from rewind.kafka import clients
from rewind.kafka.probes import PROBE_SETTINGS, ProbeJob, Prober, TimeAnswer, probe_high, time_job
from rewind.kafka.read_plan import Method, PartitionPlan, ReadPlan

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata

logger = logging.getLogger(__name__)


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
    conf: dict[str, Any],
    specs: dict[str, dict[TP, int]],
    timeout_s: float,
    isolation: str = "read_uncommitted",
) -> dict[str, dict[TP, int]]:
    """ListOffsets for several specs, one batched request per spec.

    Each spec maps partitions to a ListOffsets timestamp: -2 (earliest), -1 (latest) or
    milliseconds. It goes through a consumer's ``offsets_for_times``, which sends the
    timestamps as given, rather than ``AdminClient.list_offsets``: that call crashed the
    whole process (a segfault inside confluent-kafka 2.16.1) under memory pressure here.
    ``isolation`` is the request's isolation level: ``read_committed`` makes ``latest`` the
    last stable offset.
    """
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaException, TopicPartition

    out: dict[str, dict[TP, int]] = {name: {} for name in specs}
    consumer = clients.private_consumer(conf, "list-offsets", {"isolation.level": isolation})
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


def log_starts(conf: dict[str, Any], partitions: Iterable[TP], timeout_s: float = 10.0) -> dict[TP, int]:
    """The first offset still in Kafka per partition now (ListOffsets earliest, one request)."""
    wanted = dict.fromkeys(partitions, EARLIEST)
    return _list_offsets(conf, {"earliest": wanted}, timeout_s)["earliest"]


def last_stable_offsets(
    conf: dict[str, Any], partitions: Iterable[TP], timeout_s: float = 10.0
) -> dict[TP, int]:
    """The last stable offset of each partition: where a read_committed reader must stop now.

    Below it every transaction is decided; at and above it an open transaction holds
    read_committed readers back. A broker without transactions' visibility (tansu) answers
    its ``latest`` here as well, so callers compare with the read_uncommitted answer.
    """
    wanted = dict.fromkeys(partitions, LATEST)
    return _list_offsets(conf, {"stable": wanted}, timeout_s, "read_committed")["stable"]


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
    # lazy: avoids confluent_kafka at import
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

    consumer = clients.private_consumer(conf, "plan", PROBE_SETTINGS)
    try:
        prober = Prober(consumer, timeout_s)
        prober.run((tp, probe_high(max(broker_low[tp], listed_high[tp] - 1))) for tp in partitions)
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

        jobs: list[tuple[TP, ProbeJob]] = []
        keys: list[tuple[str, TP]] = []
        for side, times, option in (
            ("start", start_times, request.start.option or "startingTimestamp"),
            ("end", end_times, request.end.option or "endingTimestamp"),
        ):
            for tp, ms in times.items():
                jobs.append((tp, time_job(tp, option, ms, listed[side][tp], lows[tp], highs[tp])))
                keys.append((side, tp))
        answers: dict[tuple[str, TP], TimeAnswer] = dict(zip(keys, prober.run(jobs), strict=True))
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
    start_answer: TimeAnswer | None,
    end_answer: TimeAnswer | None,
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
