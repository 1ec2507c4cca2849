"""The lineage of each command other than a run (:mod:`.jobs`): the job name, the datasets and
the facts, so that a command's hook is one line (``with commands.verify(...) as lineage:``).

Job names: ``{spec name}.{command}`` for the commands of a job (plan, verify, promote,
rollback, compensate, shadow), ``archive.{table}`` for an archive pass, ``reconsume.{id}`` for a
reconsume (one OpenLineage run from ``start`` to ``finish``, across processes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rewind.openlineage.datasets import Assertion, iceberg, kafka, sink_datasets
from rewind.openlineage.jobs import job_name
from rewind.openlineage.runs import LineageRun, stable_run_id, track
from rewind.spec import JobSpec

if TYPE_CHECKING:
    from rewind.config import Settings


def _spec_of_run(settings: Settings, run_id: str) -> tuple[JobSpec, str]:
    """The run's spec as the ledger holds it (secrets masked: enough to name datasets)."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger

    with Ledger.open(settings.ledger) as ledger:
        plan_id = ledger.get_run(run_id).plan_id
        return JobSpec.model_validate(ledger.get_plan(plan_id).plan["spec"]), plan_id


def of_run(command: str) -> Callable[..., LineageRun]:
    """The maker of :func:`rewind.openlineage.runs.emits` for a command on a run
    (``fn(settings, run_id, ...)``): verify, promote, rollback."""

    def make(settings: Settings, run_id: str, *args: Any, **kwargs: Any) -> LineageRun:
        spec, plan_id = _spec_of_run(settings, run_id)
        if command == "verify":
            return verify(settings, spec, run_id, plan_id)
        return publish(settings, spec, run_id, plan_id, command)

    return make


def published(lineage: LineageRun, result: Mapping[str, Any]) -> None:
    lineage.complete(state=result.get("state"), details={"swap": result.get("swap")})


def plan(settings: Settings, spec: JobSpec, *args: Any, **kwargs: Any) -> LineageRun:
    """``rewind plan``: reads the source (resolve, sample), writes no dataset."""
    return track(settings, job_name(spec.name, "plan"), "plan", spec=spec, outputs=[])


def planned(lineage: LineageRun, plan: Any) -> None:
    """COMPLETE with the plan's id (a plan a gate refused is still a plan made)."""
    lineage.complete(plan_id=plan.plan_id, details={"ok": plan.ok, "units": len(plan.units)})


def verify(settings: Settings, spec: JobSpec, run_id: str, plan_id: str) -> LineageRun:
    """``rewind verify``: reads the run's staging (and its reference); writes none."""
    staging = [d.with_stats(role="staging") for d in sink_datasets(settings, spec, run_id)]
    return track(
        settings,
        job_name(spec.name, "verify"),
        "verify",
        spec=spec,
        inputs=staging,
        outputs=[],
        plan_id=plan_id,
        rewind_run_id=run_id,
    )


def verified(lineage: LineageRun, report: Mapping[str, Any]) -> None:
    """COMPLETE with the verification's checks as ``dataQualityAssertions`` on the staging."""
    checks = assertions_of(report)
    inputs = [d.with_stats(assertions=checks, rows=_int(report.get("rows"))) for d in lineage.inputs]
    lineage.complete(inputs, details={"passed": bool(report.get("passed"))})


def _int(value: Any) -> int | None:
    if isinstance(value, Mapping):
        value = value.get("staging")
    return int(value) if isinstance(value, int) else None


def assertions_of(report: Mapping[str, Any]) -> tuple[Assertion, ...]:
    """The checks of a verify report: records missing, extra, duplicated, changed state (per
    column), each assertion of the ``verify:`` section; an outcome check's mismatches."""
    out: list[Assertion] = []
    record = report.get("record")
    if isinstance(record, Mapping):
        dup = record.get("duplicates")
        dups = dup.get("staging") if isinstance(dup, Mapping) else dup
        for name, value in (
            ("missing", record.get("missing")),
            ("extra", record.get("extra")),
            ("duplicates", dups),
        ):
            if isinstance(value, int):
                out.append(Assertion(f"no-{name}-records", value == 0, expected="0", actual=str(value)))
    state = report.get("state")
    if isinstance(state, Mapping):
        changed = state.get("changed")
        if isinstance(changed, int):
            out.append(Assertion("no-changed-rows", changed == 0, expected="0", actual=str(changed)))
        for column, n in (state.get("by_column") or {}).items():
            if isinstance(n, int):
                out.append(
                    Assertion("no-changed-values", n == 0, column=str(column), expected="0", actual=str(n))
                )
    for a in report.get("assertions") or ():
        if isinstance(a, Mapping) and a.get("name"):
            expected = a.get("expected")
            actual = a.get("value", a.get("detail"))
            out.append(
                Assertion(
                    str(a["name"]),
                    bool(a.get("passed")),
                    expected=None if expected is None else str(expected),
                    actual=None if actual is None else str(actual),
                )
            )
    if "mismatched" in report and isinstance(report.get("mismatched"), int):
        n = int(report["mismatched"])
        out.append(Assertion("outcome-matches-source", n == 0, expected="0", actual=str(n)))
    return tuple(out)


def publish(settings: Settings, spec: JobSpec, run_id: str, plan_id: str, command: str) -> LineageRun:
    """``rewind promote`` / ``rewind rollback``: the staging in, the target out."""
    targets = sink_datasets(settings, spec, run_id)
    return track(
        settings,
        job_name(spec.name, command),
        command,
        spec=spec,
        inputs=[d.with_stats(role="staging") for d in targets],
        outputs=targets,
        plan_id=plan_id,
        rewind_run_id=run_id,
    )


def archive(settings: Settings, topics: Sequence[str], table: str, *args: Any, **kwargs: Any) -> LineageRun:
    """An archive pass: the topics in, the archive table out."""
    boot = settings.bootstrap_servers
    return track(
        settings,
        f"archive.{table}",
        "archive",
        inputs=[kafka(boot, t) for t in topics],
        outputs=[iceberg(settings, table, role="archive")],
    )


def archived(lineage: LineageRun, result: Mapping[str, Any]) -> None:
    """COMPLETE with the records the passes wrote to the archive."""
    rows = result.get("records")
    outputs = [d.with_stats(rows=rows if isinstance(rows, int) else None) for d in lineage.outputs]
    keys = ("pass_id", "committed", "snapshot_id", "records", "skipped_offsets", "gaps", "files")
    passes = [{k: p.get(k) for k in keys} for p in result.get("passes") or ()]
    lineage.complete(outputs=outputs, details={"mode": result.get("mode"), "passes": passes})


def shadow(settings: Settings, spec: JobSpec, *args: Any, **kwargs: Any) -> LineageRun:
    """``rewind shadow start``: the parent of its history run (``with as_parent(...)``)."""
    return track(settings, job_name(spec.name, "shadow"), "shadow", spec=spec, processing_type="STREAMING")


def compensate(settings: Settings, run_id: str, topic: str, *args: Any, **kwargs: Any) -> LineageRun:
    """``rewind compensate``: the verified staging and the target in, the correction topic out."""
    spec, plan_id = _spec_of_run(settings, run_id)
    targets = sink_datasets(settings, spec, run_id)
    inputs = [d.with_stats(role="staging") for d in targets] + list(targets)
    return track(
        settings,
        job_name(spec.name, "compensate"),
        "compensate",
        spec=spec,
        inputs=inputs,
        outputs=[kafka(settings.bootstrap_servers, topic)],
        plan_id=plan_id,
        rewind_run_id=run_id,
    )


def compensated(lineage: LineageRun, result: Mapping[str, Any]) -> None:
    messages = result.get("messages")
    outputs = [d.with_stats(rows=messages if isinstance(messages, int) else None) for d in lineage.outputs]
    details = {k: result.get(k) for k in ("shape", "dry_run", "keys", "counts", "already_done")}
    lineage.complete(outputs=outputs, details=details)


def reconsume(settings: Settings, reconsume_id: str, *args: Any, **kwargs: Any) -> LineageRun:
    """A reconsume, one OpenLineage run from ``start`` (START) to ``finish`` (COMPLETE): the
    same run id in both processes."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger
    from rewind.ledger.reconsumes import ReconsumeStore

    with Ledger.open(settings.ledger) as ledger:
        record = ReconsumeStore(ledger.engine).get(reconsume_id)
    topics, group = record.topics, record.live_group
    return track(
        settings,
        f"reconsume.{reconsume_id}",
        "reconsume",
        inputs=[kafka(settings.bootstrap_servers, t) for t in topics],
        outputs=[],
        run_id=stable_run_id("reconsume", reconsume_id),
        details={"live_group": group, "temp_group": record.temp_group, "mode": record.mode},
    )


def rehearsal(settings: Settings, spec: JobSpec, *args: Any, **kwargs: Any) -> LineageRun:
    """``rewind rehearse``: the parent of the run, verify, promote and rollback it walks."""
    return track(settings, job_name(spec.name, "rehearse"), "rehearse", spec=spec, outputs=[])
