"""How a CLI command prints its result: one interface, a Rich and a JSON implementation.

Commands compute a plain result (dicts and lists) and hand it to :meth:`Output.result`; the
Rich form is drawn by the command's render function, the JSON form is the result itself.
Every result passes through :func:`rewind.secrets.mask` before it is printed. Every string
of a result and every error line is escaped here, once, before a render function sees it, so
text the user typed (a path, a run id, a topic, a translate reference with brackets) is
printed as written, never read as Rich markup (nor as an emoji code: ``pkg:smile:fn`` stays
as typed); render functions add markup around values and never escape them again. A result
with no render function is printed as JSON, unescaped (JSON is not markup).
"""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from rewind.logs import warnings_in_file
from rewind.secrets import mask

Render = Callable[[Console, Any], None]


class Output(ABC):
    def __init__(self) -> None:
        self.errors = Console(stderr=True, highlight=False, emoji=False)

    @abstractmethod
    def result(self, data: Any, render: Render | None = None) -> None:
        """Print a command's result (secrets masked); without ``render``, as JSON in both forms."""

    def error(self, message: str) -> None:
        """One line on stderr: the command failed."""
        self.failure(message)

    def failure(self, message: str) -> None:
        """One line on stderr after a result was printed (with --json that result is the one object).

        Warnings logged on the way went to the log file, not stderr (:mod:`rewind.logs`): the
        line names it."""
        warned, log_file = warnings_in_file()
        if warned:
            message += f" ({warned} warning{'s' if warned > 1 else ''} in {log_file})"
        self.errors.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def escape_values(data: Any) -> Any:
    """``data`` with every string in it (keys too) escaped for Rich markup."""
    if isinstance(data, str):
        return escape(data)
    if isinstance(data, dict):
        return {escape_values(k): escape_values(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(escape_values(v) for v in data)
    return data


class RichOutput(Output):
    """For people: the command's render function draws the result, its values escaped."""

    def __init__(self) -> None:
        super().__init__()
        self.console = Console(highlight=False, emoji=False)

    def result(self, data: Any, render: Render | None = None) -> None:
        if render is None:
            self.console.print_json(data=mask(data), default=str)
            return
        render(self.console, escape_values(mask(data)))


class JsonOutput(Output):
    """For programs (``--json``): the result as one JSON object on stdout."""

    def result(self, data: Any, render: Render | None = None) -> None:
        sys.stdout.write(json.dumps(mask(data), indent=2, default=str) + "\n")

    def error(self, message: str) -> None:
        """The line on stderr, and ``{"error": ...}`` on stdout for the caller."""
        sys.stdout.write(json.dumps({"error": message}) + "\n")
        super().error(message)


def output(as_json: bool) -> Output:
    return JsonOutput() if as_json else RichOutput()
