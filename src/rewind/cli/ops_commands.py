"""Commands before a production replay: `rehearse` (a slice on a throw-away target) and `readiness`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.output import output


@app.command()
@command
def rehearse(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).")],
    fraction: Annotated[
        float | None, typer.Option("--fraction", help="Share of every partition, in (0, 1] (default 0.01).")
    ] = None,
    records: Annotated[
        int | None, typer.Option("--records", help="Records in all, split over the partitions by size.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run the job on a slice into a throw-away target: verify, promote, roll back, clean up, measure."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.ops.rehearse import rehearse as run_rehearsal
    from rewind.progress import CliConsole
    from rewind.spec import load_spec

    settings = _settings()
    if fraction is None and records is None:
        fraction = 0.01
    with CliConsole(enabled=not json_out) as console:
        result = run_rehearsal(settings, load_spec(spec), fraction=fraction, records=records, console=console)
    out = output(json_out)
    out.result(result, _render_rehearsal)
    if not result["passed"]:
        failed = [name for name, step in result["steps"].items() if not step.get("ok")]
        out.failure(
            f"rehearsal {result['rehearsal_id']} failed at {', '.join(failed) or 'the run'}: "
            f"{result.get('error') or 'see the steps above'}"
        )
        raise typer.Exit(1)


def _render_rehearsal(console: Console, d: dict[str, Any]) -> None:
    # lazy: keeps rewind.core.cost out of --help
    from rewind.core.cost import describe

    s = d["slice"]
    verdict = "[green]passed[/]" if d["passed"] else "[red]FAILED[/]"
    console.print(
        f"[bold]rehearsal {d['rehearsal_id']}[/] of {d['spec_name']} {verdict}: {s['offsets']:,} of "
        f"{s['of_offsets']:,} offsets in {len(s['units'])} pieces, on {d['throwaway']['target']} "
        f"(run {d.get('run_id')}, {d['seconds']}s)"
    )
    for name, step in d["steps"].items():
        console.print(f"  {name}: {'ok' if step.get('ok') else '[red]failed[/]'}")
    stages = d.get("stages") or {}
    if stages:
        table = Table("stage", "records", "seconds", "records/s")
        for name, st in stages.items():
            mark = " [bold](bottleneck)[/]" if name == d.get("bottleneck") else ""
            table.add_row(name + mark, f"{st['records']:,}", f"{st['seconds']}", f"{st['rate'] or 0:,.0f}")
        spark = d.get("spark") or {}
        table.add_row(
            "spark (all cores)",
            f"{spark.get('records', 0):,}",
            f"{spark.get('seconds')}",
            f"{spark.get('rate') or 0:,.0f}",
        )
        console.print(table)
    for reason, rate in (d.get("quarantine_rates") or {}).items():
        console.print(f"  quarantined {rate:.4%}: {reason}")
    for note in d.get("notes") or []:
        console.print(f"[yellow]note:[/] {note}")
    if d.get("extrapolated"):
        console.print("[bold]the full run[/]:")
        for line in describe(d["extrapolated"]):
            console.print(f"  {line}")


@app.command()
@command
def readiness(
    spec: Annotated[Path, typer.Argument(help="Job spec (YAML).")],
    json_out: JsonOpt = False,
) -> None:
    """Score the replay's risks: green on evidence, yellow configured, red unknown or failing."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.ops.readiness import readiness as score
    from rewind.spec import load_spec

    card = score(_settings(), load_spec(spec))
    out = output(json_out)
    out.result(card, _render_readiness)
    if not card["ready"]:
        red = [a["area"] for a in card["areas"] if a["status"] == "red"]
        out.failure(
            f"readiness of {card['name']}: red {', '.join(red)}; "
            "`rewind run` refuses it without --accept-risk"
        )
        raise typer.Exit(1)


def _render_readiness(console: Console, d: dict[str, Any]) -> None:
    colours = {"green": "green", "yellow": "yellow", "red": "red"}
    console.print(f"[bold]readiness of {d['name']}[/] (plan {d['plan_id']})")
    table = Table("area", "status", "detail", "evidence")
    for a in d["areas"]:
        table.add_row(a["area"], f"[{colours[a['status']]}]{a['status']}[/]", a["detail"], a["evidence"])
    console.print(table)


@app.command()
@command
def report(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where the HTML goes (default <state>/reports/<run>-report.html)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """One self-contained HTML page of a run: plan, readiness, progress and lag, quarantine, verify, audit."""
    # lazy: keeps rewind.ops.run_report out of --help
    from rewind.ops.run_report import write

    data, path = write(_settings(), run_id, out)
    output(json_out).result(
        {**data, "report": str(path)},
        lambda console, d: console.print(f"report of {run_id}: {d['report']}"),
    )
