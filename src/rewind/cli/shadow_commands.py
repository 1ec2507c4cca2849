"""`rewind shadow ...`: migrate a read model to a v2 rebuilt from history, then cut over.

Parse, call :mod:`rewind.shadow`, print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.output import output

shadow_app = typer.Typer(
    no_args_is_help=True,
    help="Shadow migrations: rebuild v2 from history, follow live, verify, cut over, decommission.",
)
app.add_typer(shadow_app, name="shadow")

SpecArg = Annotated[
    Path, typer.Argument(help="The job spec with a shadow: section.", exists=True, dir_okay=False)
]
NameArg = Annotated[str, typer.Argument(help="The shadow (the job's name).")]


@shadow_app.command("start")
@command
def start(
    spec: SpecArg,
    duration: Annotated[
        float | None, typer.Option("--for", help="Stop the tail after this many seconds (default: Ctrl-C).")
    ] = None,
    until_caught_up: Annotated[
        bool, typer.Option("--until-caught-up", help="Stop the tail once the shadow is caught up.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Run the history into v2 (or resume it), then follow the live topic; restartable after any kill."""
    from rewind.shadow.start import TailProgress, start_shadow
    from rewind.spec import load_spec

    def stop(p: TailProgress) -> bool:
        return (until_caught_up and p.caught_up) or (duration is not None and p.seconds >= duration)

    try:
        result = start_shadow(_settings(), load_spec(spec), stop=stop)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold]shadow {d['shadow']}[/] is {d['state']} (run {d['run_id']}): "
            f"{d['batches']} micro-batches, {d['records']:,} records into v2 in {d['seconds']} s "
            f"({d['replayed']} replayed after a restart), "
            f"max lag {d['max_lag']}, {'caught up' if d['caught_up'] else 'not caught up'}"
        )

    output(json_out).result(result, render)


@shadow_app.command("status")
@command
def status(
    name: NameArg,
    history: Annotated[int, typer.Option("--history", help="Lag samples to show, newest last.")] = 10,
    json_out: JsonOpt = False,
) -> None:
    """Per-partition lag against the log end and the live group, caught-up or not, the lag history."""
    from rewind.shadow.status import shadow_status

    def render(console: Console, d: dict[str, Any]) -> None:
        table = Table("TOPIC", "PARTITION", "V2-AT", "LOG-END", "LAG", "GROUP-OFFSET", "GROUP-LAG")
        for p in d["partitions"]:
            table.add_row(
                p["topic"],
                str(p["partition"]),
                f"{p['position']:,}",
                f"{p['log_end']:,}",
                f"{p['lag']:,}",
                "-" if p["group_offset"] is None else f"{p['group_offset']:,}",
                "-" if p["group_lag"] is None else f"{p['group_lag']:,}",
            )
        console.print(table)
        if d["lag_history"]:
            hist = Table("AT", "MAX-LAG", "MAX-GROUP-LAG")
            for h in d["lag_history"]:
                hist.add_row(
                    h["at"],
                    f"{h['max_lag']:,}",
                    "-" if h["max_group_lag"] is None else f"{h['max_group_lag']:,}",
                )
            console.print(hist)
        word = "[bold green]caught-up[/]" if d["caught_up"] else "[yellow]not caught up[/]"
        console.print(f"[bold]shadow {d['shadow']}[/] is {d['state']}: {word} ({d['caught_up_reason']})")

    output(json_out).result(shadow_status(_settings(), name, history=history), render)
