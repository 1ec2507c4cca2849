"""``guards.max_quarantine_ratio``: a run whose quarantine grows past a share of what it read
stops after the wave that showed it, instead of "succeeding" with everything quarantined.

Checked after every committed wave, from the ledger's counts of the units this attempt
committed (not the units an earlier attempt left: after a fix, ``rewind resume`` continues,
and the records quarantined before the fix stay quarantined until ``rewind quarantine
redrive`` processes them again). Below ``guards.min_records_before_ratio`` records read, a
share says too little and the guard waits. A tripped guard fails the run in one line naming
the top reasons; a failed run cannot be promoted. ``--accept-risk`` does not override it; the
guard itself can be changed on resume (``rewind resume RUN --spec SPEC`` with the new values,
recorded in the audit).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewind.core.counts import RecordCounts
from rewind.errors import RewindError
from rewind.spec.run import Guards

if TYPE_CHECKING:
    from rewind.ledger import Ledger
    from rewind.spec import JobSpec

GUARD_FIELDS = ("max_quarantine_ratio", "min_records_before_ratio")
"""The guard's settings: the only fields of a spec a resume may change."""

TOP_REASONS = 3


class QuarantineGuardTripped(RewindError):
    """The run quarantined more than ``guards.max_quarantine_ratio`` of what it read."""


def since(now: RecordCounts, before: RecordCounts) -> RecordCounts:
    """The counts added between ``before`` and ``now`` (the units of this attempt)."""
    reasons = {k: v - before.reasons.get(k, 0) for k, v in now.reasons.items()}
    return RecordCounts(
        records_read=now.records_read - before.records_read,
        emitted=now.emitted - before.emitted,
        rows_out=now.rows_out - before.rows_out,
        quarantined=now.quarantined - before.quarantined,
        filtered=now.filtered - before.filtered,
        reasons={k: v for k, v in reasons.items() if v > 0},
    )


def check(guards: Guards, counts: RecordCounts, run_id: str) -> None:
    """Raise :class:`QuarantineGuardTripped` when ``counts`` (this attempt's) break the guard."""
    ratio = guards.max_quarantine_ratio
    if ratio is None or counts.records_read < guards.min_records_before_ratio or not counts.records_read:
        return
    share = counts.quarantined / counts.records_read
    if share <= ratio:
        return
    top = sorted(counts.reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in top) or "no reason recorded"
    raise QuarantineGuardTripped(
        f"guards.max_quarantine_ratio: {counts.quarantined:,} of {counts.records_read:,} records read "
        f"({share:.1%}) quarantined, above {ratio:.1%} (top: {reasons}); the run stopped: fix the "
        f"translate or the data and `rewind resume {run_id}`, or give the guard a new value with "
        f"`rewind resume {run_id} --spec SPEC`"
    )


def guard_change(given: JobSpec, stored: Mapping[str, Any]) -> tuple[JobSpec, dict[str, Any]]:
    """``given`` with the stored spec's guard values (for the same-job check), and the guard
    values ``given`` changes (empty when none)."""
    stored_guards = dict(stored.get("guards") or {})
    old = {name: stored_guards.get(name, _default(name)) for name in GUARD_FIELDS}
    changed = {
        name: getattr(given.guards, name) for name in GUARD_FIELDS if getattr(given.guards, name) != old[name]
    }
    if not changed:
        return given, {}
    return given.model_copy(update={"guards": given.guards.model_copy(update=old)}), changed


def with_guards(spec: Mapping[str, Any], changed: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's ``spec`` data with the guard values ``changed``."""
    out = copy.deepcopy(dict(spec))
    out["guards"] = {**dict(out.get("guards") or {}), **changed}
    return out


def _default(name: str) -> Any:
    return Guards.model_fields[name].default


def enforce(ledger: Ledger, guards: Guards, run_id: str, before: RecordCounts) -> None:
    """After a wave: :func:`check` this attempt's counts; a tripped guard is audited, then raised
    (the runner marks the run failed with its line)."""
    counts = since(ledger.unit_counts(run_id).counts, before)
    try:
        check(guards, counts, run_id)
    except QuarantineGuardTripped as exc:
        ledger.audit(
            run_id,
            "quarantine-guard",
            {
                "max_quarantine_ratio": guards.max_quarantine_ratio,
                "records_read": counts.records_read,
                "quarantined": counts.quarantined,
                "reasons": counts.reasons,
                "error": str(exc),
            },
        )
        raise
