"""Commands of a run's life: `plan`, `run`, `resume`, `runs`, `show`, `promote`, `rollback`, `cleanup`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from rewind.cli.app import JsonOpt, MetricsAddressOpt, MetricsOpt, _settings, app, command
from rewind.output import output

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.progress import CliConsole


@app.command()
@command
def plan(spec: Annotated[Path, typer.Argument(help="Job spec (YAML).")], json_out: JsonOpt = False) -> None:
    """Resolve the window, sample, check the gates; store the plan. Moves nothing."""
    # lazy: keeps sqlalchemy, pydantic, yaml out of --help
    from rewind.job.service import plan_job, run_stages
    from rewind.spec import load_spec

    settings = _settings()
    job_plan = plan_job(settings, load_spec(spec))
    data = _plan_summary(job_plan)
    data["stages"] = [{"stage": s.name, "does": s.describe()} for s in run_stages(settings, job_plan)]
    out = output(json_out)
    out.result(data, _render_plan)
    if not job_plan.ok:
        gate = job_plan.failed_gates()[0]
        out.failure(f"plan {job_plan.plan_id} refused by gate {gate.name}: {gate.detail}")
        raise typer.Exit(1)


def _plan_summary(job_plan: Any) -> dict[str, Any]:
    by_partition: dict[str, dict[str, Any]] = {}
    history = job_plan.read_plan.get("history")
    # a plan refused before its ranges were known (e.g. lost offsets) has no partitions
    for p in (history or job_plan.read_plan).get("partitions", []):
        if history is not None:  # a history source: archive below the seam, Kafka above
            by_partition[f"{p['topic']}/{p['partition']}"] = {
                "start": p["start"], "end": p["end"], "low": p["low"], "high": p["high"],
                "offsets": p["end"] - p["start"], "start_method": f"archive < {p['seam']}",
                "end_method": "kafka", "missing_below_low": None, "gaps": p["gaps"],
            }
            continue
        by_partition[f"{p['topic']}/{p['partition']}"] = {
            "start": p["start"],
            "end": p["end"],
            "low": p["low"],
            "high": p["high"],
            "offsets": p["end"] - p["start"],
            "start_method": p["start_method"],
            "end_method": p["end_method"],
            "missing_below_low": p["missing_below_low"],
        }
    return {
        "plan_id": job_plan.plan_id,
        "name": job_plan.name,
        "ok": job_plan.ok,
        "offsets": job_plan.offsets,
        "units": len(job_plan.units),
        "partitions": by_partition,
        "estimates": job_plan.estimates,
        "output_columns": [list(c) for c in job_plan.output_columns],
        "gates": [{"name": g.name, "ok": g.ok, "detail": g.detail} for g in job_plan.gates],
        "notes": list(job_plan.notes),
        **({"table": _table_summary(job_plan.read_plan["table"])} if "table" in job_plan.read_plan else {}),
    }


def _table_summary(facts: dict[str, Any]) -> dict[str, Any]:
    """A re-produce's selection: where the entities land, which partitions are skipped or stuck."""
    skipped, stuck = facts.get("skipped") or {}, facts.get("stuck") or {}
    placement = {
        p: {"entities": n, "skipped": p in skipped, "stuck": stuck.get(p)}
        for p, n in (facts.get("placement") or {}).items()
    }
    keys: tuple[str, ...] = ("label", "key", "selection", "selected", "topic", "partitions", "partitioner")
    keys += ("target",)  # a reconstruction into a table: no topic
    keys += ("states", "entities", "sample")  # a reconstruction's
    return {
        **{k: facts.get(k) for k in keys},
        "ranges": len(facts.get("ranges") or []),
        "placement": placement,
    }


def _selected(t: dict[str, Any]) -> str:
    """``N entities``, or for a reconstruction ``N states of M entities``."""
    if t.get("states") is not None:
        return f"{t['states']:,} states of {t['entities']:,} entities"
    return f"{t['selected'] or 0:,} entities"


def _render_table_plan(console: Console, d: dict[str, Any]) -> None:
    t = d["table"]
    console.print(
        f"[bold]plan {d['plan_id']}[/] for {d['name']}: {_selected(t)} of {t['label']} "
        f"({t['selection']}) in {t['ranges']} key ranges → {t['topic'] or t['target']}"
        + (f", {t['partitions']} partitions by {t['partitioner']}" if t["partitions"] else "")
    )
    table = Table("partition", "entities", "")
    for p, facts in t["placement"].items():
        flags = []
        if facts["skipped"]:
            flags.append("[yellow]skipped[/] (counted as filtered)")
        if facts["stuck"]:
            stuck = facts["stuck"]
            flags.append(
                f"[red]stuck[/]: {stuck['lag']:,} unconsumed, the oldest {stuck['oldest_age_s']} s old"
            )
        table.add_row(p, f"{facts['entities']:,}", "; ".join(flags))
    if t["placement"]:
        console.print(table)


def _render_plan(console: Console, d: dict[str, Any]) -> None:
    if "table" in d:  # a re-produce: entities per partition, not offsets
        _render_table_plan(console, d)
    else:
        console.print(
            f"[bold]plan {d['plan_id']}[/] for {d['name']}: {d['offsets']:,} offsets in {d['units']} units"
        )
        table = Table("partition", "range", "offsets", "log", "how")
        for name, p in d["partitions"].items():
            how = f"{p['start_method']} → {p['end_method']}"
            if p["missing_below_low"]:
                how += " [red](below log start)[/]"
            table.add_row(
                name, f"[{p['start']}, {p['end']})", f"{p['offsets']:,}", f"[{p['low']}, {p['high']})", how
            )
        console.print(table)
    est = dict(d["estimates"])
    cost = est.pop("cost", None)
    console.print(", ".join(f"{k}={v}" for k, v in est.items()))
    if cost:
        # lazy: keeps rewind.core.cost out of --help
        from rewind.core.cost import describe

        for line in describe(cost):
            console.print(f"  {line}")
    gates = Table("gate", "ok", "detail")
    for g in d["gates"]:
        gates.add_row(g["name"], "[green]yes[/]" if g["ok"] else "[red]NO[/]", g["detail"])
    console.print(gates)
    stages = d.get("stages") or []
    waves = [st for st in stages if st["stage"] == "run-wave"]
    console.print(f"[bold]a run walks {len(stages)} stages[/] ({len(waves)} waves):")
    for i, st in enumerate(stages, 1):
        if st["stage"] == "run-wave" and st is not waves[0] and st is not waves[-1]:
            continue  # the first and the last wave stand for the rest
        console.print(f"  {i}. {st['does']}")
    for note in d["notes"][:5]:
        console.print(f"[dim]note: {note}[/]")


@app.command()
@command
def run(
    spec_or_plan: Annotated[str, typer.Argument(help="Job spec (YAML) or a stored plan id.")],
    json_out: JsonOpt = False,
    metrics_port: MetricsOpt = None,
    metrics_address: MetricsAddressOpt = None,
    accept_risk: Annotated[
        str | None,
        typer.Option(
            "--accept-risk",
            help='Run although `rewind readiness` scores an area red; the reason is recorded.',
        ),
    ] = None,
    pushgateway: Annotated[
        str | None,
        typer.Option("--pushgateway", help="Push the run's metrics to this Pushgateway when it ends (URL)."),
    ] = None,
) -> None:
    """Plan if given a spec, then execute on Spark into staging.

    A spec is scored first (`rewind readiness`): a red area refuses the run unless --accept-risk."""
    # lazy: keeps sqlalchemy, pydantic, yaml out of --help
    from rewind.job.service import run_job
    from rewind.ops.readiness import gate_run
    from rewind.spec import load_spec

    settings = _settings()
    _start_spark_early(settings)
    target: Any = spec_or_plan if spec_or_plan.startswith("p-") and not Path(spec_or_plan).exists() else None
    accepted = None
    if target is None:
        gated = gate_run(settings, load_spec(Path(spec_or_plan)), accept_risk)
        target, accepted = gated.plan, gated.accepted_risk
    timings: list[dict[str, Any]] = []
    collector_for = _collector_for(settings, timings)
    console = _run_console(settings, json_out, metrics_port, metrics_address, collector_for)
    try:
        with console:
            outcome = run_job(settings, target, console=console, timings=timings, accepted_risk=accepted)
    finally:
        if pushgateway and console.run_id:  # a failed run's counts are pushed too
            _push(settings, console.run_id, pushgateway, timings)
    output(json_out).result(outcome.to_dict(), _render_outcome)


def _push(settings: Settings, run_id: str, url: str, timings: list[dict[str, Any]]) -> None:
    """Push the run's metrics; a failed push fails a run that succeeded (one line), and is only
    logged under a run's own error (which stays the one reported)."""
    # lazy: keeps rewind.ops.metrics out of --help
    from rewind.ops.metrics import MetricsPushError, push_run

    try:
        push_run(settings, run_id, url, timings)
    except MetricsPushError:
        if not _run_failed(settings, run_id):
            raise
        logging.getLogger(__name__).warning("metrics of run %s not pushed", run_id, exc_info=True)


def _run_failed(settings: Settings, run_id: str) -> bool:
    # lazy: keeps sqlalchemy out of --help
    from rewind.job.service import open_ledger

    with open_ledger(settings) as ledger:
        return ledger.get_run(run_id).state != "succeeded"


def _collector_for(settings: Settings, timings: list[dict[str, Any]]) -> Any:
    """The run's Prometheus families on ``/metrics`` (:class:`rewind.ops.metrics.RunCollector`)."""

    def make(run_id: str) -> Any:
        # lazy: keeps rewind.ops.metrics out of --help
        from rewind.ops.metrics import RunCollector

        return RunCollector(settings, run_id, timings)

    return make


@app.command()
@command
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to finish.")],
    json_out: JsonOpt = False,
    metrics_port: MetricsOpt = None,
    metrics_address: MetricsAddressOpt = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The run's original spec file: puts back the secrets the ledger does not keep "
            "(it must be the run's spec but for them).",
        ),
    ] = None,
    pushgateway: Annotated[
        str | None,
        typer.Option("--pushgateway", help="Push the run's metrics to this Pushgateway when it ends (URL)."),
    ] = None,
) -> None:
    """Finish an interrupted or failed run; only unfinished units are redone."""
    # lazy: keeps sqlalchemy, pydantic, yaml out of --help
    from rewind.job.service import resume_job
    from rewind.spec import load_spec

    settings = _settings()
    _start_spark_early(settings)
    original = load_spec(spec) if spec is not None else None
    timings: list[dict[str, Any]] = []
    collector_for = _collector_for(settings, timings)
    console = _run_console(settings, json_out, metrics_port, metrics_address, collector_for)
    try:
        with console:
            outcome = resume_job(settings, run_id, console=console, spec=original, timings=timings)
    finally:
        if pushgateway and console.run_id:
            _push(settings, console.run_id, pushgateway, timings)
    output(json_out).result(outcome.to_dict(), _render_outcome)


def _start_spark_early(settings: Settings) -> None:
    """Spark's JVM starts while the run is planned and checked (a cold run's two slowest steps
    overlap); a run refused before it needs Spark leaves the JVM to end with this process."""
    # lazy: keeps pyspark out of --help
    from rewind.spark.session import start_early

    start_early(settings)


def _run_console(
    settings: Settings, json_out: bool, port: int | None, address: str | None, collector_for: Any = None
) -> CliConsole:
    """The console of a run: progress on stderr unless ``--json``; metrics when a port is given
    (the options win over the settings' ``metrics`` section)."""
    # lazy: keeps rewind.progress out of --help
    from rewind.progress import CliConsole

    return CliConsole(
        enabled=not json_out,
        metrics_port=port or settings.metrics.port,
        metrics_address=address or settings.metrics.address,
        collector_for=collector_for,
    )


def _render_outcome(console: Console, d: dict[str, Any]) -> None:
    console.print(
        f"[bold]{d['run_id']}[/] {d['state']}: read {d['records_read']:,}, rows out {d['rows_out']:,}, "
        f"quarantined {d['quarantined']:,}, filtered {d['filtered']:,} in {d['seconds']}s "
        f"({d['records_per_s'] or 0:,} rec/s)"
    )
    for reason, count in (d.get("quarantine_reasons") or {}).items():
        console.print(f"  quarantined {count:,}: {reason}")
    if d.get("live"):
        console.print(f"  {d['live']['summary']}")
    if d.get("folded"):
        console.print(f"  {_folded(d['folded'])}")
    if d.get("merged"):
        # lazy: keeps rewind.job.merge out of --help
        from rewind.job.merge import describe_merge

        console.print(f"  {describe_merge(d['merged'])}")
    staging = d["staging"]
    where = staging.get("table") or (f"topic {staging['topic']}" if staging.get("topic") else "?")
    where += f"@{staging['branch']}" if staging.get("branch") else ""
    if (staging.get("value_format") or {}).get("encode") == "avro":
        where += f" (Avro values, {staging['value_format']['where']})"
    console.print(f"staging: {where}; quarantine: {d['quarantine_table']}")


@app.command()
@command
def runs(json_out: JsonOpt = False, limit: Annotated[int, typer.Option(help="How many.")] = 20) -> None:
    """The latest runs."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.job.service import list_runs

    data = list_runs(_settings(), limit)

    def render(console: Console, rows: Any) -> None:
        # run ids are what users copy into the next command: never cut or wrapped
        widest = max((len(r["run_id"]) for r in rows["runs"]), default=3)
        table = Table(Column("run", no_wrap=True, min_width=widest), "name", "state", "target",
                      "created", "finished")
        for r in rows["runs"]:
            table.add_row(
                r["run_id"], r["name"], _state_text(r), r["target"], r["created_at"], r["finished_at"] or ""
            )
        console.print(table)

    output(json_out).result({"runs": data}, render)


@app.command()
@command
def show(run_id: Annotated[str, typer.Argument(help="The run.")], json_out: JsonOpt = False) -> None:
    """State, timings, counts per unit, quarantine by reason, and where the output is."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.job.service import show_run

    data = show_run(_settings(), run_id)

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold]{d['run_id']}[/] ({d['name']}) {_state_text(d)}, plan {d['plan_id']}, by {d['user']}",
            soft_wrap=True,
        )
        console.print(f"created {d['created_at']}, started {d['started_at']}, finished {d['finished_at']}")
        if d["error"]:
            console.print(f"[red]error:[/] {d['error']}", soft_wrap=True)
        if d["accepted_risk"]:
            risk = d["accepted_risk"]
            red = ", ".join(risk["red"])
            line = f"[yellow]risk accepted[/] by {risk['user']} for red {red}: {risk['reason']}"
            console.print(line, soft_wrap=True)
        console.print(
            f"read {d['records_read']:,}, emitted {d['emitted']:,}, rows out {d['rows_out']:,}, "
            f"quarantined {d['quarantined']:,}, filtered {d['filtered']:,}; "
            + ", ".join(f"{n} units {state}" for state, n in sorted(d["units_by_state"].items()))
        )
        for reason, count in (d["quarantine_reasons"] or {}).items():
            console.print(f"  quarantined {count}: {reason}")
        if d.get("merge"):
            # lazy: keeps rewind.job.merge out of --help
            from rewind.job.merge import describe_merge

            console.print(f"  {describe_merge(d['merge'])}")
        console.print(f"staging ({d['staging_state']}): {_staging_text(d['staging'])}", soft_wrap=True)
        if d["report"]:
            console.print(f"report: {d['report'].get('html') or d['report'].get('json')}", soft_wrap=True)
        table = Table("unit", "state", "attempts", "read", "rows", "quarantined", "filtered")
        for u in d["units"][:50]:
            table.add_row(
                u["unit_id"],
                u["state"],
                str(u["attempts"]),
                str(u["records_read"]),
                str(u["rows_out"]),
                str(u["quarantined"]),
                str(u["filtered"]),
            )
        console.print(table)
        for entry in d["history"]:
            console.print(f"{entry['at']} {entry['action']} by {entry['user']}{_history_detail(entry)}")

    output(json_out).result(data, render)


def _state_text(run: dict[str, Any]) -> str:
    """``running``, or ``stale (lease expired at ..., held by pid N on host H; ...)``."""
    detail = run.get("state_detail")
    shown = f"{run['state']} ({detail})" if detail and run["state"] != "running" else run["state"]
    return f"[yellow]{shown}[/]" if run["state"] in ("stale", "possibly-dead") else shown


def _staging_text(staging: dict[str, Any] | None) -> str:
    """The staging record as ``field value`` pairs; an encoded schema is named, not printed."""
    if not staging:
        return "none"
    shown = []
    for name, value in staging.items():
        if "schema" in name and isinstance(value, str) and len(value) > 40:
            shown.append(f"{name} (recorded)")
        elif isinstance(value, dict):
            shown.append(f"{name} " + ", ".join(f"{k}={v}" for k, v in value.items()))
        elif value not in (None, "", False):
            shown.append(f"{name} {value}")
    return "; ".join(shown)


def _folded(counts: dict[str, Any]) -> str:
    return (
        f"folded {counts.get('rows_in', 0):,} partial rows into {counts.get('rows_out', 0):,} "
        f"({counts.get('outside_window', 0):,} outside the window dropped)"
    )


def _history_detail(entry: dict[str, Any]) -> str:
    """The part of an audit entry worth a line: what a swap replaced, a verdict, a reason."""
    d = entry["details"] or {}
    if "before" in d and "after" in d:
        done = " (already done)" if d.get("already_done") else ""
        return f": {d.get('target')} {d.get('before')} -> {d.get('after')}{done}"
    if "passed" in d:
        return f": {'passed' if d['passed'] else 'FAILED'}"
    if "rows_in" in d:
        return f": {_folded(d)}"
    if entry["action"] == "merged":
        # lazy: keeps rewind.job.merge out of --help
        from rewind.job.merge import describe_merge

        return f": {describe_merge(d)}"
    return f": {d['reason']}" if d.get("reason") else ""


@app.command()
@command
def promote(
    run_id: Annotated[str, typer.Argument(help="The run whose staging becomes live.")],
    json_out: JsonOpt = False,
    force: Annotated[bool, typer.Option(help="Override failed gates (needs --reason).")] = False,
    reason: Annotated[str | None, typer.Option(help="Why the gates are overridden (recorded).")] = None,
    rebase: Annotated[
        bool,
        typer.Option(help="Iceberg: if the target moved since staging, re-apply the run's output on it."),
    ] = False,
) -> None:
    """Swap the verified staging in atomically; refused unless the gates pass."""
    # lazy: keeps rewind.job.publish out of --help
    from rewind.job.publish import promote_run

    data = promote_run(_settings(), run_id, force=force, reason=reason, rebase=rebase)
    output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} promoted: {d['swap']}"))


@app.command()
@command
def rollback(
    run_id: Annotated[str, typer.Argument(help="The promoted run to undo.")], json_out: JsonOpt = False
) -> None:
    """Restore what the target held before the run's promotion."""
    # lazy: keeps rewind.job.publish out of --help
    from rewind.job.publish import rollback_run

    data = rollback_run(_settings(), run_id)
    output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} rolled back: {d['swap']}"))


@app.command()
@command
def cleanup(
    run_id: Annotated[str, typer.Argument(help="The run to clean up.")], json_out: JsonOpt = False
) -> None:
    """Drop what a run left behind: staging, a previous table kept for rollback, a backfill topic."""
    # lazy: keeps rewind.job.publish out of --help
    from rewind.job.publish import cleanup_run

    data = cleanup_run(_settings(), run_id)
    output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} cleaned up: {d['cleanup']}"))
