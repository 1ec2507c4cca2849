"""``rewind promote`` and ``rewind rollback``: gated, atomic, recorded, repeatable.

Promotion gates, in order: the run succeeded; its conservation law held (records read =
emitted + quarantined + filtered, from the ledger); the latest verification of the run
passed. ``force`` with a ``reason`` overrides the gates and the reason is recorded. The swap
itself is one atomic catalog operation (see :mod:`rewind.sinks.iceberg.publish`); the
ledger is updated after it (audit entry, then run state: :func:`_record`), and a re-run after
a crash (kill -9 at any point) finds the swap done and records it, once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.errors import RewindError
from rewind.job.components import make_sink
from rewind.job.finalize import parts_in_scratch, parts_sink
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.ledger import AuditEntry, Ledger, RunState


class PromotionRefused(RewindError):
    """A promotion gate failed; ``--force --reason`` overrides it (and is recorded)."""


def _gates(ledger: Ledger, run_id: str) -> list[str]:
    run = ledger.get_run(run_id)
    failed = []
    if run.state not in ("succeeded", "rolled_back", "promoted"):
        failed.append(f"run {run_id} is {run.state}, not succeeded")
    counts = ledger.unit_counts(run_id)
    if not counts.conserved or counts.done != counts.units:
        failed.append(
            f"conservation not shown: {counts.done}/{counts.units} units done, read {counts.records_read} vs "
            f"emitted {counts.emitted} + quarantined {counts.quarantined} + filtered {counts.filtered}"
        )
    last = _last_verification(ledger, run_id)
    if last is None:
        failed.append(f"run {run_id} has not been verified (`rewind verify {run_id}`)")
    elif not last.details.get("passed"):
        failed.append(f"the last verification of run {run_id} failed")
    return failed


def _last_verification(ledger: Ledger, run_id: str) -> AuditEntry | None:
    """The latest ``verify`` entry of the run: its verdict is the gate, whichever verify section
    (the plan's, or one given to ``rewind verify --spec/--verify-file``) it was reached with."""
    verifications = [e for e in ledger.audit_log(run_id) if e.action == "verify"]
    return verifications[-1] if verifications else None


def _verification_facts(entry: AuditEntry | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {"at": entry.at.isoformat(), "passed": bool(entry.details.get("passed")),
            "verify_section": entry.details.get("verify_section")}


def _sink_and_staging(settings: Settings, ledger: Ledger, run_id: str) -> tuple[Any, Any]:
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import usable_plan

    run = ledger.get_run(run_id)
    if not run.staging:
        raise RewindError(f"run {run_id} has no staging recorded; nothing to promote")
    plan = usable_plan(settings, ledger, run.plan_id, needed=("sink",))  # the sink's URL password
    sink = make_sink(settings, plan.job_spec())
    return sink, sink.staging_from_dict(run.staging)


def _merged(ledger: Ledger, run_id: str) -> bool:
    """The run applied a ``merge:`` policy (decided against the target as it was then)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import load_plan

    return load_plan(ledger, ledger.get_run(run_id).plan_id).job_spec().merge is not None


@emits(lineage.of_run("promote"), lineage.published)
def promote_run(
    settings: Settings, run_id: str, force: bool = False, reason: str | None = None, rebase: bool = False
) -> dict[str, Any]:
    """Promote ``run_id``: gates, lease check, the sink's atomic swap, then the ledger record.

    ``rebase`` lets a sink that supports it (Iceberg) re-apply the run's output on a target
    that moved since staging, instead of refusing. The record is the audit entry first, then
    the state; a run killed between the two is completed by a re-run (see :func:`_record`).
    """
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import _ledger

    if force and not (reason and reason.strip()):
        raise PromotionRefused('--force needs --reason "why": the reason is recorded with the promotion')
    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        if run.state == "promoted":
            # the state moves only after the swap and its audit entry: report what was recorded
            recorded = _last_publish(ledger, run_id)
            details = dict(recorded.details) if recorded is not None else {}
            swap = {
                k: v
                for k, v in details.items()
                if k not in ("forced", "gates_failed", "reason", "verification")
            }
            return {"run_id": run_id, "state": "promoted", "swap": swap, "already_promoted": True}
        failed = _gates(ledger, run_id)
        if failed and not force:
            raise PromotionRefused(
                f'promotion of {run_id} refused: {"; ".join(failed)}; fix that, or --force --reason "..."'
            )
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        if rebase and not sink.SUPPORTS_REBASE:
            raise PromotionRefused(
                f"--rebase is not supported by the {sink.kind} sink of run {run_id}; promote without it"
            )
        if rebase and _merged(ledger, run_id):
            raise PromotionRefused(
                f"--rebase of {run_id}: its merge: policy decided against the target as it was; "
                "re-run the backfill on the moved target"
            )
        live = ledger.lease(sink.target)  # a live run on the target would still be writing
        if live is not None and live.holder != run_id and _alive(live):
            raise PromotionRefused(
                f"target {sink.target} is held by run {live.holder}; wait for it to finish"
            )
        swap = sink.promote(staging, rebase=rebase)
        verification = _verification_facts(_last_verification(ledger, run_id))
        details = {
            **swap.to_dict(),
            "forced": bool(failed),
            "gates_failed": failed,
            "reason": reason,
            "verification": verification,  # the verdict (and verify section) promoted on
        }
        _record(ledger, run_id, "promote", details, "promoted")
        return {
            "run_id": run_id,
            "state": "promoted",
            "swap": swap.to_dict(),
            "forced": bool(failed),
            "gates_failed": failed,
            "verification": verification,
        }


@emits(lineage.of_run("rollback"), lineage.published)
def rollback_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """Undo the last promotion of ``run_id``; completes an interrupted promote or rollback record."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import _ledger

    with _ledger(settings) as ledger:
        promotions = [e for e in ledger.audit_log(run_id) if e.action == "promote"]
        if not promotions:
            raise RewindError(
                f"run {run_id} was never promoted (no promotion recorded); if `rewind promote {run_id}` "
                "was interrupted, run it again first"
            )
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        last = _last_publish(ledger, run_id)
        if ledger.get_run(run_id).state != "promoted" and last is not None and last.action == "promote":
            ledger.set_state(run_id, "promoted")  # a promote killed between its audit and its state
        swap = sink.rollback(staging, promotions[-1].details)
        if ledger.get_run(run_id).state == "promoted":
            _record(ledger, run_id, "rollback", swap.to_dict(), "rolled_back")
        return {"run_id": run_id, "state": "rolled_back", "swap": swap.to_dict()}


def _last_publish(ledger: Ledger, run_id: str) -> AuditEntry | None:
    """The newest ``promote`` or ``rollback`` audit entry of the run, or None."""
    entries = [e for e in ledger.audit_log(run_id) if e.action in ("promote", "rollback")]
    return entries[-1] if entries else None


def _record(ledger: Ledger, run_id: str, action: str, details: dict[str, Any], state: RunState) -> None:
    """Record a swap: (1) the audit entry, (2) the run state; each its own ledger transaction.

    The audit goes first so no crash can leave a state without its entry (rollback needs the
    promotion's snapshot ids). A crash between the two leaves the entry as the newest
    promote/rollback of the run with the state not moved: a re-run sees that and only moves
    the state, so every swap is audited once. Fault point ``<action>-after-audit`` sits between.
    """
    last = _last_publish(ledger, run_id)
    if last is None or last.action != action:
        ledger.audit(run_id, action, details)
    faults.point(f"{action}-after-audit")
    ledger.set_state(run_id, state)


def _alive(lease: Any) -> bool:
    return bool(lease.expires_at and lease.expires_at > datetime.now(UTC))


def cleanup_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """``rewind cleanup RUN``: drop what the run left behind in its sink (see each sink's ``cleanup``).

    Refused while the run holds a live lease (it may still be writing) or is running.
    """
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import _ledger

    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        live = ledger.lease(sink.target)
        if run.state == "running" and live is not None and live.holder == run_id and _alive(live):
            raise RewindError(f"run {run_id} is running (lease held until {live.expires_at}); stop it first")
        if not sink.SUPPORTS_CLEANUP:
            raise RewindError(f"the {sink.kind} sink has nothing to clean up")
        result = sink.cleanup(staging)
        scratch = _drop_fold_parts(settings, ledger, run_id)
        if scratch is not None:
            result = {**result, "fold_parts": scratch}
        ledger.audit(run_id, "cleanup", result)
        return {"run_id": run_id, "state": run.state, "cleanup": result}


def _drop_fold_parts(settings: Settings, ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    """The scratch table of a fold's partial rows, left by a run that did not finish (a run that
    succeeded dropped it already)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import load_plan

    spec = load_plan(ledger, ledger.get_run(run_id).plan_id).job_spec()
    if not parts_in_scratch(spec):
        return None
    sink = parts_sink(settings, spec)
    return sink.cleanup(sink.table_staging(run_id))
