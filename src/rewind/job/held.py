"""Before a run concludes: the sink still holds everything the run's units committed.

A Kafka broker can come back from a crash without records it had acknowledged (noida-db
after SIGKILL loses its last second): a unit committed in a Spark task just before, and done
in the ledger, may then be gone from the backfill topic together with its commit marker. The
sink checks (:meth:`~rewind.sinks.base.StagingSink.check_held`); units it no longer holds are
reopened in the ledger (``failed``, counts cleared, audited), so the run fails in one line
and ``rewind resume`` writes them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.ledger.reopen import reopen_units
from rewind.sinks.kafka.held import StagingLost

if TYPE_CHECKING:
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink


def check_staging_held(ledger: Ledger, sink: StagingSink[Any], staging: Staging, run_id: str) -> None:
    done = {u.unit_id for u in ledger.units(run_id) if u.state == "done"}
    try:
        sink.check_held(staging, run_id, done)
    except StagingLost as exc:
        if exc.units:
            reopen_units(ledger.engine, run_id, exc.units, str(exc))
            ledger.audit(run_id, "units-lost", {"count": len(exc.units), "first": exc.units[:10]})
        raise
