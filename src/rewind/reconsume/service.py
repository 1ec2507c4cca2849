"""Orchestrating a reconsume: plan, start, status, finish (what ``rewind reconsume`` calls).

``plan`` reads and records a plan, ``start`` commits the temporary group's start offsets and
creates the handover rows, ``status`` reads, ``finish`` checks every partition was handed
over, deletes the temporary group and records the end. Each refuses bad input with one
line before it changes anything. The services' side of the work is in
:mod:`rewind.reconsume.existing` and :mod:`rewind.reconsume.temporary`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.core.windows import TP
from rewind.groups import plan_reset
from rewind.groups.exceptions import TimeAfterNewestRecord, TimeBeforeLogStart
from rewind.groups.plan import parse_when
from rewind.kafka import clients
from rewind.kafka import groups as kg
from rewind.kafka.exceptions import GroupNotFound
from rewind.kafka.resolve import log_starts
from rewind.ledger import Ledger, NotFound, owner_is_dead
from rewind.ledger.reconsumes import (
    ReconsumeRecord,
    ReconsumeStateError,
    ReconsumeStore,
    not_handed_over,
    temp_group_name,
)
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.reconsume.exceptions import ReconsumeError, ReconsumeInputError, TemporaryGroupTaken
from rewind.reconsume.plan import (
    DEFAULT_RATE,
    PlannedPartition,
    ReconsumePlan,
    check_id,
    check_mode,
    duration_text,
    parse_offsets,
)
from rewind.reconsume.temporary import DEFAULT_IDLE_HANDOVER_S, lease_target

if TYPE_CHECKING:
    from rewind.config import Settings

logger = logging.getLogger(__name__)


def _name(tp: TP) -> str:
    return f"{tp[0]}/{tp[1]}"


def plan_reconsume(
    settings: Settings,
    reconsume_id: str,
    *,
    group: str,
    topics: Iterable[str] = (),
    from_datetime: datetime | int | str | None = None,
    from_offsets: str | None = None,
    from_earliest: bool = False,
    mode: str = "handover",
    allow_gaps: bool = False,
    idle_handover_s: float = DEFAULT_IDLE_HANDOVER_S,
    rate: float = DEFAULT_RATE,
    timeout_s: float = 10.0,
) -> ReconsumePlan:
    """Plan a reconsume of ``group``'s ``topics`` and store it (state ``planned``).

    Steps: (1) the options, each checked alone; (2) the ledger: a started or finished
    reconsume of this id is refused; (3) the live group must exist and consume each topic,
    the start offsets come from the checked time lookup (or the offsets, or the log start),
    and a start below the log start is refused unless ``allow_gaps`` (the same checks as
    ``rewind groups reset``: :func:`rewind.groups.plan_reset`); (4) the temporary group's
    name must be free; (5) the plan is stored. Nothing in Kafka changes.
    """
    check_id(reconsume_id)
    mode_ = check_mode(mode)
    topics = list(topics)
    chosen = [n for n, v in (("--from-datetime", from_datetime is not None),
                             ("--from-offsets", from_offsets is not None),
                             ("--from-earliest", from_earliest)) if v]
    if len(chosen) != 1:
        given = f"{' and '.join(chosen)} given" if chosen else "none given"
        raise ReconsumeInputError(
            f"say where the temporary group starts with exactly one of --from-datetime, --from-offsets, "
            f"--from-earliest ({given})",
            option="--from-datetime",
        )
    if not idle_handover_s > 0:
        raise ReconsumeInputError(f"--idle-handover {idle_handover_s}: expected seconds > 0",
                                  option="--idle-handover")
    if not rate > 0:
        raise ReconsumeInputError(f"--rate {rate}: expected records per second > 0", option="--rate")
    offsets = parse_offsets(from_offsets) if from_offsets is not None else None
    when = parse_when(from_datetime, "--from-datetime") if from_datetime is not None else None
    if offsets is None and not topics:
        raise ReconsumeInputError(
            "name the topics to reconsume with --topic T (repeatable)", option="--topic"
        )
    if offsets is not None:
        named = {t for t, _p in offsets}
        stray = sorted(set(topics) - named)
        if stray:
            raise ReconsumeInputError(
                f"--from-offsets names no partition of --topic {stray[0]}; give an offset for every "
                "partition of every topic", option="--from-offsets")

    with Ledger.open(settings.ledger) as ledger:
        store = ReconsumeStore(ledger.engine)
        try:
            existing = store.get(reconsume_id)
        except NotFound:
            existing = None
        if existing is not None and existing.state != "planned":
            raise ReconsumeStateError(
                f"reconsume {reconsume_id} is already {existing.state}; it cannot be planned again — "
                "pick another id"
            )

        conf = settings.kafka_config()
        start: dict[str, Any]
        try:
            if when is not None:
                start = {"datetime": when.isoformat().replace("+00:00", "Z")}
                reset = plan_reset(settings, group, topics=topics, to_datetime=when, allow_gaps=allow_gaps,
                                   timeout_s=timeout_s)
            elif offsets is not None:
                start = {"offsets": {t: {str(p): o for (tt, p), o in sorted(offsets.items()) if tt == t}
                                     for t in sorted({t for t, _p in offsets})}}
                reset = plan_reset(settings, group, offsets=offsets, timeout_s=timeout_s)
            else:
                start = {"earliest": True}
                reset = plan_reset(settings, group, topics=topics, to_earliest=True, timeout_s=timeout_s)
        except TimeBeforeLogStart as exc:
            raise TimeBeforeLogStart(group, "--from-datetime", str(start["datetime"]), exc.missing) from None
        except TimeAfterNewestRecord as exc:
            raise TimeAfterNewestRecord(
                "--from-datetime",
                str(start["datetime"]),
                exc.newest,
                "the temporary side would start at the log end and reconsume nothing",
                "give the time of the first record to reconsume",
            ) from None
        partitions = tuple(
            PlannedPartition(p.topic, p.partition, p.current, p.new, p.low, p.high, p.method, p.missing,
                             p.notes)
            for p in reset.partitions
        )
        if offsets is not None:
            _check_covered(settings, offsets, timeout_s)
            gone = {p.tp: (p.start - p.missing, p.start) for p in partitions if p.missing}
            if gone and not allow_gaps:
                (t, part), (lo, _hi) = sorted(gone.items())[0]
                raise TimeBeforeLogStart(group, "--from-offsets", f"{t}/{part}={lo}", gone)
        notes = list(reset.notes)
        for p in partitions:
            if p.live is not None and p.start > p.live:
                notes.append(
                    f"{_name(p.tp)}: the live group is at {p.live:,}, behind the start {p.start:,}; "
                    + ("the existing side handles those records itself" if mode_ == "handover"
                       else "the temporary side starts later than the live group")
                )
            if p.missing and allow_gaps:
                notes.append(f"{_name(p.tp)}: {p.missing:,} records are no longer in Kafka (--allow-gaps)")
        temp = temp_group_name(reconsume_id)
        taken = kg.committed_offsets(conf, temp, timeout_s=timeout_s)
        if taken:
            shown = ", ".join(f"{_name(tp)} at {o}" for tp, o in list(taken.items())[:3])
            raise TemporaryGroupTaken(reconsume_id, temp, f"already has committed offsets ({shown})")
        plan = ReconsumePlan(
            reconsume_id=reconsume_id,
            live_group=group,
            mode=mode_,
            start=start,
            partitions=partitions,
            allow_gaps=allow_gaps,
            idle_handover_s=idle_handover_s,
            rate=rate,
            notes=tuple(notes),
            planned_at=datetime.now(UTC).isoformat(),
        )
        store.save_plan(reconsume_id, live_group=group, mode=mode_, topics=plan.topics, plan=plan.to_dict())
    return plan


def _check_covered(settings: Settings, offsets: dict[TP, int], timeout_s: float) -> None:
    """``--from-offsets`` must name every partition of each topic it names (as Spark's options)."""
    metadata = clients.cluster_metadata(settings.kafka_config(), timeout_s)
    for topic in sorted({t for t, _p in offsets}):
        meta = metadata.topics.get(topic)
        left = sorted(set(meta.partitions) - {p for t, p in offsets if t == topic}) if meta else []
        if left:
            raise ReconsumeInputError(
                f"--from-offsets names no offset for {topic}/{left[0]}"
                + (f" and {len(left) - 1} more partitions" if len(left) > 1 else "")
                + f"; give one for every partition of {topic}",
                option="--from-offsets",
            )


def _record(settings: Settings, reconsume_id: str) -> tuple[ReconsumeRecord, ReconsumePlan]:
    with Ledger.open(settings.ledger) as ledger:
        record = ReconsumeStore(ledger.engine).get(check_id(reconsume_id))
    return record, ReconsumePlan.from_dict(record.plan)


@emits(lineage.reconsume, phase="start")
def start_reconsume(settings: Settings, reconsume_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Commit the temporary group's start offsets and create the handover rows.

    Steps: (1) the reconsume must be planned (a started one with the same offsets is a
    no-op, so a ``start`` killed halfway is run again); (2) the temporary group must be
    inactive and hold no offsets but the plan's; (3) no start offset may be below the log
    start now; (4) the offsets are committed and read back; (5) the ledger gets the rows and
    the state ``started`` in one transaction. Services' wrappers refuse to run before (5).
    """
    record, plan = _record(settings, reconsume_id)
    if record.state == "finished":
        raise ReconsumeStateError(f"reconsume {reconsume_id} is finished; plan a new one with another id")
    conf = settings.kafka_config()
    starts = plan.start_offsets
    if record.state == "planned":
        kg.require_inactive(conf, plan.temp_group, timeout_s, must_exist=False)
        have = kg.committed_offsets(conf, plan.temp_group, list(starts), timeout_s=timeout_s)
        other = {tp: o for tp, o in have.items() if o is not None and o != starts[tp]}
        if other:
            shown = ", ".join(
                f"{_name(tp)} at {o} (plan: {starts[tp]})" for tp, o in sorted(other.items())[:3]
            )
            raise TemporaryGroupTaken(reconsume_id, plan.temp_group, f"has other committed offsets: {shown}")
        lows = log_starts(conf, list(starts), timeout_s)
        moved = sorted(tp for tp, s in starts.items() if s < lows[tp])
        if moved:
            tp = moved[0]
            raise ReconsumeError(
                f"the log start of {_name(tp)} moved to {lows[tp]:,}, past the planned start {starts[tp]:,}"
                + (f" (and {len(moved) - 1} more partitions)" if len(moved) > 1 else "")
                + f"; plan reconsume {reconsume_id} again"
            )
        kg.alter_offsets(conf, plan.temp_group, starts, timeout_s=timeout_s)
    with Ledger.open(settings.ledger) as ledger:
        record = ReconsumeStore(ledger.engine).start(reconsume_id, starts)
    logger.info("reconsume %s started on %d partitions", reconsume_id, len(starts))
    return {
        "reconsume_id": reconsume_id,
        "state": record.state,
        "mode": record.mode,
        "live_group": record.live_group,
        "temp_group": record.temp_group,
        "started_at": record.started_at,
        "partitions": [{"topic": t, "partition": p, "start": s} for (t, p), s in sorted(starts.items())],
        "records": plan.reread,
    }


def status(settings: Settings, reconsume_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Per partition: where each side is, who owns it, what is left; nothing changes."""
    with Ledger.open(settings.ledger) as ledger:
        record = ReconsumeStore(ledger.engine).get(check_id(reconsume_id))
        rows = {r.tp: r for r in ReconsumeStore(ledger.engine).rows(reconsume_id)}
        lease = ledger.lease(lease_target(reconsume_id))
        now = ledger.clock()
    plan = ReconsumePlan.from_dict(record.plan)
    conf = settings.kafka_config()
    tps = [p.tp for p in plan.partitions]
    temp_at: dict[TP, int | None] = {}
    if record.state == "started":
        temp_at = kg.committed_offsets(conf, record.temp_group, tps, timeout_s=timeout_s)
    live_at = kg.committed_offsets(conf, record.live_group, tps, timeout_s=timeout_s)
    bounds = kg.log_bounds(conf, tps, timeout_s=timeout_s)
    parts: list[dict[str, Any]] = []
    for p in plan.partitions:
        row = rows.get(p.tp)
        h = row.handover_offset if row else None
        e = row.existing_last_offset if row else None
        at = temp_at.get(p.tp)
        position = h if h is not None else (at if at is not None else p.start)
        target = e + 1 if e is not None else bounds[p.tp].high
        parts.append({
            "topic": p.topic,
            "partition": p.partition,
            "start": p.start,
            "temp_position": position,
            "existing_last": e,
            "handover": h,
            "owner": "-" if row is None else row.owner,
            "live_committed": live_at.get(p.tp),
            "high": bounds[p.tp].high,
            "done": position - p.start,
            "left": 0 if h is not None else max(0, target - position),
            "handed_over_at": row.handed_over_at if row else None,
        })
    done, left = sum(int(x["done"]) for x in parts), sum(int(x["left"]) for x in parts)
    rate = None
    if record.started_at is not None and record.state == "started":
        elapsed = (now - record.started_at).total_seconds()
        rate = done / elapsed if elapsed > 0 and done else None
    running = lease is not None and lease.expires_at > now and not owner_is_dead(lease.owner)
    return {
        "reconsume_id": reconsume_id,
        "state": record.state,
        "mode": record.mode,
        "live_group": record.live_group,
        "temp_group": record.temp_group,
        "temporary_side": lease.owner if running and lease else None,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "partitions": parts,
        "handed_over": sum(1 for r in rows.values() if r.handover_offset is not None),
        "done": done,
        "left": left,
        "rate": round(rate, 1) if rate else None,
        "eta": duration_text(left / rate) if rate else ("0s" if not left else "unknown"),
    }


@emits(lineage.reconsume, phase="finish")
def finish_reconsume(settings: Settings, reconsume_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Check every partition was handed over, delete the temporary group, record the end.

    Steps: (1) a finished reconsume is reported as is; (2) every partition must be handed
    over (else one line naming those left, nothing changed); (3) the temporary side must not
    be running (its lease) and the temporary group must be inactive; (4) the group, with its
    offsets, is deleted (already gone: a re-run); (5) the ledger records the end.
    """
    with Ledger.open(settings.ledger) as ledger:
        store = ReconsumeStore(ledger.engine)
        record = store.get(check_id(reconsume_id))
        if record.state == "planned":
            raise ReconsumeStateError(f"reconsume {reconsume_id} is planned, not started: nothing to finish")
        rows = store.rows(reconsume_id)
        if record.state == "started":
            pending = [r for r in rows if r.handover_offset is None]
            if pending:
                raise ReconsumeStateError(not_handed_over(reconsume_id, pending))
            lease = ledger.lease(lease_target(reconsume_id))
            if lease is not None and lease.expires_at > ledger.clock() and not owner_is_dead(lease.owner):
                raise ReconsumeError(
                    f"the temporary side of reconsume {reconsume_id} still runs as {lease.owner}; "
                    "it stops by itself once every partition is handed over — wait for it, or stop it"
                )
            conf = settings.kafka_config()
            try:
                kg.require_inactive(conf, record.temp_group, timeout_s, must_exist=True)
                kg.delete_group(conf, record.temp_group, timeout_s=timeout_s)
            except GroupNotFound:
                logger.info("temporary group %s is already gone", record.temp_group)
            record = store.finish(reconsume_id)
    handled = sum((r.handover_offset or r.start_offset) - r.start_offset for r in rows)
    return {
        "reconsume_id": reconsume_id,
        "state": record.state,
        "mode": record.mode,
        "temp_group": record.temp_group,
        "temp_group_deleted": True,
        "finished_at": record.finished_at,
        "temporary_records": handled,
        "partitions": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start_offset,
                "handover": r.handover_offset,
                "handed_over_at": r.handed_over_at,
            }
            for r in rows
        ],
    }


def get_plan(settings: Settings, reconsume_id: str) -> ReconsumePlan:
    return _record(settings, reconsume_id)[1]
