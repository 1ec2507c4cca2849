"""``rewind`` commands run in the test's own process, for tests of what a command does and
prints rather than of the process that runs it.

A cold ``rewind`` process costs one to four seconds of CPU to import its modules (by the
machine and its load), and one that starts Spark several more (its driver JVM, Spark's Python
daemon and workers): a large share of the suite's CPU went to such processes, not to the data
they moved. In process, a command runs through the same Typer app, its error handling and its
output, and takes this worker's Spark session (``rewind.spark.session`` finds it running): a
module whose commands need Spark requests the ``spark`` fixture first, so that the session is
the tests' own and not one a command started with its own settings.

Tests of the process itself keep a child: a kill or a signal, start-up time, what the JVM
prints, settings that only a new driver takes (``spark.conf``, ``spark.master``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import traceback
from collections.abc import Mapping
from pathlib import Path

from tests.job_fixtures import REWIND_BIN


def rewind(args: list[str], *, cwd: Path, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``rewind ARGS`` here, as a child would with ``env`` (a whole environment, as
    ``subprocess.run`` takes it) in ``cwd``; returns what the child would: its exit code,
    stdout and stderr (with the traceback a child would print for an error not handled)."""
    # lazy: the CLI's modules load on the first command, as in a child
    from typer.testing import CliRunner

    from rewind import logs
    from rewind.cli import app

    changes: dict[str, str | None] = {k: v for k, v in env.items() if os.environ.get(k) != v}
    changes.update({k: None for k in os.environ if k.startswith("REWIND_") and k not in env})
    loggers = {name: logging.getLogger(name).level for name in ("rewind", "rewind.librdkafka")}
    before = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args, env=changes)
    finally:
        os.chdir(before)
        logs.remove_handlers()  # the command's log file and stderr handler, as its exit would
        for name, level in loggers.items():
            logging.getLogger(name).setLevel(level)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["rewind", *args], result.exit_code, result.stdout, stderr)


def rewind_unless_killed(
    args: list[str], *, cwd: Path, env: Mapping[str, str], fault: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``rewind ARGS`` in a child process when ``fault`` (a ``REWIND_FAULT`` point) is to kill
    it, else in this one (:func:`rewind`): a promote killed at a step, then its plain re-run."""
    if not fault:
        return rewind(args, cwd=cwd, env=env)
    return subprocess.run(
        [REWIND_BIN, *args],
        cwd=cwd,
        env={**env, "REWIND_FAULT": fault},
        capture_output=True,
        text=True,
        timeout=120,
    )
