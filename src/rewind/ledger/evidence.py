"""Readiness evidence in the ledger: rehearsals (by spec fingerprint) and probes (doctor, lag).

``rewind rehearse`` stores one row per rehearsal; the plan's cost model reads the measured
rates of the latest passed one, and ``rewind readiness`` reads rehearsals and probes to score
each area green only on evidence. Rows are only ever added: a readiness verdict can always be
traced to the rehearsal or probe it rests on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, desc, select

from rewind.ledger._common import current_user, to_json_object, utcnow
from rewind.ledger.db import WRITE
from rewind.ledger.schema import probes, rehearsals


@dataclass(frozen=True)
class RehearsalRecord:
    id: str
    fingerprint: str
    name: str
    run_id: str | None
    passed: bool
    details: dict[str, Any]
    user: str
    at: datetime


@dataclass(frozen=True)
class ProbeRecord:
    id: int
    kind: str
    subject: str
    ok: bool
    details: dict[str, Any]
    at: datetime


def _rehearsal(m: RowMapping) -> RehearsalRecord:
    return RehearsalRecord(
        id=m["id"],
        fingerprint=m["fingerprint"],
        name=m["name"],
        run_id=m["run_id"],
        passed=bool(m["passed"]),
        details=dict(m["details"]),
        user=m["username"],
        at=m["at"],
    )


def _probe(m: RowMapping) -> ProbeRecord:
    return ProbeRecord(
        id=int(m["id"]),
        kind=m["kind"],
        subject=m["subject"],
        ok=bool(m["ok"]),
        details=dict(m["details"]),
        at=m["at"],
    )


def new_rehearsal_id() -> str:
    return "rh-" + uuid.uuid4().hex[:12]


class EvidenceStore:
    """Rehearsal and probe rows of one ledger database (``Ledger.open(url).engine``)."""

    def __init__(self, engine: Any, *, user: str | None = None) -> None:
        self.engine = engine
        self.user = user or current_user()
        self._writer = engine.execution_options(**WRITE)

    def save_rehearsal(
        self,
        rehearsal_id: str,
        *,
        fingerprint: str,
        name: str,
        run_id: str | None,
        passed: bool,
        details: dict[str, Any],
    ) -> RehearsalRecord:
        row = {
            "id": rehearsal_id,
            "fingerprint": fingerprint,
            "name": name,
            "run_id": run_id,
            "passed": int(passed),
            "details": to_json_object(details, "rehearsal details"),
            "username": self.user,
            "at": utcnow(),
        }
        with self._writer.begin() as conn:
            conn.execute(rehearsals.insert().values(**row))
        return _rehearsal(row)  # type: ignore[arg-type]

    def rehearsals(self, fingerprint: str) -> list[RehearsalRecord]:
        """The rehearsals of a fingerprint, newest first."""
        query = (
            select(rehearsals)
            .where(rehearsals.c.fingerprint == fingerprint)
            .order_by(desc(rehearsals.c.at), desc(rehearsals.c.id))
        )
        with self.engine.begin() as conn:
            return [_rehearsal(r._mapping) for r in conn.execute(query)]

    def latest_passed(self, fingerprint: str) -> RehearsalRecord | None:
        return next((r for r in self.rehearsals(fingerprint) if r.passed), None)

    def record_probe(self, kind: str, subject: str, ok: bool, details: dict[str, Any]) -> ProbeRecord:
        row = {
            "kind": kind,
            "subject": subject,
            "ok": int(ok),
            "details": to_json_object(details, "probe details"),
            "at": utcnow(),
        }
        with self._writer.begin() as conn:
            new_id = conn.execute(probes.insert().values(**row)).inserted_primary_key[0]
        return _probe({**row, "id": new_id})  # type: ignore[arg-type]

    def latest_probe(self, kind: str, subject: str) -> ProbeRecord | None:
        query = (
            select(probes)
            .where(probes.c.kind == kind, probes.c.subject == subject)
            .order_by(desc(probes.c.id))
            .limit(1)
        )
        with self.engine.begin() as conn:
            row = conn.execute(query).first()
        return None if row is None else _probe(row._mapping)

    def probes(self, kind: str, subject: str | None = None) -> list[ProbeRecord]:
        """Probes of a kind (and subject), oldest first."""
        query = select(probes).where(probes.c.kind == kind).order_by(probes.c.id)
        if subject is not None:
            query = query.where(probes.c.subject == subject)
        with self.engine.begin() as conn:
            return [_probe(r._mapping) for r in conn.execute(query)]
