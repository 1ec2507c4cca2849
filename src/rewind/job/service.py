"""The job operations the CLI and the Python API share: plan, run, resume, show.

``rewind.job.service`` is the Python API: build a :class:`rewind.spec.JobSpec` in code (or
load one with :func:`rewind.spec.load_spec`) and call these functions.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.console import QUIET, Console
from rewind.errors import RewindError
from rewind.job import quarantine_guard
from rewind.job.components import make_sink
from rewind.job.merge import recorded_merge
from rewind.job.plan import JobPlan, PlanRefused
from rewind.job.planner import build_plan
from rewind.job.run_status import shown_state
from rewind.job.runner import RunOutcome, execute, start_run
from rewind.job.spec_secrets import resolve_plan
from rewind.job.stages import Stage, default_wave_size, plan_stages
from rewind.kafka import clients
from rewind.ledger import Ledger, NotFound
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rewind.config import Settings
    from rewind.spec import JobSpec


def open_ledger(settings: Settings) -> Ledger:
    return Ledger.open(settings.ledger, retry_s=settings.ledger_retry_s)


@emits(lineage.plan, lineage.planned)
def plan_job(settings: Settings, spec: JobSpec, ledger: Ledger | None = None) -> JobPlan:
    """Build the plan and store it in the ledger (the only write planning does).

    The id depends only on the spec and the units; when it is stored already (the same spec
    over the same log), the stored plan is kept and the fresh one, equal but for its
    measured estimates, is returned.
    """
    plan = build_plan(settings, spec)
    own = ledger is None
    ledger = ledger or open_ledger(settings)
    try:
        try:
            ledger.get_plan(plan.plan_id)
        except NotFound:
            ledger.save_plan(plan.plan_id, plan.name, plan.spec, plan.to_dict())
        ledger.audit(None, "plan", {"plan_id": plan.plan_id, "name": plan.name, "ok": plan.ok})
    finally:
        if own:
            ledger.close()
    return plan


def load_plan(ledger: Ledger, plan_id: str) -> JobPlan:
    """The stored plan as the ledger holds it: secrets masked (``***``); see :func:`usable_plan`."""
    record = ledger.get_plan(plan_id)
    return JobPlan.from_dict(record.plan)


def usable_plan(
    settings: Settings,
    ledger: Ledger,
    plan_id: str,
    *,
    spec: JobSpec | None = None,
    needed: tuple[str, ...] = ("",),
    how: str = "",
) -> JobPlan:
    """The stored plan with the secrets of its spec put back (:mod:`rewind.job.spec_secrets`):
    from ``spec`` (the original, checked to be the same job), the settings or libpq's
    PGPASSWORD/passfile; one line naming the field when a value under ``needed`` cannot be."""
    return resolve_plan(load_plan(ledger, plan_id), settings, original=spec, needed=needed, how=how)


def run_job(
    settings: Settings,
    spec_or_plan: JobSpec | JobPlan | str,
    *,
    console: Console = QUIET,
    run_id: str | None = None,
    units_per_wave: int | None = None,
    timings: list[dict[str, Any]] | None = None,
    accepted_risk: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """Plan (or take a plan made by the caller, or load a stored plan by id), refuse on a failed
    gate, then execute (``timings``:
    see :func:`rewind.job.runner.execute`). ``accepted_risk`` (the readiness gate's, see
    :func:`rewind.ops.readiness.gate_run`) is recorded in the run's audit before it executes."""
    with _ledger(settings) as ledger:
        if isinstance(spec_or_plan, str):
            plan = usable_plan(settings, ledger, spec_or_plan, how="the original spec (rewind run SPEC)")
        elif isinstance(spec_or_plan, JobPlan):  # planned (and stored) by the caller
            plan = spec_or_plan
        else:
            plan = plan_job(settings, spec_or_plan, ledger)
        if not plan.ok:
            gate = plan.failed_gates()[0]
            raise PlanRefused(f"plan {plan.plan_id} refused by gate {gate.name}: {gate.detail}")
        _check_broker(settings, plan)  # a stored plan was checked when it was made, not now
        target = make_sink(settings, plan.job_spec()).target
        rid = start_run(ledger, plan, target, run_id)
        if accepted_risk:
            ledger.audit(rid, "accept-risk", dict(accepted_risk))
        faults.point("after-plan")
        return execute(
            settings, ledger, plan, rid, console=console, units_per_wave=units_per_wave, timings=timings
        )


def resume_job(
    settings: Settings,
    run_id: str,
    *,
    console: Console = QUIET,
    units_per_wave: int | None = None,
    spec: JobSpec | None = None,
    timings: list[dict[str, Any]] | None = None,
) -> RunOutcome:
    """Finish an interrupted or failed run: only units not yet committed are redone.

    The stored spec's secrets are put back first (``spec``: the original spec, which must be the
    run's; else the settings or PGPASSWORD), before the broker check and the lease."""
    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        if run.state in ("succeeded", "promoted", "rolled_back"):
            raise RewindError(f"run {run_id} is {run.state}; there is nothing to resume")
        how = f"the original spec (rewind resume {run_id} --spec SPEC)"
        changed: dict[str, Any] = {}
        if spec is not None:  # the quarantine guard is the one thing a resume may change
            spec, changed = quarantine_guard.guard_change(spec, load_plan(ledger, run.plan_id).spec)
        plan = usable_plan(settings, ledger, run.plan_id, spec=spec, how=how)
        if changed:
            plan = dataclasses.replace(plan, spec=quarantine_guard.with_guards(plan.spec, changed))
            ledger.audit(run_id, "guard-changed", changed)
        _check_broker(settings, plan)
        ledger.audit(run_id, "resume", {"from_state": run.state})
        return execute(
            settings, ledger, plan, run_id, console=console, units_per_wave=units_per_wave, timings=timings
        )


def _check_broker(settings: Settings, plan: JobPlan) -> None:
    """Fail in one line, within ~10 s, when a run needs the broker and it does not answer:
    before the run is recorded, its lease taken or its staging prepared (nothing is created).
    The same :class:`~rewind.errors.BrokerUnreachable` that ``rewind plan`` gives."""
    spec = plan.job_spec()
    if any(u.source == "kafka" for u in plan.units) or spec.sink.kafka is not None:
        clients.cluster_metadata(settings.kafka_config(), timeout_s=10.0)


def run_stages(settings: Settings, plan: JobPlan) -> list[Stage]:
    """The stages a run of ``plan`` will walk (as :func:`execute` does), for ``rewind plan``."""
    target = make_sink(settings, plan.job_spec()).target
    return plan_stages(plan, target=target, wave_size=default_wave_size())


def show_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """Everything about one run; ``state`` says ``stale`` / ``possibly-dead`` for a running run
    whose lease says nobody runs it (:mod:`rewind.job.run_status`), ``ledger_state`` what the
    ledger holds."""
    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        totals = ledger.unit_counts(run_id)
        units = ledger.units(run_id)
        history = ledger.audit_log(run_id)
        lease = ledger.lease(run.target) if run.state == "running" else None
        shown = shown_state(run.state, run.id, lease, ledger.clock())
        cleaned = [e for e in history if e.action == "cleanup"]
        reports = [e.details.get("report") for e in history if e.action == "verify" and e.details]
        risks = [e for e in history if e.action == "accept-risk"]
        return {
            "run_id": run.id,
            "name": run.name,
            "plan_id": run.plan_id,
            "state": shown.state,
            "state_detail": shown.detail,
            "ledger_state": run.state,
            "lease": shown.lease_facts(lease),
            "target": run.target,
            "user": run.user,
            "created_at": run.created_at.isoformat(),
            "started_at": run.started_at.isoformat() if run.started_at else None,
            "finished_at": run.finished_at.isoformat() if run.finished_at else None,
            "error": run.error,
            "staging": run.staging,
            "staging_state": "cleaned" if cleaned else ("present" if run.staging else "none"),
            "report": reports[-1] if reports else None,  # the last verify's report files
            # `rewind run --accept-risk REASON`: the red readiness areas run anyway, and why
            "accepted_risk": (
                {
                    "reason": risks[-1].details.get("reason"),
                    "red": risks[-1].details.get("red", []),
                    "user": risks[-1].user,
                    "at": risks[-1].at.isoformat(),
                }
                if risks
                else None
            ),
            "records_read": totals.records_read,
            "emitted": totals.emitted,
            "rows_out": totals.rows_out,
            "quarantined": totals.quarantined,
            "filtered": totals.filtered,
            "quarantine_reasons": totals.reasons,
            "merge": recorded_merge(ledger, run_id),
            "units_total": totals.units,
            "units_by_state": totals.by_state,
            "units": [
                {
                    "unit_id": u.unit_id,
                    "state": u.state,
                    "attempts": u.attempts,
                    "records_read": u.records_read,
                    "rows_out": u.rows_out,
                    "quarantined": u.quarantined,
                    "filtered": u.filtered,
                }
                for u in units
            ],
            # what happened to the run, oldest first: promotions and rollbacks carry what was
            # swapped and what it replaced (snapshot ids, table names, topic offsets)
            "history": [
                {"at": e.at.isoformat(), "action": e.action, "user": e.user, "details": e.details}
                for e in history
            ],
        }


def list_runs(settings: Settings, limit: int = 20) -> list[dict[str, Any]]:
    """The latest runs, each with its state as :func:`show_run` shows it."""
    with _ledger(settings) as ledger:
        now = ledger.clock()
        out = []
        for r in ledger.list_runs(limit):
            lease = ledger.lease(r.target) if r.state == "running" else None
            shown = shown_state(r.state, r.id, lease, now)
            out.append(
                {
                    "run_id": r.id,
                    "name": r.name,
                    "state": shown.state,
                    "state_detail": shown.detail,
                    "target": r.target,
                    "created_at": r.created_at.isoformat(),
                    "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                }
            )
        return out


class _ledger:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __enter__(self) -> Ledger:
        self.ledger = open_ledger(self.settings)
        return self.ledger

    def __exit__(self, *exc: object) -> None:
        self.ledger.close()
