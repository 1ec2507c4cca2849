"""``rewind run`` and ``rewind resume``: execute a stored plan, exactly once per work unit.

Steps of a run, in order: the stages of :func:`rewind.job.stages.plan_stages`, which
``rewind plan`` prints and :func:`execute` walks one by one:

1. take the lease on the staging target, heartbeated for the whole run: a second run
   against the same target is refused, a crashed holder's lease expires; a refused run is
   left as it was (another process may be running it), only a new run is marked refused;
2. record the run as ``running`` in the ledger (on resume, move it back to ``running``);
3. prepare staging (an Iceberg branch or staging table) and the quarantine table;
4. reconcile: units whose output the sink already holds are marked done in the ledger
   with the counts stored in the commit (a kill between commit and ledger update loses
   nothing and duplicates nothing);
5. run the pending units in waves; per wave: offsets that left Kafka since the plan fail the
   run with the lost ranges (:mod:`rewind.job.retention`); Spark reads, processes and writes files;
   the driver checks the conservation law per unit, commits the quarantine files, then the
   output files with the unit ids and counts in the same commit, then updates the ledger
   (:mod:`rewind.job.event_wave`);
6. read models only (``translate.fold``, or ``replace-window`` on an output column): fold
   the run's rows per key across the window and drop rows outside the replaced window, in
   one commit marked with the run (:mod:`rewind.job.finalize`; for a PostgreSQL sink the
   units of step 5 commit their partial rows to a scratch Iceberg table instead);
7. check the conservation law over the whole run, mark it ``succeeded``, release the lease.

Any failure marks the run ``failed`` (Ctrl-C: ``interrupted``) with the error; ``rewind
resume RUN`` continues from step 1.

A re-produce (``source.table``) walks the same stages, but its units are committed by the
Spark tasks themselves, one Kafka transaction each, before the driver commits their
quarantine files: :mod:`rewind.job.reproduce` says in which order and why; so are a Kafka
source's units into a transactional Kafka topic (:mod:`rewind.job.kafka_loads`) or a
PostgreSQL staging table (COPY per unit, :mod:`rewind.job.task_loads`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.core.console import QUIET, Console, RunProgress
from rewind.core.counts import RecordCounts
from rewind.errors import RewindError, error_line
from rewind.job import kafka_loads, quarantine_guard, reproduce, task_loads
from rewind.job.components import make_sink, quarantine_table
from rewind.job.event_wave import run_event_wave
from rewind.job.finalize import finalize_run, parts_in_scratch, parts_sink
from rewind.job.live import LiveProgress
from rewind.job.merge import merge_run
from rewind.job.realtime import SPEED_AUDIT, first_look, planned_live, run_meter, run_speed
from rewind.job.retention import OffsetsLostError, check_still_in_kafka
from rewind.job.stages import (
    Conclude,
    Finalize,
    MergeRows,
    PrepareStaging,
    Reconcile,
    RunWave,
    TakeLease,
    default_wave_size,
    plan_stages,
)
from rewind.job.wave import Wave
from rewind.openlineage.jobs import JobRun
from rewind.sinks.iceberg import IcebergSink, IcebergStaging
from rewind.spark import session
from rewind.spark.ratelimit import default_state_dir, remove_shared_state
from rewind.spark.topology import is_connect

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.kafka.live_rate import LogEnds
    from rewind.ledger import Ledger, LedgerUnavailable
    from rewind.sinks.base import Staging, StagingSink
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)


class ConservationViolated(RewindError):
    """records read != emitted + quarantined + filtered for some unit: the run fails."""


@dataclass
class RunOutcome:
    run_id: str
    state: str
    plan_id: str
    counts: RecordCounts
    staging: dict[str, Any]
    quarantine_table: str
    seconds: float
    units: int
    waves: int = 0
    notes: list[str] = field(default_factory=list)
    folded: dict[str, Any] | None = None
    merged: dict[str, int] | None = None
    live: dict[str, Any] | None = None
    """This execution's speed against the live stream (:func:`rewind.job.realtime.run_speed`)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"folded": self.folded} if self.folded is not None else {}),
            **({"live": self.live} if self.live is not None else {}),
            **({"merged": self.merged} if self.merged is not None else {}),
            "run_id": self.run_id,
            "state": self.state,
            "plan_id": self.plan_id,
            "records_read": self.counts.records_read,
            "emitted": self.counts.emitted,
            "rows_out": self.counts.rows_out,
            "quarantined": self.counts.quarantined,
            "filtered": self.counts.filtered,
            "quarantine_reasons": self.counts.reasons,
            "staging": self.staging,
            "quarantine_table": self.quarantine_table,
            "seconds": round(self.seconds, 2),
            "records_per_s": round(self.counts.records_read / self.seconds) if self.seconds > 0 else None,
            "units": self.units,
            "waves": self.waves,
        }


def start_run(ledger: Ledger, plan: JobPlan, target: str, run_id: str | None = None) -> str:
    """Store the plan (idempotent) and record a new run of it; returns the run id."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import NotFound
    from rewind.ledger.models import unit_id

    try:
        ledger.get_plan(plan.plan_id)
    except NotFound:
        ledger.save_plan(plan.plan_id, plan.name, plan.spec, plan.to_dict())
    record = ledger.create_run(plan.plan_id, plan.name, target, run_id=run_id)
    ledger.add_units(record.id, [u.range for u in plan.units])
    assert all(unit_id(u.topic, u.partition, u.start, u.end) == u.id for u in plan.units)
    ledger.audit(
        record.id, "run", {"plan_id": plan.plan_id, "units": len(plan.units), "offsets": plan.offsets}
    )
    return record.id


def execute(
    settings: Settings,
    ledger: Ledger,
    plan: JobPlan,
    run_id: str,
    *,
    console: Console = QUIET,
    units_per_wave: int | None = None,
    after_commit: Callable[[list[str]], None] | None = None,
    timings: list[dict[str, Any]] | None = None,
) -> RunOutcome:
    """Run (or resume) ``run_id`` of ``plan`` to the end. See the module docstring for the steps.

    ``timings`` (``rewind rehearse``) hears one entry per wave: its units, records,
    seconds in Spark (read, decode, translate, write in the tasks) and seconds of its commits."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import LeaseHeld, LedgerUnavailable

    spec = plan.job_spec()
    started = time.monotonic()
    watched = console is not QUIET  # the live rate is shown, never needed: no looks for nobody
    live = LiveProgress(
        console,
        started,
        live_rate=planned_live(plan).get("records_per_second"),
        live_meter=run_meter(settings, plan) if watched else None,
    )
    live.run_started(_progress(ledger, plan, run_id, started))  # the run id first, before Spark starts
    run = _RunContext(log_ends=first_look(settings, plan))
    sink = make_sink(settings, spec)
    interrupts = _Interrupts(settings)
    waiting = {u.unit_id for u in ledger.pending_units(run_id)}
    stages = plan_stages(
        plan,
        target=sink.target,
        wave_size=units_per_wave or default_wave_size(),
        done=[u.id for u in plan.units if u.id not in waiting],
    )
    units = {u.id: u for u in plan.units}
    lineage = JobRun(settings, spec, plan.plan_id, run_id, quarantine_table(spec)).start()  # docs/lineage.md
    try:
        with contextlib.ExitStack() as held:
            held.callback(live.close)
            for stage in stages:
                console.stage(stage.name, stage.describe())
                if isinstance(stage, TakeLease):
                    # the lease for the whole run; only then is the run `running` (a refused
                    # resume must not touch a live run)
                    run.keeper = held.enter_context(ledger.keeper(stage.target, run_id, spec.run.lease_ttl_s))
                    held.enter_context(interrupts)
                    # read under the lease, so that no other attempt can come between: a run
                    # still `planned` has never had an attempt past here, nor staging prepared
                    run.new_run = ledger.get_run(run_id).state == "planned"
                    ledger.set_state(run_id, "running")
                elif isinstance(stage, PrepareStaging):
                    # a killed task's open transaction holds the bookkeeping back
                    kafka_loads.fence(settings, ledger, run_id, spec)
                    schema = plan.output_schema()
                    run.staging = sink.prepare(run_id, schema, new_run=run.new_run)
                    run.qsink, run.qstaging = _quarantine(settings, stage.quarantine_table, run_id)
                    ledger.set_state(run_id, "running", staging=run.staging.to_dict())
                    # units commit to the sink, or (a fold into a one-row-per-key sink) to a scratch table
                    run.parts = _parts(settings, spec, run_id, schema)
                elif isinstance(stage, Reconcile):
                    unit_sink, unit_staging = run.unit_target(sink)
                    # a re-produce's units commit only from tasks of a started attempt: none, nothing to read
                    fresh = spec.source.table is not None and not reproduce.any_attempted(ledger, run_id)
                    if not fresh:
                        _reconcile(ledger, unit_sink, unit_staging, run_id)
                    run.done_q = run.quarantine()[0].committed_units(run.quarantine()[1], run_id)
                    kafka_loads.reconcile_quarantine(
                        settings, ledger, run_id, spec, unit_staging, run.quarantine(), run.done_q
                    )
                    if spec.source.table is None or spec.sink.kafka is None:  # units tasks loaded,
                        # their quarantine not committed (a PostgreSQL sink's)
                        task_loads.reconcile_quarantine(ledger, run_id, unit_sink, unit_staging, run)
                    if spec.source.table is not None and spec.sink.kafka is not None and not fresh:
                        qsink, qstaging = run.quarantine()
                        reproduce.reconcile_quarantine(
                            settings, ledger, run_id, unit_staging, qsink, qstaging, run.done_q  # type: ignore[arg-type]
                        )
                    run.pending = {u.unit_id for u in ledger.pending_units(run_id)}
                    run.before = ledger.unit_counts(run_id).counts  # the guard looks at this attempt's
                elif isinstance(stage, RunWave):
                    assert run.keeper is not None
                    run.keeper.check()  # fenced: a lost lease stops the run before it writes again
                    todo = tuple(units[uid] for uid in stage.unit_ids if uid in run.pending)
                    if not todo:  # the reconcile found all of it in the sink already
                        continue
                    try:  # every unit still to run, so that one failure names all that is lost
                        check_still_in_kafka(settings.kafka_config(), [units[u] for u in sorted(run.pending)])
                    except OffsetsLostError as lost:
                        ledger.audit(run_id, "offsets-lost", {"ranges": lost.to_dict()})
                        raise
                    unit_sink, unit_staging = run.unit_target(sink)
                    qsink, qstaging = run.quarantine()
                    wave = Wave(
                        settings=settings, ledger=ledger, plan=plan, run_id=run_id, units=todo,
                        sink=unit_sink, staging=unit_staging, qsink=qsink, qstaging=qstaging,
                        done_q=run.done_q, live=live, timings=timings,
                        base=_progress(ledger, plan, run_id, live.started),  # before the wave
                    )
                    if spec.source.table is not None:
                        reproduce.run_table_wave(wave)
                    else:
                        for source, n in run_event_wave(wave, run.latest).items():
                            run.bytes_read[source] = run.bytes_read.get(source, 0) + n
                    run.waves += 1
                    run.pending -= set(wave.unit_ids)
                    if after_commit is not None:
                        after_commit(wave.unit_ids)
                    live.committed(_progress(ledger, plan, run_id, started))
                    quarantine_guard.enforce(ledger, spec.guards, run_id, run.before)  # stops a bad run
                    lineage.wave(ledger.unit_counts(run_id).counts.to_dict(), run.bytes_read)
                elif isinstance(stage, MergeRows):
                    assert run.staging is not None
                    run.merged = merge_run(
                        settings, ledger, plan, sink, run.staging, run_id, run.quarantine(), run.parts
                    )
                    if run.parts is not None:  # merged into the sink: the scratch rows are not needed
                        run.parts[0].cleanup(run.parts[1])
                elif isinstance(stage, Finalize):
                    # read models: fold the run's rows per key, keep the replaced window (once)
                    assert run.staging is not None
                    run.folded = finalize_run(settings, ledger, plan, sink, run.staging, run_id, run.parts)
                    if run.parts is not None:  # folded into the sink: the partial rows are not needed
                        run.parts[0].cleanup(run.parts[1])
                elif isinstance(stage, Conclude):
                    assert run.staging is not None
                    # lazy: avoids sqlalchemy at import
                    from rewind.job.held import check_staging_held  # a broker may lose what it acknowledged

                    check_staging_held(ledger, sink, run.staging, run_id)
                    outcome = _conclude(settings, ledger, plan, run_id, run, started)
                    lineage.complete(outcome.counts.to_dict(), run.bytes_read, outcome.staging)
                    return outcome
        raise AssertionError("the stages of a run end with Conclude")  # plan_stages guarantees it
    except LeaseHeld as exc:
        # nothing ran; a new run fails, a run another process holds is not ours to change
        if ledger.get_run(run_id).state == "planned":
            ledger.set_state(run_id, "refused", error=error_line(exc))
        lineage.fail(exc)
        raise
    except KeyboardInterrupt:
        ledger.set_state(run_id, "interrupted", error=INTERRUPTED)
        lineage.abort()
        raise
    except Exception as exc:
        if interrupts.seen:  # Ctrl-C cancelled Spark's job, whose error surfaced here instead
            ledger.set_state(run_id, "interrupted", error=INTERRUPTED)
            lineage.abort()
            raise KeyboardInterrupt from exc
        try:
            ledger.set_state(run_id, "failed", error=error_line(exc))
        except LedgerUnavailable as gone:  # left `running`: a resume takes over from this process
            lineage.fail(exc)
            raise _ledger_lost(run_id, gone) from exc
        lineage.fail(exc)
        if isinstance(exc, LedgerUnavailable):
            raise _ledger_lost(run_id, exc) from exc
        raise


def _ledger_lost(run_id: str, exc: LedgerUnavailable) -> LedgerUnavailable:
    """The one line of a run the ledger's outage stopped (:mod:`rewind.ledger.outage`)."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import LedgerUnavailable

    return LedgerUnavailable(f"run {run_id} stopped: {exc}; `rewind resume {run_id}` once it is back")


@dataclass
class _RunContext:
    """What the stages of one run hand to the stages after them."""

    keeper: Any = None
    new_run: bool = False  # no attempt took the lease (and prepared staging) before this one
    staging: Staging | None = None
    qsink: IcebergSink | None = None
    qstaging: IcebergStaging | None = None
    parts: tuple[IcebergSink, IcebergStaging] | None = None
    done_q: set[str] = field(default_factory=set)
    pending: set[str] = field(default_factory=set)
    waves: int = 0
    folded: dict[str, Any] | None = None
    merged: dict[str, int] | None = None
    latest: dict[str, Any] = field(default_factory=dict)
    bytes_read: dict[str, int] = field(default_factory=dict)
    """Record bytes this execution read per source (``kafka``, ``archive``): a resume counts its own."""
    before: RecordCounts = field(default_factory=RecordCounts)
    """The counts of the units done before this execution's waves (:mod:`rewind.job.quarantine_guard`)."""
    log_ends: LogEnds | None = None
    """The log ends of the topics read as this execution started (its speed against them)."""

    def unit_target(self, sink: StagingSink[Any]) -> tuple[StagingSink[Any], Staging]:
        if self.parts is not None:
            return self.parts
        assert self.staging is not None, "PrepareStaging runs first"
        return sink, self.staging

    def quarantine(self) -> tuple[IcebergSink, IcebergStaging]:
        assert self.qsink is not None and self.qstaging is not None, "PrepareStaging runs first"
        return self.qsink, self.qstaging


def _conclude(
    settings: Settings, ledger: Ledger, plan: JobPlan, run_id: str, run: _RunContext, started: float
) -> RunOutcome:
    """The last stage: the conservation law over the whole run, this execution's speed against
    the live stream (audited as ``live-speed``), then ``succeeded``."""
    counts = ledger.unit_counts(run_id).counts
    if run.merged is not None:  # the merge's decisions, one per output row
        counts = counts.merge(RecordCounts(merge_decisions=run.merged))
    if not counts.balanced:
        merged = sum(counts.merge_decisions.values())
        merged_text = f"; merge decisions {merged} != rows out {counts.rows_out}" if merged else ""
        raise ConservationViolated(
            f"run {run_id}: read {counts.records_read} != emitted {counts.emitted} + quarantined "
            f"{counts.quarantined} + filtered {counts.filtered}{merged_text}"
        )
    _forget_pacing(run_id)
    speed = run_speed(settings, run.log_ends, counts.records_read - run.before.records_read)
    if speed is not None:
        ledger.audit(run_id, SPEED_AUDIT, speed)
    ledger.set_state(run_id, "succeeded", totals=counts.to_dict())
    ledger.audit(run_id, "run-succeeded", {**counts.to_dict(), "bytes_read": run.bytes_read})
    assert run.staging is not None
    return RunOutcome(
        run_id,
        "succeeded",
        plan.plan_id,
        counts,
        run.staging.to_dict(),
        run.quarantine()[1].table,
        time.monotonic() - started,
        len(plan.units),
        run.waves,
        folded=run.folded,
        merged=run.merged,
        live=speed,
    )

INTERRUPTED = "interrupted (Ctrl-C); `rewind resume` continues"


class _Interrupts:
    """Notes a Ctrl-C during the run, then lets the handler already installed act on it.

    PySpark's own SIGINT handler cancels the running jobs, and the cancellation reaches the
    driver as a Py4J error rather than ``KeyboardInterrupt``; this says it was the user's
    Ctrl-C, so the run is ``interrupted``, not ``failed``. The Spark session is started first,
    so its handler is the one chained to. A session started in another thread
    (:func:`rewind.spark.session.start_early`) has no such handler: the jobs of a local
    session are cancelled here first either way (twice is harmless).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen = False
        self.previous: Any = None
        self.spark: Any = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self.spark = session(self.settings)  # PySpark's handler (if local, started here) first
            self.previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        if self.spark is not None and not is_connect(self.spark):
            self.spark.sparkContext.cancelAllJobs()
        if callable(self.previous):
            self.previous(signum, frame)
        elif self.previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _forget_pacing(run_id: str) -> None:
    """Remove the run's shared pacing files, of reads and of produced records (a resume starts anew)."""
    for name in ("read", "produce"):
        remove_shared_state(default_state_dir(), f"{name}-{run_id}")


def _quarantine(settings: Settings, table: str, run_id: str) -> tuple[IcebergSink, IcebergStaging]:
    """The quarantine table (created on first use); written directly, never staged."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import NoSuchTableError

    # lazy: avoids pandas / pyarrow / numpy at import
    from rewind.translate.quarantine import QUARANTINE_SCHEMA

    catalog = load_catalog(settings)
    try:
        catalog.load_table(table)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(table.rpartition(".")[0])
        try:
            catalog.create_table(table, schema=QUARANTINE_SCHEMA)
        except Exception:  # another run created it first
            catalog.load_table(table)
    return IcebergSink(catalog, table), IcebergStaging(f"iceberg:{table}", table, None, None, False)


def _reconcile(ledger: Ledger, sink: StagingSink[Any], staging: Staging, run_id: str) -> None:
    """Step 4: units committed in the sink but not done in the ledger become done."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger.models import UnitResult

    waiting = {u.unit_id for u in ledger.pending_units(run_id)}
    held = sink.committed_units(staging, run_id)
    recovered = waiting & held
    if not recovered:
        return
    counts = sink.committed_counts(staging, run_id)
    results = [UnitResult.of(uid, RecordCounts.from_dict(counts.get(uid) or {})) for uid in sorted(recovered)]
    ledger.complete_units(run_id, results)
    ledger.audit(run_id, "reconcile", {"units_recovered_from_sink": len(recovered)})


def _parts(
    settings: Settings, spec: JobSpec, run_id: str, schema: Any
) -> tuple[IcebergSink, IcebergStaging] | None:
    """The scratch table of a fold's partial rows, when the sink keeps one row per key."""
    if not parts_in_scratch(spec):
        return None
    sink = parts_sink(settings, spec)
    return sink, sink.prepare(run_id, schema)


def _progress(ledger: Ledger, plan: JobPlan, run_id: str, started: float) -> RunProgress:
    """The committed progress of the run, from the ledger."""
    totals = ledger.unit_counts(run_id)
    waiting = {u.unit_id for u in ledger.pending_units(run_id)}
    left = sum(u.end - u.start for u in plan.units if u.id in waiting)
    return RunProgress(
        run_id, len(plan.units), totals.done, plan.offsets, totals.counts, started, offsets_left=left
    )
