"""A PostgreSQL server of the test's own, on a free port, that a test may stop, start and restart.

Made with the machine's ``initdb``/``pg_ctl`` (run as the ``postgres`` user when the tests run
as root: the server refuses to run as root; its folder is outside pytest's private temporary
folder so that user can reach it). Trust authentication on loopback only.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        pytest.fail(f"PostgreSQL's {name} is not installed; `apt-get install postgresql` provides it")
    return found[-1]


@dataclass
class PgCluster:
    home: Path
    port: int

    @classmethod
    def create(cls) -> PgCluster:
        home = Path(tempfile.mkdtemp(prefix="rewind-pg-"))
        if os.geteuid() == 0:
            shutil.chown(home, "postgres")
        cluster = cls(home, free_port())
        cluster._ctl_run([pg_bin("initdb"), "-D", str(home / "data"), "--auth=trust", "-U", "postgres", "-N"])
        cluster.start()
        return cluster

    @property
    def _as_user(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _ctl_run(self, args: list[str]) -> None:
        done = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]} failed: {done.stdout}{done.stderr}"

    def _ctl(self, *args: str) -> list[str]:
        return [pg_bin("pg_ctl"), "-D", str(self.home / "data"), *args]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"ledger_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl_run(self._ctl("-o", options, "-l", str(self.home / "log"), "-w", "start"))

    def stop(self) -> None:
        """A fast shutdown: every client connection is terminated, open transactions roll back."""
        self._ctl_run(self._ctl("-m", "fast", "-w", "stop"))

    def destroy(self) -> None:
        subprocess.run([*self._as_user, *self._ctl("-m", "immediate", "-w", "stop")], capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)
