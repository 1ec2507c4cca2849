"""`rewind verify`: re-verify a run's staging against its reference."""

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
    out = output(json_out)
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
