"""What the console sees while a run runs: committed waves, the running wave, a rate, an ETA.

The runner hands over the committed progress (a ledger query on the runner's thread) when it
has it: when the run starts (before Spark starts), when a wave starts and when it commits.
While a wave's Spark job runs, the runner's thread waits in Spark, so a daemon thread asks
the progress channel (:mod:`rewind.spark.progress_channel`) every second how many records
the wave's tasks have read and tells the console (:meth:`Console.wave_progress`).

Beside the run's rate, the live produce rate of the topics it reads: the plan's measure, then
the log ends' growth while the run reads (:class:`rewind.kafka.live_rate.LogEndMeter`), so the
console shows the run's speed as a multiple of it ("x real-time").

Nothing here is needed for correctness: what a wave commits comes from its tasks' results,
never from these numbers, and a failure here is logged once and ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from rewind.core.console import Console, RunProgress
from rewind.core.units import WorkUnit
from rewind.kafka.live_rate import LogEndMeter
from rewind.spark.progress_channel import open_listener

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rewind.spark.progress_channel import ProgressAddress, ProgressListener

log = logging.getLogger(__name__)

TICK_S = 1.0
"""How often the console hears from a running wave."""

RATE_WINDOW_S = 20.0
"""The rate is measured over about this many of the last seconds."""


class RateMeter:
    """Records per second over a sliding window of (time, records read) samples.

    Only what this process read counts (a resumed run's earlier units are the first sample).
    Samples before the count last started to move are dropped: the seconds Spark takes to
    start a job are not a read rate (measured: 15 s of start-up before a wave read 5,000
    records at 400 rec/s showed 108 rec/s and an ETA of 26 s instead of 400 rec/s and 7 s),
    while a stall after reading began still lowers the rate, as it should.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque()

    def measure(self, records: int) -> float | None:
        """Add a sample; the rate since the oldest sample in the window (``None`` under 1 s)."""
        now = self.clock()
        self.samples.append((now, records))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        while len(self.samples) > 2 and self.samples[1][1] == self.samples[0][1]:
            self.samples.popleft()  # not moving yet: start-up, not rate
        then, before = self.samples[0]
        if now - then < 1.0:
            return None
        return max(0.0, (records - before) / (now - then))


class LiveProgress:
    """Turns the runner's committed progress and the wave's in-flight counts into console calls."""

    def __init__(
        self,
        console: Console,
        started: float,
        tick_s: float = TICK_S,
        live_rate: float | None = None,
        live_meter: LogEndMeter | None = None,
    ) -> None:
        """``live_rate`` is the plan's measure of the topics' live produce rate; ``live_meter``
        measures it again while the run reads (its rate wins once it has one)."""
        self.console = console
        self.started = started
        self.tick_s = tick_s
        self.meter = RateMeter()
        self.live_rate = live_rate
        self.live_meter = live_meter
        self._lock = threading.Lock()
        self._listener: ProgressListener | None = None
        self._no_listener = False
        self._warned = False

    def run_started(self, progress: RunProgress) -> None:
        self.console.run_started(self._measured(progress))

    def committed(self, progress: RunProgress) -> None:
        self.console.run_progress(self._measured(progress))

    def channel(self, spark: SparkSession) -> ProgressAddress | None:
        """Where the wave's tasks report (the listener opens on the first wave)."""
        if self._listener is None and not self._no_listener:
            try:
                self._listener = open_listener(spark)
            except OSError as exc:  # progress is then shown only when waves commit
                self._no_listener = True
                log.warning("no live progress: could not open the progress channel (%s)", exc)
        return self._listener.address if self._listener is not None else None

    @contextlib.contextmanager
    def wave(self, base: RunProgress, units: Sequence[WorkUnit]) -> Iterator[None]:
        """While the block runs (the wave's Spark job), the console hears every ``tick_s``:
        ``base`` (the committed progress) plus the records the wave's tasks have read."""
        sizes = {u.id: u.end - u.start for u in units}
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(self.tick_s):
                try:
                    self.console.wave_progress(self._measured(self._in_flight(base, sizes)))
                except Exception:  # progress is shown, never needed: the run goes on
                    if not self._warned:
                        self._warned = True
                        log.warning("live progress failed", exc_info=True)

        ticker = threading.Thread(target=tick, name="rewind-wave-progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join(timeout=5)
            if self._listener is not None:
                self._listener.counts.forget(list(sizes))

    def _in_flight(self, base: RunProgress, sizes: dict[str, int]) -> RunProgress:
        read = self._listener.counts.records(sizes) if self._listener is not None else 0
        counts = dataclasses.replace(base.counts, records_read=base.counts.records_read + read)
        return dataclasses.replace(
            base, counts=counts, in_flight=read, offsets_left=max(0, base.offsets_left - read)
        )

    def _measured(self, progress: RunProgress) -> RunProgress:
        with self._lock:
            rate = self.meter.measure(progress.counts.records_read)
        eta = progress.offsets_left / rate if rate else None
        live = self.live_meter.rate() if self.live_meter is not None else None
        if live is not None:
            self.live_rate = live
        return dataclasses.replace(progress, rate=rate, eta_s=eta, live_rate=self.live_rate)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None
