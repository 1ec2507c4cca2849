"""A Spark Connect server on loopback, started from the PySpark distribution for a test.

The server class ships in the wheel's jars (``spark-connect``): ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer spark-internal``, as a user would start
it without a Spark download, on a free port of 127.0.0.1 with ``local[2]`` inside. It is one
process group of its own (spark-submit's JVM and its Python workers), stopped by its pid.

Its Python workers run this interpreter with the repository on ``PYTHONPATH``, so that they
import Rewind and the ``tests.*`` translate functions the specs name, as a user's server must
import theirs. ``REWIND_TEST_SPARK_REMOTE=sc://host:port`` uses a server already running
instead (its workers must import the same).

The interpreter is named through a wrapper, :func:`late_python`, that can make one Python
worker late on purpose: a fault test touches :func:`late_worker_marker` and the next
foreachBatch worker the server starts misses Spark's fixed wait for it to connect back, as
a worker on a loaded machine does.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from rewind.spark.class_archive import java_options
from tests.conftest import free_port
from tests.job_fixtures import QUICK_JVM

SPARK_HOME = Path(pyspark.__file__).resolve().parent
REPO = Path(__file__).resolve().parents[1]
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
EXTERNAL_REMOTE = os.environ.get("REWIND_TEST_SPARK_REMOTE", "")


def java_missing() -> str | None:
    """Why a server cannot start here, or None."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java on this machine (PATH or JAVA_HOME): a Spark Connect server needs one"
    return None


LATE_WORKER_MODULE = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"
LATE_BY_S = 15  # Spark waits 10 s for a worker to connect back (PythonWorkerFactory)


def late_worker_marker(folder: Path) -> Path:
    """Touch it and the next foreachBatch worker of the server started in ``folder`` is late."""
    return folder / "late-foreach-batch-worker"


def late_python(folder: Path) -> Path:
    """This interpreter behind a script that, once :func:`late_worker_marker` exists, takes it
    away and lets the next foreachBatch worker start :data:`LATE_BY_S` seconds late (then
    exit: Spark has given up on it); every other start runs Python at once."""
    script = folder / "python"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{LATE_WORKER_MODULE}*)\n'
        f"  if rm '{late_worker_marker(folder)}' 2>/dev/null; then sleep {LATE_BY_S}; exit 1; fi;;\n"
        "esac\n"
        f"exec '{sys.executable}' \"$@\"\n"
    )
    script.chmod(0o755)
    return script


def server_command(port: int, python: str = sys.executable) -> list[str]:
    log4j = (REPO / "src/rewind/spark/log4j2.properties").as_uri()
    # the same jars as a local session's: Spark's class archive maps into this JVM too (start to
    # a first answer measured 5.5 s -> 2.8 s on a 2-core machine)
    java = f"-Dlog4j2.configurationFile={log4j} {QUICK_JVM} {java_options()}".strip()
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.driver.extraJavaOptions": java,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.python.worker.reuse": "true",
        # workers forked with Rewind's task modules imported, as a local session's are
        "spark.python.daemon.module": "rewind.spark.daemon",
        "spark.pyspark.python": python,
    }
    cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", "local[2]"]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, "spark-internal"]


@contextmanager
def spark_connect_server(folder: Path, timeout_s: float = 180) -> Iterator[str]:
    """Start a server, wait until its port answers, yield ``sc://127.0.0.1:PORT``; stop it."""
    if EXTERNAL_REMOTE:
        yield EXTERNAL_REMOTE
        return
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    python = str(late_python(folder))
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("REWIND_")},
        "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(folder),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": python,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    log = folder / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            server_command(port, python),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not _listening(port):
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited ({proc.returncode})\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server not ready in {timeout_s:g} s\n{_tail(log)}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its JVM and Python workers), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for _ in range(50):  # Python workers outliving the JVM: the group is gone once they are
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def _listening(port: int) -> bool:
    """Whether the server's gRPC port takes connections (Rewind's log4j settings keep the
    server's own "started" line out of its log)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
