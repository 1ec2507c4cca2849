"""The run ledger: plans, runs, work units, leases and audit, in SQLAlchemy.

SQLite by default (one machine), PostgreSQL for a team (``ledger_url``). Start with
``Ledger.open(url)``; see :mod:`rewind.ledger.repo` for the repository and
:mod:`rewind.ledger.leases` for how leases stay race-free.
"""

from rewind.ledger._common import owner_is_dead
from rewind.ledger.db import SCHEMA_VERSION, connect, ensure_schema
from rewind.ledger.exceptions import (
    IllegalTransition,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    LedgerError,
    LedgerUnavailable,
    NotFound,
    PlanConflict,
    UnitStateError,
)
from rewind.ledger.leases import LeaseKeeper
from rewind.ledger.models import (
    RUN_STATES,
    TRANSITIONS,
    UNIT_STATES,
    AuditEntry,
    Lease,
    PlanRecord,
    RunRecord,
    RunState,
    RunTotals,
    UnitRange,
    UnitRecord,
    UnitResult,
    UnitState,
    unit_id,
)
from rewind.ledger.repo import Ledger, new_run_id

__all__ = [
    "RUN_STATES",
    "SCHEMA_VERSION",
    "TRANSITIONS",
    "UNIT_STATES",
    "AuditEntry",
    "IllegalTransition",
    "Lease",
    "LeaseError",
    "LeaseHeld",
    "LeaseKeeper",
    "LeaseLost",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "NotFound",
    "PlanConflict",
    "PlanRecord",
    "RunRecord",
    "RunState",
    "RunTotals",
    "UnitRange",
    "UnitRecord",
    "UnitResult",
    "UnitState",
    "UnitStateError",
    "connect",
    "ensure_schema",
    "new_run_id",
    "owner_is_dead",
    "unit_id",
]
