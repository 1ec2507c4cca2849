"""The ledger's repository: plans, runs, work units, leases and audit over one SQLAlchemy engine.

A :class:`Ledger` does no I/O when constructed; :meth:`Ledger.open` connects and makes sure
the tables exist. Every method runs in its own short transaction, and every method that
reads before it writes takes the write lock first (SQLite ``BEGIN IMMEDIATE``, PostgreSQL
row locks or conditional statements), so several processes may share one ledger. A method
that loses the database runs again while the outage lasts less than ``retry_s``, and a
lease holder's first write after an outage checks the lease first (:mod:`rewind.ledger.outage`).

What goes in is cleaned: JSON (specs, plans, staging, totals, audit details) through
:func:`rewind.secrets.mask`, error texts through :func:`rewind.secrets.mask_url`.
What comes out are frozen records with timezone-aware UTC datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any
from uuid import uuid4

from sqlalchemy import Connection, Engine, RowMapping, func, literal, select, update

from rewind.ledger import leases as _leases
from rewind.ledger._common import (
    MAX_COUNT,
    audit_entry,
    chunks,
    clean_counts,
    clean_text,
    current_owner,
    current_user,
    db_now,
    insert_audit,
    merge_counts,
    to_json_object,
    upsert,
    utcnow,
)
from rewind.ledger.db import WRITE, connect, ensure_schema
from rewind.ledger.exceptions import (
    IllegalTransition,
    LedgerError,
    NotFound,
    PlanConflict,
    UnitStateError,
)
from rewind.ledger.models import (
    FINISHED,
    RUN_STATES,
    TRANSITIONS,
    AuditEntry,
    Lease,
    PlanRecord,
    RunRecord,
    RunState,
    RunTotals,
    UnitRange,
    UnitRecord,
    UnitResult,
    unit_id,
)
from rewind.ledger.outage import RETRY_S, Outage
from rewind.ledger.outage import retried as _retried
from rewind.ledger.schema import UTCDateTime, audit, plans, runs, units
from rewind.secrets import mask_url

_RUNS_HINT = "`rewind runs` lists the runs"
_COUNTS = ("records_read", "emitted", "rows_out", "quarantined", "filtered")


def new_run_id(now: datetime | None = None) -> str:
    """A fresh run id that sorts by creation time: ``r-20250102-030405-9f2c1a``."""
    return f"r-{(now or utcnow()):%Y%m%d-%H%M%S}-{uuid4().hex[:6]}"


class Ledger:
    """Plans, runs, units, leases and audit of Rewind, in one database."""

    def __init__(self, engine: Engine, *, user: str | None = None, retry_s: float = RETRY_S) -> None:
        """Wrap ``engine`` (made by :func:`rewind.ledger.connect`); no I/O happens here.

        ``user`` is who is recorded on runs and audit entries; by default the login name.
        ``retry_s`` bounds how long a lost database is waited for (``ledger_retry_s``).
        """
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise LedgerError(f"the ledger runs on SQLite or PostgreSQL, not {engine.dialect.name}")
        self.engine = engine
        self.user = user or current_user()
        self.outage = Outage(engine, engine.execution_options(**WRITE), retry_s)

    @classmethod
    def open(cls, url: str, *, user: str | None = None, retry_s: float = RETRY_S) -> Ledger:
        """Connect to ``url`` and create or upgrade the tables (at once: no retry before the
        database was ever reached)."""
        engine = connect(url)
        try:
            ensure_schema(engine)
        except Exception:
            engine.dispose()
            raise
        ledger = cls(engine, user=user, retry_s=retry_s)
        ledger.outage.reached = True
        return ledger

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({mask_url(str(self.engine.url))!r})"

    def _tx(self, write: bool = True, *, fenced: bool = True) -> AbstractContextManager[Connection]:
        """One transaction; losing the database is a one-line :class:`LedgerUnavailable`.

        A write after an outage is fenced (a lease keeper's checks first) unless ``fenced`` is
        False: the lease methods, compare-and-set themselves."""
        return self.outage.transaction(write=write, fenced=write and fenced)

    # -- plans -------------------------------------------------------------------------------

    @_retried
    def save_plan(
        self, plan_id: str, name: str, spec: Mapping[str, Any] | str, plan: Mapping[str, Any] | str
    ) -> PlanRecord:
        """Store a plan under the caller's deterministic id; idempotent.

        Saving the same id with the same name and content again is a no-op returning the
        stored plan; the same id with anything different raises :class:`PlanConflict`.
        ``spec`` and ``plan`` are mappings or JSON text; their secrets are masked, so a
        plan read back carries ``***`` where a secret was: resolve secrets from settings.
        """
        spec_data = to_json_object(spec, f"spec of plan {plan_id}")
        plan_data = to_json_object(plan, f"plan {plan_id}")
        with self._tx() as conn:
            conn.execute(
                upsert(conn, plans)
                .values(id=plan_id, name=name, spec_json=spec_data, plan_json=plan_data, created_at=utcnow())
                .on_conflict_do_nothing(index_elements=[plans.c.id])
            )
            stored = self._plan(conn, plan_id)
        differs = [
            what
            for what, mine, theirs in (
                ("name", name, stored.name),
                ("spec", spec_data, stored.spec),
                ("plan", plan_data, stored.plan),
            )
            if mine != theirs
        ]
        if differs:
            raise PlanConflict(plan_id, differs)
        return stored

    @_retried
    def get_plan(self, plan_id: str) -> PlanRecord:
        with self._tx(write=False) as conn:
            return self._plan(conn, plan_id)

    @staticmethod
    def _plan(conn: Connection, plan_id: str) -> PlanRecord:
        row = conn.execute(select(plans).where(plans.c.id == plan_id)).first()
        if row is None:
            raise NotFound("plan", plan_id, "`rewind plan SPEC` makes one")
        m = row._mapping
        return PlanRecord(m["id"], m["name"], m["spec_json"], m["plan_json"], m["created_at"])

    # -- runs --------------------------------------------------------------------------------

    @_retried
    def create_run(
        self,
        plan_id: str,
        name: str,
        target: str,
        *,
        run_id: str | None = None,
        staging: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """Record a new run of a saved plan, in state ``planned``, by this user, host and pid."""
        now = utcnow()
        run_id = run_id or new_run_id(now)
        staging_data = to_json_object(staging, f"staging of run {run_id}") if staging is not None else None
        host, _, pid = current_owner().rpartition(":")
        with self._tx() as conn:
            self._plan(conn, plan_id)
            if conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first() is not None:
                raise LedgerError(f"run {run_id} already exists; pick another id or `rewind resume {run_id}`")
            conn.execute(
                runs.insert().values(
                    id=run_id,
                    plan_id=plan_id,
                    name=name,
                    target=target,
                    state="planned",
                    created_at=now,
                    username=self.user,
                    host=host,
                    pid=int(pid),
                    staging=staging_data,
                )
            )
            return self._run(conn, run_id)

    @_retried
    def get_run(self, run_id: str) -> RunRecord:
        """The run ``run_id``; :class:`NotFound` if there is none."""
        with self._tx(write=False) as conn:
            return self._run(conn, run_id)

    @_retried
    def list_runs(self, limit: int = 20, name: str | None = None) -> list[RunRecord]:
        """The newest ``limit`` runs, newest first, optionally of one job ``name``."""
        if limit <= 0:
            raise ValueError("limit must be positive")
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
        if name is not None:
            query = query.where(runs.c.name == name)
        with self._tx(write=False) as conn:
            return [_run_record(r._mapping) for r in conn.execute(query)]

    @_retried
    def set_state(
        self,
        run_id: str,
        state: RunState,
        *,
        error: str | None = None,
        staging: Mapping[str, Any] | None = None,
        totals: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """Move a run to ``state`` if :data:`TRANSITIONS` allows it, else :class:`IllegalTransition`.

        The check and the move are one conditional UPDATE, so two processes cannot both
        make the same move. Side effects: entering ``running`` stamps ``started_at`` once,
        clears ``finished_at`` and ``error``, and records this host and pid (a resume);
        entering succeeded/failed/interrupted stamps ``finished_at``. ``error``, ``staging``
        and ``totals`` are stored when given (masked).
        """
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; one of {', '.join(RUN_STATES)}")
        sources = [s for s, targets in TRANSITIONS.items() if state in targets]
        now = utcnow()
        values: dict[str, Any] = {"state": state}
        if state == "running":
            host, _, pid = current_owner().rpartition(":")
            values.update(
                started_at=func.coalesce(runs.c.started_at, literal(now, UTCDateTime())),
                finished_at=None,
                error=None,
                host=host,
                pid=int(pid),
            )
        elif state in FINISHED:
            values["finished_at"] = now
        if state == "succeeded":
            values["error"] = None
        if error is not None:
            values["error"] = clean_text(error)
        if staging is not None:
            values["staging"] = to_json_object(staging, f"staging of run {run_id}")
        if totals is not None:
            values["totals"] = to_json_object(totals, f"totals of run {run_id}")
        with self._tx() as conn:
            moved = conn.execute(
                update(runs).where(runs.c.id == run_id, runs.c.state.in_(sources)).values(**values)
            ).rowcount
            if not moved:
                current = self._run(conn, run_id).state
                if current == state and self.outage.retrying:  # the lost attempt had committed
                    return self._run(conn, run_id)
                raise IllegalTransition(run_id, current, state, sorted(TRANSITIONS[current]))
            return self._run(conn, run_id)

    @staticmethod
    def _run(conn: Connection, run_id: str) -> RunRecord:
        row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        if row is None:
            raise NotFound("run", run_id, _RUNS_HINT)
        return _run_record(row._mapping)

    # -- units -------------------------------------------------------------------------------

    @_retried
    def add_units(self, run_id: str, ranges: Iterable[UnitRange]) -> int:
        """Add the work units of a run as ``pending``; units already there are left alone.

        A unit's id is ``topic/partition/start-end`` (:func:`unit_id`). Returns how many
        units were new.
        """
        rows = {}
        for r in ranges:
            uid = unit_id(r.topic, r.partition, r.start, r.end)
            rows[uid] = {
                "run_id": run_id,
                "unit_id": uid,
                "topic": r.topic,
                "partition": r.partition,
                "start_offset": r.start,
                "end_offset": r.end,
                "state": "pending",
                "attempts": 0,
                "records_read": 0,
                "emitted": 0,
                "rows_out": 0,
                "quarantined": 0,
                "filtered": 0,
                "reasons": {},
            }
        with self._tx() as conn:
            self._run(conn, run_id)
            before = self._unit_total(conn, run_id)
            if rows:
                conn.execute(
                    upsert(conn, units).on_conflict_do_nothing(
                        index_elements=[units.c.run_id, units.c.unit_id]
                    ),
                    list(rows.values()),
                )
            return self._unit_total(conn, run_id) - before

    @staticmethod
    def _unit_total(conn: Connection, run_id: str) -> int:
        return int(conn.execute(select(func.count()).where(units.c.run_id == run_id)).scalar_one())

    def units(self, run_id: str) -> list[UnitRecord]:
        """Every unit of the run, by topic, partition and offset (empty for an unknown run)."""
        return self._units(run_id, pending=False)

    def pending_units(self, run_id: str) -> list[UnitRecord]:
        """The units still to do: every unit not ``done``.

        That is pending and failed units, and running ones an earlier attempt left behind
        when its process died; the caller holds the target's lease, so nobody else is
        running them.
        """
        return self._units(run_id, pending=True)

    @_retried
    def _units(self, run_id: str, *, pending: bool) -> list[UnitRecord]:
        query = (
            select(units)
            .where(units.c.run_id == run_id)
            .order_by(units.c.topic, units.c.partition, units.c.start_offset, units.c.end_offset)
        )
        if pending:
            query = query.where(units.c.state != "done")
        with self._tx(write=False) as conn:
            return [_unit_record(r._mapping) for r in conn.execute(query)]

    @_retried
    def mark_running(self, run_id: str, unit_ids: Sequence[str]) -> None:
        """Start an attempt of each unit: state ``running``, ``attempts`` + 1.

        All or nothing: an unknown or already done unit raises :class:`UnitStateError`.
        """
        ids = _unique(unit_ids)
        now = utcnow()
        with self._tx() as conn:
            for part in chunks(ids):
                changed = conn.execute(
                    update(units)
                    .where(units.c.run_id == run_id, units.c.unit_id.in_(part), units.c.state != "done")
                    .values(
                        state="running",
                        attempts=units.c.attempts + 1,
                        started_at=now,
                        finished_at=None,
                        error=None,
                    )
                ).rowcount
                if changed != len(part):
                    self._refuse(conn, run_id, part, "cannot start")

    @_retried
    def fail_units(self, run_id: str, unit_ids: Sequence[str], error: str) -> None:
        """Record a failed attempt of each unit (state ``failed``, ``error`` masked).

        All or nothing: an unknown or already done unit raises :class:`UnitStateError`.
        """
        ids = _unique(unit_ids)
        now = utcnow()
        text = clean_text(error)
        with self._tx() as conn:
            for part in chunks(ids):
                changed = conn.execute(
                    update(units)
                    .where(units.c.run_id == run_id, units.c.unit_id.in_(part), units.c.state != "done")
                    .values(state="failed", finished_at=now, error=text)
                ).rowcount
                if changed != len(part):
                    self._refuse(conn, run_id, part, "cannot fail")

    @_retried
    def complete_units(self, run_id: str, results: Iterable[UnitResult]) -> None:
        """Mark units ``done`` with their counts, all in ONE transaction: all or nothing.

        Steps: 1. clean every result (counts, masked reasons) before touching the database;
        2. read the units' current states under the write lock; 3. refuse unknown units, and
        units already done with *different* counts (their output was committed once already);
        units already done with the same counts are skipped, so a resume may repeat this;
        4. update each remaining unit. Any failure rolls every unit back.
        """
        cleaned: dict[str, dict[str, Any]] = {}
        for res in results:
            if res.unit_id in cleaned:
                raise ValueError(f"unit {res.unit_id} appears twice in one complete_units call")
            counts = {k: getattr(res, k) for k in _COUNTS}
            if any(v > MAX_COUNT for v in counts.values()):
                raise ValueError(f"unit {res.unit_id}: a count is beyond 2**63-1")
            counts["reasons"] = clean_counts(res.reasons, f"unit {res.unit_id}")
            cleaned[res.unit_id] = counts
        if not cleaned:
            return
        now = utcnow()
        with self._tx() as conn:
            current: dict[str, Any] = {}
            for part in chunks(list(cleaned)):
                query = select(units).where(units.c.run_id == run_id, units.c.unit_id.in_(part))
                for row in conn.execute(query.with_for_update()):
                    current[row.unit_id] = row._mapping
            missing = [u for u in cleaned if u not in current]
            if missing:
                raise UnitStateError(run_id, "unknown units", missing)
            clash = [
                u
                for u, counts in cleaned.items()
                if current[u]["state"] == "done" and any(current[u][k] != v for k, v in counts.items())
            ]
            if clash:
                raise UnitStateError(run_id, "units already done with different counts", clash)
            for uid, counts in cleaned.items():
                if current[uid]["state"] == "done":
                    continue
                conn.execute(
                    update(units)
                    .where(units.c.run_id == run_id, units.c.unit_id == uid)
                    .values(state="done", finished_at=now, error=None, **counts)
                )

    @_retried
    def unit_counts(self, run_id: str) -> RunTotals:
        """Totals over the run's units: how many in each state, summed counts, merged reasons."""
        sums = [func.coalesce(func.sum(getattr(units.c, k)), 0) for k in _COUNTS]
        by_state: dict[str, int] = {}
        totals = dict.fromkeys(_COUNTS, 0)
        reasons: dict[str, Any] = {}
        with self._tx(write=False) as conn:
            grouped = conn.execute(
                select(units.c.state, func.count(), *sums)
                .where(units.c.run_id == run_id)
                .group_by(units.c.state)
            )
            for state, count, *values in grouped:
                by_state[state] = int(count)
                for k, v in zip(_COUNTS, values, strict=True):
                    totals[k] += int(v)
            for (found,) in conn.execute(
                select(units.c.reasons).where(units.c.run_id == run_id, units.c.quarantined > 0)
            ):
                merge_counts(reasons, found or {})
        return RunTotals(units=sum(by_state.values()), by_state=by_state, reasons=reasons, **totals)

    @staticmethod
    def _refuse(conn: Connection, run_id: str, ids: Sequence[str], doing: str) -> None:
        query = select(units.c.unit_id, units.c.state).where(
            units.c.run_id == run_id, units.c.unit_id.in_(ids)
        )
        found = {uid: state for uid, state in conn.execute(query)}
        missing = [u for u in ids if u not in found]
        if missing:
            raise UnitStateError(run_id, f"{doing} unknown units", missing)
        raise UnitStateError(run_id, f"{doing} units already done", [u for u in ids if found[u] == "done"])

    # -- leases ------------------------------------------------------------------------------

    @_retried
    def acquire(self, target: str, holder: str, ttl_s: float, *, owner: str | None = None) -> Lease:
        """Take the lease on ``target`` for run ``holder`` for ``ttl_s`` seconds.

        Succeeds when the target is free, already held by this holder in this process
        (renewed), expired, or held by this holder from a dead process on this host (the
        last two are audited as ``lease-takeover``). Otherwise raises :class:`LeaseHeld`
        naming the holding run, its ``host:pid`` and the expiry. ``owner`` defaults to this
        process (``host:pid``).
        """
        with self._tx(fenced=False) as conn:
            return _leases.acquire(conn, target, holder, ttl_s, owner or current_owner(), self.user)

    def heartbeat(self, target: str, holder: str, ttl_s: float, *, owner: str | None = None) -> Lease:
        """Extend the lease by ``ttl_s`` from now; :class:`LeaseLost` if it is no longer ours."""
        with self._tx(fenced=False) as conn:
            return _leases.heartbeat(conn, target, holder, ttl_s, owner or current_owner())

    @_retried
    def release(self, target: str, holder: str, *, owner: str | None = None) -> bool:
        """Give the lease up; False when this holder and process did not hold it."""
        with self._tx(fenced=False) as conn:
            return _leases.release(conn, target, holder, owner or current_owner())

    @_retried
    def lease(self, target: str) -> Lease | None:
        """The lease row on ``target`` (possibly expired), or None."""
        with self._tx(write=False) as conn:
            return _leases.read_lease(conn, target)

    @_retried
    def clock(self) -> datetime:
        """Now, by the clock leases expire by (the database's on PostgreSQL)."""
        with self._tx(write=False) as conn:
            return db_now(conn)

    def keeper(
        self, target: str, holder: str, ttl_s: float, *, interval_s: float | None = None
    ) -> _leases.LeaseKeeper:
        """A :class:`LeaseKeeper` for ``with ledger.keeper(target, run_id, 30) as keeper: ...``."""
        return _leases.LeaseKeeper(self, target, holder, ttl_s, interval_s=interval_s)

    # -- audit -------------------------------------------------------------------------------

    @_retried
    def audit(self, run_id: str | None, action: str, details: Mapping[str, Any] | None = None) -> AuditEntry:
        """Append an entry (``plan``, ``run``, ``resume``, ``promote``, ``rollback``, ``cleanup``...).

        ``details`` is masked before it is written.
        """
        with self._tx() as conn:
            return insert_audit(conn, run_id, action, self.user, details)

    @_retried
    def audit_log(self, run_id: str | None = None, *, limit: int | None = None) -> list[AuditEntry]:
        """Entries of one run (or of all runs), oldest first; the newest ``limit`` if given."""
        query = select(audit).order_by(audit.c.id.desc())
        if run_id is not None:
            query = query.where(audit.c.run_id == run_id)
        if limit is not None:
            query = query.limit(limit)
        with self._tx(write=False) as conn:
            entries = [audit_entry(r._mapping) for r in conn.execute(query)]
        return entries[::-1]


def _unique(unit_ids: Sequence[str]) -> list[str]:
    if isinstance(unit_ids, str):
        raise TypeError("unit_ids must be a list of unit ids, not one string")
    return list(dict.fromkeys(unit_ids))


def _run_record(m: RowMapping) -> RunRecord:
    return RunRecord(
        id=m["id"],
        plan_id=m["plan_id"],
        name=m["name"],
        target=m["target"],
        state=m["state"],
        created_at=m["created_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        user=m["username"],
        host=m["host"],
        pid=int(m["pid"]),
        staging=m["staging"],
        totals=m["totals"],
        error=m["error"],
    )


def _unit_record(m: RowMapping) -> UnitRecord:
    return UnitRecord(
        run_id=m["run_id"],
        unit_id=m["unit_id"],
        topic=m["topic"],
        partition=int(m["partition"]),
        start_offset=int(m["start_offset"]),
        end_offset=int(m["end_offset"]),
        state=m["state"],
        attempts=int(m["attempts"]),
        records_read=int(m["records_read"]),
        emitted=int(m["emitted"]),
        rows_out=int(m["rows_out"]),
        quarantined=int(m["quarantined"]),
        filtered=int(m["filtered"]),
        reasons=m["reasons"] or {},
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        error=m["error"],
    )
