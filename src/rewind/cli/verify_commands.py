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
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="The run's spec with a new verify: section, used instead of the plan's (anything "
            "else that differs is refused).",
        ),
    ] = None,
    verify_file: Annotated[
        Path | None,
        typer.Option(
            "--verify-file", help="A YAML file holding only a verify: section, used instead of the plan's."
        ),
    ] = None,
) -> None:
    """Reconcile staging with its reference: keys, values, assertions. Exit 0 only if all pass.

    The verify section is the plan's, or the one of --spec / --verify-file: a tolerance can
    change without running the backfill again. The ledger records which section each verdict
    used; promotion looks at the latest verdict."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.spec import load_spec, load_verify
    from rewind.verify.exceptions import VerifyError
    from rewind.verify.service import verify_run

    if spec is not None and verify_file is not None:
        raise VerifyError("give --spec (a whole spec) or --verify-file (a verify section), not both")
    settings = _settings()
    original = load_spec(spec) if spec is not None else None
    section = load_verify(verify_file) if verify_file is not None else None
    data = verify_run(settings, run_id, report, spec=original, verify=section)
    out = output(json_out)
    out.result(data, _render_verify)
    if not data["passed"]:
        out.failure(f"verification of {run_id} failed: {'; '.join(data['failed'])}")
        raise typer.Exit(1)


def _render_verify(console: Console, d: dict[str, Any]) -> None:
    verdict = "[bold green]PASSED[/]" if d["passed"] else "[bold red]FAILED[/]"
    if d["mode"] == "outcome":  # a reconstruction: the events replayed vs the source's latest state
        _render_outcome(console, d, verdict)
        return
    console.print(f"[bold]{d['run_id']}[/] {verdict}: {d['staging']} vs {d['reference']} ({d['mode']})")
    used = d.get("verify_section") or {}
    if used:
        origins = {"plan": "the plan's", "spec": "--spec's", "file": "--verify-file's"}
        origin = origins.get(used["source"], used["source"])
        console.print(f"verify section: {origin} (digest {used['digest']})")
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


def _render_outcome(console: Console, d: dict[str, Any], verdict: str) -> None:
    console.print(
        f"[bold]{d['run_id']}[/] {verdict}: {d['events']:,} events replayed with the fold vs the source's "
        f"latest state: {d['matched']:,} of {d['entities']:,} entities match, {d['mismatched']:,} differ, "
        f"{d['missing']:,} missing ({d['skipped_quarantined']:,} with quarantined states left out)"
    )
    table = Table("event type", "events", "entities", "matched", "mismatched")
    for name, t in d["by_type"].items():
        table.add_row(
            name, f"{t['events']:,}", f"{t['entities']:,}", f"{t['matched']:,}", f"{t['mismatched']:,}"
        )
    console.print(table)
    for example in d["examples"]:
        console.print(
            f"[dim]{example['entity']}: replayed {example['replayed']}, source {example['source']}[/]"
        )
    report = d.get("report") or {}
    console.print(f"report: {report.get('json')}")
