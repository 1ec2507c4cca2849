"""The CLI starts without the heavy libraries it does not need (issue #37 item 3).

Help imports none of pyspark, pyiceberg, confluent-kafka, SQLAlchemy, pandas or pyarrow; the
ledger commands (``config``, ``runs``, ``show``) import SQLAlchemy at most. Each check runs
the commands in a fresh interpreter and reads ``sys.modules`` after each one; how long they
take is measured by ``bench/cli_startup.py``, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from rewind.cli import app

HEAVY = ("pyspark", "pyiceberg", "confluent_kafka", "sqlalchemy", "pandas", "pyarrow")
LEDGER_ALLOWED = ("sqlalchemy",)

# Runs each argv of argv[1] (a JSON list) through the app in this one interpreter, in order,
# and writes to argv[2] the exit code and the heavy top-level packages loaded after each.
RUNNER = """
import json, sys
commands, out = json.loads(sys.argv[1]), sys.argv[2]
heavy = set(json.loads(sys.argv[3]))
from rewind.cli import app
results = []
for argv in commands:
    try:
        app(argv, prog_name="rewind")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    loaded = sorted({name.split(".")[0] for name in sys.modules} & heavy)
    results.append({"argv": argv, "code": code, "loaded": loaded})
with open(out, "w") as f:
    json.dump(results, f)
"""


def run_in_fresh_python(commands: list[list[str]], tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "startup.json"
    env = {k: v for k, v in os.environ.items() if k != "REWIND_CONFIG"}
    env["REWIND_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(commands), str(out), json.dumps(HEAVY)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


def help_commands() -> list[list[str]]:
    """``--help`` of the app and of every command and group under it, by walking Typer's command tree."""
    found: list[list[str]] = [["--help"]]

    def walk(group: TyperGroup, path: list[str]) -> None:
        for name, sub in sorted(group.commands.items()):
            found.append([*path, name, "--help"])
            if isinstance(sub, TyperGroup):
                walk(sub, [*path, name])

    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    walk(root, [])
    return found


def first_import(results: list[dict[str, Any]], allowed: tuple[str, ...] = ()) -> list[str]:
    """One line per heavy package: the first command after which it was loaded."""
    seen: set[str] = set(allowed)
    lines = []
    for r in results:
        for name in sorted(set(r["loaded"]) - seen):
            lines.append(f"`rewind {' '.join(r['argv'])}` imports {name}")
            seen.add(name)
    return lines


def test_help_imports_no_heavy_library(tmp_path: Path) -> None:
    commands = help_commands()
    assert ["runs", "--help"] in commands and ["groups", "reset", "--help"] in commands
    results = run_in_fresh_python(commands, tmp_path)
    failed = [r["argv"] for r in results if r["code"] != 0]
    assert not failed, f"help exited non-zero: {failed}"
    assert first_import(results) == []


def seed_run(state: Path, run_id: str) -> None:
    """A finished run in the ledger under ``state``, written directly (no Spark, no broker)."""
    from rewind.core.ranges import OffsetRange
    from rewind.ledger import Ledger

    state.mkdir(parents=True, exist_ok=True)
    spec = {"name": "orders-repair"}
    plan = {"plan_id": "p-startup", "name": spec["name"], "spec": spec, "read_plan": {}, "units": []}
    with Ledger.open(f"sqlite:///{state / 'ledger.db'}") as ledger:
        ledger.save_plan("p-startup", spec["name"], spec, plan)
        ledger.create_run("p-startup", spec["name"], "iceberg:lake.orders", run_id=run_id,
                          staging={"kind": "iceberg", "table": "lake.orders"})
        ledger.add_units(run_id, [OffsetRange("orders", 0, 0, 10)])
        ledger.set_state(run_id, "running")
        ledger.set_state(run_id, "succeeded")


def test_ledger_commands_import_only_the_ledger(tmp_path: Path) -> None:
    seed_run(tmp_path / "state", "r-startup")
    commands = [["config"], ["runs"], ["show", "r-startup"], ["show", "r-startup", "--json"]]
    results = run_in_fresh_python(commands, tmp_path)
    assert [r["code"] for r in results] == [0] * len(commands), results
    assert "sqlalchemy" in results[1]["loaded"]  # the check sees what a command imports
    assert first_import(results, LEDGER_ALLOWED) == []
