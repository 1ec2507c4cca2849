"""`rewind quarantine ...`: what a run quarantined, and re-driving it after a fix.

Parse, call :mod:`rewind.job.redrive`, print.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.output import output

quarantine_app = typer.Typer(
    no_args_is_help=True,
    help="A run's quarantined records: list them, re-drive them into the run's staging after a fix.",
)
app.add_typer(quarantine_app, name="quarantine")

ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help='Only records whose "stage: reason" contains this text.')
]


@quarantine_app.command("list")
@command
def list_(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    reason: ReasonOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Quarantined records of RUN (the latest entry of each), by reason, then one per line."""
    # lazy: keeps rewind.job.redrive out of --help
    from rewind.job.redrive import list_quarantine

    data = list_quarantine(_settings(), run_id, reason)

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(f"{d['run_id']}: {d['records']:,} quarantined records in {d['quarantine_table']}")
        for label, count in d["by_reason"].items():
            console.print(f"  {count:,}  {label}", soft_wrap=True)
        table = Table("topic", "partition", "offset", "stage", "reason", "unit")
        for e in d["entries"][:100]:
            cells = (e["topic"], str(e["partition"]), str(e["offset"]), e["stage"], e["reason"], e["unit_id"])
            table.add_row(*cells)
        if d["entries"]:
            console.print(table)
        if len(d["entries"]) > 100:
            console.print(f"(first 100 of {len(d['entries']):,}; --json lists all)")

    output(json_out).result(data, render)


@quarantine_app.command("redrive")
@command
def redrive(
    run_id: Annotated[str, typer.Argument(help="The run whose quarantined records are processed again.")],
    reason: ReasonOpt = None,
    translate_version: Annotated[
        str | None,
        typer.Option("--translate-version", help="The fixed translate's version (new event ids)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Process RUN's quarantined records again into its staging, exactly once."""
    # lazy: keeps rewind.job.redrive out of --help
    from rewind.job.redrive import redrive as do_redrive

    data = do_redrive(_settings(), run_id, reason, translate_version)

    def render(console: Console, d: dict[str, Any]) -> None:
        done = " (already done: nothing written again)" if d.get("already_done") else ""
        console.print(
            f"{d['run_id']} re-drive {d['redrive']} (version {d['version']}){done}: read "
            f"{d.get('records_read', 0):,}, emitted {d.get('emitted', 0):,} ({d.get('rows_out', 0):,} rows), "
            f"quarantined again {d.get('quarantined', 0):,}, filtered {d.get('filtered', 0):,}",
            soft_wrap=True,
        )
        for label, count in (d.get("reasons") or {}).items():
            console.print(f"  quarantined again {count:,}: {label}", soft_wrap=True)
        if d.get("note"):
            console.print(d["note"])

    output(json_out).result(data, render)
