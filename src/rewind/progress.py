"""The CLI's :class:`~rewind.core.console.Console`: what core code reports, shown to a person.

A run prints its id on stderr as soon as it is recorded (before Spark starts); its progress
is then a Rich bar on a terminal, otherwise a line at least every 5 s while a wave runs
(records read so far, rate, ETA, and the rate as a multiple of the topics' live produce rate:
"12.3x real-time", or "no live writes"), and Prometheus metrics when a port is given, served from
the moment the console enters. Archive commits are one line each. With ``--json`` nothing is
shown here (the command prints one JSON object at the end), metrics still are.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

from rich.console import Console

from rewind.core.console import RunProgress
from rewind.core.live_speed import describe_speed, multiple
from rewind.errors import ConfigError

log = logging.getLogger(__name__)

LINE_EVERY_S = 5.0
"""Progress lines (no terminal) are at most this far apart while updates come every second."""


class CliConsole:
    """A context manager that turns what core code reports into output and metrics.

    The metrics server (``metrics_port``) starts when the console enters and stops when it
    exits, so ``/metrics`` answers for the whole command; the run's gauges exist (at 0, or
    at a resumed run's committed counts) from the moment its id is known.
    """

    def __init__(
        self,
        enabled: bool = True,
        metrics_port: int | None = None,
        stream: Any = None,
        metrics_address: str = "127.0.0.1",
        collector_for: Any = None,
    ) -> None:
        """``collector_for(run_id)`` (optional) gives a prometheus-client collector registered
        on ``/metrics`` once the run id is known (:class:`rewind.ops.metrics.RunCollector`)."""
        self.enabled = enabled
        self.collector_for = collector_for
        self.collector: Any = None
        self.run_id: str | None = None
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        self.metrics: _Metrics | None = None
        self._rich: Any = None
        self._task: Any = None
        self._last_line = -math.inf
        self._lock = threading.Lock()  # wave progress comes from a background thread

    def __enter__(self) -> CliConsole:
        if self.metrics_port:
            self.metrics = _Metrics(self.metrics_port, self.metrics_address)
        if self.enabled and self.tty:
            # lazy: avoids rich.progress at import
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} units"),
                TextColumn("{task.fields[records]} rec"),
                TextColumn("{task.fields[rate]} rec/s"),
                TextColumn("q {task.fields[quarantined]}"),
                TimeElapsedColumn(),
                TextColumn("eta {task.fields[eta]}"),
                TextColumn("{task.fields[realtime]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)
        if self.metrics is not None:
            self.metrics.close()
        if self.collector is not None:
            self.collector.close()

    def stage(self, name: str, description: str) -> None:
        """Stages are not shown: the plan printed them, the progress follows the waves."""

    def archive_committed(self, result: Mapping[str, Any]) -> None:
        if self.enabled:
            self._say(
                f"committed {result['pass_id']}: {result['records']:,} records, "
                f"{result['skipped_offsets']:,} skipped offsets, {result['files']} files "
                f"in {result['seconds']}s"
            )

    def run_started(self, p: RunProgress) -> None:
        self.run_id = p.run_id
        if self.collector_for is not None and self.collector is None:
            try:  # a console must not fail the run: without it, the gauges below still answer
                self.collector = self.collector_for(p.run_id)  # it samples live lag, scraped or not
                if self.metrics is not None:
                    self.metrics.registry.register(self.collector)
            except Exception:
                log.warning("run %s: the per-partition metrics are off", p.run_id, exc_info=True)
        if self.metrics is not None:
            self.metrics.update(p)
        if self.enabled:
            done = f", {p.units_done} done already" if p.units_done else ""
            self._say(f"run {p.run_id}: {p.units_total} units{done}, {p.offsets_total:,} offsets planned")

    def wave_progress(self, p: RunProgress) -> None:
        self._show(p, last=False)

    def run_progress(self, p: RunProgress) -> None:
        self._show(p, last=p.units_done == p.units_total)

    def _show(self, p: RunProgress, last: bool) -> None:
        if self.metrics is not None:
            self.metrics.update(p)
        if not self.enabled:
            return
        rate = "?" if p.rate is None else f"{p.rate:,.0f}"
        eta = "?" if p.eta_s is None else f"{p.eta_s:,.0f}s"
        with self._lock:
            if self._rich is not None:
                if self._task is None:
                    self._task = self._rich.add_task(
                        p.run_id, total=p.units_total, records=0, rate="?", quarantined=0, eta="?",
                        realtime="",
                    )
                self._rich.update(
                    self._task,
                    completed=p.units_done,
                    records=f"{p.counts.records_read:,}",
                    rate=rate,
                    quarantined=f"{p.counts.quarantined:,}",
                    eta=eta,
                    realtime="" if p.live_rate is None else describe_speed(p.rate, p.live_rate),
                )
                return
            now = time.monotonic()
            # updates come every second: a line when 5 s have nearly passed keeps them <= 5 s apart
            if not last and now - self._last_line < LINE_EVERY_S - 0.5:
                return
            self._last_line = now
        self._say(
            f"{p.run_id}: {p.units_done}/{p.units_total} units, {p.counts.records_read:,} records read, "
            f"{rate} rec/s, {p.counts.quarantined:,} quarantined, eta {eta}"
            + ("" if p.live_rate is None else f", {describe_speed(p.rate, p.live_rate)}")
        )

    def _say(self, line: str) -> None:
        if self._rich is not None:  # above the live bar, not through it
            self._rich.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.stream, flush=True)


_GAUGES = (
    ("rewind_records_read", "Records read (committed units and the running wave)"),
    ("rewind_rows_written", "Rows written to staging"),
    ("rewind_records_quarantined", "Records quarantined"),
    ("rewind_records_filtered", "Records filtered"),
    ("rewind_offsets_to_planned_end", "Offsets left to the planned end"),
    ("rewind_records_per_second", "Read throughput"),
    ("rewind_units_done", "Work units done"),
    ("rewind_live_records_per_second", "Records per second written to the topics read (log ends' growth)"),
    ("rewind_realtime_multiple", "Read throughput as a multiple of the live produce rate (x real-time)"),
)


def _gauge_values(p: RunProgress) -> tuple[float | None, ...]:
    """:data:`_GAUGES`' values, in their order; None: no series (a live rate not measured, or no
    live writes: no multiple rather than a division by zero)."""
    c = p.counts
    return (c.records_read, c.rows_out, c.quarantined, c.filtered, p.offsets_left, p.rate or 0.0,
            p.units_done, p.live_rate, multiple(p.rate, p.live_rate))


class _Metrics:
    """Run metrics on ``/metrics`` (prometheus-client), in a registry of their own.

    One scrape shows one update: the gauges of a run are served from one snapshot of its
    progress, swapped in whole by :meth:`update`. (Gauges set one by one let a scrape land
    between two sets and see, say, records read of one update beside offsets left of the one
    before.)
    """

    def __init__(self, port: int, address: str) -> None:
        # lazy: avoids prometheus_client at import
        from prometheus_client import CollectorRegistry, start_http_server

        self._snapshots: dict[str, tuple[float | None, ...]] = {}
        self.registry = CollectorRegistry()
        self.registry.register(self)  # a collector is anything with collect()
        try:
            self.server, self.thread = start_http_server(port, addr=address, registry=self.registry)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(
                f"metrics on {address}:{port}: {reason}; choose another --metrics-port / --metrics-address "
                "(settings metrics.port / metrics.address)"
            ) from None

    def update(self, p: RunProgress) -> None:
        # a new dict, assigned once: a scrape in another thread sees the old one or the new one
        self._snapshots = {**self._snapshots, p.run_id: _gauge_values(p)}

    def collect(self) -> Iterator[Any]:
        # lazy: avoids prometheus_client at import
        from prometheus_client.core import GaugeMetricFamily

        snapshots = self._snapshots
        for i, (name, doc) in enumerate(_GAUGES):
            family = GaugeMetricFamily(name, doc, labels=["run_id"])
            for run, values in snapshots.items():
                value = values[i]
                if value is not None:
                    family.add_metric([run], value)
            yield family

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
