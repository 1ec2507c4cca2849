"""`rewind reconsume plan|start|status|finish`: a temporary group beside a live one.

Parse, call :mod:`rewind.reconsume.service`, print. The services run the two sides with
:mod:`rewind.reconsume` (docs/reconsume.md).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command
from rewind.cli.app import number_text as _n
from rewind.output import output

reconsume_app = typer.Typer(
    no_args_is_help=True,
    help="Re-read a live group's topics with a temporary group, then hand each partition back.",
)
app.add_typer(reconsume_app, name="reconsume")



def _render_plan(console: Console, d: dict[str, Any]) -> None:
    table = Table("TOPIC", "PARTITION", "LIVE-OFFSET", "START", "LOG-START", "LOG-END", "RE-READ", "HOW")
    for p in d["partitions"]:
        table.add_row(p["topic"], str(p["partition"]), _n(p["live"]), _n(p["start"]), _n(p["low"]),
                      _n(p["high"]), _n(p["reread"]), p["method"])
    console.print(table)
    for p in d["partitions"]:
        for note in p["notes"]:
            console.print(f"[yellow]note[/] {note}")
    for note in d["notes"]:
        console.print(f"[yellow]note[/] {note}")
    console.print(
        f"[bold]reconsume {d['reconsume_id']}[/] ({d['mode']}): group {d['temp_group']} re-reads "
        f"{d['reread']:,} records of {d['live_group']}'s {', '.join(d['topics'])}; ETA {d['eta']} at "
        f"{d['rate']:,.0f} records/s (--rate); planned, nothing changed — "
        f"`rewind reconsume start {d['reconsume_id']}` commits the start offsets"
    )


@reconsume_app.command("plan")
@command
def plan(
    reconsume_id: Annotated[str, typer.Argument(help="A name for it (names the temporary group).")],
    group: Annotated[str, typer.Option("--group", help="The live consumer group.")],
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="A topic the group consumes; repeatable.")
    ] = None,
    from_datetime: Annotated[
        str | None, typer.Option("--from-datetime", help="Start at this time: ISO-8601 with a zone.")
    ] = None,
    from_offsets: Annotated[
        str | None, typer.Option("--from-offsets", help='Start offsets, JSON: {"orders": {"0": 120}}.')
    ] = None,
    from_earliest: Annotated[bool, typer.Option("--from-earliest", help="Start at the log start.")] = False,
    mode: Annotated[str, typer.Option("--mode", help="parallel or handover.")] = "handover",
    allow_gaps: Annotated[
        bool, typer.Option("--allow-gaps", help="Start at the log start where records before it are gone.")
    ] = False,
    idle_handover: Annotated[
        float, typer.Option("--idle-handover", help="Hand over a partition idle (lag 0) this many seconds.")
    ] = 30.0,
    rate: Annotated[
        float, typer.Option("--rate", help="Records/s the temporary handler manages (for the ETA).")
    ] = 1000.0,
    json_out: JsonOpt = False,
) -> None:
    """Plan a reconsume: partitions, start offsets, records to re-read, ETA. Changes nothing in Kafka."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.reconsume.service import plan_reconsume

    result = plan_reconsume(
        _settings(),
        reconsume_id,
        group=group,
        topics=topic or [],
        from_datetime=from_datetime,
        from_offsets=from_offsets,
        from_earliest=from_earliest,
        mode=mode,
        allow_gaps=allow_gaps,
        idle_handover_s=idle_handover,
        rate=rate,
    )
    output(json_out).result(result.to_dict(), _render_plan)


@reconsume_app.command("start")
@command
def start(
    reconsume_id: Annotated[str, typer.Argument(help="A planned reconsume.")],
    json_out: JsonOpt = False,
) -> None:
    """Commit the temporary group's start offsets and create the handover rows."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.reconsume.service import start_reconsume

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold green]reconsume {d['reconsume_id']} started[/] ({d['mode']}): {d['temp_group']} "
            f"starts at {len(d['partitions'])} partitions' planned offsets, {d['records']:,} records to "
            f"re-read; run the services' ExistingSide and the TemporarySide now"
        )

    output(json_out).result(start_reconsume(_settings(), reconsume_id), render)


@reconsume_app.command("status")
@command
def status(
    reconsume_id: Annotated[str, typer.Argument(help="A reconsume.")],
    json_out: JsonOpt = False,
) -> None:
    """Per partition: how far each side is and which side owns it."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.reconsume.service import status as read_status

    def render(console: Console, d: dict[str, Any]) -> None:
        table = Table("TOPIC", "PARTITION", "START", "TEMPORARY-AT", "EXISTING-LAST", "HANDOVER", "OWNER",
                      "LEFT", "LOG-END")
        for p in d["partitions"]:
            table.add_row(p["topic"], str(p["partition"]), _n(p["start"]), _n(p["temp_position"]),
                          _n(p["existing_last"]), _n(p["handover"]), p["owner"], _n(p["left"]), _n(p["high"]))
        console.print(table)
        side = f"running as {d['temporary_side']}" if d["temporary_side"] else "not running"
        rate = f"{d['rate']:,.0f} records/s" if d["rate"] else "no rate yet"
        console.print(
            f"[bold]reconsume {d['reconsume_id']}[/] ({d['mode']}) is {d['state']}: "
            f"{d['handed_over']} of {len(d['partitions'])} partitions handed over, {d['done']:,} records "
            f"re-read, {d['left']:,} left ({rate}, ETA {d['eta']}); temporary side {side}"
        )

    output(json_out).result(read_status(_settings(), reconsume_id), render)


@reconsume_app.command("finish")
@command
def finish(
    reconsume_id: Annotated[str, typer.Argument(help="A started reconsume.")],
    json_out: JsonOpt = False,
) -> None:
    """Check every partition was handed over, delete the temporary group, record the end."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.reconsume.service import finish_reconsume

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold green]reconsume {d['reconsume_id']} finished[/]: every partition handed over, "
            f"{d['temporary_records']:,} records handled by the temporary side; group {d['temp_group']} "
            "deleted with its offsets"
        )

    output(json_out).result(finish_reconsume(_settings(), reconsume_id), render)
