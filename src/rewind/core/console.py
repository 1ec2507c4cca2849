"""How core code tells the person or program running it what is happening: one Console.

Core code (the job runner, the archive) is handed a :class:`Console` and calls it with plain
data at the moments that matter; it never prints and never formats for a terminal (no Rich
markup), so the same run can be shown as a progress bar, as JSON lines, as metrics, or not
at all. The CLI's implementation is :class:`rewind.progress.CliConsole`; library callers
that want nothing shown pass nothing (:data:`QUIET`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rewind.core.counts import RecordCounts


@dataclass
class RunProgress:
    """Where a run stands: when it starts, while a wave runs, after a wave committed.

    ``counts`` are the committed units' counts; while a wave runs, ``counts.records_read``
    also holds what its tasks have read so far (``in_flight`` of it). ``offsets_left`` are
    the offsets of units not committed yet, less what is in flight. ``rate`` (records per
    second over the last seconds of this process) and ``eta_s`` (``offsets_left / rate``)
    are ``None`` until they can be measured.
    """

    run_id: str
    units_total: int
    units_done: int
    offsets_total: int
    counts: RecordCounts
    started: float
    state: str = "running"
    offsets_left: int = 0
    in_flight: int = 0
    rate: float | None = None
    eta_s: float | None = None
    live_rate: float | None = None
    """Records per second written to the topics read now (the log ends' growth; 0: no live
    writes, ``None``: not measured): the run's ``rate`` is judged as a multiple of it."""


class Console(Protocol):
    """The events core code reports. Each method must return quickly and must not raise."""

    def stage(self, name: str, description: str) -> None:
        """A stage of a run starts (see :mod:`rewind.job.stages`)."""
        ...

    def run_started(self, progress: RunProgress) -> None:
        """A run is recorded (or resumed) and about to start, before Spark starts."""
        ...

    def wave_progress(self, progress: RunProgress) -> None:
        """A wave is running: called about every second, from a background thread."""
        ...

    def run_progress(self, progress: RunProgress) -> None:
        """A wave of a run committed (sink, quarantine and ledger)."""
        ...

    def archive_committed(self, result: Mapping[str, Any]) -> None:
        """An archive pass committed (the pass's ``to_dict()``: pass_id, records, files...)."""
        ...


class QuietConsole:
    """Shows nothing: the default of library calls."""

    def stage(self, name: str, description: str) -> None:
        pass

    def run_started(self, progress: RunProgress) -> None:
        pass

    def wave_progress(self, progress: RunProgress) -> None:
        pass

    def run_progress(self, progress: RunProgress) -> None:
        pass

    def archive_committed(self, result: Mapping[str, Any]) -> None:
        pass


QUIET: Console = QuietConsole()
