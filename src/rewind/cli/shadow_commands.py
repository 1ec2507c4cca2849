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
    # lazy: keeps sqlalchemy, pydantic, yaml out of --help
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
    # lazy: keeps rewind.shadow.status out of --help
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
        speed = d.get("speed")
        if speed:
            console.print(speed["summary"], markup=False, highlight=False)
            if speed.get("verdict"):
                color = {"ok": "green", "yellow": "yellow", "red": "red"}[speed["status"]]
                console.print(f"[{color}]speed {speed['status']}[/]: {speed['verdict']}")

    output(json_out).result(shadow_status(_settings(), name, history=history), render)


@shadow_app.command("verify")
@command
def verify(
    name: NameArg,
    repeat: Annotated[int, typer.Option("--repeat", help="Verify this many times.")] = 1,
    every: Annotated[float, typer.Option("--every", help="Seconds between verifications.")] = 30.0,
    json_out: JsonOpt = False,
) -> None:
    """Compare v2 with v1 on keys settled for settle_s; record each result; say go or no-go."""
    # lazy: keeps rewind.shadow.verify out of --help
    from rewind.shadow.verify import verify_shadow

    def render(console: Console, d: dict[str, Any]) -> None:
        for r in d["results"]:
            word = "[green]passed[/]" if r["passed"] else "[red]failed[/]"
            console.print(
                f"{word}: {r['rows']} rows, {r['missing']} missing, {r['extra']} extra, "
                f"{r['changed']} changed ({r['unsettled_keys']} keys updated within "
                f"{r['settle_s']:g} s left out)"
            )
        go = "[bold green]go[/]" if d["go"] else "[bold yellow]no-go[/]"
        console.print(f"shadow {d['shadow']}: {go} for cutover ({d['go_reason']})")

    output(json_out).result(verify_shadow(_settings(), name, repeat=repeat, every_s=every), render)


def _render_proof(console: Console, d: dict[str, Any]) -> None:
    table = Table("TOPIC", "PARTITION", "HISTORY-START", "GROUP-AT", "CUT", "OVERLAP", "V2-RANGES", "HOLDS")
    for p in d["partitions"]:
        table.add_row(
            p["topic"],
            str(p["partition"]),
            f"{p['history_start']:,}",
            f"{p['committed']:,}",
            f"{p['cut']:,}",
            str(p["overlap"]),
            " ".join(f"[{a},{b})" for a, b in p["v2_ranges"]),
            "yes" if p["holds"] else "NO",
        )
    console.print(table)
    console.print(f"cut line: {d['reason']}")


@shadow_app.command("cut")
@command
def cut(name: NameArg, json_out: JsonOpt = False) -> None:
    """Take the cut line from the (inactive) live group minus the overlap, prove it, record it."""
    # lazy: keeps rewind.shadow.cutline out of --help
    from rewind.shadow.cutline import cut_shadow

    output(json_out).result(cut_shadow(_settings(), name), _render_proof)


@shadow_app.command("cutover")
@command
def cutover(
    name: NameArg,
    hard: Annotated[bool, typer.Option("--hard", help="Swap v2 in for v1 now, in one step.")] = False,
    dual_write: Annotated[
        bool, typer.Option("--dual-write", help="Publish the cut line: the live service writes v1 and v2.")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Cut over to v2 (gates: caught up, verified, live group inactive): --hard swaps it in atomically;
    --dual-write publishes the cut line for rewind.dualwrite, and `shadow repoint` swaps later."""
    # lazy: keeps rewind.shadow.cutover, rewind.shadow.exceptions, rewind.shadow.lifecycle out of --help
    from rewind.shadow.cutover import cutover_hard
    from rewind.shadow.exceptions import ShadowError
    from rewind.shadow.lifecycle import cutover_dual_write

    if hard == dual_write:
        raise ShadowError("say how to cut over: --hard (swap v2 in now) or --dual-write (repoint later)")
    if dual_write:

        def published(console: Console, d: dict[str, Any]) -> None:
            console.print(
                f"[bold green]shadow {d['shadow']} dual-writes[/]: restart the live service from the cut "
                f"line {d['cut_line']} with rewind.dualwrite (writes {d['v1']} and {d['v2']}); then "
                "`rewind shadow repoint`"
            )

        output(json_out).result(cutover_dual_write(_settings(), name), published)
        return

    def render(console: Console, d: dict[str, Any]) -> None:
        swap = d["swap"]
        console.print(
            f"[bold green]shadow {d['shadow']} cut over[/]: {swap['after'].get('from')} is now "
            f"{swap['after'].get('table')}; v1 kept as {swap['after'].get('previous')} "
            "(`rewind rollback` until `rewind shadow decommission`)"
        )

    output(json_out).result(cutover_hard(_settings(), name), render)


@shadow_app.command("repoint")
@command
def repoint(name: NameArg, json_out: JsonOpt = False) -> None:
    """Dual-write: swap v2 in for v1 (reads move to v2); the dual writers follow."""
    # lazy: keeps rewind.shadow.lifecycle out of --help
    from rewind.shadow.lifecycle import repoint as run_repoint

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(
            f"[bold green]shadow {d['shadow']} repointed[/]: {d['swap']['after'].get('table')} is v2"
        )

    output(json_out).result(run_repoint(_settings(), name), render)


@shadow_app.command("decommission")
@command
def decommission(name: NameArg, json_out: JsonOpt = False) -> None:
    """Drop v1 (kept for a rollback) once shadow.monitoring_s has passed since the swap."""
    # lazy: keeps rewind.shadow.lifecycle out of --help
    from rewind.shadow.lifecycle import decommission as run_decommission

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(f"shadow {d['shadow']} decommissioned: dropped {d.get('dropped')}")

    output(json_out).result(run_decommission(_settings(), name), render)


@shadow_app.command("abort")
@command
def abort(name: NameArg, json_out: JsonOpt = False) -> None:
    """Drop v2 and the tail's checkpoint of a shadow that was not swapped in."""
    # lazy: keeps rewind.shadow.lifecycle out of --help
    from rewind.shadow.lifecycle import abort as run_abort

    def render(console: Console, d: dict[str, Any]) -> None:
        console.print(f"shadow {d['shadow']} aborted: dropped {d.get('dropped')} and {d['checkpoint']}")

    output(json_out).result(run_abort(_settings(), name), render)
