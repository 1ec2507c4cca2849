"""`rewind compensate RUN --topic T`: correction events for what a verified run fixed.

Parse, call :mod:`rewind.job.compensate`, print.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.output import output


@app.command("compensate")
@command
def compensate(
    run_id: Annotated[str, typer.Argument(help="A verified run whose staging differs from production.")],
    topic: Annotated[str, typer.Option("--topic", help="The topic the consumers of the model read.")],
    shape: Annotated[
        str,
        typer.Option(
            "--shape", help="retract-and-correct (two messages) or correction (old and new in one)."
        ),
    ] = "retract-and-correct",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show how many of each; write nothing.")] = False,
    partitions: Annotated[
        int | None,
        typer.Option(
            "--partitions",
            help="The partition count the live producer places keys by (default: the topic's); "
            "a topic with fewer is refused.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write, exactly once, a retraction and a correction (or one correction) per differing key."""
    # lazy: keeps rewind.job.compensate out of --help
    from rewind.job.compensate import compensate_run

    data = compensate_run(_settings(), run_id, topic, shape, dry_run, partitions=partitions)  # type: ignore[arg-type]

    def render(console: Console, d: dict[str, Any]) -> None:
        each = ", ".join(f"{n:,} {op}" for op, n in d["counts"].items()) or "nothing"
        if d["dry_run"]:
            verb = "would write"
        elif d.get("already_done"):
            verb = "already wrote (nothing written again)"
        else:
            verb = "wrote"
        console.print(
            f"{d['run_id']}: {d['keys']:,} keys differ; {verb} to {d['topic']}: {each}", soft_wrap=True
        )

    output(json_out).result(data, render)
