"""``rewind dev up|down|status`` through the real command line, each in its own process.

Every test gets its own state folder and a free port; a finalizer runs ``dev down`` and then
stops, by pid, any broker a test started, so no tansu outlives the tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind.embedded.broker import BrokerProcess, metadata_answers, pid_alive, port_open

try:
    from tests.conftest import free_port
except ImportError:  # tests/ run as a plain folder, not a package
    from conftest import free_port  # type: ignore[no-redef]

REWIND = str(Path(sys.executable).with_name("rewind"))


class DevCli:
    """Runs ``rewind`` with one state folder and one broker port."""

    def __init__(self, root: Path, port: int, **extra_env: str) -> None:
        self.root = root
        self.state = root / "state"
        self.port = port
        self.address = f"127.0.0.1:{port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_") or k == "REWIND_TANSU_BIN"}
        self.env = {
            **base,
            "COLUMNS": "200",
            "REWIND_STATE_DIR": str(self.state),
            "REWIND_DEV_BROKER_PORT": str(port),
            **extra_env,
        }
        self.timings: dict[str, float] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        result = subprocess.run(
            [REWIND, *args], env=self.env, cwd=self.root, capture_output=True, text=True, timeout=120
        )
        self.timings[" ".join(args)] = time.monotonic() - t0
        return result

    def json(self, *args: str) -> dict[str, dict[str, Any]]:
        result = self.run(*args, "--json")
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        return {p["name"]: p for p in json.loads(result.stdout)["parts"]}

    def pid_file_pid(self) -> int | None:
        try:
            return int((self.state / "broker.pid").read_text())
        except (OSError, ValueError):
            return None


def _kill(pid: int | None) -> None:
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[DevCli]:
    cli = DevCli(tmp_path, free_port())
    started: list[int] = []
    cli.started = started  # type: ignore[attr-defined]
    yield cli
    cli.run("dev", "down")
    for pid in [*started, cli.pid_file_pid()]:
        _kill(pid)


def remember(cli: DevCli, pid: int | None) -> None:
    if pid:
        cli.started.append(pid)  # type: ignore[attr-defined]


# -- the lifecycle ---------------------------------------------------------------------------


def test_up_status_down_are_idempotent(dev: DevCli) -> None:
    up = dev.json("dev", "up")
    broker = up["broker"]
    remember(dev, broker["pid"])
    assert broker["state"] == "running"
    assert broker["detail"] == "started"
    assert broker["started_by_rewind"] is True
    assert broker["address"] == dev.address
    assert up["catalog"]["state"] == "ready"
    assert up["ledger"]["state"] == "ready"
    assert up["ledger"]["detail"] == "schema v1"
    pid = broker["pid"]
    assert pid_alive(pid)
    assert port_open("127.0.0.1", dev.port)
    assert metadata_answers(dev.address)

    # pid and log files and the embedded catalog and ledger live under the state folder
    assert dev.pid_file_pid() == pid
    assert (dev.state / "broker.log").exists()
    assert (dev.state / "catalog.db").exists()
    assert (dev.state / "ledger.db").exists()
    assert json.loads((dev.state / "stack.json").read_text()) == {
        "broker": True,
        "catalog": True,
        "ledger": True,
    }

    again = dev.json("dev", "up")
    assert again["broker"]["state"] == "running"
    assert again["broker"]["detail"] == "already running"
    assert again["broker"]["pid"] == pid
    assert again["broker"]["started_by_rewind"] is True
    # each part's time is measured: finding the broker running is quicker than starting it
    assert again["broker"]["seconds"] < broker["seconds"]
    assert again["ledger"]["detail"] == "schema v1"

    status = dev.json("dev", "status")
    assert status["broker"]["state"] == "running"
    assert status["broker"]["detail"] == "answers metadata"
    assert status["broker"]["pid"] == pid
    assert status["broker"]["address"] == dev.address
    assert status["catalog"]["state"] == "ready"
    assert status["catalog"]["address"] == f"sqlite:///{dev.state / 'catalog.db'}"
    assert status["ledger"]["state"] == "ready"
    assert status["ledger"]["address"] == f"sqlite:///{dev.state / 'ledger.db'}"

    human = dev.run("dev", "status")
    assert human.returncode == 0
    assert "running" in human.stdout
    assert dev.address in human.stdout
    assert f"pid {pid}" in human.stdout

    down = dev.json("dev", "down")
    assert down["broker"]["state"] == "stopped"
    assert down["broker"]["started_by_rewind"] is True
    assert not pid_alive(pid)
    assert not port_open("127.0.0.1", dev.port)
    assert not (dev.state / "broker.pid").exists()
    assert (dev.state / "catalog.db").exists()  # files stay for the next `up`
    assert (dev.state / "ledger.db").exists()
    assert down["catalog"]["state"] == down["ledger"]["state"] == "ready"

    second = dev.run("dev", "down", "--json")
    assert second.returncode == 0, second.stderr
    parts = {p["name"]: p for p in json.loads(second.stdout)["parts"]}
    assert parts["broker"]["state"] == "stopped"
    assert parts["broker"]["started_by_rewind"] is False

    after = dev.json("dev", "status")
    assert after["broker"]["state"] == "stopped"
    assert after["broker"]["pid"] is None
    assert after["catalog"]["state"] == "ready"


def test_dev_up_is_quick(dev: DevCli, record_property: Any) -> None:
    up = dev.json("dev", "up")
    remember(dev, up["broker"]["pid"])
    record_property("dev_up_seconds", dev.timings["dev up --json"])
    record_property("broker_start_seconds", up["broker"]["seconds"])
    assert up["broker"]["seconds"] < 10
    assert dev.timings["dev up --json"] < 20


def test_status_before_anything_ran(dev: DevCli) -> None:
    status = dev.json("dev", "status")
    assert status["broker"]["state"] == "stopped"
    assert status["catalog"]["state"] == "missing"
    assert status["ledger"]["state"] == "missing"
    down = dev.json("dev", "down")
    assert down["broker"]["state"] == "stopped"
    assert down["catalog"]["state"] == "missing"  # never made, so not "external"


def test_up_after_the_broker_died_starts_a_new_one(dev: DevCli) -> None:
    first = dev.json("dev", "up")["broker"]["pid"]
    remember(dev, first)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(first) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert dev.json("dev", "status")["broker"]["state"] == "stopped"
    up = dev.json("dev", "up")
    remember(dev, up["broker"]["pid"])
    assert up["broker"]["detail"] == "started"
    assert up["broker"]["pid"] != first
    assert metadata_answers(dev.address)


# -- a broker rewind did not start -------------------------------------------------------------


@pytest.fixture
def outside_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A tansu started by someone else: its pid file is not in the stack's state folder."""
    outside = tmp_path / "outside"
    broker = BrokerProcess("127.0.0.1", free_port(), outside / "broker.pid", outside / "broker.log")
    broker.start(timeout_s=30)
    try:
        yield broker
    finally:
        broker.stop()


def test_an_outside_broker_is_used_and_left_alone(tmp_path: Path, outside_broker: BrokerProcess) -> None:
    dev = DevCli(tmp_path, outside_broker.port)
    outside_pid = outside_broker.pid()
    assert outside_pid

    up = dev.json("dev", "up")
    assert up["broker"]["state"] == "external"
    assert up["broker"]["started_by_rewind"] is False
    assert up["broker"]["address"] == outside_broker.address
    assert up["ledger"]["state"] == "ready"
    assert not (dev.state / "broker.pid").exists()
    assert json.loads((dev.state / "stack.json").read_text())["broker"] is False

    assert dev.json("dev", "up")["broker"]["state"] == "external"  # still idempotent
    assert dev.json("dev", "status")["broker"]["state"] == "external"

    down = dev.json("dev", "down")
    assert down["broker"]["state"] == "external"
    assert "left alone" in down["broker"]["detail"]
    assert outside_broker.pid() == outside_pid
    assert metadata_answers(outside_broker.address)


def test_a_port_taken_by_something_else_is_a_clear_error(dev: DevCli) -> None:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", dev.port))
        squatter.listen(8)
        result = dev.run("dev", "up")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert dev.address in lines[0]
    assert "REWIND_DEV_BROKER_PORT" in lines[0]
    assert "Traceback" not in result.stderr
    assert dev.pid_file_pid() is None


# -- a failed `up` does not leave an orphan ----------------------------------------------------


def test_a_failed_up_is_masked_and_down_still_stops_its_broker(tmp_path: Path) -> None:
    password = "Ledger/Pw-314"
    dev = DevCli(
        tmp_path,
        free_port(),
        REWIND_LEDGER_URL=f"postgresql://postgres:{password}@127.0.0.1:{free_port()}/nowhere",
    )
    try:
        result = dev.run("dev", "up")
        assert result.returncode == 1
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ledger at postgresql")
        assert "***" in lines[0]
        assert password not in result.stdout + result.stderr
        assert password.split("/")[0] not in result.stdout + result.stderr

        pid = dev.pid_file_pid()  # the broker part had started before the ledger failed
        assert pid and pid_alive(pid)
        down = dev.json("dev", "down")
        assert down["broker"]["state"] == "stopped"
        assert down["broker"]["started_by_rewind"] is True
        assert not pid_alive(pid)
        assert not port_open("127.0.0.1", dev.port)
    finally:
        _kill(dev.pid_file_pid())
