"""``rewind verify RUN``: reconcile a run's staging with its reference and record the verdict.

:func:`verify_run` is the operation the CLI calls; :func:`verify_frames` is the same
comparison for any two DataFrames (tests, benchmarks, notebooks).

Steps of :func:`verify_run`, in order: (1) load the run, its plan and spec from the ledger
(a run that has not succeeded is refused); (2) read staging through its sink; (3) read the
reference named in ``verify.reference`` (one-line error when it cannot be reached);
(4) compare (records, state, buckets) and run the assertions; (5) write the HTML and JSON
report; (6) record ``verify`` in the ledger's audit with ``passed`` and a summary, which
the promotion gate reads. Nothing is written to staging, the target or the reference.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.spec import Verify
from rewind.verify.exceptions import VerifyError

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
    from rewind.verify.assertions import run_assertions
    from rewind.verify.compare import compare
    from rewind.verify.prepare import apply_scope, without_flag
    from rewind.verify.report import build_report
    from rewind.verify.rules import resolve
    from rewind.verify.spark_util import spark_types

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


def default_report_path(settings: Settings, run_id: str) -> Path:
    return settings.state_path / "reports" / f"{run_id}-verify.html"


def verify_run(settings: Settings, run_id: str, report_path: str | Path | None = None) -> dict[str, Any]:
    """Verify run ``run_id`` and record the verdict in the ledger; returns the JSON report.

    The report is written to ``report_path`` (HTML, with the JSON beside it; a ``.json`` path
    writes only JSON), by default ``<state_dir>/reports/<run>-verify.html``.
    """
    from rewind.catalog import load_catalog
    from rewind.job.components import make_sink
    from rewind.job.service import open_ledger, usable_plan
    from rewind.spark import session
    from rewind.verify.report import summary, write_report
    from rewind.verify.sources import reference_side, scratch

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
        spec = usable_plan(settings, ledger, run.plan_id, needed=("sink", "verify")).job_spec()
        verify = spec.verify or Verify()
        sink = make_sink(settings, spec)
        staging = sink.staging_from_dict(run.staging)
        spark = session(settings)
        staging_df = sink.read(spark, staging)
        needs_catalog = verify.reference.iceberg is not None or verify.reference.sql is not None
        catalog = load_catalog(settings) if needs_catalog else None
        window_column = spec.sink.window_column
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
                notes=side.notes,
            )
        write_report(report, Path(report_path) if report_path else default_report_path(settings, run_id))
        ledger.audit(run_id, "verify", summary(report))
        return report
    finally:
        if sink is not None:  # made once the run is known
            sink.close()
        ledger.close()
