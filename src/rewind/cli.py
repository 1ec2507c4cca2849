"""The ``rewind`` command line: parse, call the core, print. No logic lives here."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from rewind import logs
from rewind.config import Settings, load_settings
from rewind.errors import RewindError
from rewind.output import Output
from rewind.secrets import mask_text

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help=(
        "Rewind reprocesses Kafka history safely: plan a window, run it on Spark into staging, "
        "verify it against a reference, promote it atomically, roll it back with one command. "
        "`rewind demo` shows a whole repair; docs/quickstart.md starts you off."
    ),
)
dev_app = typer.Typer(no_args_is_help=True, help="The embedded stack on loopback.")
app.add_typer(dev_app, name="dev")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
F = TypeVar("F", bound=Callable[..., Any])


class _Context:
    config: Path | None = None
    debug: bool = False


ctx = _Context()


@app.callback()
def _main(
    config: Annotated[Path | None, typer.Option(help="Settings file (default ./rewind.yaml).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and client logs.")] = False,
) -> None:
    """Rewind: safe, fast, repeatable backfills and replays of Kafka event streams."""
    ctx.config, ctx.debug = config, debug


def _settings() -> Settings:
    settings = load_settings(ctx.config)
    logs.configure(logging.DEBUG if ctx.debug else logging.WARNING, settings.secret_values())
    if not ctx.debug:
        logging.getLogger("rewind.librdkafka").setLevel(logging.CRITICAL)
    return settings


def command(fn: F) -> F:
    """Turn a RewindError into one masked line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = Output(bool(kwargs.get("json_out")))
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            spark = _from_spark(exc)
            if ctx.debug or not (isinstance(exc, RewindError) or spark):
                raise
            secrets: list[str] = []
            with contextlib.suppress(RewindError):
                secrets = load_settings(ctx.config).secret_values()
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            out.error(mask_text(f"Spark: {text}" if spark else str(exc), secrets))
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _from_spark(exc: BaseException) -> bool:
    """An error Spark raised (a query that failed, a cast that did not fit): one line, like ours."""
    return type(exc).__module__.startswith(("pyspark.", "py4j."))


def _parts_table(console: Console, parts: list[dict[str, Any]]) -> None:
    table = Table("part", "state", "address", "detail")
    for p in parts:
        detail = p["detail"] + (f" (pid {p['pid']})" if p.get("pid") else "")
        if p.get("seconds") is not None:
            detail += f" [{p['seconds']:.2f}s]"
        table.add_row(p["name"], p["state"], p["address"], detail)
    console.print(table)


@dev_app.command("up")
@command
def dev_up(json_out: JsonOpt = False) -> None:
    """Start the embedded broker, catalog and ledger (idempotent)."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).up())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("down")
@command
def dev_down(json_out: JsonOpt = False) -> None:
    """Stop what `rewind dev up` started (idempotent); catalog and ledger files stay."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).down())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("status")
@command
def dev_status(json_out: JsonOpt = False) -> None:
    """Report each part of the embedded stack and its address."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).status())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@app.command()
@command
def doctor(
    json_out: JsonOpt = False,
    spark: Annotated[bool, typer.Option(help="Also time a Spark start-up.")] = True,
    join_timeout: Annotated[float, typer.Option(help="Seconds to wait for a group join.")] = 45.0,
) -> None:
    """Check Java, Spark and the broker, and probe what the broker really supports."""
    from rewind.doctor import run_doctor

    report = run_doctor(_settings(), with_spark=spark, join_timeout_s=join_timeout)
    out = Output(json_out)
    out.result(report, _render_doctor)
    if not report["ok"]:  # stderr only: with --json the report above is the one JSON object
        out.failure(report["failure"])
        raise typer.Exit(1)


def _render_doctor(console: Console, report: dict[str, Any]) -> None:
    colours = {
        "ok": "green",
        "supported": "green",
        "wrong-answer": "yellow",
        "missing": "yellow",
        "failed": "red",
    }
    table = Table("check", "status", "detail", "seconds")
    for c in report["checks"]:
        colour = colours.get(c["status"], "white")
        table.add_row(c["name"], f"[{colour}]{c['status']}[/]", c["detail"], f"{c['seconds']:.2f}")
    console.print(table)


@app.command()
@command
def demo(
    json_out: JsonOpt = False,
    events: Annotated[int, typer.Option(help="Order events in the topic (60 days of them).")] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Seed of the generated history.")] = 7,
    report: Annotated[Path | None, typer.Option(help="Where to write the HTML report.")] = None,
) -> None:
    """Play a production repair end to end on the embedded stack (starts it if needed)."""
    from rewind.demo.story import run_demo

    console = Console(stderr=json_out, highlight=False, soft_wrap=True)
    result = run_demo(_settings(), events=events, seed=seed, say=console.print, report_path=report)
    Output(json_out).result({"ok": True, "steps": result.steps, "summary": result.summary}, _render_demo)


def _render_demo(console: Console, data: dict[str, Any]) -> None:
    s = data["summary"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["quarantine_reasons"].items())) or "none"
    table = Table("", "", show_header=False, box=None)
    table.add_row("events in the topic", f"{s['events_in_topic']:,}")
    table.add_row("records read (archive + log)", f"{s['records_read']:,}")
    table.add_row("orders written to staging", f"{s['rows_written']:,}")
    table.add_row("orders repaired", f"{s['orders_repaired']:,}")
    table.add_row("quarantined", f"{s['quarantined']:,} ({reasons})")
    table.add_row("run", f"{s['run_seconds']:.1f} s, {s['records_per_s'] or 0:,} records/s")
    table.add_row("whole demo", f"{s['demo_seconds']:.1f} s")
    console.print(table)
    console.print(f"report: {s['report']}", soft_wrap=True)
    console.print(
        f"[green]demo passed[/]: every step gave the result the data says it must. "
        f"`rewind show {s['run_id']}` tells the run again; `rewind dev down` stops the stack.",
        soft_wrap=True,
    )


MetricsOpt = Annotated[
    int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics on 127.0.0.1:PORT.")
]


@app.command()
@command
def plan(spec: Annotated[Path, typer.Argument(help="Job spec (YAML).")], json_out: JsonOpt = False) -> None:
    """Resolve the window, sample, check the gates; store the plan. Moves nothing."""
    from rewind.job.service import plan_job
    from rewind.spec import load_spec

    job_plan = plan_job(_settings(), load_spec(spec))
    data = _plan_summary(job_plan)
    out = Output(json_out)
    out.result(data, _render_plan)
    if not job_plan.ok:
        gate = job_plan.failed_gates()[0]
        out.failure(f"plan {job_plan.plan_id} refused by gate {gate.name}: {gate.detail}")
        raise typer.Exit(1)


def _plan_summary(job_plan: Any) -> dict[str, Any]:
    by_partition: dict[str, dict[str, Any]] = {}
    history = job_plan.read_plan.get("history")
    for p in (history or job_plan.read_plan)["partitions"]:
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
    }


def _render_plan(console: Console, d: dict[str, Any]) -> None:
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
    est = d["estimates"]
    console.print(", ".join(f"{k}={v}" for k, v in est.items()))
    gates = Table("gate", "ok", "detail")
    for g in d["gates"]:
        gates.add_row(g["name"], "[green]yes[/]" if g["ok"] else "[red]NO[/]", g["detail"])
    console.print(gates)
    for note in d["notes"][:5]:
        console.print(f"[dim]note: {note}[/]")


@app.command()
@command
def run(
    spec_or_plan: Annotated[str, typer.Argument(help="Job spec (YAML) or a stored plan id.")],
    json_out: JsonOpt = False,
    metrics_port: MetricsOpt = None,
) -> None:
    """Plan if given a spec, then execute on Spark into staging."""
    from rewind.job.service import run_job
    from rewind.progress import ProgressView
    from rewind.spec import load_spec

    settings = _settings()
    target: Any = spec_or_plan if spec_or_plan.startswith("p-") and not Path(spec_or_plan).exists() else None
    if target is None:
        target = load_spec(Path(spec_or_plan))
    with ProgressView(enabled=not json_out, metrics_port=metrics_port) as view:
        outcome = run_job(settings, target, progress=view)
    Output(json_out).result(outcome.to_dict(), _render_outcome)


@app.command()
@command
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to finish.")],
    json_out: JsonOpt = False,
    metrics_port: MetricsOpt = None,
) -> None:
    """Finish an interrupted or failed run; only unfinished units are redone."""
    from rewind.job.service import resume_job
    from rewind.progress import ProgressView

    settings = _settings()
    with ProgressView(enabled=not json_out, metrics_port=metrics_port) as view:
        outcome = resume_job(settings, run_id, progress=view)
    Output(json_out).result(outcome.to_dict(), _render_outcome)


def _render_outcome(console: Console, d: dict[str, Any]) -> None:
    console.print(
        f"[bold]{d['run_id']}[/] {d['state']}: read {d['records_read']:,}, rows out {d['rows_out']:,}, "
        f"quarantined {d['quarantined']:,}, filtered {d['filtered']:,} in {d['seconds']}s "
        f"({d['records_per_s'] or 0:,} rec/s)"
    )
    for reason, count in (d.get("quarantine_reasons") or {}).items():
        console.print(f"  quarantined {count:,}: {reason}")
    if d.get("folded"):
        console.print(f"  {_folded(d['folded'])}")
    staging = d["staging"]
    where = staging.get("table", "?") + (f"@{staging['branch']}" if staging.get("branch") else "")
    console.print(f"staging: {where}; quarantine: {d['quarantine_table']}")


@app.command()
@command
def runs(json_out: JsonOpt = False, limit: Annotated[int, typer.Option(help="How many.")] = 20) -> None:
    """The latest runs."""
    from rewind.job.service import list_runs

    data = list_runs(_settings(), limit)

    def render(console: Console, rows: Any) -> None:
        table = Table("run", "name", "state", "target", "created", "finished")
        for r in rows["runs"]:
            table.add_row(
                r["run_id"], r["name"], r["state"], r["target"], r["created_at"], r["finished_at"] or ""
            )
        console.print(table)

    Output(json_out).result({"runs": data}, render)


@app.command()
@command
def show(run_id: Annotated[str, typer.Argument(help="The run.")], json_out: JsonOpt = False) -> None:
    """State, timings, counts per unit, quarantine by reason, and where the output is."""
    from rewind.job.service import show_run

    data = show_run(_settings(), run_id)

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold]{d['run_id']}[/] ({d['name']}) {d['state']}, plan {d['plan_id']}, by {d['user']}"
        )
        console.print(f"created {d['created_at']}, started {d['started_at']}, finished {d['finished_at']}")
        if d["error"]:
            console.print(f"[red]error:[/] {d['error']}")
        console.print(
            f"read {d['records_read']:,}, emitted {d['emitted']:,}, rows out {d['rows_out']:,}, "
            f"quarantined {d['quarantined']:,}, filtered {d['filtered']:,}; units {d['units_by_state']}"
        )
        for reason, count in (d["quarantine_reasons"] or {}).items():
            console.print(f"  quarantined {count}: {reason}")
        console.print(f"staging: {d['staging']}")
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

    Output(json_out).result(data, render)


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
    return f": {d['reason']}" if d.get("reason") else ""


@app.command()
@command
def verify(
    run_id: Annotated[str, typer.Argument(help="The run whose staging is verified.")],
    json_out: JsonOpt = False,
    report: Annotated[
        Path | None,
        typer.Option("--report", help="HTML report path (JSON beside it; a .json path writes JSON only)."),
    ] = None,
) -> None:
    """Reconcile staging with its reference: keys, values, assertions. Exit 0 only if all pass."""
    from rewind.verify.service import verify_run

    data = verify_run(_settings(), run_id, report)
    out = Output(json_out)
    out.result(data, _render_verify)
    if not data["passed"]:
        out.failure(f"verification of {run_id} failed: {'; '.join(data['failed'])}")
        raise typer.Exit(1)


def _render_verify(console: Console, d: dict[str, Any]) -> None:
    verdict = "[bold green]PASSED[/]" if d["passed"] else "[bold red]FAILED[/]"
    console.print(f"[bold]{d['run_id']}[/] {verdict}: {d['staging']} vs {d['reference']} ({d['mode']})")
    rows, record, state = d["rows"], d["record"], d["state"]
    console.print(
        f"rows {rows.get('staging', 0):,} vs {rows.get('reference', 0):,}; missing {record['missing']:,}, "
        f"extra {record['extra']:,}, changed {state['changed']:,}, "
        f"within tolerance {state['within_tolerance']:,}"
    )
    if d["mode"] == "repair":
        ch = d["changes"]
        console.print(
            f"changes in the window: added {ch['extra']:,}, removed {ch['missing']:,}, "
            f"updated {ch['changed']:,}"
        )
    table = Table("level", "check", "result", "detail")
    for c in d["checks"]:
        table.add_row(c["level"], c["name"], "[green]pass[/]" if c["passed"] else "[red]FAIL[/]", c["detail"])
    console.print(table)
    for note in d["notes"]:
        console.print(f"[dim]note: {note}[/]")
    report = d.get("report") or {}
    console.print(f"report: {report.get('html') or report.get('json')}")


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
    from rewind.job.publish import promote_run

    data = promote_run(_settings(), run_id, force=force, reason=reason, rebase=rebase)
    Output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} promoted: {d['swap']}"))


@app.command()
@command
def rollback(
    run_id: Annotated[str, typer.Argument(help="The promoted run to undo.")], json_out: JsonOpt = False
) -> None:
    """Restore what the target held before the run's promotion."""
    from rewind.job.publish import rollback_run

    data = rollback_run(_settings(), run_id)
    Output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} rolled back: {d['swap']}"))


@app.command()
@command
def archive(
    topics: Annotated[list[str], typer.Argument(help="Topics to archive.")],
    table: Annotated[str, typer.Option("--table", help="Iceberg archive table, namespace.table.")],
    json_out: JsonOpt = False,
    once: Annotated[
        bool, typer.Option("--once/--continuous", help="One pass (default), or archive every micro-batch.")
    ] = True,
    compact: Annotated[bool, typer.Option("--compact", help="Then rewrite small archive files.")] = False,
    allow_loss: Annotated[
        bool, typer.Option("--allow-loss", help="Record offsets gone from Kafka before archiving as lost.")
    ] = False,
    max_offsets: Annotated[
        int | None, typer.Option("--max-offsets", help="At most this many offsets per pass or micro-batch.")
    ] = None,
    trigger_seconds: Annotated[float, typer.Option(help="Continuous: seconds between micro-batches.")] = 5.0,
    duration: Annotated[
        float | None, typer.Option("--for", help="Continuous: stop after this many seconds (or Ctrl-C).")
    ] = None,
) -> None:
    """Copy topics into an Iceberg archive, exactly once (the high-water is in the same commit)."""
    from rewind.history.service import run_archive

    out = Output(json_out)

    def progress(result: Any) -> None:
        if not json_out:
            r = result.to_dict()
            out.console.print(
                f"[green]committed[/] {r['pass_id']}: {r['records']:,} records, "
                f"{r['skipped_offsets']:,} skipped offsets, {r['files']} files in {r['seconds']}s"
            )

    data = run_archive(
        _settings(),
        topics,
        table,
        continuous=not once,
        compact=compact,
        allow_loss=allow_loss,
        max_offsets=max_offsets,
        trigger_seconds=trigger_seconds,
        duration_s=duration,
        on_commit=progress,
    )

    def render(console: Console, d: dict[str, Any]) -> None:
        committed = sum(1 for p in d["passes"] if p["committed"])
        console.print(f"[bold]{d['table']}[/]: {d['records']:,} records archived in {committed} commits")
        for p in d["passes"]:
            for g in p["lost"]:
                console.print(f"[red]lost[/] {g['topic']}/{g['partition']} [{g['start']}, {g['end']})")
        c = d.get("compaction")
        if c and c["committed"]:
            console.print(
                f"compaction: {c['files_rewritten']} files → {c['files_written']} ({c['rows']:,} rows)"
            )
        elif c:
            console.print(f"compaction: {'; '.join(c['notes'])}")

    out.result(data, render)


@app.command()
@command
def query(
    sql: Annotated[str, typer.Argument(help="Spark SQL over the view `history`.")],
    history: Annotated[list[str], typer.Option("--history", help="A topic of the window (repeatable).")],
    archive_table: Annotated[str, typer.Option("--archive", help="The Iceberg archive, namespace.table.")],
    json_out: JsonOpt = False,
    start: Annotated[str, typer.Option("--from", help="earliest, an ISO time, epoch ms or offsets JSON.")] = (
        "earliest"
    ),
    end: Annotated[str, typer.Option("--to", help="latest, an ISO time, epoch ms or offsets JSON.")] = (
        "latest"
    ),
    allow_gaps: Annotated[bool, typer.Option("--allow-gaps", help="Read the rest if some are lost.")] = False,
    prefer: Annotated[str, typer.Option(help="Seam: kafka (log start) or archive (high-water).")] = "kafka",
    declared_log_start: Annotated[
        str | None, typer.Option(help='Simulated retention: JSON like {"orders": {"0": 500}}.')
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows to print at most.")] = 100,
) -> None:
    """Run Spark SQL over a window of history (archive below the seam, Kafka above it)."""
    from rewind.history.service import run_query

    if prefer not in ("kafka", "archive"):
        raise RewindError(f"--prefer {prefer!r}: expected kafka or archive")
    data = run_query(
        _settings(),
        sql,
        history,
        archive_table,
        start=start,
        end=end,
        declared_log_start=declared_log_start,
        allow_gaps=allow_gaps,
        prefer=prefer,  # type: ignore[arg-type]
        limit=limit,
    )

    def render(console: Console, d: dict[str, Any]) -> None:
        table = Table(*d["columns"])
        for row in d["rows"]:
            table.add_row(*(str(v) for v in row))
        console.print(table)
        p = d["plan"]
        console.print(
            f"{len(d['rows'])} rows{' (more left out)' if d['truncated'] else ''}; window: "
            f"{p['archive_offsets']:,} offsets from {p['archive_table']}, {p['kafka_offsets']:,} from Kafka"
        )
        for g in p["lost"]:
            where = f"{g['topic']}/{g['partition']} [{g['start']}, {g['end']})"
            console.print(f"[yellow]lost[/] {where}: {g['reason']}")

    Output(json_out).result(data, render)


@app.command()
@command
def cleanup(
    run_id: Annotated[str, typer.Argument(help="The run to clean up.")], json_out: JsonOpt = False
) -> None:
    """Drop what a run left behind: staging, a previous table kept for rollback, a backfill topic."""
    from rewind.job.publish import cleanup_run

    data = cleanup_run(_settings(), run_id)
    Output(json_out).result(data, lambda c, d: c.print(f"{d['run_id']} cleaned up: {d['cleanup']}"))


@app.command("config")
@command
def show_config(json_out: JsonOpt = False) -> None:
    """Print the effective settings, secrets masked."""
    Output(json_out).result(_settings().public(), lambda c, d: c.print_json(data=d))


def main() -> None:
    app()
