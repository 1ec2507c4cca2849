"""Commands over history: `archive` (Kafka into the lake archive) and `query`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.errors import RewindError
from rewind.output import output


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
    # lazy: keeps rewind.history.service, rewind.progress out of --help
    from rewind.history.service import run_archive
    from rewind.progress import CliConsole

    out = output(json_out)
    with CliConsole(enabled=not json_out) as console:
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
            console=console,
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
    # lazy: keeps rewind.history.service out of --help
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

    output(json_out).result(data, render)
