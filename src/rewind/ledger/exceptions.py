"""Errors of the run ledger. Each names the run, unit or target and says what to do."""

from __future__ import annotations

from datetime import UTC, datetime

from rewind.errors import RewindError


class LedgerError(RewindError):
    """Base of the ledger's errors."""


class LedgerUnavailable(LedgerError):
    """The ledger's database could not be reached or stayed locked (a transient failure)."""


class NotFound(LedgerError):
    """A plan or run is not in the ledger."""

    def __init__(self, kind: str, key: str, hint: str = "") -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"no {kind} {key!r} in the ledger" + (f"; {hint}" if hint else ""))


class PlanConflict(LedgerError):
    """A plan id is already stored with different content (plan ids must be content hashes)."""

    def __init__(self, plan_id: str, differs: list[str]) -> None:
        self.plan_id = plan_id
        self.differs = differs
        super().__init__(
            f"plan {plan_id} is already in the ledger with a different {', '.join(differs)}; "
            "a plan id must be computed from the plan's content — re-plan instead of reusing the id"
        )


class IllegalTransition(LedgerError):
    """A run cannot move from its current state to the one asked for."""

    def __init__(self, run_id: str, current: str, wanted: str, allowed: list[str]) -> None:
        self.run_id = run_id
        self.current = current
        self.wanted = wanted
        self.allowed = allowed
        can = ", ".join(allowed) if allowed else "nothing (final state)"
        super().__init__(f"run {run_id} is {current}; it cannot become {wanted} (from {current}: {can})")


class UnitStateError(LedgerError):
    """Work units are unknown, already done, or completed twice with different counts."""

    def __init__(self, run_id: str, message: str, unit_ids: list[str]) -> None:
        self.run_id = run_id
        self.unit_ids = unit_ids
        shown = ", ".join(unit_ids[:5]) + (f" and {len(unit_ids) - 5} more" if len(unit_ids) > 5 else "")
        super().__init__(f"run {run_id}: {message}: {shown}")


class LeaseError(LedgerError):
    """Base of lease errors; carries the target."""

    def __init__(self, message: str, target: str) -> None:
        self.target = target
        super().__init__(message)


def _when(at: datetime) -> str:
    at = at.astimezone(UTC)
    if at.date() == datetime.now(UTC).date():
        return at.strftime("%H:%M:%SZ")
    return at.strftime("%Y-%m-%d %H:%M:%SZ")


class LeaseHeld(LeaseError):
    """Another live run (or another live process of the same run) holds the target."""

    def __init__(self, target: str, holder: str, owner: str, expires_at: datetime, *, same_run: bool) -> None:
        self.holder = holder
        self.owner = owner
        self.expires_at = expires_at
        if same_run:
            message = (
                f"run {holder} is still running as {owner} (its lease on {target} lasts until "
                f"{_when(expires_at)}); stop that process, or wait until then if it is dead"
            )
        else:
            message = (
                f"target {target} is held by run {holder} ({owner}) until {_when(expires_at)}; "
                f"wait, or `rewind resume {holder}` if that run is dead"
            )
        super().__init__(message, target)


class LeaseLost(LeaseError):
    """A holder's lease is gone: taken over after it expired, or released. Stop writing."""

    def __init__(
        self, target: str, holder: str, now_held_by: str | None = None, owner: str | None = None
    ) -> None:
        self.holder = holder
        self.now_held_by = now_held_by
        by = f"now held by run {now_held_by} ({owner})" if now_held_by else "no longer held"
        super().__init__(f"run {holder} lost its lease on {target} ({by}); stop writing to it", target)
