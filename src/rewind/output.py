"""One output interface for the CLI, with a Rich and a JSON implementation.

Commands compute a plain result (dicts and lists) and hand it to :class:`Output`; the
human form is drawn by a render function, the machine form is the result itself. Every
result passes through :func:`rewind.secrets.mask` before it is printed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console

from rewind.secrets import mask


class Output:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = Console(highlight=False)
        self.errors = Console(stderr=True, highlight=False)

    def result(self, data: Any, render: Callable[[Console, Any], None]) -> None:
        safe = mask(data)
        if self.as_json:
            sys.stdout.write(json.dumps(safe, indent=2, default=str) + "\n")
        else:
            render(self.console, safe)

    def error(self, message: str) -> None:
        """One line on stderr; with --json also a JSON object on stdout for the caller."""
        if self.as_json:
            sys.stdout.write(json.dumps({"error": message}) + "\n")
        self.errors.print(f"[bold red]error:[/] {message}", soft_wrap=True)

    def failure(self, message: str) -> None:
        """One line on stderr after a result was printed (with --json that result is the one object)."""
        self.errors.print(f"[bold red]error:[/] {message}", soft_wrap=True)
