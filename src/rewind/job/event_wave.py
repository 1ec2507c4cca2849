"""Step 5 of a run whose units are events (a Kafka source, and its lake archive): one wave.

Spark reads, decodes and translates the wave's units in its tasks and writes their output and
quarantine files (or, for a Kafka or PostgreSQL sink written by the tasks, loads each unit
itself: :mod:`rewind.job.kafka_loads`, :mod:`rewind.job.task_loads`). The driver then checks the
conservation law per unit, commits the quarantine files, then the output files with the unit
ids and counts in the same commit, then marks the units done in the ledger, in this order: a
kill between two of these steps loses nothing and duplicates nothing on resume (the runner's
reconcile, :mod:`rewind.job.runner`). A re-produce's wave (``source.table``) is
:func:`rewind.job.reproduce.run_table_wave`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.errors import error_line
from rewind.history.read import read_ranges_from_archive
from rewind.job import kafka_loads, task_loads
from rewind.job.wave_commit import commit_wave
from rewind.spark import session, waves
from rewind.spark.job_stage import StageContext
from rewind.spark.latest_per_key import latest_per_key
from rewind.spark.pace_server import pace_server_for
from rewind.spark.ratelimit import RateLimit
from rewind.spark.stage_clock import add_stage_seconds

if TYPE_CHECKING:
    from rewind.job.wave import Wave

log = logging.getLogger(__name__)


def run_event_wave(wave: Wave, latest: dict[str, Any] | None = None) -> dict[str, int]:
    """Step 5 of a run for one wave: Spark (its progress shown live), conservation per unit,
    quarantine commit, output commit, ledger. ``latest`` keeps the run's ``latest_per_key``
    decision between waves. Returns the record bytes the wave read per source."""
    settings, ledger, plan, run_id = wave.settings, wave.ledger, wave.plan, wave.run_id
    spec = plan.job_spec()
    ledger.mark_running(run_id, wave.unit_ids)
    spark = session(settings)  # before arming: the kill must land in the job, not in Spark's start
    ctx = StageContext(
        run_id=run_id,
        spec_json=spec.model_dump_json(by_alias=True),
        output_schema_b64=plan.output_schema_b64,
        data_folder=wave.sink.data_folder(wave.staging),
        quarantine_folder=wave.qsink.data_folder(wave.qstaging),
        kafka_conf=settings.kafka_config(),
        units=wave.units,
        max_records_per_second=spec.guards.max_records_per_second,
        rate_limit_id=run_id,
        progress=wave.live.channel(spark),
        unit_loader=task_loads.loader_for(wave.sink, wave.staging, plan),
    )
    read_archive = None
    if spec.source.history is not None:
        read_archive = functools.partial(
            read_ranges_from_archive,
            spark,
            settings,
            spec.source.history.archive,
            snapshot_id=(plan.read_plan.get("history") or {}).get("archive_snapshot_id"),
        )
    if spec.source.window.latest_per_key:
        ctx = dataclasses.replace(ctx, latest=_latest(wave, spark, ctx, read_archive, latest))
    ctx = kafka_loads.with_loader(ctx, wave.sink, wave.staging, ledger, spark)
    faults.after(float(os.environ.get("REWIND_FAULT_DELAY", "2")), "mid-wave")
    try:
        t_spark = time.monotonic()
        limit = RateLimit(spec.guards.max_records_per_second) if spec.guards.max_records_per_second else None
        with wave.live.wave(wave.base, wave.units), pace_server_for(spark, limit) as pace:
            outputs = waves.run_wave(spark, dataclasses.replace(ctx, pace=pace), read_archive)
        t_commit = time.monotonic()
        faults.point("after-wave-tasks")  # units its tasks loaded are committed, nothing else
    except Exception as exc:  # the wave's units are not done: say why in the ledger
        try:
            ledger.fail_units(run_id, wave.unit_ids, error_line(exc))
        except Exception:  # best effort: the wave's own error is the one to raise
            log.warning("could not record the failed units of run %s", run_id, exc_info=True)
        raise
    ids = commit_wave(wave, outputs)
    wave_bytes: dict[str, int] = {}
    for out in outputs.values():
        for source, n in out.bytes_read.items():
            wave_bytes[source] = wave_bytes.get(source, 0) + n
    if wave.timings is not None:
        wave.timings.append(
            {
                "units": len(ids),
                "records": sum(outputs[uid].counts.records_read for uid in ids),
                "spark_s": t_commit - t_spark,
                "commit_s": time.monotonic() - t_commit,
                "stages": _stage_seconds(outputs.values()),
                "bytes": wave_bytes,
            }
        )
    return wave_bytes


def _stage_seconds(outputs: Any) -> dict[str, float]:
    """The wave's task seconds per stage (read, decode, translate, write), summed over tasks."""
    total: dict[str, float] = {}
    for out in outputs:
        add_stage_seconds(total, out.stage_s)
    return total


def _latest(wave: Wave, spark: Any, ctx: Any, read_archive: Any, cache: dict[str, Any] | None) -> Any:
    """The records ``source.kafka.latest_per_key`` keeps, over every unit of the run (not only
    the pending ones: a superseding record may sit in a unit already done); once per run
    attempt, recorded in the audit."""
    cache = {} if cache is None else cache
    if "latest" not in cache:
        found = latest_per_key(spark, dataclasses.replace(ctx, units=tuple(wave.plan.units)), read_archive)
        wave.ledger.audit(wave.run_id, "latest-per-key", found.to_audit())
        cache["latest"] = found
    return cache["latest"]
