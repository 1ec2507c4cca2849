"""The ledger's record of consumer-group offset resets: who, when, offsets before and after.

A reset is written *before* the offsets change (state ``applying``, with the offsets read
just before and the ones about to be written), then marked ``applied`` or ``failed``; so a
process killed halfway still leaves a row that ``rewind groups undo`` can restore from.
Undoing marks the row ``undone`` with one conditional update: two undos of one reset cannot
both succeed.

Offsets are stored as lists of ``{"topic", "partition", "offset"}`` (``offset`` null where
the group had none committed), sorted by topic and partition.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import uuid4

from sqlalchemy import select, update

from rewind.core.windows import TP
from rewind.ledger._common import clean_text, to_json, to_json_object, utcnow
from rewind.ledger.exceptions import LedgerError, NotFound
from rewind.ledger.repo import Ledger
from rewind.ledger.schema import group_resets

ResetState = Literal["applying", "applied", "failed", "undone"]
UNDOABLE: frozenset[str] = frozenset({"applying", "applied", "failed"})
"""States a reset can be undone from: a failed or interrupted one may have applied in part."""

_HINT = "`rewind groups resets` lists the resets"


class ResetAlreadyUndone(LedgerError):
    """The reset was undone before; undoing it again would overwrite what came after."""

    def __init__(self, reset_id: str, undone_at: datetime | None, undone_by: str | None) -> None:
        self.reset_id = reset_id
        when = f" at {undone_at:%Y-%m-%d %H:%M:%S}Z" if undone_at else ""
        by = f" by {undone_by}" if undone_by else ""
        super().__init__(f"reset {reset_id} was already undone{when}{by}; nothing to do")


@dataclass(frozen=True)
class GroupResetRecord:
    reset_id: str
    group: str
    who: str
    at: datetime
    mode: str
    args: dict[str, Any]
    before: dict[TP, int | None]
    after: dict[TP, int]
    state: str
    error: str | None = None
    notes: tuple[str, ...] = ()
    undone_at: datetime | None = None
    undone_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reset_id": self.reset_id,
            "group": self.group,
            "who": self.who,
            "at": self.at.isoformat(),
            "mode": self.mode,
            "args": self.args,
            "before": _offsets_json(self.before),
            "after": _offsets_json(self.after),
            "state": self.state,
            "error": self.error,
            "notes": list(self.notes),
            "undone_at": self.undone_at.isoformat() if self.undone_at else None,
            "undone_by": self.undone_by,
        }


def new_reset_id(now: datetime | None = None) -> str:
    """A fresh reset id that sorts by time: ``gr-20250102-030405-9f2c1a``."""
    return f"gr-{(now or utcnow()):%Y%m%d-%H%M%S}-{uuid4().hex[:6]}"


def who(ledger: Ledger) -> str:
    """``user@host`` of this process, as recorded on resets."""
    return f"{ledger.user}@{socket.gethostname()}"


def _offsets_json(offsets: Mapping[TP, int | None]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(offsets.items())]


def _offsets_from(data: Sequence[Mapping[str, Any]]) -> dict[TP, Any]:
    out: dict[TP, Any] = {}
    for d in data:
        out[(str(d["topic"]), int(d["partition"]))] = None if d["offset"] is None else int(d["offset"])
    return out


def _record(row: Any) -> GroupResetRecord:
    m = row._mapping
    return GroupResetRecord(
        reset_id=m["reset_id"],
        group=m["group_id"],
        who=m["who"],
        at=m["at"],
        mode=m["mode"],
        args=dict(m["args"] or {}),
        before=_offsets_from(m["before_offsets"] or []),
        after=_offsets_from(m["after_offsets"] or []),
        state=m["state"],
        error=m["error"],
        notes=tuple(m["notes"] or ()),
        undone_at=m["undone_at"],
        undone_by=m["undone_by"],
    )


def record_reset(
    ledger: Ledger,
    *,
    group: str,
    mode: str,
    args: Mapping[str, Any],
    before: Mapping[TP, int | None],
    after: Mapping[TP, int],
    notes: Sequence[str] = (),
    reset_id: str | None = None,
) -> GroupResetRecord:
    """Write a reset about to be applied (state ``applying``) and return it."""
    now = utcnow()
    rid = reset_id or new_reset_id(now)
    values = {
        "reset_id": rid,
        "group_id": group,
        "who": who(ledger),
        "at": now,
        "mode": mode,
        "args": to_json_object(dict(args), f"arguments of reset {rid}"),
        "before_offsets": to_json(_offsets_json(before), f"offsets before reset {rid}"),
        "after_offsets": to_json(_offsets_json(after), f"offsets after reset {rid}"),
        "state": "applying",
        "notes": to_json(list(notes), f"notes of reset {rid}"),
    }
    with ledger._tx() as conn:
        conn.execute(group_resets.insert().values(**values))
        row = conn.execute(select(group_resets).where(group_resets.c.reset_id == rid)).one()
    return _record(row)


def finish_reset(
    ledger: Ledger,
    reset_id: str,
    state: Literal["applied", "failed"],
    *,
    error: str | None = None,
    notes: Sequence[str] | None = None,
) -> GroupResetRecord:
    """Mark an ``applying`` reset as ``applied`` or ``failed`` (with the error's one line)."""
    values: dict[str, Any] = {"state": state, "error": clean_text(error)}
    if notes is not None:
        values["notes"] = to_json(list(notes), f"notes of reset {reset_id}")
    with ledger._tx() as conn:
        done = conn.execute(
            update(group_resets)
            .where(group_resets.c.reset_id == reset_id, group_resets.c.state == "applying")
            .values(**values)
        ).rowcount
        row = conn.execute(select(group_resets).where(group_resets.c.reset_id == reset_id)).first()
    if row is None:
        raise NotFound("group reset", reset_id, _HINT)
    if not done:
        now = row._mapping["state"]
        raise LedgerError(f"reset {reset_id} is {now}, not applying; it cannot become {state}")
    return _record(row)


def mark_undone(ledger: Ledger, reset_id: str, *, notes: Sequence[str] = ()) -> GroupResetRecord:
    """Mark a reset undone, once: a second undo raises :class:`ResetAlreadyUndone`."""
    with ledger._tx() as conn:
        row = conn.execute(select(group_resets).where(group_resets.c.reset_id == reset_id)).first()
        if row is None:
            raise NotFound("group reset", reset_id, _HINT)
        current = _record(row)
        done = conn.execute(
            update(group_resets)
            .where(group_resets.c.reset_id == reset_id, group_resets.c.state.in_(sorted(UNDOABLE)))
            .values(
                state="undone",
                undone_at=utcnow(),
                undone_by=who(ledger),
                notes=to_json([*current.notes, *notes], f"notes of reset {reset_id}"),
            )
        ).rowcount
        row = conn.execute(select(group_resets).where(group_resets.c.reset_id == reset_id)).one()
    record = _record(row)
    if not done:
        raise ResetAlreadyUndone(reset_id, record.undone_at, record.undone_by)
    return record


def get_reset(ledger: Ledger, reset_id: str) -> GroupResetRecord:
    with ledger._tx(write=False) as conn:
        row = conn.execute(select(group_resets).where(group_resets.c.reset_id == reset_id)).first()
    if row is None:
        raise NotFound("group reset", reset_id, _HINT)
    return _record(row)


def list_resets(ledger: Ledger, group: str | None = None, limit: int = 50) -> list[GroupResetRecord]:
    """The newest resets first, of one group or of all."""
    query = select(group_resets).order_by(group_resets.c.at.desc(), group_resets.c.reset_id.desc())
    if group is not None:
        query = query.where(group_resets.c.group_id == group)
    with ledger._tx(write=False) as conn:
        rows = conn.execute(query.limit(limit)).all()
    return [_record(r) for r in rows]
