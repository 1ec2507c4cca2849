"""Commands about the machine: the embedded stack (`rewind dev`), `doctor`, `demo`, `config`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rewind.cli.app import JsonOpt, _parts_table, _settings, app, command, dev_app
from rewind.errors import ConfigError, RewindError
from rewind.output import output


@dev_app.command("up")
@command
def dev_up(json_out: JsonOpt = False) -> None:
    """Start the embedded broker, catalog and ledger (idempotent)."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).up())
    output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("down")
@command
def dev_down(json_out: JsonOpt = False) -> None:
    """Stop what `rewind dev up` started (idempotent); catalog and ledger files stay."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).down())
    output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("status")
@command
def dev_status(json_out: JsonOpt = False) -> None:
    """Report each part of the embedded stack and its address."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).status())
    output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@app.command()
@command
def doctor(
    json_out: JsonOpt = False,
    spark: Annotated[bool, typer.Option(help="Also time a Spark start-up.")] = True,
    join_timeout: Annotated[float, typer.Option(help="Seconds to wait for a group join.")] = 45.0,
) -> None:
    """Check Java, Spark and the broker, and probe what the broker really supports."""
    # lazy: keeps pydantic, yaml out of --help
    from rewind.doctor import run_doctor

    settings = _settings()
    report = run_doctor(settings, with_spark=spark, join_timeout_s=join_timeout)
    if any(c["name"] == "broker" and c["status"] == "ok" for c in report["checks"]):
        # lazy: keeps rewind.ops.readiness out of --help
        from rewind.ops.readiness import record_doctor

        try:  # evidence for `rewind readiness`; a ledger out of reach must not hide the report
            report["probe_id"] = record_doctor(settings, report)
        except RewindError as exc:
            report["probe_not_recorded"] = str(exc).splitlines()[0]
    out = output(json_out)
    out.result(report, _render_doctor)
    if not report["ok"]:  # stderr only: with --json the report above is the one JSON object
        out.failure(report["failure"])
        raise typer.Exit(1)


def _render_doctor(console: Console, report: dict[str, Any]) -> None:
    colours = {
        "ok": "green",
        "supported": "green",
        "wrong-answer": "yellow",
        "missing": "yellow",
        "failed": "red",
    }
    table = Table("check", "status", "detail", "seconds")
    for c in report["checks"]:
        colour = colours.get(c["status"], "white")
        table.add_row(c["name"], f"[{colour}]{c['status']}[/]", c["detail"], f"{c['seconds']:.2f}")
    console.print(table)


@app.command()
@command
def demo(
    json_out: JsonOpt = False,
    events: Annotated[int, typer.Option(help="Order events in the topic (60 days of them).")] = 1_000_000,
    seed: Annotated[int, typer.Option(help="Seed of the generated history.")] = 7,
    report: Annotated[Path | None, typer.Option(help="Where to write the HTML report.")] = None,
    story: Annotated[
        str,
        typer.Option(
            help="repair (a bounded repair of order_totals) or shadow (order_totals, a folded aggregate, "
            "migrated to a v2 with a new field by `rewind shadow` while orders keep arriving)."
        ),
    ] = "repair",
) -> None:
    """Play a production repair (or, --story shadow, a live migration) end to end on the
    embedded stack (starts it if needed)."""
    # lazy: keeps pandas out of --help
    from rewind.demo.story import run_demo

    if story not in ("repair", "shadow"):
        raise ConfigError(f"--story {story} is not a story of the demo; use repair or shadow")
    console = Console(stderr=json_out, highlight=False, soft_wrap=True)
    if story == "shadow":
        # lazy: keeps pandas out of --help
        from rewind.demo.shadow_story import run_shadow_story

        played = run_shadow_story(_settings(), events=min(events, 200_000), seed=seed, say=console.print)
        facts = {"ok": True, "steps": played.steps, "summary": played.summary}
        output(json_out).result(facts, _render_shadow)
        return
    result = run_demo(_settings(), events=events, seed=seed, say=console.print, report_path=report)
    output(json_out).result({"ok": True, "steps": result.steps, "summary": result.summary}, _render_demo)


def _render_demo(console: Console, data: dict[str, Any]) -> None:
    s = data["summary"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(s["quarantine_reasons"].items())) or "none"
    table = Table("", "", show_header=False, box=None)
    table.add_row("events in the topic", f"{s['events_in_topic']:,}")
    table.add_row("records read (archive + log)", f"{s['records_read']:,}")
    table.add_row("orders written to staging", f"{s['rows_written']:,}")
    table.add_row("orders repaired", f"{s['orders_repaired']:,}")
    table.add_row("quarantined", f"{s['quarantined']:,} ({reasons})")
    table.add_row("run", f"{s['run_seconds']:.1f} s, {s['records_per_s'] or 0:,} records/s")
    table.add_row("whole demo", f"{s['demo_seconds']:.1f} s")
    console.print(table)
    console.print(f"report: {s['report']}", soft_wrap=True)
    console.print(
        f"[green]demo passed[/]: every step gave the result the data says it must. "
        f"`rewind show {s['run_id']}` tells the run again; `rewind dev down` stops the stack.",
        soft_wrap=True,
    )


def _render_shadow(console: Console, data: dict[str, Any]) -> None:
    s = data["summary"]
    for step in data["steps"]:
        console.print(f" {step['step']:<28} {step['seconds']:>7.1f} s")
    console.print(
        f"[green]demo passed[/]: {s['orders']:,} orders in order_totals equal a clean recomputation "
        f"({s['live_events']:,} live events arrived during the migration). `rewind shadow status "
        f"{s['shadow']}` tells the shadow again; `rewind dev down` stops the stack.",
        soft_wrap=True,
    )


@app.command("config")
@command
def show_config(json_out: JsonOpt = False) -> None:
    """Print the effective settings, secrets masked."""
    output(json_out).result(_settings().public())
