"""A Kafka-source run whose tasks produce their units to the Kafka sink: the driver's part.

With the Kafka sink's task loader (:mod:`rewind.sinks.kafka.task_load`), the order of a run
becomes the re-produce's (:mod:`rewind.job.reproduce`):

1. before staging is prepared (which reads the run's bookkeeping): fence the transactions of
   units an earlier attempt started and did not finish: a killed driver's or task's open
   transaction holds ``rewind.commits`` back until the broker aborts it;
2. the reconcile marks done the units whose marker is in the log, and commits the quarantine
   files those markers name when the quarantine commit did not happen (a driver killed after
   the tasks committed);
3. per wave, the units of one source partition are read in one task, in offset order
   (:mod:`rewind.spark.unit_produce`), and each is produced with its marker in one transaction
   of its own; the driver checks the counts, commits the quarantine files, records the units no
   task produced (units without records, archive units) through the sink's own commit, and
   marks the ledger. No output row passes through the driver.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rewind.job import reproduce
from rewind.sinks.kafka.bookkeeping import KafkaStaging
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.sinks.kafka.task_load import task_loader
from rewind.spark.pace_server import PaceServer, needs_pace_server
from rewind.spark.progress_channel import driver_addresses
from rewind.spark.ratelimit import RateLimit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rewind.config import Settings
    from rewind.ledger import Ledger
    from rewind.sinks.base import Staging, StagingSink
    from rewind.sinks.iceberg import IcebergSink, IcebergStaging
    from rewind.spark.job_stage import StageContext
    from rewind.spark.pace_server import PaceAddress, PaceServer
    from rewind.spec import JobSpec


def may_load(spec: JobSpec) -> bool:
    """Can this run's tasks produce their units (a Kafka source into a transactional topic)?"""
    kafka = spec.sink.kafka
    return spec.source.table is None and kafka is not None and kafka.transactional


def fence(settings: Settings, ledger: Ledger, run_id: str, spec: JobSpec) -> None:
    """Step 1 (cheap when nothing was attempted: one ledger query)."""
    if (spec.source.table is not None and spec.sink.kafka is not None) or may_load(spec):
        reproduce.fence_attempted(settings, ledger, run_id)


def reconcile_quarantine(
    settings: Settings,
    ledger: Ledger,
    run_id: str,
    spec: JobSpec,
    staging: Staging,
    quarantine: tuple[IcebergSink, IcebergStaging],
    done_q: set[str],
) -> None:
    """Step 2's quarantine part (after the reconcile: the units it marked done may be the ones)."""
    if may_load(spec) and isinstance(staging, KafkaStaging):
        qsink, qstaging = quarantine
        reproduce.reconcile_quarantine(settings, ledger, run_id, staging, qsink, qstaging, done_q)


def with_loader(
    ctx: StageContext, sink: StagingSink[Any], staging: Staging, ledger: Ledger, spark: SparkSession
) -> StageContext:
    """The wave's context with the Kafka sink's task loader, when its tasks can produce (after
    the wave's units were marked running: a unit of an earlier attempt has 2 attempts or more)."""
    if not isinstance(sink, KafkaTopicSink):
        return ctx
    rate = ctx.max_records_per_second
    loader = task_loader(sink, staging, frozenset(), rate)
    if loader is None:
        return ctx
    wave = {u.id for u in ctx.units}
    earlier = frozenset(
        u.unit_id for u in ledger.pending_units(ctx.run_id) if u.unit_id in wave and u.attempts > 1
    )
    loader = dataclasses.replace(loader, attempted=earlier, pace=_produce_budget(spark, ctx.run_id, rate))
    # one task per source partition: its units in offset order (per-key order), tasks in parallel
    return dataclasses.replace(ctx, unit_loader=loader, whole_partitions=True, ranges_per_task=1)


_BUDGETS: dict[str, PaceServer] = {}
"""Per run, the driver's budget of produced records on a cluster: open while the process lives
(a daemon thread and a socket), so the rate holds across waves too."""


def _produce_budget(spark: SparkSession, run_id: str, rate: float | None) -> PaceAddress | None:
    """On a cluster, where the produced records' budget is kept (the read budget is the wave's)."""
    if not rate or not needs_pace_server(spark):
        return None
    server = _BUDGETS.get(run_id)
    if server is None:
        bind, advertise = driver_addresses(spark)
        server = _BUDGETS[run_id] = PaceServer(RateLimit(rate), bind, advertise)
    return server.address
