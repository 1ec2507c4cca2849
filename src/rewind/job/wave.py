"""One wave of a run: its units and what running them needs, built by the runner per wave.

Both wave bodies take it, :func:`rewind.job.event_wave.run_event_wave` (a Kafka or archive
source) and :func:`rewind.job.reproduce.run_table_wave` (a table source), and so do the
driver's commits that close either (:func:`rewind.job.wave_commit.commit_wave`). A body takes
beside it only what is its own (a Kafka-source run's ``latest_per_key`` decision).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.core.console import RunProgress
    from rewind.core.units import WorkUnit
    from rewind.job.live import LiveProgress
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink
    from rewind.sinks.iceberg import IcebergSink, IcebergStaging


@dataclass(frozen=True)
class Wave:
    """The fields are fixed for the wave; ``done_q`` and ``timings`` are the run's own, which
    the wave adds to."""

    settings: Settings
    ledger: Ledger
    plan: JobPlan
    run_id: str
    units: tuple[WorkUnit, ...]
    sink: StagingSink[Any]
    """Where the units commit: the run's sink, or the scratch table of a fold's partial rows."""
    staging: Staging
    qsink: IcebergSink
    qstaging: IcebergStaging
    done_q: set[str]
    """The run's units whose quarantine files are committed; the wave's commit adds its own."""
    live: LiveProgress
    base: RunProgress
    """The run's committed progress before the wave: what its live progress counts on from."""
    timings: list[dict[str, Any]] | None = None
    """``rewind rehearse``: hears one entry for the wave (its units, records, seconds in Spark
    and in the driver's commits)."""

    @property
    def unit_ids(self) -> list[str]:
        return [u.id for u in self.units]
