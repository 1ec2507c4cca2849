"""A run's metrics in Prometheus' conventions, read from the ledger, and live groups' lag.

:class:`RunCollector` is a prometheus-client collector: every scrape reads the run's units from
the ledger (so ``/metrics`` answers from the moment the run id is known, per partition and
source, exactly what is committed) and samples the lag of the spec's ``live_groups`` (at most
every ``LAG_EVERY_S``), so one dashboard shows the live consumers' lag beside the backfill's
throughput. :func:`push_run` sends the same families to a Pushgateway (``--pushgateway``) for
batch runs that no Prometheus scrapes in time.

Families (``_total`` counters; labels ``job`` = the spec's name, ``run`` = the run id):

* ``rewind_records_read_total{job,run,topic,partition,source}`` (``source``: kafka | archive)
* ``rewind_rows_written_total{job,run,topic,partition,source}``
* ``rewind_records_quarantined_total{job,run,reason}``, ``rewind_records_filtered_total{job,run}``
* ``rewind_merge_decisions_total{job,run,decision}`` (a ``merge:`` policy's decisions)
* ``rewind_estimated_bytes_read_total{job,run,source}``: records read x the plan's sampled
  average record size (an estimate: Kafka does not report bytes per unit)
* ``rewind_bytes_read_total{job,run,source}``: record bytes (key + value + headers) the run's
  tasks actually read, per wave as it commits (:mod:`rewind.spark.stage_clock`)
* ``rewind_units{job,run,state}``, ``rewind_offsets_planned{job,run}``
* ``rewind_stage_duration_seconds{job,run,stage}`` histogram, one observation per wave and
  stage: ``read``, ``decode``, ``translate``, ``write`` (seconds of the wave's tasks in each,
  summed over its tasks: :mod:`rewind.spark.stage_clock`) and ``commit`` (quarantine, sink and
  ledger commits in the driver); buckets in seconds, ``_bucket{le}``/``_sum``/``_count``
* ``rewind_live_group_lag{group,topic,partition}`` and ``rewind_live_group_lag_sum{group}``
* once the run succeeded: ``rewind_run_live_records_per_second{job,run}`` (the topics' live
  produce rate over the run) and ``rewind_run_realtime_multiple{job,run}`` (the run's read rate
  as a multiple of it; no series without live writes), as :func:`rewind.job.realtime.run_speed`
  measured them
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rewind.core.counts import flatten_reasons
from rewind.errors import RewindError
from rewind.job.merge import recorded_merge
from rewind.job.realtime import recorded_speed
from rewind.kafka.groups import committed_offsets, log_bounds
from rewind.ops.readiness import LIVE_LAG
from rewind.secrets import mask_url

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from rewind.config import Settings

LAG_EVERY_S = 5.0
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


STAGES = ("read", "decode", "translate", "write", "commit")


def stage_observations(timings: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per stage, one observation per wave: the tasks' seconds in read, decode, translate and
    write (:mod:`rewind.spark.stage_clock`; a wave whose tasks did not time them, a table
    source's, has none) and the driver's commit seconds."""
    out: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for t in timings:
        for stage, seconds in (t.get("stages") or {}).items():
            if stage in out:
                out[stage].append(float(seconds))
        out["commit"].append(float(t["commit_s"]))
    return out


def group_lag(conf: dict[str, Any], group: str) -> dict[tuple[str, int], int] | None:
    """Lag per partition of ``group`` (log end minus committed offset); None: no such group."""
    committed = {tp: o for tp, o in committed_offsets(conf, group).items() if o is not None}
    if not committed:
        return None
    ends = log_bounds(conf, list(committed))
    return {tp: max(0, ends[tp].high - o) for tp, o in committed.items()}


class RunCollector:
    """The metric families of one run (see the module docstring); thread-safe scrapes."""

    def __init__(self, settings: Settings, run_id: str, timings: list[dict[str, Any]] | None = None) -> None:
        # lazy: avoids sqlalchemy at import
        from rewind.job.service import load_plan, open_ledger

        self.settings, self.run_id = settings, run_id
        self.timings = timings if timings is not None else []
        self.ledger = open_ledger(settings)
        plan = load_plan(self.ledger, self.ledger.get_run(run_id).plan_id)
        self.job = plan.name
        self.sources = {u.id: u.source for u in plan.units}
        self.offsets = plan.offsets
        self.avg_bytes = float(plan.estimates.get("avg_record_bytes") or 0.0)
        self.live_groups = list(plan.spec.get("live_groups") or [])
        self._lag: dict[str, dict[tuple[str, int], int] | None] = {}
        self._lag_at = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        if self.live_groups:  # sampled while the run lives, scraped or not (the report charts it)
            self._sampler = threading.Thread(target=self._sample_loop, name=f"lag-{run_id}", daemon=True)
            self._sampler.start()

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_lag(force=True)
            except Exception:  # a broker hiccup must not end the sampling (nor the run)
                log.warning("live lag of run %s not sampled", self.run_id, exc_info=True)
            self._stop.wait(LAG_EVERY_S)

    def close(self) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=LAG_EVERY_S + 10)
        self.ledger.close()

    def sample_lag(self, force: bool = False) -> dict[str, dict[tuple[str, int], int] | None]:
        with self._lock:
            if force or time.monotonic() - self._lag_at >= LAG_EVERY_S:
                conf = self.settings.kafka_config()
                self._lag = {g: group_lag(conf, g) for g in self.live_groups}
                self._lag_at = time.monotonic()
                self._record_lag()
            return dict(self._lag)

    def _record_lag(self) -> None:
        """Each sample into the ledger (``live-lag`` probes naming the run): the run report's lag
        chart, and readiness evidence that the groups' lag was measured."""
        # lazy: avoids sqlalchemy at import
        from rewind.ledger.evidence import EvidenceStore

        store = EvidenceStore(self.ledger.engine)
        for group, parts in self._lag.items():
            lag = None if parts is None else sum(parts.values())
            store.record_probe(LIVE_LAG, group, parts is not None, {"run": self.run_id, "lag": lag})

    def collect(self) -> Iterator[Any]:
        # lazy: avoids prometheus_client at import
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        job, run = self.job, self.run_id
        part = ["job", "run", "topic", "partition", "source"]
        read = CounterMetricFamily("rewind_records_read", "Records read, committed units", labels=part)
        rows = CounterMetricFamily(
            "rewind_rows_written", "Rows written to staging, committed units", labels=part
        )
        quarantined = CounterMetricFamily(
            "rewind_records_quarantined", "Records quarantined, by reason", labels=["job", "run", "reason"]
        )
        filtered = CounterMetricFamily("rewind_records_filtered", "Records filtered", labels=["job", "run"])
        nbytes = CounterMetricFamily(
            "rewind_estimated_bytes_read",
            "Records read x the plan's sampled average record size (estimate)",
            labels=["job", "run", "source"],
        )
        units = GaugeMetricFamily("rewind_units", "Work units by state", labels=["job", "run", "state"])
        planned = GaugeMetricFamily("rewind_offsets_planned", "Offsets of the plan", labels=["job", "run"])
        by_part: dict[tuple[str, str, str], list[int]] = {}
        by_state: dict[str, int] = {}
        reasons: dict[str, int] = {}
        filtered_n = 0
        for u in self.ledger.units(run):
            key = (u.topic, str(u.partition), self.sources.get(u.unit_id, "kafka"))
            acc = by_part.setdefault(key, [0, 0])
            by_state[u.state] = by_state.get(u.state, 0) + 1
            if u.state == "done":
                acc[0] += u.records_read
                acc[1] += u.rows_out
                filtered_n += u.filtered
                for label, n in flatten_reasons(u.reasons).items():
                    reasons[label] = reasons.get(label, 0) + n
        by_source: dict[str, int] = {}
        for (topic, partition, source), (n_read, n_rows) in sorted(by_part.items()):
            read.add_metric([job, run, topic, partition, source], n_read)
            rows.add_metric([job, run, topic, partition, source], n_rows)
            by_source[source] = by_source.get(source, 0) + n_read
        for source, n in sorted(by_source.items()):
            nbytes.add_metric([job, run, source], n * self.avg_bytes)
        for reason, n in sorted(reasons.items()):
            quarantined.add_metric([job, run, reason], n)
        filtered.add_metric([job, run], filtered_n)
        for state, n in sorted(by_state.items()):
            units.add_metric([job, run, state], n)
        planned.add_metric([job, run], self.offsets)
        measured = CounterMetricFamily(
            "rewind_bytes_read",
            "Record bytes (key + value + headers) the run's tasks read, by source (measured)",
            labels=["job", "run", "source"],
        )
        read_bytes: dict[str, int] = {}
        for t in list(self.timings):
            for source, n in (t.get("bytes") or {}).items():
                read_bytes[source] = read_bytes.get(source, 0) + int(n)
        for source, n in sorted(read_bytes.items()):
            measured.add_metric([job, run, source], n)
        yield from (read, rows, quarantined, filtered, nbytes, measured, units, planned)
        yield from self._merge(job, run)
        yield from self._speed(job, run)
        stages = HistogramMetricFamily(
            "rewind_stage_duration_seconds",
            "Seconds per wave, by stage (task seconds summed over the wave's tasks; commit: the driver's)",
            labels=["job", "run", "stage"],
        )
        for stage, values in stage_observations(list(self.timings)).items():
            buckets = [(str(b), sum(v <= b for v in values)) for b in BUCKETS] + [("+Inf", len(values))]
            stages.add_metric([job, run, stage], buckets, sum(values))
        yield stages
        if self.live_groups:
            lag = GaugeMetricFamily(
                "rewind_live_group_lag", "A live consumer group's lag", labels=["group", "topic", "partition"]
            )
            total = GaugeMetricFamily(
                "rewind_live_group_lag_sum", "A live group's lag, all partitions", labels=["group"]
            )
            for group, parts in sorted(self.sample_lag().items()):
                if parts is None:
                    continue  # no such group (readiness says so): no series rather than a false 0
                for (lag_topic, lag_partition), behind in sorted(parts.items()):
                    lag.add_metric([group, lag_topic, str(lag_partition)], behind)
                total.add_metric([group], sum(parts.values()))
            yield lag
            yield total

    def _speed(self, job: str, run: str) -> Iterator[Any]:
        # lazy: avoids prometheus_client at import
        from prometheus_client.core import GaugeMetricFamily

        speed = recorded_speed(self.ledger, run)
        if speed is None:
            return
        live = GaugeMetricFamily(
            "rewind_run_live_records_per_second",
            "Records per second written to the topics the run read, over the run (log ends' growth)",
            labels=["job", "run"],
        )
        live.add_metric([job, run], float(speed["live_records_per_second"]))
        times = GaugeMetricFamily(
            "rewind_run_realtime_multiple",
            "The run's read rate as a multiple of the live produce rate over the run (x real-time)",
            labels=["job", "run"],
        )
        if speed.get("multiple") is not None:  # no live writes: nothing to outrun, no series
            times.add_metric([job, run], float(speed["multiple"]))
        yield from (live, times)

    def _merge(self, job: str, run: str) -> Iterator[Any]:
        # lazy: avoids prometheus_client at import
        from prometheus_client.core import CounterMetricFamily

        merged = recorded_merge(self.ledger, run) or {}
        family = CounterMetricFamily(
            "rewind_merge_decisions",
            "Merge policy decisions, per output row",
            labels=["job", "run", "decision"],
        )
        for decision, n in sorted(merged.items()):
            if isinstance(n, int | float):
                family.add_metric([job, run, str(decision)], n)
        yield family


def push_run(settings: Settings, run_id: str, url: str, timings: list[dict[str, Any]] | None = None) -> None:
    """Push the run's families to a Pushgateway (grouped by ``job`` and ``run``)."""
    # lazy: avoids prometheus_client at import
    from prometheus_client import CollectorRegistry, push_to_gateway

    collector = RunCollector(settings, run_id, timings)
    try:
        registry = CollectorRegistry()
        registry.register(collector)
        push_to_gateway(url, job=collector.job, registry=registry, grouping_key={"run": run_id})
    except OSError as exc:  # URLError, refused, timeout
        reason = getattr(exc, "reason", None) or exc
        raise MetricsPushError(
            f"--pushgateway {mask_url(url)}: {reason}; check the URL (the run itself is recorded: "
            f"`rewind show {run_id}`)"
        ) from None
    finally:
        collector.close()


class MetricsPushError(RewindError):
    """The Pushgateway did not take a run's metrics (one line)."""
