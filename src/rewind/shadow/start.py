"""``rewind shadow start SPEC``: history into v2, then the live tail, in one restartable process.

Steps, each safe to repeat after a kill -9 anywhere (a folded read model's fold is first
checked to take its own rows, :mod:`rewind.shadow.fold_check`, before anything is written):

1. the shadow's ledger row (name = the job's name, with the spec's fingerprint and a run id
   chosen once): a restart finds it and continues;
2. ``history``: the job's plan over archive + log is run as ``rewind run`` runs it, into the
   run's staging — v2, created like the target but empty (the SQL sink's ``copy_target``
   off); a killed run is resumed (its committed units are kept, the rest redone);
3. the history's end per partition (the plan's resolved ``latest``) is recorded and the
   shadow moves to ``tailing``;
4. ``tailing``: a streaming query continues on the live topic from there, its checkpoint in
   ``<state>/shadow/<name>/checkpoint``, every micro-batch committed like a unit
   (:mod:`rewind.shadow.tail`); the lag is sampled into the ledger every ``sample_s``.

The tail runs until ``stop(progress)`` says so (the CLI: Ctrl-C or ``--max-seconds``); the
shadow stays ``tailing`` and a later ``start`` continues it. A lease on ``shadow:<name>``
keeps a second process from tailing the same shadow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.core.console import QUIET, Console
from rewind.job.components import make_sink, quarantine_table
from rewind.job.service import load_plan, open_ledger, resume_job, run_job, usable_plan
from rewind.ledger import NotFound, new_run_id
from rewind.ledger.shadows import ShadowEvent, ShadowStore
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.shadow.exceptions import ShadowError
from rewind.shadow.fold_check import check_fold_takes_own_rows
from rewind.shadow.lag import PartitionLag, caught_up, sample
from rewind.shadow.tail import TailWriter
from rewind.sinks.iceberg import IcebergSink, IcebergStaging
from rewind.spark import session
from rewind.spark.shadow_tail import start_tail
from rewind.spark.stream_restarts import RestartPolicy, StreamSupervisor

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowRecord
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class TailProgress:
    """What ``stop`` is shown after every lag sample."""

    seconds: float
    batches: int
    replayed: int
    records: int
    lag: list[PartitionLag]
    caught_up: bool = False

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.lag), default=0)


def checkpoint_dir(settings: Settings, name: str) -> str:
    return str(settings.state_path / "shadow" / name / "checkpoint")


@emits(lineage.shadow, parent=True)
def start_shadow(
    settings: Settings,
    spec: JobSpec,
    *,
    console: Console = QUIET,
    stop: Callable[[TailProgress], bool] | None = None,
    sample_s: float = 2.0,
) -> dict[str, Any]:
    """Run steps 1-4 (see the module docstring); returns the shadow's facts when the tail stops."""
    config = spec.shadow
    if config is None:
        raise ShadowError(f"spec {spec.name} has no shadow: section; add one (shadow: {{live_group: ...}})")
    check_fold_takes_own_rows(settings, spec)  # a folded v2 is folded again with each micro-batch
    ledger = open_ledger(settings)
    try:
        store = ShadowStore(ledger.engine)
        record = store.create_or_get(
            spec.name,
            run_id=new_run_id(),
            fingerprint=spec.fingerprint(),
            checkpoint=checkpoint_dir(settings, spec.name),
        )
        if record.state == "history":
            record = _history(settings, ledger, store, record, spec, console)
        if record.state != "tailing":
            raise ShadowError(
                f"shadow {spec.name} is {record.state}; only a tailing shadow is started again "
                "(`rewind shadow status` shows it)"
            )
        return _tail(settings, ledger, store, record, console, stop, sample_s)
    finally:
        ledger.close()


def _history(
    settings: Settings,
    ledger: Ledger,
    store: ShadowStore,
    record: ShadowRecord,
    spec: JobSpec,
    console: Console,
) -> ShadowRecord:
    try:
        run = ledger.get_run(record.run_id)
    except NotFound:
        run = None
    if run is None:
        console.stage("history", f"run the history of {spec.name} into v2 (run {record.run_id})")
        run_job(settings, spec, console=console, run_id=record.run_id)
    elif run.state != "succeeded":
        console.stage("history", f"resume the history run {record.run_id} ({run.state})")
        resume_job(settings, record.run_id, console=console, spec=spec)
    plan = _plan(ledger, record.run_id)
    end = history_end(plan)
    return store.move(
        record.name, ["history"], "tailing", history_end=end, event=("history-done", {"history_end": end})
    )


def _plan(ledger: Ledger, run_id: str) -> JobPlan:
    return load_plan(ledger, ledger.get_run(run_id).plan_id)


def history_end(plan: JobPlan) -> dict[str, dict[str, int]]:
    """Where the history run ended per partition: the plan's resolved window ends."""
    parts = (plan.read_plan.get("history") or {}).get("partitions") or []
    out: dict[str, dict[str, int]] = {}
    for p in parts:
        out.setdefault(str(p["topic"]), {})[str(int(p["partition"]))] = int(p["end"])
    if not out:
        raise ShadowError(f"plan {plan.plan_id} is not a history plan; a shadow needs source.history")
    return out


def _tail(
    settings: Settings,
    ledger: Ledger,
    store: ShadowStore,
    record: ShadowRecord,
    console: Console,
    stop: Callable[[TailProgress], bool] | None,
    sample_s: float,
) -> dict[str, Any]:
    run = ledger.get_run(record.run_id)
    plan = usable_plan(settings, ledger, run.plan_id, how="the original spec (rewind shadow start SPEC)")
    spec = plan.job_spec()
    assert spec.shadow is not None and record.history_end is not None
    sink = make_sink(settings, spec)
    if run.staging is None:
        raise ShadowError(
            f"run {run.id} of shadow {record.name} has no staging; abort the shadow and start again"
        )
    staging = sink.staging_from_dict(run.staging)
    started = time.monotonic()
    with ledger.keeper(f"shadow:{record.name}", record.run_id, spec.run.lease_ttl_s):
        writer = TailWriter(settings, plan, record.run_id, sink, staging, _quarantine(settings, plan))
        spark = session(settings)
        console.stage(
            "tail", f"follow {', '.join(spec.source.window.topics)} into v2 from {record.history_end}"
        )
        shadow, history_end = spec.shadow, record.history_end

        def start() -> Any:
            writer.reload()  # the first batch after a (re)start may be a replay of a committed one
            return start_tail(
                spark,
                kafka_conf=settings.kafka_config(),
                topics=list(spec.source.window.topics),
                start=history_end,
                checkpoint=record.checkpoint,
                trigger_s=shadow.trigger_s,
                max_offsets_per_trigger=shadow.max_offsets_per_trigger,
                on_batch=writer,
                name=f"rewind-shadow-{record.name}",
            )

        def restarted(n: int, cause: str) -> None:  # `rewind shadow status` shows them
            store.add_event(record.name, "restart", {"restart": n, "cause": cause})

        tail = StreamSupervisor(
            f"the live tail of shadow {record.name}", start, RestartPolicy.from_settings(settings), restarted
        )
        progress = None
        recent: list[ShadowEvent] = []
        try:
            while tail.running:
                time.sleep(max(1, round(sample_s)))
                if tail.error() is not None:
                    break
                lag = sample(
                    settings, spec.source.window.topics, spec.shadow.live_group, sorted(writer.known)
                )
                details = {"partitions": [p.to_dict() for p in lag]}
                store.add_event(record.name, "lag", details)
                now = ledger.clock()
                recent.append(ShadowEvent(0, now, "lag", details))
                horizon = now - timedelta(seconds=spec.shadow.caught_up_for_s + 2 * sample_s)
                recent = [e for e in recent[:-1] if e.at >= horizon] + recent[-1:]
                s = writer.stats
                progress = TailProgress(
                    time.monotonic() - started,
                    s.batches,
                    s.replayed,
                    s.counts.records_read,
                    lag,
                    caught_up(recent, spec.shadow, now)[0],
                )
                if stop is not None and stop(progress):
                    break
        finally:
            tail.stop()
        error = tail.error()
        if error is not None:
            raise ShadowError(str(error))
    s = writer.stats
    return {
        "shadow": record.name,
        "run_id": record.run_id,
        "state": store.get(record.name).state,
        "restarts": tail.count,
        "batches": s.batches,
        "replayed": s.replayed,
        "records": s.counts.records_read,
        "rows_out": s.counts.rows_out,
        "quarantined": s.counts.quarantined,
        "max_lag": progress.max_lag if progress else None,
        "caught_up": progress.caught_up if progress else False,
        "seconds": round(time.monotonic() - started, 2),
    }


def _quarantine(settings: Settings, plan: JobPlan) -> Any:
    """The run's quarantine table (the history run created it), written directly."""
    table = quarantine_table(plan.job_spec())
    return IcebergSink(load_catalog(settings), table), IcebergStaging(
        f"iceberg:{table}", table, None, None, False
    )
