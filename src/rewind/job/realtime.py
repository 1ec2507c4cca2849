"""A job's speed against the live stream: the plan's ``live`` estimate and the run's meter.

The plan watches the log ends of the topics it reads (:class:`rewind.kafka.live_rate.LiveRateProbe`:
a look before its own work, one after it, ``live.interval_s`` apart) and keeps, under
``estimates.cost.live``:

* ``records_per_second`` (and per partition): the live produce rate over ``interval_s``;
* ``expected_records_per_second`` and ``multiple``: the run's sustained speed from the cost model
  (:func:`rewind.core.live_speed.expected_rate`) and its multiple of the live rate ("x real-time"),
  None when nothing is written live;
* ``retention`` per topic and ``oldest_leaves_at_ms``: when the first of the window's records in
  Kafka may leave the log (:func:`rewind.core.live_speed.seconds_until_gone`), ``oldest`` naming it;
* ``summary``: the line ``rewind plan`` prints beside the ETA.

Measuring never fails a plan: a broker that does not answer leaves ``error`` and no rate.
``rewind readiness`` judges these numbers (:func:`rewind.core.live_speed.judge`); a run measures
the live rate again while it reads (:func:`run_meter`), and once over its whole execution
(:func:`first_look` as it starts, :func:`run_speed` as it ends): the multiple its report, its
ledger audit (``live-speed``) and its pushed metrics carry is the measured one, not the plan's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from rewind.core.cost import human_seconds
from rewind.core.live_speed import describe_speed, expected_eta, expected_rate, multiple, seconds_until_gone
from rewind.kafka.live_rate import (
    LiveRateProbe,
    LogEndMeter,
    LogEnds,
    first_timestamps,
    look,
    rate_between,
    record_share,
    retention_of,
    topic_partitions,
)

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.core.units import WorkUnit
    from rewind.core.windows import TP
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)


def start_probe(settings: Settings, spec: JobSpec, read_plan: dict[str, Any]) -> LiveRateProbe | None:
    """The first look at the log ends of the topics ``spec`` reads from Kafka (None: nothing to
    watch, ``live.interval_s`` is 0, or the broker did not answer)."""
    if settings.live.interval_s <= 0 or spec.source.table is not None:
        return None
    conf = settings.kafka_config()
    try:
        if spec.source.kafka is not None:
            partitions = [(p["topic"], int(p["partition"])) for p in read_plan.get("partitions", [])]
        else:
            assert spec.source.history is not None
            partitions = topic_partitions(conf, spec.source.history.topics)
        if not partitions:
            return None
        probe = LiveRateProbe(conf, partitions, settings.live.interval_s)
        probe.start()
        return probe
    except Exception as exc:  # a plan must not fail for a number it only reports
        log.warning("live rate not measured: %s", exc)
        return None


def live_estimate(
    settings: Settings,
    spec: JobSpec,
    probe: LiveRateProbe | None,
    units: tuple[WorkUnit, ...],
    cost: dict[str, Any],
    avg_record_bytes: float | None,
) -> dict[str, Any] | None:
    """The second look and what follows from it (see the module docstring); None without a probe."""
    if probe is None:
        return None
    guard = spec.guards.max_records_per_second
    expected, eta = expected_rate(cost, guard), expected_eta(cost, guard)
    out: dict[str, Any] = {"expected_records_per_second": _round(expected), "eta_seconds": _round(eta)}
    conf = settings.kafka_config()
    try:
        rate = probe.finish()
        ends = probe.last.highs if probe.last is not None else {}
        firsts: dict[TP, tuple[int, int]] = {}
        for u in units:
            if u.source == "kafka":
                start, end = firsts.get((u.topic, u.partition), (u.start, u.end))
                firsts[(u.topic, u.partition)] = (min(start, u.start), max(end, u.end))
        retention = retention_of(conf, {t for t, _p in probe.partitions})
        oldest = first_timestamps(conf, firsts)
    except Exception as exc:  # a plan must not fail for a number it only reports
        log.warning("live rate not measured: %s", exc)
        return {**out, "error": str(exc), "summary": f"live rate not measured ({exc})"}
    live = rate.records_per_second
    now_ms = int(time.time() * 1000)
    soonest: tuple[float, str, Any] | None = None
    for tp, record in oldest.items():
        if record is None:
            continue
        kept = retention.get(tp[0])
        left = seconds_until_gone(
            now_ms=now_ms,
            first_ts_ms=record.ts,
            retention_ms=kept.ms if kept else None,
            retention_bytes=kept.bytes if kept else None,
            offsets_to_end=max(0, ends.get(tp, record.offset) - record.offset),
            avg_record_bytes=avg_record_bytes,
            live_rate=rate.per_partition.get(tp),
        )
        if left is not None and (soonest is None or left < soonest[0]):
            soonest = (left, f"{tp[0]}/{tp[1]}", record)
    out.update(rate.to_dict())
    out["multiple"] = _round(multiple(expected, live))
    out["retention"] = {t: r.to_dict() for t, r in sorted(retention.items())}
    out["measured_at_ms"] = now_ms
    summary = f"{describe_speed(expected, live)} over {rate.seconds:.1f}s"
    if soonest is not None:
        left, where, record = soonest
        out["oldest"] = {"partition": where, "offset": record.offset, "timestamp_ms": record.ts}
        out["oldest_leaves_at_ms"] = now_ms + round(left * 1000)
        summary += (
            f"; retention takes the window's oldest record ({where}@{record.offset}) in {human_seconds(left)}"
        )
    out["summary"] = summary
    return out


def seconds_left(live: dict[str, Any], now_ms: int | None = None) -> float | None:
    """Seconds from now until the window's oldest record may leave the log (None: never)."""
    at = live.get("oldest_leaves_at_ms")
    if at is None:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return max(0.0, (int(at) - now) / 1000)


def planned_live(plan: JobPlan) -> dict[str, Any]:
    return dict((plan.estimates.get("cost") or {}).get("live") or {})


def _watched(settings: Settings, plan: JobPlan) -> list[TP]:
    """The partitions the plan watched (none when it watched none or measuring is off)."""
    watched = planned_live(plan).get("partitions") or {}
    if settings.live.interval_s <= 0:
        return []
    return [(name.rpartition("/")[0], int(name.rpartition("/")[2])) for name in watched]


def run_meter(settings: Settings, plan: JobPlan) -> LogEndMeter | None:
    """A meter of the live rate while ``plan`` runs: the partitions the plan watched, looked at
    every ``live.interval_s`` (None when the plan watched none or measuring is off)."""
    partitions = _watched(settings, plan)
    if not partitions:
        return None
    share = float(planned_live(plan).get("record_share") or 1.0)
    return LogEndMeter(settings.kafka_config(), partitions, settings.live.interval_s, share=share)


def first_look(settings: Settings, plan: JobPlan) -> LogEnds | None:
    """The log ends of the partitions the plan watched, as an execution of it starts (None:
    nothing watched, measuring off, or the broker did not answer): :func:`run_speed` measures
    from here."""
    partitions = _watched(settings, plan)
    if not partitions:
        return None
    try:
        return look(settings.kafka_config(), partitions)
    except Exception as exc:  # a run must not fail for a number it only reports
        log.warning("the run's speed against the live stream is not measured: %s", exc)
        return None


def run_speed(settings: Settings, first: LogEnds | None, records: int) -> dict[str, Any] | None:
    """An execution's speed against the live stream, measured as it ends: the ``records`` it read
    over the seconds since ``first`` (Spark's start-up included: what the run took), the topics'
    live rate over the same seconds, and the first as a multiple of the second (None: no live
    writes). None when nothing was measured."""
    if first is None:
        return None
    conf = settings.kafka_config()
    try:
        last = look(conf, first.highs)
        live = rate_between(first, last).scaled(record_share(conf, first, last))
    except Exception as exc:  # a run must not fail for a number it only reports
        log.warning("the run's speed against the live stream is not measured: %s", exc)
        return None
    rate = records / live.seconds
    return {
        "records_per_second": round(rate, 3),
        "live_records_per_second": round(live.records_per_second, 3),
        "multiple": _round(multiple(rate, live.records_per_second)),
        "over_s": round(live.seconds, 3),
        "summary": f"{describe_speed(rate, live.records_per_second)} over {live.seconds:.0f}s",
    }


SPEED_AUDIT = "live-speed"


def recorded_speed(ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    """The last execution's :func:`run_speed`, as the run's ``live-speed`` audit entry holds it."""
    found = [a.details for a in ledger.audit_log(run_id) if a.action == SPEED_AUDIT]
    return dict(found[-1]) if found else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
