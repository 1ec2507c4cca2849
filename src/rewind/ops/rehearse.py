"""``rewind rehearse SPEC``: the job on a representative slice, end to end, on a throw-away target.

Steps, each recorded in the rehearsal's ``steps``:

1. plan the real spec (refused on a failed gate, as a run would be);
2. make the throw-away spec: the same job under ``<name>-<tag>``, writing to
   ``<target>_<tag>`` with its own quarantine table ``<namespace>.rewind_quarantine_<tag>``
   (the real target and the real quarantine are never touched);
3. slice the real plan's units (:mod:`rewind.core.slices`: a proportional share of every
   partition in evenly spaced pieces over the window) and run them (:func:`rewind.job.runner.execute`,
   with per-wave timings);
4. verify the staging against the throw-away target (``{reference: {target: true}}``: an
   absent target counts as empty), promote it onto the throw-away target, roll back;
5. clean up: the run's staging, the throw-away target and quarantine tables, their files;
6. measure the stages (:mod:`rewind.ops.stage_rates`), extrapolate time and cost to the full
   plan (:mod:`rewind.job.cost` on the measured rates) and store it all in the ledger under
   the real spec's fingerprint (:mod:`rewind.ledger.evidence`).

A rehearsal *passes* when every step did. Every sink and source kind is rehearsed: the
throw-away target of each (an Iceberg or SQL table, a Kafka topic) and a table source's slice
are described in :mod:`rewind.ops.throwaway`.
"""

from __future__ import annotations

import shutil
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from rewind.catalog import load_catalog
from rewind.core.console import QUIET, Console
from rewind.core.slices import SliceError, slice_units
from rewind.errors import RewindError
from rewind.job.components import make_sink
from rewind.job.cost import cores_of, cost_estimate
from rewind.job.planner import build_plan
from rewind.job.publish import cleanup_run, promote_run, rollback_run
from rewind.job.runner import execute, start_run
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.ops.metrics import group_lag
from rewind.ops.readiness import LIVE_LAG
from rewind.ops.stage_rates import measure_stages, read_table_sample, wave_costs
from rewind.ops.throwaway import (
    RehearsalError,
    cleanup_targets,
    slice_plan,
    target_name,
    throwaway_spec,
    throwaway_verify,
)
from rewind.verify.service import default_report_path, verify_run

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.spec import JobSpec

__all__ = ["RehearsalError", "rehearse"]


SMALL_SLICE = 10_000
"""Below this many records a slice's rates are mostly fixed costs (said in the result's notes)."""


@emits(lineage.rehearsal, parent=True)
def rehearse(
    settings: Settings,
    spec: JobSpec,
    *,
    fraction: float | None = None,
    records: int | None = None,
    console: Console = QUIET,
) -> dict[str, Any]:
    """Rehearse ``spec`` on a slice; returns (and stores) the rehearsal's record as a dict."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger
    from rewind.ledger.evidence import EvidenceStore, new_rehearsal_id

    try:  # bad input first, before any broker is asked
        slice_units((), fraction=fraction, records=records)
    except SliceError as exc:
        raise RehearsalError(str(exc)) from None
    rehearsal_id = new_rehearsal_id()
    tag = "rh" + uuid.uuid4().hex[:6]
    real = build_plan(settings, spec)
    if not real.ok:
        gate = real.failed_gates()[0]
        raise RehearsalError(
            f"plan {real.plan_id} refused by gate {gate.name}: {gate.detail}; nothing rehearsed"
        )
    throw = throwaway_spec(spec, tag, partitions=(real.read_plan.get("table") or {}).get("partitions"))
    throw_plan = build_plan(settings, throw)
    if not throw_plan.ok:
        gate = throw_plan.failed_gates()[0]
        raise RehearsalError(
            f"the throw-away plan is refused by gate {gate.name}: {gate.detail}; nothing rehearsed"
        )
    plan = slice_plan(settings, throw_plan, throw, fraction=fraction, records=records)
    steps: dict[str, Any] = {}
    timings: list[dict[str, Any]] = []
    run_id: str | None = None
    details: dict[str, Any] = {
        "tag": tag,
        "spec_name": spec.name,
        "throwaway": {
            "name": throw.name,
            "sink": throw.sink.kind,
            "target": target_name(throw),
            "quarantine": throw.quarantine.table,
        },
        "slice": {
            "fraction": fraction,
            "records": records,
            "offsets": plan.offsets,
            "of_offsets": real.offsets,
            "units": [u.to_dict() for u in plan.units],
            **({"key_ranges": plan.read_plan["table"]["ranges"]} if spec.source.table is not None else {}),
        },
        "steps": steps,
    }
    ledger = open_ledger(settings)
    started = time.monotonic()
    error: str | None = None
    try:
        run_id = start_run(ledger, plan, make_sink(settings, throw).target)
        details["run_id"] = run_id
        outcome = execute(settings, ledger, plan, run_id, console=console, timings=timings)
        steps["run"] = {
            "ok": True,
            "records_read": outcome.counts.records_read,
            "seconds": round(outcome.seconds, 2),
        }
        details["counts"] = outcome.counts.to_dict()
        _publish_steps(settings, run_id, steps, throw)
    except RewindError as exc:
        error = str(exc).splitlines()[0]
        steps.setdefault("run", {"ok": False, "error": error})
    finally:
        ledger.close()
        steps["cleanup"] = _cleanup(settings, throw, run_id, tag)
    details["seconds"] = round(time.monotonic() - started, 2)
    details["timings"] = [
        {k: round(v, 4) if isinstance(v, float) else v for k, v in t.items()} for t in timings
    ]
    if timings:
        measured = _measure(settings, spec, plan, timings, cores_of(settings), run_id)
        details.update(measured)
        rates = {**measured["rates"], "rehearsal_id": rehearsal_id}
        details["extrapolated"] = cost_estimate(settings, real.units, real.estimates, rates)
        counts = details.get("counts") or {}
        read = counts.get("records_read") or 0
        details["quarantine_rates"] = (
            {reason: round(n / read, 6) for reason, n in (counts.get("reasons") or {}).items()}
            if read
            else {}
        )
    if plan.offsets < SMALL_SLICE:
        details["notes"] = [
            f"the slice holds {plan.offsets:,} records: fixed costs (a consumer's start, a Spark "
            f"job's start) dominate its rates; rehearse {SMALL_SLICE:,} or more for rates that "
            "extrapolate"
        ]
    details["live_lag"] = _sample_live_lag(settings, spec)
    missing = [g for g, facts in details["live_lag"].items() if facts["lag"] is None]
    if missing:  # a warning, not a failure: readiness scores observability yellow for it
        details.setdefault("notes", []).append(
            f"live group(s) {', '.join(missing)} not found (no committed offsets): check live_groups"
        )
    passed = error is None and all(step.get("ok") for step in steps.values())
    details["error"] = error
    with open_ledger(settings) as led:
        stored = EvidenceStore(led.engine).save_rehearsal(
            rehearsal_id,
            fingerprint=spec.fingerprint(),
            name=spec.name,
            run_id=run_id,
            passed=passed,
            details=details,
        )
    return {"rehearsal_id": stored.id, "fingerprint": stored.fingerprint, "passed": passed, **details}


def _publish_steps(settings: Settings, run_id: str, steps: dict[str, Any], throw: JobSpec) -> None:
    """Verify, promote onto the throw-away target, roll back: each recorded; stops at a failure."""
    path = default_report_path(settings, run_id).with_suffix(".json")
    report = verify_run(settings, run_id, path, verify=throwaway_verify(throw))
    steps["verify"] = {
        "ok": bool(report["passed"]),
        "failed": report["failed"],
        "rows": report["rows"],
        "report": str(path),
    }
    if not report["passed"]:
        return
    promoted = promote_run(settings, run_id)
    steps["promote"] = {"ok": promoted["state"] == "promoted", "swap": promoted["swap"]}
    rolled = rollback_run(settings, run_id)
    steps["rollback"] = {"ok": rolled["state"] == "rolled_back", "swap": rolled["swap"]}


def _cleanup(settings: Settings, throw: JobSpec, run_id: str | None, tag: str) -> dict[str, Any]:
    """Drop the run's staging (``rewind cleanup``: a Kafka sink's topic too), then every table of
    the throw-away target's and quarantine's namespaces whose name carries the rehearsal's tag
    (target, quarantine, staging, scratch), and their files when the warehouse is a local
    folder; then what is left of a throw-away SQL table or topic (:func:`cleanup_targets`)."""
    out: dict[str, Any] = {"ok": True, "dropped": [], "files": []}
    catalog = load_catalog(settings)
    iceberg = throw.sink.iceberg.table if throw.sink.iceberg is not None else None
    namespaces = {n.rpartition(".")[0] for n in (iceberg, throw.quarantine.table) if n}

    def tagged() -> list[str]:
        found = []
        for ns in sorted(namespaces):
            if catalog.namespace_exists(ns):
                found += [".".join(t) for t in catalog.list_tables(ns) if tag in t[-1]]
        return found

    locations = [catalog.load_table(n).location() for n in tagged()]
    if run_id is not None:
        try:
            out["staging"] = cleanup_run(settings, run_id)["cleanup"]
        except RewindError as exc:
            out["staging"] = {"error": str(exc).splitlines()[0]}
    for name in tagged():
        locations.append(catalog.load_table(name).location())
        catalog.drop_table(name)
        out["dropped"].append(name)
    for location in dict.fromkeys(locations):
        parsed = urlparse(location)
        if parsed.scheme in ("", "file"):
            shutil.rmtree(parsed.path, ignore_errors=True)
            out["files"].append(location)
    try:
        other = cleanup_targets(settings, throw, tag)
    except RewindError as exc:
        other = {"dropped": [], "left": [f"? ({str(exc).splitlines()[0]})"]}
    out["dropped"] += other["dropped"]
    left = tagged() + other["left"]
    if left:
        out["ok"], out["left"] = False, left
    return out


def _measure(
    settings: Settings,
    spec: JobSpec,
    plan: JobPlan,
    timings: list[dict[str, Any]],
    cores: int,
    run_id: str | None,
) -> dict[str, Any]:
    """Stage rates, the bottleneck, quarantine rates and the rates the cost model uses, with
    the record bytes the run's tasks read per source and per record (``bytes_per_record``)."""
    sample = read_table_sample(settings, spec, plan.read_plan) if spec.source.table is not None else None
    measured = measure_stages(settings.kafka_config(), spec, plan.units, timings, sample)
    units = sum(t["units"] for t in timings)
    per_core, wave_fixed = wave_costs(timings, cores)
    rates = {
        "records_per_core_second": per_core,
        "wave_fixed_s": wave_fixed,
        "commit_s_per_unit": round(sum(t["commit_s"] for t in timings) / units, 4) if units else None,
        "cores": cores,
    }
    read_bytes: dict[str, int] = {}
    for t in timings:
        for source, n in (t.get("bytes") or {}).items():
            read_bytes[source] = read_bytes.get(source, 0) + int(n)
    per_source = _records_by_source(settings, plan, run_id)
    rates["bytes_per_record"] = {
        source: round(n / per_source[source], 1) for source, n in read_bytes.items() if per_source.get(source)
    }
    return {**measured, "rates": rates, "bytes_read": read_bytes}


def _records_by_source(settings: Settings, plan: JobPlan, run_id: str | None) -> dict[str, int]:
    """Records the run's units read, per source (from the ledger: gaps and markers excluded)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    if run_id is None:
        return {}
    sources = {u.id: u.source for u in plan.units}
    out: dict[str, int] = {}
    with open_ledger(settings) as ledger:
        for u in ledger.units(run_id):
            source = sources.get(u.unit_id, "kafka")
            out[source] = out.get(source, 0) + u.records_read
    return out


def _sample_live_lag(settings: Settings, spec: JobSpec) -> dict[str, Any]:
    """The lag of the spec's live groups after the slice ran, each stored as a probe (readiness
    evidence); a group that does not exist is recorded as not found (readiness: yellow)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger
    from rewind.ledger.evidence import EvidenceStore

    out: dict[str, Any] = {}
    groups = list(spec.live_groups or [])
    if not groups:
        return out
    with open_ledger(settings) as ledger:
        store = EvidenceStore(ledger.engine)
        for group in groups:
            try:
                lag = group_lag(settings.kafka_config(), group)
            except RewindError as exc:
                lag, note = None, str(exc).splitlines()[0]
            else:
                note = "" if lag is not None else f"consumer group {group} not found (no committed offsets)"
            facts = {"lag": sum(lag.values()) if lag else None, "partitions": len(lag or {}), "note": note}
            store.record_probe(LIVE_LAG, group, lag is not None, facts)
            out[group] = facts
    return out
