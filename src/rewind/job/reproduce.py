"""The run of a re-produce (``source.table``): the runner's stages, with units committed by tasks.

A Kafka-source run commits a wave's files from the driver: quarantine first, then the sink,
then the ledger. A re-produce commits each unit where its rows are read, in the Spark task,
as one Kafka transaction holding the unit's records and its marker (:mod:`rewind.sinks.kafka.unit_writer`):
that is what lets it keep up with a bare produce loop. The marker names the unit's quarantine
file, so the order becomes, per wave:

1. before staging is prepared (which reads the run's bookkeeping): fence the transactions of
   units an earlier attempt started and did not finish (a killed driver's or task's open
   transaction holds ``rewind.commits`` back until the broker aborts it); then the usual
   reconcile marks done the units whose marker is in the log;
2. check that the target topic still has the partition count the plan placed the entities on;
3. Spark: each task reads its unit's key range, translates it, writes rejected rows to a
   quarantine file, and commits the unit (records + marker) in one transaction;
4. the driver checks the conservation law per unit, commits the quarantine files of the
   units it has not committed yet, then marks the units done in the ledger.

A kill between 3 and 4 loses nothing: on resume, step 1 finds the units committed, and
:func:`reconcile_quarantine` commits the quarantine files their markers name.

A reconstruction into an Iceberg or SQL table has no transaction to fence (step 1 is the
reconcile alone, from the sink's own record of its units) nor topic (no step 2); its tasks
write each unit's events to a file that a PostgreSQL unit loads in its task and the driver
commits otherwise, after the quarantine files and before the ledger, as for a Kafka-source wave
(:mod:`rewind.job.event_wave`, :mod:`rewind.job.task_loads`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.store import active_store, filesystem
from rewind.errors import RewindError, error_line
from rewind.job import task_loads
from rewind.job.wave_commit import commit_wave
from rewind.sinks.kafka.bookkeeping import KafkaStaging
from rewind.sinks.kafka.unit_writer import UnitWriter, committed_quarantine_files, fence_units
from rewind.spark import session
from rewind.spark.job_stage import UnitOutput
from rewind.spark.pace_server import pace_server_for
from rewind.spark.ratelimit import RateLimit
from rewind.tables.placement import KeyRange
from rewind.tables.selection import choose
from rewind.tables.unit_files import FileUnitWriter

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.wave import Wave
    from rewind.ledger import Ledger
    from rewind.sinks.iceberg import IcebergSink, IcebergStaging

log = logging.getLogger(__name__)


class ReproduceError(RewindError):
    """A re-produce cannot go on as planned (the topic changed, a committed file is gone)."""


def fence_attempted(settings: Settings, ledger: Ledger, run_id: str) -> None:
    """Step 1: fence the unit transactions of attempted, unfinished units."""
    attempted = [u.unit_id for u in ledger.pending_units(run_id) if u.attempts > 0]
    if attempted:
        fence_units(settings.kafka_config(), run_id, attempted)


def any_attempted(ledger: Ledger, run_id: str) -> bool:
    """Did an attempt of a unit still pending start? A unit's transaction commits only from a
    task, after :meth:`~rewind.ledger.Ledger.mark_running` counted the attempt; when none did,
    the run's bookkeeping holds no unit to reconcile (the reads of step 1's reconcile are skipped)."""
    return any(u.attempts > 0 for u in ledger.pending_units(run_id))


def reconcile_quarantine(
    settings: Settings,
    ledger: Ledger,
    run_id: str,
    staging: KafkaStaging,
    qsink: IcebergSink,
    qstaging: IcebergStaging,
    done_q: set[str],
) -> None:
    """Commit the quarantine files of units whose Kafka commit landed and whose quarantine
    commit did not (a driver killed between steps 3 and 4)."""
    files = committed_quarantine_files(settings.kafka_config(), staging, run_id)
    missing = {u: paths for u, paths in files.items() if paths and u not in done_q}
    if not missing:
        return
    gone = [p for paths in missing.values() for p in paths if not _exists(p)]
    if gone:
        raise ReproduceError(
            f"run {run_id}: the quarantine file {gone[0]} of a committed unit is gone; its rejected rows "
            "cannot be recorded (their count is in the unit's marker)"
        )
    units = sorted(missing)
    qsink.commit(qstaging, run_id, units, [p for u in units for p in missing[u]])
    done_q.update(units)
    ledger.audit(run_id, "reconcile-quarantine", {"units": units})


def _exists(uri: str) -> bool:
    # lazy: avoids pyarrow at import
    import pyarrow.fs as pafs

    fs, inner = filesystem(uri)  # the warehouse's store: an s3:// quarantine file too
    return bool(fs.get_file_info(inner).type != pafs.FileType.NotFound)


def run_table_wave(wave: Wave) -> dict[str, Any]:
    """Steps 2-4 for one wave; returns the per-unit counts as committed. The wave's ``timings``
    (``rewind rehearse``) hear its seconds in Spark (read, translate and each unit's produce and
    commit, in the tasks) and of the driver's commits (quarantine, ledger).

    A reconstruction into a table sink (Iceberg, SQL) runs the same wave with the table's unit
    writer (:mod:`rewind.tables.unit_files`); step 4 then also commits the files of the units
    no task loaded, with their ids and counts, before the ledger (as a Kafka-source wave does)."""
    # lazy: avoids pandas / pyarrow / numpy at import
    from rewind.tables.plan import reader_of
    from rewind.tables.stage import TableStageContext
    from rewind.tables.stage import run_table_wave as run_stage

    settings, ledger, plan, run_id = wave.settings, wave.ledger, wave.plan, wave.run_id
    staging = wave.staging
    spec = plan.job_spec()
    table = spec.source.table
    assert table is not None
    facts = plan.read_plan["table"]
    into_kafka = isinstance(staging, KafkaStaging)
    if isinstance(staging, KafkaStaging) and staging.partitions != facts["partitions"]:  # 2.
        raise ReproduceError(
            f"topic {staging.topic} has {staging.partitions} partitions, the plan placed the entities on "
            f"{facts['partitions']}; plan again"
        )
    reader = reader_of(settings, spec)
    chosen = choose(table, facts.get("key_type"), pinned=facts.get("ids_digest"))
    ranges = [KeyRange.from_dict(r) for r in facts["ranges"]]
    attempted = frozenset(u.unit_id for u in ledger.pending_units(run_id) if u.attempts > 0)
    ledger.mark_running(run_id, wave.unit_ids)
    spark = session(settings)
    ctx = TableStageContext(
        run_id=run_id,
        spec_json=spec.model_dump_json(by_alias=True),
        output_schema_b64=plan.output_schema_b64,
        quarantine_folder=wave.qsink.data_folder(wave.qstaging),
        reader=reader,
        selection=chosen.selection,
        units=wave.units,
        ranges=tuple((ranges[u.partition].lo, ranges[u.partition].hi) for u in wave.units),
        partitions=int(facts["partitions"]),
        partitioner=facts.get("partitioner") or "murmur2",
        skip_partitions=tuple(table.skip_partitions),
        max_records_per_second=spec.guards.max_records_per_second,
        rate_limit_id=run_id,
        progress=wave.live.channel(spark),
        attempted=attempted,
    )
    writer = _unit_writer(wave)
    faults.after(float(os.environ.get("REWIND_FAULT_DELAY", "2")), "mid-wave")
    try:  # 3.
        t_spark = time.monotonic()
        limit = RateLimit(ctx.max_records_per_second) if ctx.max_records_per_second else None
        with wave.live.wave(wave.base, wave.units), pace_server_for(spark, limit) as pace:
            paced = dataclasses.replace(ctx, pace=pace)
            if table.reconstruct is not None:  # states in, events out: the same wave, another unit body
                # lazy: avoids pandas / pyarrow / numpy at import
                from rewind.tables.reconstruct_stage import ReconstructPlanFacts, run_reconstruct_wave

                facts_r = ReconstructPlanFacts(tuple(facts.get("snapshots") or ()))
                outputs = run_reconstruct_wave(spark, paced, writer, facts_r)
            else:
                outputs = run_stage(spark, paced, writer)
        t_commit = time.monotonic()
    except Exception as exc:
        try:
            ledger.fail_units(run_id, wave.unit_ids, error_line(exc))
        except Exception:
            log.warning("could not record the failed units of run %s", run_id, exc_info=True)
        raise
    units = {  # a Kafka unit was committed by its task; a table's unit, when its task loaded it
        u: UnitOutput(
            u,
            list(out.written.get("data_files") or []),
            out.quarantine_files,
            out.counts,
            loaded=into_kafka or bool(out.written.get("loaded")),
        )
        for u, out in outputs.items()
    }
    ids = commit_wave(wave, units)  # 4.
    if wave.timings is not None:
        wave.timings.append(
            {
                "units": len(ids),
                "records": sum(outputs[u].counts.records_read for u in ids),
                "spark_s": t_commit - t_spark,
                "commit_s": time.monotonic() - t_commit,
            }
        )
    return {u: outputs[u].counts.to_dict() for u in ids}


def _unit_writer(wave: Wave) -> Any:
    """The tasks' unit writer: a Kafka transaction per unit, or a table sink's file per unit
    (loaded by its task into PostgreSQL, committed by the driver into Iceberg or SQLite)."""
    plan, staging = wave.plan, wave.staging
    spec = plan.job_spec()
    table, kafka = spec.source.table, spec.sink.kafka
    assert table is not None
    if isinstance(staging, KafkaStaging):
        assert kafka is not None
        return UnitWriter(
            conf=wave.settings.kafka_config(),
            staging=staging.to_dict(),
            key=tuple(spec.key),
            partitioner=kafka.partitioner,
            skip_partitions=tuple(table.skip_partitions),
        )

    return FileUnitWriter(
        run_id=wave.run_id,
        data_folder=wave.sink.data_folder(staging),
        schema_b64=plan.output_schema_b64,
        store=active_store(),
        loader=task_loads.loader_for(wave.sink, staging, plan),
    )
