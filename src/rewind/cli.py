"""The ``rewind`` command line: parse, call the core, print. No logic lives here."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from rewind import logs
from rewind.config import Settings, load_settings
from rewind.errors import RewindError
from rewind.output import Output
from rewind.secrets import mask_text

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
dev_app = typer.Typer(no_args_is_help=True, help="The embedded stack on loopback.")
app.add_typer(dev_app, name="dev")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
F = TypeVar("F", bound=Callable[..., Any])


class _Context:
    config: Path | None = None
    debug: bool = False


ctx = _Context()


@app.callback()
def _main(
    config: Annotated[Path | None, typer.Option(help="Settings file (default ./rewind.yaml).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and client logs.")] = False,
) -> None:
    """Rewind: safe, fast, repeatable backfills and replays of Kafka event streams."""
    ctx.config, ctx.debug = config, debug


def _settings() -> Settings:
    settings = load_settings(ctx.config)
    logs.configure(logging.DEBUG if ctx.debug else logging.WARNING, settings.secret_values())
    if not ctx.debug:
        logging.getLogger("rewind.librdkafka").setLevel(logging.CRITICAL)
    return settings


def command(fn: F) -> F:
    """Turn a RewindError into one masked line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = Output(bool(kwargs.get("json_out")))
        try:
            return fn(*args, **kwargs)
        except RewindError as exc:
            if ctx.debug:
                raise
            secrets: list[str] = []
            with contextlib.suppress(RewindError):
                secrets = load_settings(ctx.config).secret_values()
            out.error(mask_text(str(exc), secrets))
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _parts_table(console: Console, parts: list[dict[str, Any]]) -> None:
    table = Table("part", "state", "address", "detail")
    for p in parts:
        detail = p["detail"] + (f" (pid {p['pid']})" if p.get("pid") else "")
        if p.get("seconds") is not None:
            detail += f" [{p['seconds']:.2f}s]"
        table.add_row(p["name"], p["state"], p["address"], detail)
    console.print(table)


@dev_app.command("up")
@command
def dev_up(json_out: JsonOpt = False) -> None:
    """Start the embedded broker, catalog and ledger (idempotent)."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).up())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("down")
@command
def dev_down(json_out: JsonOpt = False) -> None:
    """Stop what `rewind dev up` started (idempotent); catalog and ledger files stay."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).down())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@dev_app.command("status")
@command
def dev_status(json_out: JsonOpt = False) -> None:
    """Report each part of the embedded stack and its address."""
    from rewind.embedded.stack import Stack, as_dicts

    parts = as_dicts(Stack(_settings()).status())
    Output(json_out).result({"parts": parts}, lambda c, d: _parts_table(c, d["parts"]))


@app.command()
@command
def doctor(
    json_out: JsonOpt = False,
    spark: Annotated[bool, typer.Option(help="Also time a Spark start-up.")] = True,
    join_timeout: Annotated[float, typer.Option(help="Seconds to wait for a group join.")] = 45.0,
) -> None:
    """Check Java, Spark and the broker, and probe what the broker really supports."""
    from rewind.doctor import run_doctor

    report = run_doctor(_settings(), with_spark=spark, join_timeout_s=join_timeout)
    out = Output(json_out)
    out.result(report, _render_doctor)
    if not report["ok"]:  # stderr only: with --json the report above is the one JSON object
        Output(as_json=False).error(report["failure"])
        raise typer.Exit(1)


def _render_doctor(console: Console, report: dict[str, Any]) -> None:
    colours = {"ok": "green", "supported": "green", "wrong-answer": "yellow",
               "missing": "yellow", "failed": "red"}
    table = Table("check", "status", "detail", "seconds")
    for c in report["checks"]:
        colour = colours.get(c["status"], "white")
        table.add_row(c["name"], f"[{colour}]{c['status']}[/]", c["detail"], f"{c['seconds']:.2f}")
    console.print(table)


@app.command()
@command
def demo(
    json_out: JsonOpt = False,
    records: Annotated[int, typer.Option(help="Events to produce.")] = 60_000,
) -> None:
    """Run the end-to-end smoke on the embedded stack (starts it if needed)."""
    from rewind.smoke import run_smoke

    report = run_smoke(_settings(), records=records)
    Output(json_out).result({"ok": True, "steps": report.steps}, _render_steps)


def _render_steps(console: Console, data: dict[str, Any]) -> None:
    table = Table("step", "seconds", "facts")
    for step in data["steps"]:
        facts = ", ".join(f"{k}={v}" for k, v in step.items() if k not in ("step", "seconds"))
        table.add_row(step["step"], f"{step['seconds']:.2f}", facts)
    console.print(table)
    console.print("[green]demo passed[/]: every count was exact. `rewind dev down` stops the stack.")


@app.command("config")
@command
def show_config(json_out: JsonOpt = False) -> None:
    """Print the effective settings, secrets masked."""
    Output(json_out).result(_settings().public(), lambda c, d: c.print_json(data=d))


def main() -> None:
    app()
