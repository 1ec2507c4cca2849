"""`rewind groups ...`: describe a consumer group, reset its offsets, undo a reset.

Parse, call :mod:`rewind.groups`, print. A reset is a dry run unless ``--execute``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _settings, app, command, number_text
from rewind.output import output

groups_app = typer.Typer(
    no_args_is_help=True,
    help="Consumer groups: describe one, reset its offsets (dry run by default), undo a reset.",
)
app.add_typer(groups_app, name="groups")



def _effect(p: dict[str, Any]) -> str:
    if p["current"] is None:
        return "no offset committed"
    if p["reread"]:
        return f"re-reads {p['reread']:,}"
    if p["skipped"]:
        return f"skips {p['skipped']:,}"
    return "unchanged"


def _render_plan(console: Console, d: dict[str, Any]) -> None:
    # Kafka's dry-run columns first (GROUP TOPIC PARTITION NEW-OFFSET), then what Rewind adds
    table = Table(
        "GROUP", "TOPIC", "PARTITION", "NEW-OFFSET", "CURRENT-OFFSET", "EFFECT", "LOG-START", "LOG-END"
    )
    for p in d["partitions"]:
        table.add_row(
            d["group"],
            p["topic"],
            str(p["partition"]),
            number_text(p["new"]),
            number_text(p["current"]),
            _effect(p),
            number_text(p["low"]),
            number_text(p["high"]),
        )
    console.print(table)
    for p in d["partitions"]:
        for note in p["notes"]:
            console.print(f"[yellow]note[/] {note}")
    for note in d["notes"]:
        console.print(f"[yellow]note[/] {note}")
    summary = f"the group re-reads {d['reread']:,} records and skips {d['skipped']:,}"
    if d.get("reset_id"):
        console.print(
            f"[bold green]reset {d['reset_id']} applied[/] to {len(d['partitions'])} partitions "
            f"of {d['group']}: {summary}; undo with `rewind groups undo {d['reset_id']}`"
        )
    else:
        console.print(f"[bold]dry run[/] ({d['mode']}): {summary}; nothing changed, --execute applies it")
    if d.get("exported"):
        console.print(f"plan written to {d['exported']} (kafka-consumer-groups --from-file reads it)")


@groups_app.command("reset")
@command
def reset(
    group: Annotated[str, typer.Argument(help="The consumer group.")],
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="T or T:0,2 (partitions); repeatable.")
    ] = None,
    all_topics: Annotated[bool, typer.Option("--all-topics", help="Every topic the group consumes.")] = False,
    to_datetime: Annotated[
        str | None,
        typer.Option("--to-datetime", help="ISO time with a zone (2026-10-01T00:00:00Z) or epoch ms."),
    ] = None,
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", help="This offset on every partition.")
    ] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="Move each committed offset by N (negative: back).")
    ] = None,
    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="The log start.")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="The end of the log.")] = False,
    from_file: Annotated[
        Path | None,
        typer.Option("--from-file", help="A CSV plan (topic,partition,offset), as Kafka's tool exports."),
    ] = None,
    execute: Annotated[
        bool,
        typer.Option(
            "--execute/--dry-run", help="Apply the reset (default: a dry run that changes nothing)."
        ),
    ] = False,
    export: Annotated[
        str | None, typer.Option("--export", help="Write the plan as Kafka's CSV to PATH ('-': stdout only).")
    ] = None,
    allow_gaps: Annotated[
        bool, typer.Option("--allow-gaps", help="Accept a time before the log start (records gone).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Reset a group's committed offsets; a dry run unless --execute, and recorded for undo."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.groups import ResetInputError, execute_reset, plan_reset, to_csv

    if export == "-" and (json_out or execute):
        raise ResetInputError(
            "--export - prints only the CSV on stdout, so it goes with a dry run without --json; "
            "with --execute or --json, give --export a file",
            option="--export",
        )
    settings = _settings()
    plan = plan_reset(
        settings,
        group,
        topics=topic or (),
        all_topics=all_topics,
        to_datetime=to_datetime,
        to_offset=to_offset,
        shift_by=shift_by,
        to_earliest=to_earliest,
        to_latest=to_latest,
        from_file=from_file,
        allow_gaps=allow_gaps,
    )
    if export == "-":
        sys.stdout.write(to_csv(plan.offsets))
        return
    if export:
        Path(export).write_text(to_csv(plan.offsets))
    data = execute_reset(settings, plan).to_dict() if execute else plan.to_dict()
    if export:
        data["exported"] = export
    output(json_out).result(data, _render_plan)


@groups_app.command("undo")
@command
def undo(
    reset_id: Annotated[str, typer.Argument(help="A reset id (gr-...), as `rewind groups resets` lists.")],
    json_out: JsonOpt = False,
) -> None:
    """Put back the offsets a reset found (the group must be inactive); once per reset."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.groups import undo_reset

    data = undo_reset(_settings(), reset_id).to_dict()

    def render(console: Console, d: dict[str, Any]) -> None:
        restored = ", ".join(f"{r['topic']}/{r['partition']}→{r['offset']}" for r in d["restored"]) or "none"
        console.print(f"[bold green]reset {d['reset_id']} undone[/] on {d['group']}: restored {restored}")
        if d["removed"]:
            console.print(
                "offsets removed: " + ", ".join(f"{r['topic']}/{r['partition']}" for r in d["removed"])
            )
        for note in d["notes"]:
            console.print(f"[yellow]note[/] {note}")

    output(json_out).result(data, render)


@groups_app.command("describe")
@command
def describe(
    group: Annotated[str, typer.Argument(help="The consumer group.")],
    json_out: JsonOpt = False,
) -> None:
    """A group's state and members, and per partition its committed offset, log end and lag."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.groups import describe as describe_group

    data = describe_group(_settings(), group).to_dict()

    def render(console: Console, d: dict[str, Any]) -> None:
        members = len(d["members"])
        console.print(
            f"[bold]{d['group']}[/]: {d['state']}, {members} member{'s' if members != 1 else ''}"
            f"{', assignor ' + d['protocol'] if d['protocol'] else ''}; total lag {d['lag']:,}"
        )
        table = Table("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-START", "LOG-END", "LAG", "MEMBER")
        for p in d["partitions"]:
            table.add_row(
                p["topic"],
                str(p["partition"]),
                number_text(p["committed"]),
                number_text(p["log_start"]),
                number_text(p["log_end"]),
                number_text(p["lag"]),
                p["member"] or "-",
            )
        console.print(table)
        for m in d["members"]:
            parts = ", ".join(f"{a['topic']}/{a['partition']}" for a in m["assignment"]) or "nothing assigned"
            console.print(f"member {m['client_id']}@{m['host']} ({m['member_id']}): {parts}")
        for note in d["notes"]:
            console.print(f"[yellow]note[/] {note}")

    output(json_out).result(data, render)


@groups_app.command("resets")
@command
def resets(
    group: Annotated[str | None, typer.Argument(help="Only this group's resets.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    json_out: JsonOpt = False,
) -> None:
    """The resets recorded in the ledger, newest first."""
    # lazy: keeps sqlalchemy out of --help
    from rewind.groups import list_resets

    data = {"resets": [r.to_dict() for r in list_resets(_settings(), group, limit)]}

    def render(console: Console, d: dict[str, Any]) -> None:
        table = Table("RESET", "GROUP", "STATE", "MODE", "WHO", "AT", "PARTITIONS")
        for r in d["resets"]:
            table.add_row(
                r["reset_id"],
                r["group"],
                r["state"],
                r["mode"],
                r["who"],
                r["at"][:19] + "Z",
                str(len(r["after"])),
            )
        console.print(table)

    output(json_out).result(data, render)
