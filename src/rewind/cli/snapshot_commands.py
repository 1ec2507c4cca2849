"""`rewind snapshot create RUN`: a promoted read model's state, tagged with its offsets.

Parse, call :mod:`rewind.job.snapshot`, print.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.output import output

snapshot_app = typer.Typer(
    no_args_is_help=True,
    help="Snapshots of read models: state as of recorded offsets, for source.kafka.snapshot.",
)
app.add_typer(snapshot_app, name="snapshot")


@snapshot_app.command("create")
@command
def create(
    run_id: Annotated[str, typer.Argument(help="A promoted run of a folded read model (Iceberg).")],
    json_out: JsonOpt = False,
) -> None:
    """Tag RUN's target as rewind-snapshot-RUN and record the run's end offsets with the tag."""
    # lazy: keeps rewind.job.snapshot_create out of --help
    from rewind.job.snapshot_create import snapshot_run

    data = snapshot_run(_settings(), run_id)

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(f"{d['table']}@{d['ref']} (snapshot {d['snapshot_id']}) as of offsets {d['offsets']}")
        console.print(
            f"start a job from it: source.kafka.snapshot: {{table: {d['table']}, ref: {d['ref']}}}",
            soft_wrap=True,
        )

    output(json_out).result(data, render)
