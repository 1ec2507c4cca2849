"""A Spark standalone cluster on loopback, started from the PySpark distribution for a test.

One master and ``workers`` workers of ``cores`` cores each (``spark-class ...Master`` / ``...Worker``,
as a user would start them without a Spark download), each a process of its own started and
stopped by pid. The master's ``/json`` page says when the workers registered and, after a
job, which applications ran on how many cores.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark

from rewind.spark.class_archive import java_options
from tests.conftest import free_port
from tests.job_fixtures import QUICK_JVM  # heap sizes go in their own settings

SPARK_HOME = Path(pyspark.__file__).resolve().parent


@dataclass
class SparkCluster:
    master_url: str
    web_url: str
    logs: Path

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    def completed_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("completedapps", []))

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.logs.glob("*.log")):
            out.append(
                f"== {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            )
        return "\n".join(out)


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):  # workers first, then the master
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def isolated(command: list[str], spark_home: Path, hidden: list[Path]) -> list[str]:
    """``command`` in a mount namespace of its own where each of ``hidden`` is an empty tmpfs
    and the Spark distribution is bind-mounted at ``spark_home`` first (it lives inside the
    virtualenv, which may be hidden): a worker host that shares nothing with the driver but
    the network and a Spark installation."""
    script = [f"mount --bind {shlex.quote(str(SPARK_HOME))} {shlex.quote(str(spark_home))}"]
    script += [f"mount -t tmpfs tmpfs {shlex.quote(str(path))}" for path in hidden]
    script.append("exec " + " ".join(shlex.quote(c) for c in command))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join(script)]


def can_isolate() -> str | None:
    """Why workers cannot get a mount namespace here, or None."""
    if os.geteuid() != 0:
        return "needs root (unshare --mount)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --mount fails: {probe.stderr.strip()}"


@contextmanager
def spark_cluster(
    folder: Path,
    workers: int = 2,
    timeout_s: float = 120,
    hidden: list[Path] | None = None,
    cores: int = 1,
) -> Iterator[SparkCluster]:
    """``hidden``: folders the workers must not see (each in its own mount namespace, with
    only a bare Python, the Spark distribution and the network); None: plain workers."""
    folder.mkdir(parents=True, exist_ok=True)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # the master's and workers' own JVMs: small, quick, and from the driver's jars, so that
        # Spark's class archive maps into them too (the isolated workers below cannot see it)
        "SPARK_DAEMON_JAVA_OPTS": f"{QUICK_JVM} {java_options()}".strip(),
        "SPARK_DAEMON_MEMORY": "512m",
    }
    worker_env = env
    if hidden is not None:
        home = folder / "spark-home"
        home.mkdir(exist_ok=True)
        # nothing of the driver's environment: no virtualenv on PATH, no PYTHONPATH
        worker_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(folder),
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
            "SPARK_DAEMON_MEMORY": "512m",
            **({"JAVA_HOME": os.environ["JAVA_HOME"]} if "JAVA_HOME" in os.environ else {}),
        }
    port, web = free_port(), free_port()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}", folder)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            _start(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(web),
                ],
                folder / "master.log",
                env,
            )
        )
        _wait(lambda: cluster.state().get("status") == "ALIVE", timeout_s, "the master", cluster, procs)
        for i in range(workers):
            procs.append(
                _start(
                    worker_command(
                        [
                            spark_class
                            if hidden is None
                            else str(folder / "spark-home" / "bin" / "spark-class"),
                            "org.apache.spark.deploy.worker.Worker",
                            "--host",
                            "127.0.0.1",
                            "--cores",
                            str(cores),
                            "--memory",
                            "1g",
                            "--webui-port",
                            str(free_port()),
                            "--work-dir",
                            str(folder / f"worker-{i}"),
                            cluster.master_url,
                        ],
                        folder,
                        hidden,
                    ),
                    folder / f"worker-{i}.log",
                    worker_env,
                )
            )
        _wait(
            lambda: cluster.state().get("aliveworkers") == workers, timeout_s, "the workers", cluster, procs
        )
        yield cluster
    finally:
        _stop(procs)


def worker_command(command: list[str], folder: Path, hidden: list[Path] | None) -> list[str]:
    return command if hidden is None else isolated(command, folder / "spark-home", hidden)


def _wait(
    ready: Any, timeout_s: float, what: str, cluster: SparkCluster, procs: list[subprocess.Popen[bytes]]
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(
                f"{what}: a cluster process exited ({dead[0].returncode})\n{cluster.log_tail()}"
            )
        try:
            if ready():
                return
        except OSError:
            pass  # the web UI is not up yet
        except ValueError:
            pass  # it is, but answers its HTML page until its JSON handler is attached
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready in {timeout_s:g} s\n{cluster.log_tail()}")
