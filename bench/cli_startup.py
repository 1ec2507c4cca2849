"""Benchmark: start-up of the ``rewind`` command line (issue #37 item 3).

Targets: ``rewind --help`` and every ``rewind <cmd> --help`` ≤ 0.5 s; ``rewind config``,
``rewind runs`` and ``rewind show RUN`` ≤ 1.0 s on a quiet 2-core machine. Each command is a
whole new process (the console script of the venv this runs in), started ``--repeat`` times
in turn with the peer ``python -c pass`` (A B A B ...), after one warm-up that fills the
page cache and writes the bytecode. Wall seconds from the parent's clock; CPU seconds
(user + system) from the kernel's accounting of the reaped child (``os.wait4``), which the
load of other processes moves less than the wall clock (the command is one single-threaded
process, so on a quiet machine its wall time is its CPU time plus a few ms). The median is the
figure; min and max show the spread.

``runs`` and ``show`` read a ledger (SQLite under a temporary state dir) that holds one
finished run, written directly through :class:`rewind.ledger.Ledger` as
``tests/job_fixtures.py`` does, so no Spark or broker is needed.

Run: ``.venv/bin/python bench/cli_startup.py [--repeat 9]``. To time another checkout's code
with the same console script, put its ``src`` first: ``PYTHONPATH=/other/src .venv/bin/python
bench/cli_startup.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from common import machine, stamp  # noqa: E402

RUN_ID = "r-bench-startup"


def seed_ledger(state: Path) -> None:
    """One finished run in the ledger under ``state`` (its plan, the run, two units)."""
    from rewind.core.ranges import OffsetRange
    from rewind.ledger import Ledger

    name = "orders-repair"
    spec = {"name": name, "source": {"topic": "orders"}}
    plan = {"plan_id": "p-bench", "name": name, "spec": spec, "read_plan": {}, "units": [],
            "offsets": 0, "output_schema_b64": "", "output_columns": [], "gates": []}
    staging = {"kind": "iceberg", "table": "lake.orders", "branch": f"rewind-{RUN_ID}"}
    with Ledger.open(f"sqlite:///{state / 'ledger.db'}") as ledger:
        ledger.save_plan("p-bench", name, spec, plan)
        ledger.create_run("p-bench", name, "iceberg:lake.orders", run_id=RUN_ID, staging=staging)
        ledger.add_units(RUN_ID, [OffsetRange("orders", p, 0, 1000) for p in range(2)])
        ledger.set_state(RUN_ID, "running")
        ledger.set_state(RUN_ID, "succeeded")


def one_run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one whole process; fails loudly if the command fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err.decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()

    rewind = str(Path(sys.executable).with_name("rewind"))
    commands: list[tuple[str, float, list[str]]] = [
        ("rewind --help", 0.5, [rewind, "--help"]),
        ("rewind runs --help", 0.5, [rewind, "runs", "--help"]),
        ("rewind run --help", 0.5, [rewind, "run", "--help"]),
        ("rewind groups reset --help", 0.5, [rewind, "groups", "reset", "--help"]),
        ("rewind config", 1.0, [rewind, "config"]),
        ("rewind runs", 1.0, [rewind, "runs"]),
        (f"rewind show {RUN_ID}", 1.0, [rewind, "show", RUN_ID]),
    ]
    peer = [sys.executable, "-c", "pass"]
    print(f"# {stamp()} {machine()}; load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="rewind-bench-cli-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        seed_ledger(state)
        env = {**os.environ, "REWIND_STATE_DIR": str(state)}
        env.pop("REWIND_CONFIG", None)
        print(f"{'command':<34} {'target':>6}  {'wall s median (min-max)':<26} "
              f"{'cpu s median (min-max)':<26} {'peer wall':<9} met (wall / cpu)")
        for name, target, argv in commands:
            walls, cpus, peer_walls = [], [], []
            for _ in range(1):  # warm-up
                one_run(argv, env, Path(tmp))
            for _ in range(args.repeat):
                wall, cpu = one_run(argv, env, Path(tmp))
                walls.append(wall)
                cpus.append(cpu)
                peer_walls.append(one_run(peer, env, Path(tmp))[0])
            met = ["yes" if statistics.median(v) <= target else "NO" for v in (walls, cpus)]
            print(f"{name:<34} {target:>6.1f}  {spread(walls):<26} {spread(cpus):<26} "
                  f"{statistics.median(peer_walls):<9.3f} {' / '.join(met)}", flush=True)
    print(f"# load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
