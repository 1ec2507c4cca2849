"""Reconsumes in the ledger: one row per reconsume, one handover row per partition.

A reconsume re-reads a live consumer group's topics with a temporary group (see
:mod:`rewind.reconsume`). Its life is ``planned`` → ``started`` → ``finished``:

* ``plan`` stores the plan (re-planning a ``planned`` reconsume replaces it; a started one is
  refused, because services may already be skipping messages on its behalf);
* ``start`` inserts the handover rows (start offset per partition) and marks it started, in
  one transaction, so a service never sees a started reconsume with half of its rows;
* ``finish`` checks that every partition was handed over and stamps the end, under the write
  lock, so a partition cannot be left owned by the temporary side of a finished reconsume.

The per-batch writes of the two sides live in :mod:`rewind.ledger.handover`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, RowMapping, select, update

from rewind.core.windows import TP
from rewind.ledger._common import current_user, insert_audit, to_json_object, utcnow
from rewind.ledger.db import WRITE
from rewind.ledger.exceptions import LedgerError, NotFound
from rewind.ledger.schema import handover, reconsumes

ReconsumeMode = Literal["parallel", "handover"]
ReconsumeState = Literal["planned", "started", "finished"]
MODES: tuple[ReconsumeMode, ...] = ("parallel", "handover")
_HINT = "`rewind reconsume plan` records one"


class ReconsumeStateError(LedgerError):
    """A reconsume is not in the state the operation needs (names it and what to do)."""


def temp_group_name(reconsume_id: str) -> str:
    """The temporary group of a reconsume: Rewind names it, so nobody else's group is touched."""
    return f"rewind-reconsume-{reconsume_id}"


@dataclass(frozen=True)
class ReconsumeRecord:
    id: str
    live_group: str
    temp_group: str
    mode: ReconsumeMode
    topics: tuple[str, ...]
    plan: dict[str, Any]
    state: ReconsumeState
    user: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class HandoverRow:
    """One partition of a reconsume.

    The temporary side owns ``[start_offset, handover_offset)``; the existing side owns every
    other offset. ``handover_offset`` is None until the handover, and never changes after it.
    """

    topic: str
    partition: int
    start_offset: int
    existing_last_offset: int | None
    temp_last_offset: int | None
    handover_offset: int | None
    existing_updated_at: datetime | None
    temp_updated_at: datetime | None
    handed_over_at: datetime | None

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)

    @property
    def owner(self) -> Literal["temporary", "existing"]:
        return "temporary" if self.handover_offset is None else "existing"


def _record(m: RowMapping) -> ReconsumeRecord:
    return ReconsumeRecord(
        id=m["id"],
        live_group=m["live_group"],
        temp_group=m["temp_group"],
        mode=m["mode"],
        topics=tuple(m["topics"]),
        plan=dict(m["plan_json"]),
        state=m["state"],
        user=m["username"],
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def handover_row(m: RowMapping) -> HandoverRow:
    return HandoverRow(
        topic=m["topic"],
        partition=int(m["partition"]),
        start_offset=int(m["start_offset"]),
        existing_last_offset=_int(m["existing_last_offset"]),
        temp_last_offset=_int(m["temp_last_offset"]),
        handover_offset=_int(m["handover_offset"]),
        existing_updated_at=m["existing_updated_at"],
        temp_updated_at=m["temp_updated_at"],
        handed_over_at=m["handed_over_at"],
    )


def read_record(conn: Connection, reconsume_id: str) -> ReconsumeRecord:
    row = conn.execute(select(reconsumes).where(reconsumes.c.id == reconsume_id)).first()
    if row is None:
        raise NotFound("reconsume", reconsume_id, _HINT)
    return _record(row._mapping)


def read_rows(conn: Connection, reconsume_id: str) -> list[HandoverRow]:
    query = (
        select(handover)
        .where(handover.c.reconsume_id == reconsume_id)
        .order_by(handover.c.topic, handover.c.partition)
    )
    return [handover_row(r._mapping) for r in conn.execute(query)]


class ReconsumeStore:
    """The reconsume rows of one ledger database; no I/O in ``__init__``.

    Takes the engine of a :class:`rewind.ledger.Ledger` (``Ledger.open(url).engine``), so the
    tables exist and SQLite's write transactions take the lock up front.
    """

    def __init__(self, engine: Any, *, user: str | None = None) -> None:
        self.engine = engine
        self.user = user or current_user()
        self._writer = engine.execution_options(**WRITE)

    def save_plan(
        self,
        reconsume_id: str,
        *,
        live_group: str,
        mode: ReconsumeMode,
        topics: Sequence[str],
        plan: Mapping[str, Any],
    ) -> ReconsumeRecord:
        """Record a planned reconsume, or replace the plan of one that is still only planned."""
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        values = {
            "live_group": live_group,
            "temp_group": temp_group_name(reconsume_id),
            "mode": mode,
            "topics": list(topics),
            "plan_json": to_json_object(plan, f"plan of reconsume {reconsume_id}"),
            "state": "planned",
            "username": self.user,
            "created_at": utcnow(),
        }
        with self._writer.begin() as conn:
            row = conn.execute(
                select(reconsumes).where(reconsumes.c.id == reconsume_id).with_for_update()
            ).first()
            if row is None:
                conn.execute(reconsumes.insert().values(id=reconsume_id, **values))
            elif row._mapping["state"] != "planned":
                raise ReconsumeStateError(
                    f"reconsume {reconsume_id} is already {row._mapping['state']}; it cannot be "
                    "planned again — pick another id"
                )
            else:
                conn.execute(update(reconsumes).where(reconsumes.c.id == reconsume_id).values(**values))
            insert_audit(conn, None, "reconsume-plan", self.user, {"reconsume": reconsume_id, "mode": mode})
            return read_record(conn, reconsume_id)

    def get(self, reconsume_id: str) -> ReconsumeRecord:
        with self.engine.begin() as conn:
            return read_record(conn, reconsume_id)

    def rows(self, reconsume_id: str) -> list[HandoverRow]:
        with self.engine.begin() as conn:
            return read_rows(conn, reconsume_id)

    def start(self, reconsume_id: str, start_offsets: Mapping[TP, int]) -> ReconsumeRecord:
        """Insert one handover row per partition and mark the reconsume started, atomically.

        Starting a started reconsume with the same offsets is a no-op (a ``start`` re-run
        after a crash); with other offsets it is refused.
        """
        if not start_offsets:
            raise ValueError(f"reconsume {reconsume_id}: no partitions to start")
        with self._writer.begin() as conn:
            record = read_record(conn, reconsume_id)
            if record.state == "started":
                have = {r.tp: r.start_offset for r in read_rows(conn, reconsume_id)}
                if have == dict(start_offsets):
                    return record
                raise ReconsumeStateError(
                    f"reconsume {reconsume_id} was started with other start offsets; "
                    "`rewind reconsume status` shows them"
                )
            if record.state != "planned":
                raise ReconsumeStateError(
                    f"reconsume {reconsume_id} is {record.state}; it cannot start again"
                )
            conn.execute(
                handover.insert(),
                [
                    {"reconsume_id": reconsume_id, "topic": t, "partition": p, "start_offset": int(s)}
                    for (t, p), s in sorted(start_offsets.items())
                ],
            )
            conn.execute(
                update(reconsumes)
                .where(reconsumes.c.id == reconsume_id)
                .values(state="started", started_at=utcnow())
            )
            insert_audit(conn, None, "reconsume-start", self.user, {"reconsume": reconsume_id,
                                                                     "partitions": len(start_offsets)})
            return read_record(conn, reconsume_id)

    def finish(self, reconsume_id: str) -> ReconsumeRecord:
        """Stamp the end once every partition is handed over; a finished one is returned as is."""
        with self._writer.begin() as conn:
            record = read_record(conn, reconsume_id)
            if record.state == "finished":
                return record
            if record.state != "started":
                raise ReconsumeStateError(
                    f"reconsume {reconsume_id} is {record.state}; "
                    f"`rewind reconsume start {reconsume_id}` first"
                )
            pending = [r for r in read_rows(conn, reconsume_id) if r.handover_offset is None]
            if pending:
                raise ReconsumeStateError(not_handed_over(reconsume_id, pending))
            conn.execute(
                update(reconsumes)
                .where(reconsumes.c.id == reconsume_id)
                .values(state="finished", finished_at=utcnow())
            )
            insert_audit(conn, None, "reconsume-finish", self.user, {"reconsume": reconsume_id})
            return read_record(conn, reconsume_id)


def not_handed_over(reconsume_id: str, pending: Sequence[HandoverRow]) -> str:
    """One line naming the partitions the temporary side still owns, and where it is."""

    def where(r: HandoverRow) -> str:
        at = "not started" if r.temp_last_offset is None else f"at {r.temp_last_offset + 1:,}"
        return f"{r.topic}/{r.partition} ({at})"

    shown = ", ".join(where(r) for r in pending[:5])
    shown += f" and {len(pending) - 5} more" if len(pending) > 5 else ""
    return (
        f"reconsume {reconsume_id}: {len(pending)} partition(s) not handed over yet: {shown}; "
        "keep the temporary side running until `rewind reconsume status` shows every partition "
        "owned by existing"
    )
