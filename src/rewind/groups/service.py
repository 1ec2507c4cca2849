"""Resetting, undoing and describing a consumer group's offsets, with the ledger's record.

:func:`plan_reset` reads (the group, its offsets, the log bounds, the checked time lookup)
and changes nothing; :func:`execute_reset` applies a plan only to an inactive group whose
offsets did not move since, records it in the ledger first, and reads the offsets back;
:func:`undo_reset` puts back the offsets a reset found. Why each step is there is in the
docstrings; the Kafka calls are in :mod:`rewind.kafka.groups`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.core.windows import TP
from rewind.errors import RewindError
from rewind.groups.csvplan import from_csv
from rewind.groups.exceptions import (
    LogStartMoved,
    OffsetsMoved,
    ResetInputError,
    TimeAfterNewestRecord,
    TimeBeforeLogStart,
    TopicNotConsumed,
)
from rewind.groups.plan import (
    PartitionReset,
    ResetPlan,
    choose_mode,
    parse_topic_args,
    parse_when,
    target_offset,
)
from rewind.kafka import clients
from rewind.kafka import groups as kg
from rewind.kafka.exceptions import GroupOperationRefused
from rewind.kafka.resolve import log_starts
from rewind.ledger import Ledger
from rewind.ledger import group_resets as ledger_resets
from rewind.ledger.group_resets import GroupResetRecord, ResetAlreadyUndone

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata

    from rewind.config import Settings

logger = logging.getLogger(__name__)


def _name(tp: TP) -> str:
    return f"{tp[0]}/{tp[1]}"


def _partitions_of(metadata: ClusterMetadata, topic: str) -> list[int]:
    meta = metadata.topics.get(topic)
    if meta is None or meta.error is not None:
        raise ResetInputError(f"topic '{topic}' does not exist", option="--topic")
    return sorted(meta.partitions)


def _select(
    group: str,
    metadata: ClusterMetadata,
    consumed: list[str],
    *,
    topics: Iterable[str],
    all_topics: bool,
    named: Iterable[TP],
) -> list[TP]:
    """The partitions a reset covers; each topic must exist and be consumed by the group."""
    chosen: list[TP] = []
    if all_topics:
        if not consumed:
            raise ResetInputError(f"consumer group '{group}' consumes no topic: --all-topics selects nothing")
        for topic in consumed:
            chosen.extend((topic, p) for p in _partitions_of(metadata, topic))
        return chosen
    wanted: dict[str, tuple[int, ...] | None] = dict(parse_topic_args(topics))
    for topic, partition in named:
        listed = wanted.get(topic) or ()
        wanted[topic] = (*listed, partition)
    for topic, parts in wanted.items():
        if topic not in consumed:
            if topic not in metadata.topics:
                raise ResetInputError(f"topic '{topic}' does not exist", option="--topic")
            raise TopicNotConsumed(group, topic, consumed)
        existing = _partitions_of(metadata, topic)
        for partition in parts if parts is not None else existing:
            if partition not in existing:
                raise ResetInputError(
                    f"partition {topic}/{partition} does not exist "
                    f"(the topic has {len(existing)} partitions)",
                    option="--topic",
                )
            chosen.append((topic, partition))
    return sorted(set(chosen))


def plan_reset(
    settings: Settings,
    group: str,
    *,
    topics: Iterable[str] = (),
    all_topics: bool = False,
    to_datetime: datetime | int | str | None = None,
    to_offset: int | None = None,
    shift_by: int | None = None,
    to_earliest: bool = False,
    to_latest: bool = False,
    from_file: str | Path | None = None,
    offsets: Mapping[TP, int] | None = None,
    allow_gaps: bool = False,
    timeout_s: float = 10.0,
) -> ResetPlan:
    """Plan a reset of ``group``'s offsets; reads the broker, changes nothing.

    Exactly one of ``to_datetime``, ``to_offset``, ``shift_by``, ``to_earliest``,
    ``to_latest``, ``from_file`` (a CSV as kafka-consumer-groups exports) or ``offsets``
    (per partition) says where to; ``topics`` (``T`` or ``T:0,2``) or ``all_topics`` says
    which partitions, except for the last two, which name their own.

    Steps: (1) the options; (2) the group, which must exist, and the topics it consumes
    (committed offsets and members' assignments); (3) the partitions; (4) per partition the
    log start and the true end, and for a time the checked lookup (the broker's time-index
    answer verified by reading records, searched when wrong); (5) the new offset, clamped
    into the log with a note; (6) a time before the log start is refused unless
    ``allow_gaps``: the records the group would re-read are gone.
    """
    mode = choose_mode(
        to_datetime=to_datetime,
        to_offset=to_offset,
        shift_by=shift_by,
        to_earliest=to_earliest,
        to_latest=to_latest,
        from_file=from_file,
        offsets=offsets,
    )
    topics = [t for t in topics]
    if not group or not group.strip():
        raise ResetInputError("the group id is empty; name the consumer group to reset")
    named: dict[TP, int] = {}
    args: dict[str, Any] = {}
    if mode in ("from-file", "offsets"):
        if topics or all_topics:
            given = "--from-file" if mode == "from-file" else "offsets"
            raise ResetInputError(
                f"--topic and --all-topics do not go with {given}: the plan names its partitions",
                option="--topic",
            )
        if mode == "from-file":
            path = Path(str(from_file))
            try:
                text = path.read_text()
            except OSError as exc:
                raise ResetInputError(
                    f"--from-file {path}: {exc.strerror or exc}", option="--from-file"
                ) from None
            named = from_csv(text, group, str(path))
            args["file"] = str(path)
        else:
            assert offsets is not None
            named = {(str(t), int(p)): int(o) for (t, p), o in offsets.items()}
            if any(o < 0 for o in named.values()):
                raise ResetInputError("offsets must be >= 0", option="offsets")
    elif bool(topics) == all_topics:
        raise ResetInputError(
            "name the partitions to reset with --topic T (or T:0,2; repeatable) or --all-topics, not both"
            if topics
            else "name the partitions to reset with --topic T (or T:0,2; repeatable) or --all-topics",
            option="--topic",
        )
    when: datetime | None = None
    if mode == "to-datetime":
        assert to_datetime is not None
        when = parse_when(to_datetime)
        args["datetime"] = when.isoformat().replace("+00:00", "Z")
        args["ms"] = int(when.timestamp() * 1000)
    elif mode == "to-offset":
        if isinstance(to_offset, bool) or not isinstance(to_offset, int) or to_offset < 0:
            raise ResetInputError(f"--to-offset {to_offset!r}: expected an offset >= 0", option="--to-offset")
        args["offset"] = to_offset
    elif mode == "shift-by":
        if isinstance(shift_by, bool) or not isinstance(shift_by, int):
            raise ResetInputError(f"--shift-by {shift_by!r}: expected a whole number", option="--shift-by")
        args["shift"] = shift_by
    if topics:
        args["topics"] = topics
    if all_topics:
        args["all_topics"] = True

    conf = settings.kafka_config()
    state = kg.describe_group(conf, group, timeout_s)
    committed = kg.committed_offsets(conf, group, timeout_s=timeout_s)
    consumed = sorted({t for t, _p in committed} | {t for m in state.members for t, _p in m.assignment})
    metadata = clients.cluster_metadata(conf, timeout_s)
    selection = _select(group, metadata, consumed, topics=topics, all_topics=all_topics, named=named)

    if when is not None:
        positions = kg.offsets_at_time(conf, selection, when, timeout_s=timeout_s)
    else:
        positions = kg.log_bounds(conf, selection, timeout_s=timeout_s)
    rows: list[PartitionReset] = []
    missing: dict[TP, tuple[int, int]] = {}
    notes: list[str] = []
    searched = 0
    for tp in selection:
        pos, current = positions[tp], committed.get(tp)
        row_notes: list[str] = []
        method: str
        if mode == "to-datetime":
            requested = new = pos.offset
            method = pos.method
            searched += method == "search"
            row_notes.extend(n for n in pos.notes if "timestamps go backwards" in n)
            if pos.missing_below is not None:
                missing[tp] = (pos.missing_below.start, pos.missing_below.end)
            gone = pos.missing_count
        else:
            value = {"to-offset": to_offset, "shift-by": shift_by}.get(mode, named.get(tp))
            requested, new, note = target_offset(mode, value, current, pos.low, pos.high, _name(tp))
            method = mode
            gone = max(0, pos.low - requested)
            if note:
                row_notes.append(note)
        if current is None:
            row_notes.append(f"{_name(tp)}: the group has no committed offset here")
        rows.append(
            PartitionReset(
                tp[0], tp[1], current, requested, new, pos.low, pos.high, method, gone, tuple(row_notes)
            )
        )
    if missing:
        if not allow_gaps:
            raise TimeBeforeLogStart(group, "--to-datetime", str(args["datetime"]), missing)
        for tp, (start, end) in sorted(missing.items()):
            notes.append(
                f"{_name(tp)}: up to {end - start:,} records (offsets [{start}, {end})) are no longer "
                f"in Kafka; the group starts at the log start {end} (--allow-gaps)"
            )
    if mode == "to-datetime":
        _refuse_after_newest(conf, rows, positions, str(args["datetime"]), timeout_s)
    if searched:
        notes.append(
            f"the broker's time index answered wrongly on {searched} of {len(rows)} partitions; "
            "those offsets were found by searching record timestamps"
        )
    return ResetPlan(
        group=group,
        mode=mode,
        args=args,
        partitions=tuple(rows),
        group_state=state.state,
        allow_gaps=allow_gaps,
        notes=tuple(notes),
    )


def _refuse_after_newest(
    conf: Mapping[str, Any],
    rows: list[PartitionReset],
    positions: Mapping[TP, kg.PartitionPosition],
    when: str,
    timeout_s: float,
) -> None:
    """Refuse a time after the newest record of every partition that holds records: the reset
    would land on the log end everywhere, which is what ``--to-latest`` says on purpose. A
    partition that is only idle (the time after its newest record, others re-read) is normal."""
    filled = [p for p in rows if p.high > p.low]
    if not filled or any(p.new < p.high for p in filled):
        return
    newest = kg.newest_records(conf, [positions[(p.topic, p.partition)] for p in filled], timeout_s=timeout_s)
    found = {tp: (r.offset, r.ts) for tp, r in newest.items() if r is not None}
    if not found:
        return
    skipped = sum(p.high - p.low if p.skipped is None else p.skipped for p in filled)
    raise TimeAfterNewestRecord(
        "--to-datetime",
        when,
        found,
        f"the reset would re-read nothing and skip {skipped:,} record{'' if skipped == 1 else 's'}",
        "to skip every record on purpose, use --to-latest",
    )


@dataclass(frozen=True)
class ResetOutcome:
    """An executed reset: the plan and its ledger record."""

    plan: ResetPlan
    record: GroupResetRecord

    def to_dict(self) -> dict[str, Any]:
        return {"reset_id": self.record.reset_id, "state": self.record.state, **self.plan.to_dict()}


def execute_reset(settings: Settings, plan: ResetPlan, *, timeout_s: float = 10.0) -> ResetOutcome:
    """Apply ``plan`` and record it; never reports success for offsets that did not apply.

    Steps: (1) the group must be inactive (no members, not rebalancing); (2) its committed
    offsets must still be the plan's ``current`` (else :class:`OffsetsMoved`: plan again);
    (3) no planned offset may be below the log start now; (4) the reset is written to the
    ledger as ``applying`` with the offsets before and after; (5) the offsets are committed
    and read back; (6) the record becomes ``applied``, or ``failed`` with the error, which
    is raised again. A reset killed between (4) and (6) stays ``applying`` and can be undone.
    """
    conf = settings.kafka_config()
    kg.require_inactive(conf, plan.group, timeout_s)
    partitions = [(p.topic, p.partition) for p in plan.partitions]
    now = kg.committed_offsets(conf, plan.group, partitions, timeout_s=timeout_s)
    moved = {tp: (was, now.get(tp)) for tp, was in plan.current.items() if now.get(tp) != was}
    if moved:
        raise OffsetsMoved(plan.group, moved)
    lows = log_starts(conf, partitions, timeout_s)
    gone = {tp: (new, lows[tp]) for tp, new in plan.offsets.items() if new < lows[tp]}
    if gone:
        raise LogStartMoved(plan.group, gone)
    with Ledger.open(settings.ledger) as ledger:
        record = ledger_resets.record_reset(
            ledger,
            group=plan.group,
            mode=plan.mode,
            args=plan.args,
            before=plan.current,
            after=plan.offsets,
            notes=[*plan.notes, *(n for p in plan.partitions for n in p.notes)],
        )
        try:
            kg.alter_offsets(conf, plan.group, plan.offsets, timeout_s=timeout_s)
        except RewindError as exc:
            ledger_resets.finish_reset(ledger, record.reset_id, "failed", error=str(exc))
            raise
        record = ledger_resets.finish_reset(ledger, record.reset_id, "applied")
    logger.info("reset %s of group %s applied on %d partitions", record.reset_id, plan.group, len(partitions))
    return ResetOutcome(plan, record)


@dataclass(frozen=True)
class UndoOutcome:
    """What an undo put back: offsets restored, offsets removed, offsets it had to keep."""

    record: GroupResetRecord
    restored: dict[TP, int]
    removed: tuple[TP, ...] = ()
    kept: dict[TP, int | None] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        def rows(d: Mapping[TP, int | None]) -> list[dict[str, Any]]:
            return [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(d.items())]

        return {
            "reset_id": self.record.reset_id,
            "group": self.record.group,
            "state": self.record.state,
            "restored": rows(self.restored),
            "removed": [{"topic": t, "partition": p} for t, p in self.removed],
            "kept": rows(self.kept),
            "notes": list(self.notes),
        }


def undo_reset(settings: Settings, reset_id: str, *, timeout_s: float = 10.0) -> UndoOutcome:
    """Put back the offsets ``reset_id`` found, on an inactive group; once per reset.

    Steps: (1) the reset, which must not be undone already; (2) the group must be inactive;
    (3) offsets that moved since the reset are noted (consumers ran): they are overwritten,
    which is what undo means; (4) the offsets before the reset are committed and read back;
    (5) partitions that had no offset before lose theirs, when the broker allows it (else
    they stay, and the outcome says so); (6) the ledger marks the reset undone.
    """
    with Ledger.open(settings.ledger) as ledger:
        record = ledger_resets.get_reset(ledger, reset_id)
        if record.state == "undone":
            raise ResetAlreadyUndone(reset_id, record.undone_at, record.undone_by)
        conf = settings.kafka_config()
        kg.require_inactive(conf, record.group, timeout_s, must_exist=False)
        partitions = sorted(record.before)
        now = kg.committed_offsets(conf, record.group, partitions, timeout_s=timeout_s)
        notes = [
            f"{_name(tp)} moved since the reset (set to {record.after.get(tp)}, now {now.get(tp)}); "
            f"restored to {'none' if record.before[tp] is None else record.before[tp]}"
            for tp in partitions
            if now.get(tp) != record.after.get(tp)
        ]
        restore = {tp: o for tp, o in record.before.items() if o is not None}
        kg.alter_offsets(conf, record.group, restore, timeout_s=timeout_s)
        drop = [tp for tp, o in sorted(record.before.items()) if o is None]
        removed: tuple[TP, ...] = ()
        kept: dict[TP, int | None] = {}
        if drop:
            try:
                kg.delete_group_offsets(conf, record.group, drop, timeout_s=timeout_s)
                removed = tuple(drop)
            except GroupOperationRefused as exc:
                kept = {tp: now.get(tp) for tp in drop}
                notes.append(
                    f"{', '.join(_name(tp) for tp in drop)} had no committed offset before the reset "
                    f"and keep the reset's: {exc.detail}"
                )
        record = ledger_resets.mark_undone(ledger, reset_id, notes=notes)
    return UndoOutcome(record, restore, removed, kept, tuple(notes))


def list_resets(settings: Settings, group: str | None = None, limit: int = 50) -> list[GroupResetRecord]:
    """The ledger's resets, newest first, of one group or all."""
    with Ledger.open(settings.ledger) as ledger:
        return ledger_resets.list_resets(ledger, group, limit)


@dataclass(frozen=True)
class GroupDescription:
    """A group's state, members and, per partition, committed offset, log bounds and lag."""

    state: kg.GroupState
    partitions: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()

    @property
    def lag(self) -> int:
        return sum(p["lag"] or 0 for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.state.to_dict(),
            "partitions": list(self.partitions),
            "lag": self.lag,
            "notes": list(self.notes),
        }


def describe(settings: Settings, group: str, *, timeout_s: float = 10.0) -> GroupDescription:
    """The group's state and members, and per partition its offset, the log's bounds and lag.

    Partitions are those with a committed offset and those assigned to a member. The end
    of the log is the high watermark from a fetch (ListOffsets ``latest`` is not trusted).
    """
    conf = settings.kafka_config()
    state = kg.describe_group(conf, group, timeout_s)
    committed = kg.committed_offsets(conf, group, timeout_s=timeout_s)
    owner = {tp: m.label for m in state.members for tp in m.assignment}
    metadata = clients.cluster_metadata(conf, timeout_s)
    wanted = sorted(set(committed) | set(owner))
    exists = [tp for tp in wanted if tp[0] in metadata.topics and tp[1] in metadata.topics[tp[0]].partitions]
    bounds = kg.log_bounds(conf, exists, timeout_s=timeout_s)
    notes = [
        f"{_name(tp)} has a committed offset but does not exist on the broker"
        for tp in wanted
        if tp not in bounds
    ]
    rows = []
    for tp in wanted:
        pos, offset = bounds.get(tp), committed.get(tp)
        rows.append(
            {
                "topic": tp[0],
                "partition": tp[1],
                "committed": offset,
                "log_start": pos.low if pos else None,
                "log_end": pos.high if pos else None,
                "lag": pos.high - offset if pos and offset is not None else None,
                "member": owner.get(tp),
            }
        )
    return GroupDescription(state, tuple(rows), tuple(notes))
