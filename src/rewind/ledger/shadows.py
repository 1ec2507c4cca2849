"""Shadow migrations in the ledger: one row per shadow, and its events (lag, verify, proofs).

A shadow's life (see :mod:`rewind.shadow`): ``history`` (the history run fills v2) →
``tailing`` (the live tail follows the topic) → ``cut`` (stopped at a recorded cut line) →
``cutover`` (v2 swapped in as the target) or ``dual-write`` → ``repointing`` → ``repointed`` →
``decommissioned``; ``aborted`` from any state before ``decommissioned``. Every transition
is a compare-and-set on the state under the write lock, so two processes cannot both move a
shadow, and a re-run after a crash sees where the first one got.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, select, update

from rewind.ledger._common import current_user, insert_audit, to_json_object, utcnow
from rewind.ledger.db import WRITE
from rewind.ledger.exceptions import LedgerError, NotFound
from rewind.ledger.schema import shadow_events, shadows

STATES = (
    "history",
    "tailing",
    "cut",
    "cutover",
    "dual-write",
    "repointing",
    "repointed",
    "decommissioned",
    "aborted",
)
_HINT = "`rewind shadow start SPEC` starts one"


class ShadowStateError(LedgerError):
    """A shadow is not in the state an operation needs (names both, and what to do)."""


@dataclass(frozen=True)
class ShadowRecord:
    name: str
    run_id: str
    fingerprint: str
    state: str
    history_end: dict[str, dict[str, int]] | None
    checkpoint: str
    details: dict[str, Any]
    user: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ShadowEvent:
    id: int
    at: datetime
    kind: str
    details: dict[str, Any]


def _record(m: RowMapping) -> ShadowRecord:
    end = m["history_end"]
    return ShadowRecord(
        name=m["name"],
        run_id=m["run_id"],
        fingerprint=m["fingerprint"],
        state=m["state"],
        history_end=None
        if end is None
        else {t: {str(p): int(o) for p, o in ps.items()} for t, ps in end.items()},
        checkpoint=m["checkpoint"],
        details=dict(m["details"]),
        user=m["username"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


def _read(conn: Connection, name: str, lock: bool = False) -> ShadowRecord:
    query = select(shadows).where(shadows.c.name == name)
    row = conn.execute(query.with_for_update() if lock else query).first()
    if row is None:
        raise NotFound("shadow", name, _HINT)
    return _record(row._mapping)


class ShadowStore:
    """The shadow rows of one ledger database (``Ledger.open(url).engine``); no I/O in ``__init__``."""

    def __init__(self, engine: Any, *, user: str | None = None) -> None:
        self.engine = engine
        self.user = user or current_user()
        self._writer = engine.execution_options(**WRITE)

    def create_or_get(self, name: str, *, run_id: str, fingerprint: str, checkpoint: str) -> ShadowRecord:
        """The shadow ``name``: created in ``history`` the first time, else the one recorded.

        A recorded shadow of another spec (fingerprint) is refused: a restart continues the
        same job, a changed job is a new shadow under another name.
        """
        now = utcnow()
        with self._writer.begin() as conn:
            row = conn.execute(select(shadows).where(shadows.c.name == name).with_for_update()).first()
            if row is not None:
                found = _record(row._mapping)
                if found.fingerprint != fingerprint:
                    raise ShadowStateError(
                        f"shadow {name} was started with another spec "
                        f"(fingerprint {found.fingerprint[:12]}); "
                        "start the changed job under another name, or `rewind shadow abort` this one"
                    )
                return found
            conn.execute(
                shadows.insert().values(
                    name=name,
                    run_id=run_id,
                    fingerprint=fingerprint,
                    state="history",
                    history_end=None,
                    checkpoint=checkpoint,
                    details={},
                    username=self.user,
                    created_at=now,
                    updated_at=now,
                )
            )
            insert_audit(conn, run_id, "shadow-start", self.user, {"shadow": name})
            return _read(conn, name)

    def get(self, name: str) -> ShadowRecord:
        with self.engine.begin() as conn:
            return _read(conn, name)

    def move(
        self,
        name: str,
        expected: Sequence[str],
        state: str,
        *,
        history_end: Mapping[str, Mapping[str, int]] | None = None,
        details: Mapping[str, Any] | None = None,
        event: tuple[str, Mapping[str, Any]] | None = None,
    ) -> ShadowRecord:
        """Move ``name`` from one of ``expected`` to ``state`` (a no-op when it is there already),
        merging ``details`` and recording ``event``, in one transaction."""
        if state not in STATES:
            raise ValueError(f"state {state!r}")
        with self._writer.begin() as conn:
            found = _read(conn, name, lock=True)
            if found.state != state and found.state not in expected:
                raise ShadowStateError(
                    f"shadow {name} is {found.state}, not {' or '.join(expected)}; nothing was changed"
                )
            values: dict[str, Any] = {"state": state, "updated_at": utcnow()}
            if history_end is not None:
                values["history_end"] = {
                    t: {str(p): int(o) for p, o in ps.items()} for t, ps in history_end.items()
                }
            if details:
                values["details"] = {**found.details, **to_json_object(dict(details), f"shadow {name}")}
            conn.execute(update(shadows).where(shadows.c.name == name).values(**values))
            if event is not None:
                self._event(conn, name, *event)
            if found.state != state:
                insert_audit(
                    conn, found.run_id, f"shadow-{state}", self.user, {"shadow": name, "from": found.state}
                )
            return _read(conn, name)

    def _event(self, conn: Connection, name: str, kind: str, details: Mapping[str, Any]) -> None:
        conn.execute(
            shadow_events.insert().values(
                name=name, at=utcnow(), kind=kind, details=to_json_object(dict(details), f"{kind} of {name}")
            )
        )

    def add_event(self, name: str, kind: str, details: Mapping[str, Any]) -> None:
        with self._writer.begin() as conn:
            _read(conn, name)
            self._event(conn, name, kind, details)

    def events(self, name: str, kind: str | None = None, limit: int | None = None) -> list[ShadowEvent]:
        """The shadow's events of ``kind`` (all kinds: None), oldest first; the last ``limit``."""
        query = select(shadow_events).where(shadow_events.c.name == name)
        if kind is not None:
            query = query.where(shadow_events.c.kind == kind)
        query = query.order_by(shadow_events.c.id.desc())
        if limit is not None:
            query = query.limit(limit)
        with self.engine.begin() as conn:
            rows = conn.execute(query).all()
        return [
            ShadowEvent(
                int(r._mapping["id"]), r._mapping["at"], r._mapping["kind"], dict(r._mapping["details"])
            )
            for r in reversed(rows)
        ]
