"""Reopen units the ledger says are done whose output the sink no longer holds.

A Kafka broker can come back from a crash without records it had acknowledged: a unit
committed just before is then gone from the backfill topic with its commit marker
(:mod:`rewind.job.held`). Its row goes back to ``failed`` with the reason and cleared counts,
so the run's totals no longer count it and ``rewind resume`` does it again. The caller holds
the run's target lease.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import update

from rewind.ledger._common import chunks, clean_text, utcnow
from rewind.ledger.db import WRITE
from rewind.ledger.exceptions import UnitStateError
from rewind.ledger.schema import units

_COUNTS = ("records_read", "emitted", "rows_out", "quarantined", "filtered")


def reopen_units(engine: Any, run_id: str, unit_ids: Sequence[str], error: str) -> None:
    """State ``failed`` with ``error`` and counts cleared for each unit, in ONE transaction:
    all or nothing; an unknown unit raises :class:`UnitStateError`."""
    ids = sorted(set(unit_ids))
    now = utcnow()
    text = clean_text(error)
    cleared = dict.fromkeys(_COUNTS, 0)
    with engine.execution_options(**WRITE).begin() as conn:
        for part in chunks(ids):
            changed = conn.execute(
                update(units)
                .where(units.c.run_id == run_id, units.c.unit_id.in_(part))
                .values(state="failed", finished_at=now, error=text, reasons={}, **cleared)
            ).rowcount
            if changed != len(part):
                raise UnitStateError(run_id, "cannot reopen unknown units", list(part))
