"""The ``rewind`` command line: parse, call the core, print. No logic lives here.

``app`` builds the Typer app; each ``*_commands`` module registers its commands on it when
imported, which this package does here, so ``rewind.cli.app`` is complete once
``rewind.cli`` is imported.
"""

from __future__ import annotations

from rewind.cli.app import app

# the import order is the order of the commands in `rewind --help`
# isort: off
from rewind.cli import stack_commands, run_commands, verify_commands, history_commands, groups_commands
from rewind.cli import reconsume_commands
from rewind.cli import shadow_commands
from rewind.cli import quarantine_commands
from rewind.cli import snapshot_commands
from rewind.cli import compensate_commands
from rewind.cli import ops_commands
# isort: on

__all__ = ["app", "main"]

_COMMANDS = (  # registered on import
    stack_commands,
    run_commands,
    verify_commands,
    history_commands,
    groups_commands,
    reconsume_commands,
    shadow_commands,
    quarantine_commands,
    snapshot_commands,
    compensate_commands,
    ops_commands,
)


def main() -> None:
    app()
