"""``rewind promote`` and ``rewind rollback``: gated, atomic, recorded, repeatable.

Promotion gates, in order: the run succeeded; its conservation law held (records read =
emitted + quarantined + filtered, from the ledger); the latest verification of the run
passed. ``force`` with a ``reason`` overrides the gates and the reason is recorded. The swap
itself is one atomic catalog operation (see :mod:`rewind.sinks.iceberg_publish`); the
ledger is updated after it, and a re-run after a crash finds the swap done and records it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.errors import RewindError

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.ledger import Ledger


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
    verifications = [e for e in ledger.audit_log(run_id) if e.action == "verify"]
    if not verifications:
        failed.append(f"run {run_id} has not been verified (`rewind verify {run_id}`)")
    elif not verifications[-1].details.get("passed"):
        failed.append(f"the last verification of run {run_id} failed")
    return failed


def _sink_and_staging(settings: Settings, ledger: Ledger, run_id: str) -> tuple[Any, Any]:
    from rewind.job.components import make_sink
    from rewind.job.service import load_plan

    run = ledger.get_run(run_id)
    if not run.staging:
        raise RewindError(f"run {run_id} has no staging recorded; nothing to promote")
    plan = load_plan(ledger, run.plan_id)
    sink = make_sink(settings, plan.job_spec())
    return sink, sink.staging_from_dict(run.staging)


def promote_run(
    settings: Settings, run_id: str, force: bool = False, reason: str | None = None
) -> dict[str, Any]:
    from rewind.job.service import _ledger

    if force and not (reason and reason.strip()):
        raise PromotionRefused('--force needs --reason "why": the reason is recorded with the promotion')
    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        if run.state == "promoted":
            sink, staging = _sink_and_staging(settings, ledger, run_id)
            swap = sink.promote(staging)
            return {"run_id": run_id, "state": "promoted", "swap": swap.to_dict(), "already_promoted": True}
        failed = _gates(ledger, run_id)
        if failed and not force:
            raise PromotionRefused(
                f'promotion of {run_id} refused: {"; ".join(failed)}; fix that, or --force --reason "..."'
            )
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        live = ledger.lease(sink.target)  # a live run on the target would still be writing
        if live is not None and live.holder != run_id and _alive(live):
            raise PromotionRefused(
                f"target {sink.target} is held by run {live.holder}; wait for it to finish"
            )
        swap = sink.promote(staging)
        ledger.set_state(run_id, "promoted")
        ledger.audit(
            run_id,
            "promote",
            {**swap.to_dict(), "forced": bool(failed), "gates_failed": failed, "reason": reason},
        )
        return {
            "run_id": run_id,
            "state": "promoted",
            "swap": swap.to_dict(),
            "forced": bool(failed),
            "gates_failed": failed,
        }


def rollback_run(settings: Settings, run_id: str) -> dict[str, Any]:
    from rewind.job.service import _ledger

    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        promotions = [e for e in ledger.audit_log(run_id) if e.action == "promote"]
        if not promotions:
            raise RewindError(f"run {run_id} was never promoted; nothing to roll back")
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        swap = sink.rollback(staging, promotions[-1].details)
        if run.state == "promoted":
            ledger.set_state(run_id, "rolled_back")
            ledger.audit(run_id, "rollback", swap.to_dict())
        return {"run_id": run_id, "state": "rolled_back", "swap": swap.to_dict()}


def _alive(lease: Any) -> bool:
    from datetime import UTC, datetime

    return bool(lease.expires_at and lease.expires_at > datetime.now(UTC))


def cleanup_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """``rewind cleanup RUN``: drop what the run left behind in its sink (see each sink's ``cleanup``).

    Refused while the run holds a live lease (it may still be writing) or is running.
    """
    from rewind.job.service import _ledger

    with _ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        sink, staging = _sink_and_staging(settings, ledger, run_id)
        live = ledger.lease(sink.target)
        if run.state == "running" and live is not None and live.holder == run_id and _alive(live):
            raise RewindError(f"run {run_id} is running (lease held until {live.expires_at}); stop it first")
        cleanup = getattr(sink, "cleanup", None)
        if cleanup is None:
            raise RewindError(f"the {sink.kind} sink has nothing to clean up")
        result = cleanup(staging)
        ledger.audit(run_id, "cleanup", result)
        return {"run_id": run_id, "state": run.state, "cleanup": result}
