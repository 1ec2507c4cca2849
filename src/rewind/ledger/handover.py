"""The handover table's per-batch writes: who owns which offset of a partition.

Each partition of a reconsume has one row (:mod:`rewind.ledger.reconsumes` creates them).
The temporary side owns ``[start_offset, handover_offset)``; the existing side owns the
rest. ``handover_offset`` (``h``) is NULL until the temporary side sets it, once.

The invariant that makes "every message exactly once, by exactly one side" hold:

    once the existing side has recorded ``existing_last_offset = e`` while ``h`` was NULL,
    any ``h`` set later is greater than ``e``.

It rests on two compare-and-set statements, each one ``UPDATE`` with its condition in the
``WHERE`` clause, so the database decides, not a read made before:

* the existing side, before it skips a batch ending at offset ``b`` (and before it commits
  the group's offsets past ``b``): ``SET e = max(e, b) WHERE h IS NULL``; one row changed
  means the skip is safe (the temporary side will handle ``b``); none means the handover
  happened meanwhile, and ``h`` is read to split the batch;
* the temporary side, after handling and committing up to ``n`` (exclusive):
  ``SET h = n WHERE h IS NULL AND e < n`` (with ``e IS NOT NULL`` when it hands over because
  it caught up, ``e`` may be NULL when the partition was idle).

On PostgreSQL two such updates of one row serialize on the row lock, and the second one
re-evaluates its ``WHERE`` against the row the first committed (READ COMMITTED); on SQLite
every write transaction takes the database's write lock first (``BEGIN IMMEDIATE``). Either
way the two statements are totally ordered, and each sees the other's effect.

Both sides update a batch's rows in one transaction, so on PostgreSQL they take several row
locks each: they take them in the same order (sorted by topic and partition), or a batch of
one side holding partition 1 and waiting for 0 while the other holds 0 and waits for 1 is a
deadlock, which PostgreSQL resolves by failing one side's transaction.

Cost: the existing side writes one transaction per consumed batch, and only until it has
seen the handover of every partition of the batch; the temporary side writes one
transaction per batch. Nothing is written per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import and_, bindparam, case, or_, select, update

from rewind.core.windows import TP
from rewind.ledger._common import utcnow
from rewind.ledger.db import WRITE
from rewind.ledger.reconsumes import HandoverRow, read_rows
from rewind.ledger.schema import UTCDateTime, handover

Reason = Literal["caught_up", "idle", "now"]
"""Why the temporary side hands a partition over:

* ``caught_up``: it has handled everything the existing side skipped (``e < n``); needs an
  ``e``, i.e. an existing side that has run since the start;
* ``idle``: its lag was zero long enough; ``e`` may be NULL (no message arrived at all);
* ``now``: unconditionally (parallel mode, where the existing side skips nothing).
"""

_h = handover.c.handover_offset
_e = handover.c.existing_last_offset
_KEY = and_(
    handover.c.reconsume_id == bindparam("b_rid"),
    handover.c.topic == bindparam("b_topic"),
    handover.c.partition == bindparam("b_partition"),
)
_NOW = bindparam("b_now", type_=UTCDateTime())

_CLAIM = (
    update(handover)
    .where(_KEY, _h.is_(None))
    .values(
        existing_last_offset=case(
            (or_(_e.is_(None), _e < bindparam("b_last")), bindparam("b_last")), else_=_e
        ),
        existing_updated_at=_NOW,
    )
)
_READ_H = select(_h).where(_KEY)
_CONDITIONS = {
    "caught_up": and_(_h.is_(None), _e.is_not(None), _e < bindparam("b_pos")),
    "idle": and_(_h.is_(None), or_(_e.is_(None), _e < bindparam("b_pos"))),
    "now": _h.is_(None),
}


def _handover_stmt(reason: Reason, with_last: bool) -> Any:
    values: dict[str, Any] = {
        "handover_offset": bindparam("b_pos"),
        "handed_over_at": _NOW,
        "temp_updated_at": _NOW,
    }
    if with_last:
        values["temp_last_offset"] = bindparam("b_last")
    return update(handover).where(_KEY, _CONDITIONS[reason]).values(**values)


_HANDOVER = {(r, w): _handover_stmt(r, w) for r in ("caught_up", "idle", "now") for w in (True, False)}
_PROGRESS = update(handover).where(_KEY).values(temp_last_offset=bindparam("b_last"), temp_updated_at=_NOW)


@dataclass(frozen=True)
class TempStep:
    """What the temporary side did on one partition in one batch.

    ``last``: the last offset it handled in the batch (None: none); ``position``: the next
    offset it will handle, already committed to its group; ``handover``: try to hand the
    partition over at ``position``, and why (None: only record progress).
    """

    last: int | None
    position: int
    handover: Reason | None = None


class HandoverTable:
    """The rows of one reconsume, written by the services' wrappers; no I/O in ``__init__``.

    ``engine`` is the ledger's (``Ledger.open(url).engine``): SQLite write transactions must
    begin IMMEDIATE, which that engine's event hooks do.
    """

    def __init__(self, engine: Any, reconsume_id: str) -> None:
        self.engine = engine
        self.reconsume_id = reconsume_id
        self._writer = engine.execution_options(**WRITE)

    def load(self) -> dict[TP, HandoverRow]:
        with self.engine.begin() as conn:
            return {r.tp: r for r in read_rows(conn, self.reconsume_id)}

    def claim(self, last: Mapping[TP, int]) -> dict[TP, int | None]:
        """The existing side records "I handled or skipped up to ``last[tp]``", per partition.

        Returns, per partition, None when the record was made while the partition was not
        handed over (the existing side may skip up to ``last``), else the handover offset
        (offsets below it belong to the temporary side, the rest to the existing side).
        One transaction for all partitions of a batch.
        """
        out: dict[TP, int | None] = {}
        now = utcnow()
        with self._writer.begin() as conn:
            for (topic, partition), offset in sorted(last.items()):
                key = {"b_rid": self.reconsume_id, "b_topic": topic, "b_partition": partition}
                changed = conn.execute(_CLAIM, {**key, "b_last": offset, "b_now": now}).rowcount
                if changed:
                    out[(topic, partition)] = None
                    continue
                h = conn.execute(_READ_H, key).scalar()
                if h is None:
                    raise KeyError(f"reconsume {self.reconsume_id} has no partition {topic}/{partition}")
                out[(topic, partition)] = int(h)
        return out

    def existing(self, tps: Iterable[TP] | None = None) -> dict[TP, tuple[int | None, int | None]]:
        """``(existing_last_offset, handover_offset)`` per partition (a read, no lock)."""
        wanted = set(tps) if tps is not None else None
        rows = self.load()
        return {
            tp: (r.existing_last_offset, r.handover_offset)
            for tp, r in rows.items()
            if wanted is None or tp in wanted
        }

    def record_temp(self, steps: Mapping[TP, TempStep]) -> dict[TP, int]:
        """Record the temporary side's batch; returns the partitions handed over now, at which offset.

        Per partition: the handover compare-and-set when asked for (it records the progress
        too), else (or when it did not take) the progress alone. One transaction.
        """
        handed: dict[TP, int] = {}
        now = utcnow()
        with self._writer.begin() as conn:
            for (topic, partition), step in sorted(steps.items()):
                params = {
                    "b_rid": self.reconsume_id,
                    "b_topic": topic,
                    "b_partition": partition,
                    "b_now": now,
                    "b_pos": step.position,
                    "b_last": step.last,
                }
                if step.handover is not None:
                    stmt = _HANDOVER[(step.handover, step.last is not None)]
                    if conn.execute(stmt, params).rowcount:
                        handed[(topic, partition)] = step.position
                        continue
                if step.last is not None:
                    conn.execute(_PROGRESS, params)
        return handed
