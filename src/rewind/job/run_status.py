"""What a run's state means now: the ledger says ``running``, the lease says whether it is.

A run killed with ``kill -9`` cannot say so: the ledger keeps ``running`` until something
resumes it. Its lease tells the truth: a lease that expired (or is gone) means nobody is
working on the run, and a lease whose owner is a process on this host that no longer exists
means its process died even if the lease has not expired yet. ``rewind runs`` and ``rewind
show`` show such runs as ``stale`` or ``possibly-dead`` with the lease holder's host and pid,
and ``rewind resume`` takes them over (see :mod:`rewind.ledger.leases`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rewind.ledger import Lease, owner_is_dead


@dataclass(frozen=True)
class ShownState:
    state: str  # the ledger's state, or stale / possibly-dead for a running run nobody runs
    detail: str = ""  # why, for people: when the lease expired, which process held it

    def text(self) -> str:
        return f"{self.state} ({self.detail})" if self.detail else self.state

    def lease_facts(self, lease: Lease | None) -> dict[str, Any] | None:
        if lease is None:
            return None
        host, _, pid = lease.owner.rpartition(":")
        return {"holder": lease.holder, "host": host, "pid": pid, "expires_at": lease.expires_at.isoformat()}


def shown_state(state: str, run_id: str, lease: Lease | None, now: datetime) -> ShownState:
    """``state`` as people should read it, given the lease on the run's target at ``now``."""
    if state != "running":
        return ShownState(state)
    if lease is None or lease.holder != run_id:
        return ShownState("stale", "it holds no lease: its process stopped; `rewind resume` continues it")
    host, _, pid = lease.owner.rpartition(":")
    if lease.expires_at <= now:
        return ShownState(
            "stale",
            f"lease expired at {lease.expires_at.isoformat(timespec='seconds')}, held by pid {pid} "
            f"on {host}; `rewind resume {run_id}` takes it over",
        )
    if owner_is_dead(lease.owner):
        return ShownState(
            "possibly-dead",
            f"pid {pid} on {host} is gone; its lease lasts until "
            f"{lease.expires_at.isoformat(timespec='seconds')}; `rewind resume {run_id}` takes it over now",
        )
    return ShownState("running", f"pid {pid} on {host}")
