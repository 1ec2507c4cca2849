"""The Typer app, its global options and the decorator that turns errors into one line.

Start-up matters here: `rewind --help` imports every command module, so the modules of the CLI
import at their top only Typer, Rich and what their signatures name; settings (pydantic), the
ledger (SQLAlchemy), Spark, Arrow, pandas, pyiceberg and confluent-kafka are imported inside
the command functions that use them (tests/test_cli_startup.py keeps that true).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from rewind import logs
from rewind.errors import RewindError
from rewind.output import output
from rewind.secrets import mask_text

if TYPE_CHECKING:
    from rewind.config import Settings

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help=(
        "Rewind reprocesses Kafka history safely: plan a window, run it on Spark into staging, "
        "verify it against a reference, promote it atomically, roll it back with one command. "
        "`rewind demo` shows a whole repair; docs/quickstart.md starts you off."
    ),
)
dev_app = typer.Typer(no_args_is_help=True, help="The embedded stack on loopback.")
app.add_typer(dev_app, name="dev")
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
F = TypeVar("F", bound=Callable[..., Any])


class _Context:
    config: Path | None = None
    debug: bool = False


ctx = _Context()
LOG_FILE = "rewind.log"  # under the state dir: Rewind's warnings, unless --debug
SPARK_LOG_FILE = "spark.log"  # under the state dir: the driver JVM's output, unless --debug


@app.callback()
def _main(
    config: Annotated[Path | None, typer.Option(help="Settings file (default ./rewind.yaml).")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks, warnings and client logs on stderr.")] = False,
) -> None:
    """Rewind: safe, fast, repeatable backfills and replays of Kafka event streams."""
    ctx.config, ctx.debug = config, debug


def _settings() -> Settings:
    # lazy: keeps pydantic, yaml out of --help
    from rewind.config import load_settings

    settings = load_settings(ctx.config)
    if ctx.debug:
        logs.configure(logging.DEBUG, settings.secret_values())
    else:  # warnings to the log file; stderr keeps errors and the command's own one line
        logs.configure(
            logging.WARNING,
            settings.secret_values(),
            log_file=settings.state_path / LOG_FILE,
            stderr_level=logging.ERROR,
        )
        logging.getLogger("rewind.librdkafka").setLevel(logging.CRITICAL)
        if settings.spark.jvm_output is None:  # Spark's lines to a file, as Rewind's warnings
            settings.spark.jvm_output = settings.state_path / SPARK_LOG_FILE
    return settings


def command(fn: F) -> F:
    """Turn a RewindError into one masked line on stderr and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = output(bool(kwargs.get("json_out")))
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            spark = _from_spark(exc)
            if ctx.debug or not (isinstance(exc, RewindError) or spark):
                raise
            # lazy: keeps pydantic, yaml out of --help
            from rewind.config import load_settings

            secrets: list[str] = []
            with contextlib.suppress(RewindError):
                secrets = load_settings(ctx.config).secret_values()
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            out.error(mask_text(f"Spark: {text}" if spark else str(exc), secrets))
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _from_spark(exc: BaseException) -> bool:
    """An error Spark raised (a query that failed, a cast that did not fit): one line, like ours."""
    return type(exc).__module__.startswith(("pyspark.", "py4j."))


def _parts_table(console: Console, parts: list[dict[str, Any]]) -> None:
    table = Table("part", "state", "address", "detail")
    for p in parts:
        detail = p["detail"] + (f" (pid {p['pid']})" if p.get("pid") else "")
        if p.get("seconds") is not None:
            detail += f" [{p['seconds']:.2f}s]"
        table.add_row(p["name"], p["state"], p["address"], detail)
    console.print(table)


MetricsOpt = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve Prometheus metrics on PORT from the start of the run (default: settings metrics.port).",
        min=1,
        max=65535,
    ),
]
MetricsAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-address",
        help="Address the metrics server binds (default: settings metrics.address, 127.0.0.1).",
    ),
]


def number_text(value: Any) -> str:
    """A table cell for an offset or a count: ``-`` when unknown, thousands separated."""
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
