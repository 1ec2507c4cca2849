"""Consumer groups at the protocol level: describe, committed offsets, alter, delete.

Thin wrappers over confluent-kafka's AdminClient, one short-lived client per call (no I/O
until called; the AdminClient has no ``close``, it is freed with the last reference). The
wrappers add what a reset needs to be safe:

* :func:`alter_offsets` reads the offsets back and raises :class:`OffsetsNotApplied`
  naming every partition that did not take its offset: a broker that accepts a write and
  ignores it (or refuses one partition of many) is never a silent no-op;
* :func:`require_inactive` refuses a group with live members or a rebalance in flight
  (:class:`GroupActive` names the members as ``client-id@host``); only ``Empty`` and
  ``Dead`` count as inactive, so a broker that reports ``Stable`` without listing members
  (tansu 0.6) is refused too;
* :func:`offsets_at_time` turns a time into per-partition offsets through Rewind's checked
  lookup (:func:`rewind.kafka.resolve.resolve`): the broker's time-index answer is verified
  by reading the record at it and the one before it, and searched when wrong, never used
  unverified. :func:`log_bounds` gives the log start and the true high watermark (from a
  fetch) that resets are clamped to.

A group "does not exist" when it has no members and no committed offsets: Kafka answers
``Dead`` for an unknown group, tansu ``Empty``; either way there is nothing to describe or
reset. The Python client does not expose OffsetDelete: :func:`delete_group_offsets` deletes
the whole group when asked for all its offsets, and sends OffsetDelete itself otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rewind.core.ranges import OffsetRange
from rewind.core.windows import EARLIEST, LATEST, TP, BoundSpec, Timestamp, WindowRequest
from rewind.errors import BrokerUnreachable, PlanError
from rewind.kafka import clients
from rewind.kafka.exceptions import (
    GroupActive,
    GroupError,
    GroupNotFound,
    GroupOperationRefused,
    OffsetsNotApplied,
)
from rewind.kafka.offset_delete import offset_delete
from rewind.kafka.probes import PROBE_SETTINGS, Prober, last_record_job
from rewind.kafka.read_plan import Method
from rewind.kafka.resolve import resolve

if TYPE_CHECKING:
    from concurrent.futures import Future

    from confluent_kafka.admin import AdminClient

    from rewind.kafka.probes import ProbeRecord

logger = logging.getLogger(__name__)

INACTIVE_STATES = frozenset({"Empty", "Dead"})
"""States in which a group's offsets may be changed (as kafka-consumer-groups requires)."""

_STATE_NAMES = {
    "UNKNOWN": "Unknown",
    "PREPARING_REBALANCING": "PreparingRebalance",
    "COMPLETING_REBALANCING": "CompletingRebalance",
    "STABLE": "Stable",
    "DEAD": "Dead",
    "EMPTY": "Empty",
}


@dataclass(frozen=True)
class GroupMember:
    """One member of a group as the broker describes it; ``host`` without Java's leading '/'."""

    member_id: str
    client_id: str
    host: str
    assignment: tuple[TP, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.client_id or self.member_id}@{self.host or '?'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "client_id": self.client_id,
            "host": self.host,
            "assignment": [{"topic": t, "partition": p} for t, p in self.assignment],
        }


@dataclass(frozen=True)
class GroupState:
    """A group's description: state in Kafka's spelling (Stable, Empty, Dead, ...), members."""

    group: str
    state: str
    members: tuple[GroupMember, ...] = ()
    protocol: str = ""
    coordinator: str = ""

    @property
    def active(self) -> bool:
        return bool(self.members) or self.state not in INACTIVE_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "state": self.state,
            "active": self.active,
            "protocol": self.protocol,
            "coordinator": self.coordinator,
            "members": [m.to_dict() for m in self.members],
        }


@dataclass(frozen=True)
class PartitionPosition:
    """Where one partition's log starts and ends now, and the offset a lookup resolved to.

    ``offset`` is the first offset whose timestamp is >= the time asked (``high`` when none
    is), or ``low`` for :func:`log_bounds`. ``missing_below`` is the range below the log
    start that may hold records at or after the time (an upper bound: those records are
    gone, their timestamps unknown); ``method`` says whether the broker's answer held
    (``list-offsets``) or a search over record timestamps found it (``search``).
    """

    topic: str
    partition: int
    low: int
    high: int
    offset: int
    method: Method = "earliest"
    missing_below: OffsetRange | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def missing_count(self) -> int:
        return self.missing_below.size if self.missing_below is not None else 0


def _require_id(group: str) -> None:
    if not isinstance(group, str) or not group.strip():
        raise GroupError("the consumer group id is empty; name the group", group=str(group))


def _client(conf: Mapping[str, Any], timeout_s: float) -> AdminClient:
    return clients.admin({**conf, "socket.connection.setup.timeout.ms": int(timeout_s * 1000)})


def _await(future: Future[Any], conf: Mapping[str, Any], group: str, operation: str, timeout_s: float) -> Any:
    """The future's result; a transport failure is BrokerUnreachable, anything else refused."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import KafkaError, KafkaException

    try:
        return future.result(timeout=timeout_s + 5)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        code = err.code() if isinstance(err, KafkaError) else None
        detail = err.str() if isinstance(err, KafkaError) else str(exc)
        if code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT):
            raise BrokerUnreachable(str(conf.get("bootstrap.servers")), detail) from None
        if code == KafkaError.GROUP_ID_NOT_FOUND:
            raise GroupNotFound(group, detail) from None
        if code == KafkaError.NON_EMPTY_GROUP:
            raise GroupActive(group, "not empty (said the broker)", ()) from None
        raise GroupOperationRefused(group, operation, detail) from None
    except TimeoutError:
        raise BrokerUnreachable(str(conf.get("bootstrap.servers")), f"no answer to {operation}") from None


def _assigned(member: Any) -> tuple[TP, ...]:
    tps = member.assignment.topic_partitions if member.assignment else []
    return tuple(sorted((tp.topic, tp.partition) for tp in tps))


def _state_name(state: object) -> str:
    name = getattr(state, "name", None) or str(state)
    return _STATE_NAMES.get(name.upper(), name)


def describe_group(
    conf: Mapping[str, Any], group: str, timeout_s: float = 10.0, *, must_exist: bool = True
) -> GroupState:
    """Describe ``group``: state, members with their assignments, partition assignor.

    With ``must_exist`` a group with no members and no committed offsets raises
    :class:`GroupNotFound` (one more request, only for a memberless group).
    """
    _require_id(group)
    admin = _client(conf, timeout_s)
    futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
    desc = _await(futures[group], conf, group, "DescribeGroups", timeout_s)
    members = tuple(
        GroupMember(
            member_id=m.member_id or "",
            client_id=m.client_id or "",
            host=(m.host or "").lstrip("/"),
            assignment=_assigned(m),
        )
        for m in desc.members
    )
    coordinator = desc.coordinator
    state = GroupState(
        group=group,
        state=_state_name(desc.state),
        members=members,
        protocol=desc.partition_assignor or "",
        coordinator=f"{coordinator.host}:{coordinator.port}" if coordinator is not None else "",
    )
    memberless = not members and state.state in {"Dead", "Empty", "Unknown"}
    if (
        must_exist
        and memberless
        and (state.state == "Dead" or not committed_offsets(conf, group, timeout_s=timeout_s))
    ):
        raise GroupNotFound(group)
    return state


def require_inactive(
    conf: Mapping[str, Any], group: str, timeout_s: float = 10.0, *, must_exist: bool = True
) -> GroupState:
    """The group's description, or :class:`GroupActive` when it has members or is rebalancing."""
    state = describe_group(conf, group, timeout_s, must_exist=must_exist)
    if state.active:
        raise GroupActive(group, state.state, [m.label for m in state.members])
    return state


def _expand(conf: Mapping[str, Any], partitions: Iterable[TP] | Iterable[str], timeout_s: float) -> list[TP]:
    """Partitions as given, with bare topic names expanded to all their partitions."""
    wanted: list[TP] = []
    topics: list[str] = []
    for item in partitions:
        if isinstance(item, str):
            topics.append(item)
        else:
            wanted.append((str(item[0]), int(item[1])))
    if topics:
        metadata = clients.cluster_metadata(dict(conf), timeout_s)
        for topic in topics:
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                raise PlanError(f"topic '{topic}' does not exist", topic=topic)
            wanted.extend((topic, p) for p in sorted(meta.partitions))
    return sorted(set(wanted))


def committed_offsets(
    conf: Mapping[str, Any],
    group: str,
    partitions: Iterable[TP] | Iterable[str] | None = None,
    *,
    timeout_s: float = 10.0,
) -> dict[TP, int | None]:
    """The group's committed offset per partition (``None``: nothing committed there).

    ``partitions=None`` lists every partition the group has an offset for; otherwise the
    partitions named (a bare topic name stands for all its partitions), each in the answer.
    """
    _require_id(group)
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    wanted = None if partitions is None else _expand(conf, partitions, timeout_s)
    if wanted == []:
        return {}
    request = ConsumerGroupTopicPartitions(
        group, None if wanted is None else [TopicPartition(t, p) for t, p in wanted]
    )
    admin = _client(conf, timeout_s)
    futures = admin.list_consumer_group_offsets([request], request_timeout=timeout_s)
    answer = _await(futures[group], conf, group, "OffsetFetch", timeout_s)
    out: dict[TP, int | None] = dict.fromkeys(wanted or [])
    for tp in answer.topic_partitions or []:
        if tp.error is not None:
            raise GroupOperationRefused(group, f"OffsetFetch of {tp.topic}/{tp.partition}", tp.error.str())
        out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    if wanted is None:
        out = {tp: off for tp, off in out.items() if off is not None}
    return dict(sorted(out.items()))


def alter_offsets(
    conf: Mapping[str, Any], group: str, offsets: Mapping[TP, int], *, timeout_s: float = 10.0
) -> None:
    """Commit ``offsets`` for the group, then read them back; raise unless every one applied.

    Steps: (1) AlterConsumerGroupOffsets with all partitions in one request; (2) note each
    partition the broker refused; (3) OffsetFetch the same partitions; (4) raise
    :class:`OffsetsNotApplied` naming each partition whose committed offset differs from
    the one asked, with the broker's error when it gave one. The caller checks the group is
    inactive first: a live member's commits would overwrite these.
    """
    _require_id(group)
    # lazy: avoids confluent_kafka at import
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    if not offsets:
        return
    for (topic, partition), offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset for {topic}/{partition} must be an int >= 0, got {offset!r}")
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
    )
    admin = _client(conf, timeout_s)
    futures = admin.alter_consumer_group_offsets([request], request_timeout=timeout_s)
    errors: dict[TP, str] = {}
    answer = _await(futures[group], conf, group, "OffsetCommit", timeout_s)
    for tp in answer.topic_partitions or []:
        if tp.error is not None:
            errors[(tp.topic, tp.partition)] = tp.error.str()
    now = committed_offsets(conf, group, list(offsets), timeout_s=timeout_s)
    failures = {
        tp: (wanted, now.get(tp), errors.get(tp, ""))
        for tp, wanted in offsets.items()
        if now.get(tp) != wanted or tp in errors
    }
    if failures:
        raise OffsetsNotApplied(group, failures)
    logger.info("committed %d offsets for group %s", len(offsets), group)


def delete_group(conf: Mapping[str, Any], group: str, *, timeout_s: float = 10.0) -> None:
    """Delete the group with all its committed offsets (the broker refuses a non-empty group)."""
    _require_id(group)
    admin = _client(conf, timeout_s)
    futures = admin.delete_consumer_groups([group], request_timeout=timeout_s)
    _await(futures[group], conf, group, "DeleteGroups", timeout_s)


def delete_group_offsets(
    conf: Mapping[str, Any], group: str, partitions: Sequence[TP] | None = None, *, timeout_s: float = 10.0
) -> None:
    """Remove the group's committed offsets for ``partitions`` (all when ``None``).

    When ``partitions`` covers every committed offset of the group, the group is deleted
    (DeleteGroups, which every broker here has); otherwise OffsetDelete is sent directly
    (:mod:`rewind.kafka.offset_delete`: confluent-kafka does not expose it), and a broker
    without it refuses with :class:`GroupOperationRefused`.
    """
    if partitions is not None:
        committed = set(committed_offsets(conf, group, timeout_s=timeout_s))
        if committed - set(partitions):
            drop = sorted(set(partitions) & committed)
            if drop:
                offset_delete(conf, group, drop, timeout_s=timeout_s)
            return
    delete_group(conf, group, timeout_s=timeout_s)


def _resolve_positions(
    conf: Mapping[str, Any], partitions: Iterable[TP], start: BoundSpec, timeout_s: float
) -> dict[TP, PartitionPosition]:
    wanted = tuple(sorted(set(partitions)))
    if not wanted:
        return {}
    plan = resolve(
        dict(conf), WindowRequest(assign=wanted, start=start, end=BoundSpec(LATEST)), timeout_s=timeout_s
    )
    return {
        (p.topic, p.partition): PartitionPosition(
            p.topic, p.partition, p.low, p.high, p.start, p.start_method, p.missing_below_low, p.notes
        )
        for p in plan.partitions
    }


def log_bounds(
    conf: Mapping[str, Any], partitions: Iterable[TP], *, timeout_s: float = 10.0
) -> dict[TP, PartitionPosition]:
    """Log start and true high watermark (from a fetch, not ListOffsets) of each partition."""
    return _resolve_positions(conf, partitions, BoundSpec(EARLIEST, option="earliest"), timeout_s)


def newest_records(
    conf: Mapping[str, Any], positions: Iterable[PartitionPosition], *, timeout_s: float = 10.0
) -> dict[TP, ProbeRecord | None]:
    """The newest record (offset, timestamp in ms) below each position's ``high``, read from the
    log (None: the partition holds no record); what a time after every record is checked with."""
    wanted = {(p.topic, p.partition): p for p in positions}
    if not wanted:
        return {}
    consumer = clients.private_consumer(dict(conf), "newest", PROBE_SETTINGS)
    try:
        prober = Prober(consumer, timeout_s)
        prober.highs = {tp: p.high for tp, p in wanted.items()}
        found = prober.run((tp, last_record_job(p.low, p.high)) for tp, p in wanted.items())
    finally:
        consumer.close()
    return dict(zip(wanted, found, strict=True))


def offsets_at_time(
    conf: Mapping[str, Any],
    partitions: Iterable[TP],
    when: datetime | int,
    *,
    timeout_s: float = 10.0,
    option: str = "--to-datetime",
) -> dict[TP, PartitionPosition]:
    """Per partition, the first offset whose timestamp is >= ``when`` (an aware datetime or ms).

    The broker's time-index answer is checked by reading records and replaced by a binary
    search over record timestamps when wrong (:mod:`rewind.kafka.resolve`); a time after the
    last record gives the high watermark. ``missing_below`` is set when the first record
    still in Kafka is already at or after ``when`` while the log starts above 0.
    """
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise PlanError(f"{option} {when.isoformat()} has no time zone; add one (e.g. Z)", option=option)
        ms = int(when.timestamp() * 1000)
    else:
        ms = when
    return _resolve_positions(conf, partitions, BoundSpec(Timestamp(ms), option=option), timeout_s)
