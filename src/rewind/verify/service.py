"""``rewind verify RUN``: reconcile a run's staging with its reference and record the verdict.

:func:`verify_run` is the operation the CLI calls; :func:`verify_frames` is the same
comparison for any two DataFrames (tests, benchmarks, notebooks).

Steps of :func:`verify_run`, in order: (1) load the run, its plan and spec from the ledger
(a run that has not succeeded is refused) and pick the verify section: the plan's, or one
given now (``--spec``, which must be the run's spec but for ``verify:``, or ``--verify-file``);
(2) read staging through its sink; (3) read the reference named in ``verify.reference``
(one-line error when it cannot be reached); (4) compare (records, state, buckets) and run the
assertions; (5) write the HTML and JSON report; (6) record ``verify`` in the ledger's audit
with ``passed``, a summary and which verify section was used (its source and digest); the
promotion gate reads the latest such entry. Nothing is written to staging, the target or the
reference.

A verify section given now replaces the plan's for this verification only: a tolerance can be
changed without planning and running the backfill again, and the ledger says which section
each verdict was reached with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.job.components import make_sink
from rewind.job.merge import describe_merge, recorded_merge
from rewind.job.spec_secrets import check_same_job
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.secrets import mask
from rewind.spark import session
from rewind.spec import Verify
from rewind.verify.assertions import run_assertions
from rewind.verify.compare import compare
from rewind.verify.exceptions import VerifyError
from rewind.verify.outcome import verify_outcome
from rewind.verify.prepare import apply_scope, without_flag
from rewind.verify.report import build_report, summary, write_report
from rewind.verify.rules import resolve
from rewind.verify.sources import reference_side, scratch
from rewind.verify.spark_util import spark_types

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.sinks.base import StagingSink
    from rewind.spec import JobSpec

log = logging.getLogger(__name__)

VERIFIABLE = ("succeeded", "promoted", "rolled_back")


def job_window(spec: JobSpec) -> tuple[datetime | None, datetime | None]:
    """The job's window where its ends are times (an end given as offsets is unbounded): the
    replaced window of a replace-window sink (``window_from``/``window_to``), else the source's."""
    kafka = spec.source.kafka or spec.source.history
    if kafka is None:
        return None, None
    lo = kafka.from_ if isinstance(kafka.from_, datetime) else None
    hi = kafka.to if isinstance(kafka.to, datetime) else None
    start, end = spec.sink.window_bounds
    return start or lo, end or hi


def verify_frames(
    spark: SparkSession,
    staging: DataFrame,
    reference: DataFrame,
    verify: Verify,
    *,
    job_key: list[str] | tuple[str, ...] = (),
    job_window: tuple[datetime | None, datetime | None] = (None, None),
    sink_window_column: str | None = None,
    run_id: str | None = None,
    staging_name: str = "staging",
    reference_name: str = "reference",
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Compare two DataFrames as ``verify`` says; returns the JSON report (``passed``, ``checks``...)."""
    began = time.perf_counter()
    types = spark_types(staging)
    rules = resolve(
        verify,
        types,
        spark_types(reference),
        job_key=job_key,
        job_window=job_window,
        sink_window_column=sink_window_column,
        reference_name=reference_name,
    )
    result = compare(spark, staging, reference, rules)
    assertions: list[dict[str, Any]] = []
    if verify.assertions:
        scoped_staging = without_flag(apply_scope(staging, rules, types, side=0, name="staging"))
        scoped_reference = without_flag(apply_scope(reference, rules, types, side=1, name="reference"))
        assertions = run_assertions(
            spark, list(verify.assertions), scoped_staging, scoped_reference, samples=verify.samples
        )
    return build_report(
        result,
        assertions,
        rules,
        run_id=run_id,
        staging=staging_name,
        reference=reference_name,
        notes=notes,
        seconds=time.perf_counter() - began,
    )


def verify_digest(verify: Verify) -> str:
    """sha256 (hex, first 16) of a verify section's canonical JSON, secrets masked: which
    tolerances a verdict was reached with, comparable across verifications."""
    data = mask(verify.model_dump(mode="json", by_alias=True, exclude_none=True))
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def default_report_path(settings: Settings, run_id: str) -> Path:
    return settings.state_path / "reports" / f"{run_id}-verify.html"


def _verify_outcome(
    settings: Settings, ledger: Any, spec: JobSpec, run_id: str, run: Any, report_path: str | Path | None
) -> dict[str, Any]:
    """A reconstruction's verification: its events replayed with the fold give the source's latest
    state (:mod:`rewind.verify.outcome`); the JSON report, and the verdict in the audit."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import load_plan

    facts = load_plan(ledger, run.plan_id).read_plan.get("table") or {}
    report = verify_outcome(settings, spec, run_id, run.staging, facts)
    path = Path(report_path) if report_path else default_report_path(settings, run_id)
    path = path.with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))
    report["report"] = {"json": str(path)}
    keys = ("passed", "failed", "mode", "entities", "matched", "mismatched", "missing", "by_type", "report")
    ledger.audit(run_id, "verify", {k: report[k] for k in keys})
    return report


@emits(lineage.of_run("verify"), lineage.verified)
def verify_run(
    settings: Settings,
    run_id: str,
    report_path: str | Path | None = None,
    *,
    spec: JobSpec | None = None,
    verify: Verify | None = None,
) -> dict[str, Any]:
    """Verify run ``run_id`` and record the verdict in the ledger; returns the JSON report.

    The report is written to ``report_path`` (HTML, with the JSON beside it; a ``.json`` path
    writes only JSON), by default ``<state_dir>/reports/<run>-verify.html``. ``spec`` (the
    run's spec with another ``verify:``, refused naming the first other field that differs; it
    also puts back the secrets the ledger masked) or ``verify`` (a section alone) replaces the
    plan's verify section for this verification.
    """
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import load_plan, open_ledger, usable_plan

    if spec is not None and verify is not None:
        raise VerifyError("give a spec (--spec) or a verify section (--verify-file), not both")
    ledger = open_ledger(settings)
    sink: StagingSink[Any] | None = None
    try:
        run = ledger.get_run(run_id)
        if run.state not in VERIFIABLE:
            raise VerifyError(
                f"run {run_id} is {run.state}: only a run that succeeded can be verified "
                f"(`rewind resume {run_id}` finishes it)"
            )
        if not run.staging:
            raise VerifyError(f"run {run_id} has no staging recorded; nothing to verify")
        if spec is not None:
            stored = load_plan(ledger, run.plan_id).spec
            check_same_job(spec, stored, f"--spec for run {run_id}", ("verify",))
            source = "spec"
        else:
            needed = ("sink",) if verify is not None else ("sink", "verify")
            spec = usable_plan(settings, ledger, run.plan_id, needed=needed).job_spec()
            source = "file" if verify is not None else "plan"
        table = spec.source.table
        if verify is None and spec.verify is None and table is not None and table.reconstruct is not None:
            return _verify_outcome(settings, ledger, spec, run_id, run, report_path)
        verify = verify or spec.verify or Verify()
        used = {"source": source, "digest": verify_digest(verify)}
        sink = make_sink(settings, spec)
        staging = sink.staging_from_dict(run.staging)
        spark = session(settings)
        staging_df = sink.read(spark, staging)
        needs_catalog = verify.reference.iceberg is not None or verify.reference.sql is not None
        catalog = load_catalog(settings) if needs_catalog else None
        window_column = spec.sink.window_column
        merged = recorded_merge(ledger, run_id)  # what the run's merge policy decided, per row
        with scratch(settings) as folder:
            side = reference_side(
                spark,
                verify.reference,
                staging_df=staging_df,
                catalog=catalog,
                folder=folder,
                sink=sink,
                staging=staging,
                spec=spec,
                settings=settings,
            )
            report = verify_frames(
                spark,
                staging_df,
                side.df,
                verify,
                job_key=spec.key,
                job_window=job_window(spec),
                sink_window_column=window_column,
                run_id=run_id,
                staging_name=f"{sink.kind}:{staging.describe()}",
                reference_name=side.name,
                notes=[*side.notes, *([describe_merge(merged)] if merged else [])],
            )
        if merged:
            report["merge"] = merged
        report["verify_section"] = used
        write_report(report, Path(report_path) if report_path else default_report_path(settings, run_id))
        ledger.audit(run_id, "verify", {**summary(report), "verify_section": used})
        return report
    finally:
        if sink is not None:  # made once the run is known
            sink.close()
        ledger.close()
