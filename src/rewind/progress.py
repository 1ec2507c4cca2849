"""The CLI's :class:`~rewind.core.console.Console`: what core code reports, shown to a person.

A run's progress is a Rich bar on a terminal, plain periodic lines otherwise, and Prometheus
metrics when a port is given; archive commits are one line each. With ``--json`` nothing is
shown here (the command prints one JSON object at the end), metrics still are.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from rewind.core.console import RunProgress


class CliConsole:
    """A context manager that turns what core code reports into output and metrics."""

    def __init__(self, enabled: bool = True, metrics_port: int | None = None, stream: Any = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.metrics = _Metrics(metrics_port) if metrics_port else None
        self._rich: Any = None
        self._task: Any = None
        self._last_line = 0.0

    def __enter__(self) -> CliConsole:
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._rich = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} units"),
                TextColumn("{task.fields[records]} rec"),
                TextColumn("{task.fields[rate]} rec/s"),
                TextColumn("q {task.fields[quarantined]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.__exit__(*exc)

    def stage(self, name: str, description: str) -> None:
        """Stages are not shown: the plan printed them, the progress bar follows the waves."""

    def archive_committed(self, result: Mapping[str, Any]) -> None:
        if self.enabled:
            print(
                f"committed {result['pass_id']}: {result['records']:,} records, "
                f"{result['skipped_offsets']:,} skipped offsets, {result['files']} files "
                f"in {result['seconds']}s",
                file=self.stream,
                flush=True,
            )

    def run_progress(self, p: RunProgress) -> None:
        elapsed = max(time.monotonic() - p.started, 1e-6)
        rate = p.counts.records_read / elapsed
        if self.metrics is not None:
            self.metrics.update(p, rate)
        if not self.enabled:
            return
        if self._rich is not None:
            if self._task is None:
                self._task = self._rich.add_task(
                    p.run_id, total=p.units_total, records=0, rate=0, quarantined=0
                )
            self._rich.update(
                self._task,
                completed=p.units_done,
                records=f"{p.counts.records_read:,}",
                rate=f"{rate:,.0f}",
                quarantined=f"{p.counts.quarantined:,}",
            )
            return
        now = time.monotonic()
        if now - self._last_line >= 5 or p.units_done == p.units_total:
            self._last_line = now
            left = p.units_total - p.units_done
            eta = (elapsed / p.units_done * left) if p.units_done else float("nan")
            print(
                f"{p.run_id}: {p.units_done}/{p.units_total} units, {p.counts.records_read:,} records, "
                f"{rate:,.0f} rec/s, {p.counts.quarantined:,} quarantined, eta {eta:,.0f}s",
                file=self.stream,
                flush=True,
            )


class _Metrics:
    """Run metrics on ``/metrics`` (prometheus-client), in a registry of their own."""

    def __init__(self, port: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        labels = ["run_id"]
        self.read = Gauge("rewind_records_read", "Records read", labels, registry=self.registry)
        self.written = Gauge("rewind_rows_written", "Rows written to staging", labels, registry=self.registry)
        self.quarantined = Gauge(
            "rewind_records_quarantined", "Records quarantined", labels, registry=self.registry
        )
        self.filtered = Gauge("rewind_records_filtered", "Records filtered", labels, registry=self.registry)
        self.lag = Gauge(
            "rewind_offsets_to_planned_end", "Offsets left to the planned end", labels, registry=self.registry
        )
        self.rate = Gauge("rewind_records_per_second", "Read throughput", labels, registry=self.registry)
        self.units = Gauge("rewind_units_done", "Work units done", labels, registry=self.registry)
        start_http_server(port, addr="127.0.0.1", registry=self.registry)

    def update(self, p: RunProgress, rate: float) -> None:
        run = p.run_id
        self.read.labels(run).set(p.counts.records_read)
        self.written.labels(run).set(p.counts.rows_out)
        self.quarantined.labels(run).set(p.counts.quarantined)
        self.filtered.labels(run).set(p.counts.filtered)
        self.lag.labels(run).set(max(0, p.offsets_total - p.counts.records_read))
        self.rate.labels(run).set(rate)
        self.units.labels(run).set(p.units_done)
