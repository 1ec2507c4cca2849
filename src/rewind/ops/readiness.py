"""``rewind readiness SPEC``: a scorecard of the risks of a replay, each scored on evidence.

Areas (the platform's list): offset control and isolation, storage path, cost boundary,
rollback, observability, compatibility, governance/secrets. Each is

* **green** only when Rewind holds evidence: a passed rehearsal of this spec's fingerprint
  (:mod:`rewind.ops.rehearse`), the rollback it exercised, the broker's capabilities probed by
  ``rewind doctor`` (stored in the ledger), guards set, live groups' lag measured;
* **yellow** when it is configured or checked by the plan, but not exercised;
* **red** when it is unknown or the evidence says it fails: the plan's gate for it failed, the
  latest rehearsal of this fingerprint failed at its step, or nothing bounds nor estimates what
  the run will read.

The cost area also judges the run's speed against the live stream (the plan's ``live``
estimate, :mod:`rewind.job.realtime`): yellow below ``live.min_multiple`` x real-time (default
10x), red when the run cannot finish before the window's oldest records leave the log.

Red is deliberately narrow: an ordinary spec whose plan passes is yellow everywhere until it is
rehearsed, so ``rewind run`` (which refuses a red scorecard without ``--accept-risk``) keeps
running the specs it ran before; what it stops is a replay whose last rehearsal failed or whose
size nobody knows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from rewind.core.live_speed import judge
from rewind.errors import RewindError
from rewind.job.realtime import planned_live, seconds_left
from rewind.job.spec_secrets import field_name, masked_fields, spec_data
from rewind.secrets import mask, mask_url

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.ledger.evidence import ProbeRecord, RehearsalRecord
    from rewind.spec import JobSpec

AREAS = (
    "offset-control",
    "storage-path",
    "cost-boundary",
    "rollback",
    "observability",
    "compatibility",
    "governance",
)
DOCTOR = "doctor"
LIVE_LAG = "live-lag"


@dataclass(frozen=True)
class Score:
    area: str
    status: str  # green | yellow | red
    detail: str
    evidence: str = ""


def broker_subject(settings: Settings) -> str:
    """How probes of a broker are keyed: its bootstrap servers, credentials masked."""
    return mask_url(settings.bootstrap_servers)


def record_doctor(settings: Settings, report: dict[str, Any]) -> int:
    """Store ``rewind doctor``'s report as evidence of this broker's capabilities."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger
    from rewind.ledger.evidence import EvidenceStore

    checks = {c["name"]: c["status"] for c in report.get("checks", [])}
    with Ledger.open(settings.ledger) as ledger:
        probe = EvidenceStore(ledger.engine).record_probe(
            DOCTOR, broker_subject(settings), bool(report.get("ok")), {"checks": checks}
        )
    return probe.id


@dataclass(frozen=True)
class Evidence:
    rehearsal: RehearsalRecord | None  # the latest rehearsal of the fingerprint, passed or not
    passed: RehearsalRecord | None  # the latest passed one
    doctor: ProbeRecord | None
    lag: dict[str, ProbeRecord | None]  # live group -> its latest lag probe


def gather(settings: Settings, spec: JobSpec, live_groups: list[str]) -> Evidence:
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger
    from rewind.ledger.evidence import EvidenceStore

    with Ledger.open(settings.ledger) as ledger:
        store = EvidenceStore(ledger.engine)
        rehearsals = store.rehearsals(spec.fingerprint())
        return Evidence(
            rehearsal=rehearsals[0] if rehearsals else None,
            passed=next((r for r in rehearsals if r.passed), None),
            doctor=store.latest_probe(DOCTOR, broker_subject(settings)),
            lag={g: store.latest_probe(LIVE_LAG, g) for g in live_groups},
        )


def scorecard(
    settings: Settings, spec: JobSpec, plan: JobPlan, live_groups: list[str] | None = None
) -> list[Score]:
    """The seven areas of ``spec`` (planned as ``plan``), from the ledger's evidence."""
    groups = list(live_groups or [])
    ev = gather(settings, spec, groups)
    gates = {g.name: g for g in plan.gates}
    failed_step = _failed_step(ev.rehearsal)
    rh = f"rehearsal {ev.passed.id}" if ev.passed else ""
    return [
        _offsets(gates, ev, failed_step, rh),
        _storage(gates, ev, failed_step, rh),
        _with_live_speed(_cost(spec, plan, ev, rh), plan, settings.live.min_multiple),
        _rollback(ev, failed_step, rh),
        _observability(settings, groups, ev),
        _compatibility(gates, ev, rh),
        _governance(spec),
    ]


def _failed_step(record: RehearsalRecord | None) -> str | None:
    if record is None or record.passed:
        return None
    steps = record.details.get("steps") or {}
    return next((name for name, step in steps.items() if not step.get("ok")), "run")


def _doctor_ok(ev: Evidence) -> bool:
    return ev.doctor is not None and ev.doctor.ok


def _offsets(gates: dict[str, Any], ev: Evidence, failed: str | None, rh: str) -> Score:
    window = [g for name in ("log-start", "coverage", "max-records") if (g := gates.get(name))]
    bad = [g for g in window if not g.ok]
    if bad:
        return Score("offset-control", "red", f"gate {bad[0].name}: {bad[0].detail}")
    if failed == "run":
        return Score("offset-control", "red", "the latest rehearsal of this spec failed in its run")
    if ev.passed and _doctor_ok(ev):
        return Score(
            "offset-control",
            "green",
            "a slice ran on its own target and leases; the broker was probed",
            f"{rh}; doctor probe {ev.doctor.id}",  # type: ignore[union-attr]
        )
    missing = [
        w
        for w, ok in (("a passed rehearsal", ev.passed), ("a doctor probe of the broker", _doctor_ok(ev)))
        if not ok
    ]
    return Score("offset-control", "yellow", f"window resolved by the plan; no {' nor '.join(missing)}")


def _storage(gates: dict[str, Any], ev: Evidence, failed: str | None, rh: str) -> Score:
    sink = gates.get("sink")
    if sink is not None and not sink.ok:
        return Score("storage-path", "red", f"gate sink: {sink.detail}")
    if failed in ("verify", "promote", "cleanup"):
        return Score("storage-path", "red", f"the latest rehearsal of this spec failed at {failed}")
    if ev.passed:
        return Score(
            "storage-path", "green", "a slice was written, verified and promoted through the sink", rh
        )
    return Score(
        "storage-path", "yellow", "the sink answered the plan's check; nothing written through it yet"
    )


def _cost(spec: JobSpec, plan: JobPlan, ev: Evidence, rh: str) -> Score:
    g = spec.guards
    guards = [
        n
        for n, v in (
            ("max_records", g.max_records),
            ("max_bytes", g.max_bytes),
            ("max_records_per_second", g.max_records_per_second),
        )
        if v is not None
    ]
    measured = bool(ev.passed and (ev.passed.details.get("rates") or {}).get("records_per_core_second"))
    estimated = plan.estimates.get("estimated_bytes") is not None or plan.offsets == 0
    if guards and measured:
        return Score("cost-boundary", "green", f"guards {', '.join(guards)}; cost from measured rates", rh)
    if guards or measured:
        what = (
            f"guards {', '.join(guards)}"
            if guards
            else "cost from measured rates, but no guard bounds the run"
        )
        return Score(
            "cost-boundary", "yellow", what + ("" if measured else "; rates not measured (rehearse)")
        )
    if estimated:
        return Score(
            "cost-boundary", "yellow", "estimated by the plan; no guard (guards.max_records/max_bytes)"
        )
    return Score("cost-boundary", "red", "no guard and no estimate: nothing says how much the run reads")


def _with_live_speed(score: Score, plan: JobPlan, min_multiple: float) -> Score:
    """The cost area judged against the live stream as well (:func:`rewind.core.live_speed.judge`):
    red when the run cannot finish before the window's oldest records leave the log, at least
    yellow when its expected speed is below ``live.min_multiple`` x real-time; the plan's
    measurement is said either way."""
    live = planned_live(plan)
    if not live:
        return score
    if live.get("error"):
        return replace(score, detail=f"{score.detail}; {live['summary']}")
    verdict = judge(
        live.get("expected_records_per_second"),
        live.get("records_per_second"),
        live.get("eta_seconds"),
        seconds_left(live),
        min_multiple,
    )
    rank = {"green": 0, "ok": 0, "yellow": 1, "red": 2}
    status = score.status if rank[score.status] >= rank[verdict.status] else verdict.status
    if verdict.status == "red":
        return Score(score.area, "red", f"{verdict.detail}; {score.detail}", score.evidence)
    return Score(score.area, status, f"{score.detail}; {verdict.detail}", score.evidence)


def _rollback(ev: Evidence, failed: str | None, rh: str) -> Score:
    if failed == "rollback":
        return Score("rollback", "red", "the latest rehearsal of this spec failed to roll back")
    if ev.passed and (ev.passed.details.get("steps") or {}).get("rollback", {}).get("ok"):
        return Score("rollback", "green", "promotion and rollback exercised on a throw-away target", rh)
    return Score("rollback", "yellow", "the sink supports rollback; not exercised (rehearse)")


def _observability(settings: Settings, groups: list[str], ev: Evidence) -> Score:
    metrics = settings.metrics.port is not None
    measured = [g for g in groups if ev.lag.get(g) is not None and ev.lag[g].ok]  # type: ignore[union-attr]
    unknown = [g for g in groups if g not in measured]
    if metrics and groups and not unknown:
        ids = ", ".join(str(ev.lag[g].id) for g in groups)  # type: ignore[union-attr]
        return Score(
            "observability", "green", f"metrics on; lag of {', '.join(groups)} measured", f"lag probes {ids}"
        )
    parts = ["metrics on" if metrics else "no metrics port (metrics.port / --metrics-port)"]
    if not groups:
        parts.append("no live_groups named: live lag is not watched")
    elif unknown:
        missing = [g for g in unknown if ev.lag.get(g) is not None]  # probed, group not found
        if missing:
            parts.append(f"live group(s) {', '.join(missing)} not found (check live_groups)")
        never = [g for g in unknown if g not in missing]
        if never:
            parts.append(f"lag of {', '.join(never)} not measured (rehearse)")
    return Score("observability", "yellow", "; ".join(parts))


def _compatibility(gates: dict[str, Any], ev: Evidence, rh: str) -> Score:
    bad = [g for name in ("output-schema", "key", "translate") if (g := gates.get(name)) and not g.ok]
    if bad:
        return Score("compatibility", "red", f"gate {bad[0].name}: {bad[0].detail}")
    if ev.passed and _doctor_ok(ev):
        return Score(
            "compatibility",
            "green",
            "decode, translate and the sink ran on real records; broker probed",
            f"{rh}; doctor probe {ev.doctor.id}",  # type: ignore[union-attr]
        )
    return Score("compatibility", "yellow", "the plan's sample decoded and translated; not run end to end")


def _governance(spec: JobSpec) -> Score:
    inline = [field_name(p) for p in masked_fields(mask(spec_data(spec)))]
    if inline:
        return Score(
            "governance",
            "yellow",
            f"secret value(s) written in the spec ({', '.join(inline)}): masked in the ledger, but give "
            "them in spec_secrets or REWIND_SPEC__* instead",
        )
    return Score(
        "governance", "green", "no secret in the spec; the ledger and logs mask the rest", "spec checked"
    )


def red(scores: list[Score]) -> list[Score]:
    return [s for s in scores if s.status == "red"]


def to_dicts(scores: list[Score]) -> list[dict[str, Any]]:
    return [asdict(s) for s in scores]


class ReadinessRefused(RewindError):
    """``rewind run`` of a spec with a red area, without ``--accept-risk``: one line."""


def live_groups_of(spec: JobSpec) -> list[str]:
    return list(getattr(spec, "live_groups", None) or [])


def readiness(settings: Settings, spec: JobSpec) -> dict[str, Any]:
    """Plan (stored, as ``rewind plan`` does) and score ``spec``: the scorecard as a dict."""
    return _planned_and_scored(settings, spec)[1]


def _planned_and_scored(settings: Settings, spec: JobSpec) -> tuple[JobPlan, dict[str, Any]]:
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import plan_job

    plan = plan_job(settings, spec)
    scores = scorecard(settings, spec, plan, live_groups_of(spec))
    return plan, {
        "name": spec.name,
        "fingerprint": spec.fingerprint(),
        "plan_id": plan.plan_id,
        "plan_ok": plan.ok,
        "ready": not red(scores),
        "areas": to_dicts(scores),
    }


@dataclass(frozen=True)
class Gated:
    """What the gate of ``rewind run SPEC`` lets through: the plan it made (the run executes it:
    a plan is not built twice, a SQL translate's check alone starts Spark), and the risk it
    accepted (None when nothing red was)."""

    plan: JobPlan
    accepted_risk: dict[str, Any] | None


def gate_run(settings: Settings, spec: JobSpec, accept_risk: str | None) -> Gated:
    """The gate of ``rewind run SPEC``: refuse a red scorecard unless a reason accepts the risk.

    The scorecard goes into the ledger's audit before the run starts; ``accepted_risk`` (the
    plan, the reason, the red areas) is what :func:`rewind.job.service.run_job` records in the
    run's own audit (with the user), so ``rewind show RUN`` and the run's report show it. A plan
    refused by one of its own gates passes here untouched: the run refuses it itself, with the
    plan's own message.
    """
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    if accept_risk is not None and not accept_risk.strip():
        raise ReadinessRefused('--accept-risk needs a reason: --accept-risk "why this risk is accepted"')
    plan, card = _planned_and_scored(settings, spec)
    if not card["plan_ok"]:
        return Gated(plan, None)
    reds = [a for a in card["areas"] if a["status"] == "red"]
    with open_ledger(settings) as ledger:
        ledger.audit(
            None, "readiness", {k: card[k] for k in ("name", "fingerprint", "plan_id", "ready", "areas")}
        )
    if reds and not accept_risk:
        first = reds[0]
        raise ReadinessRefused(
            f"readiness of {spec.name}: {len(reds)} red area(s), first {first['area']}: {first['detail']}; "
            f'fix it, or run with --accept-risk "reason" (recorded)'
        )
    accepted = {"plan_id": card["plan_id"], "reason": accept_risk, "red": [a["area"] for a in reds]}
    return Gated(plan, accepted if reds else None)
