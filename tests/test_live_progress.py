"""Live progress without Spark: the progress channel over real UDP sockets, the rate meter, and
the CLI console's lines and metrics server (a real HTTP server, scraped over HTTP).

The whole path through Spark and a real broker is in tests/test_job_progress.py.
"""

from __future__ import annotations

import io
import socket
import time
import urllib.request
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.core.console import RunProgress
from rewind.core.counts import RecordCounts
from rewind.errors import ConfigError
from rewind.job.live import RateMeter
from rewind.progress import CliConsole
from rewind.spark.progress_channel import InFlightCounts, ProgressAddress, ProgressListener, TaskReporter
from tests.conftest import free_port


def wait_for(check: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    return check()


def test_task_counts_reach_the_driver_over_udp_and_foreign_datagrams_are_dropped() -> None:
    with ProgressListener("127.0.0.1", "127.0.0.1") as listener:
        sizes = {"t/0/0-1000": 1000, "t/1/0-1000": 1000}
        with TaskReporter(listener.address, every_s=0.0) as reporter:
            reporter.add("t/0/0-1000", 120)
            reporter.add("t/1/0-1000", 30)
            reporter.add("t/0/0-1000", 80)
            assert wait_for(lambda: listener.counts.records(sizes) == 230), listener.counts.records(sizes)
        # another run's channel (same port, other id) changes nothing
        stranger = ProgressAddress("127.0.0.1", listener.address.port, "another-run")
        with TaskReporter(stranger, every_s=0.0) as other:
            other.add("t/0/0-1000", 500)
        assert wait_for(lambda: listener.counts.dropped >= 1)
        assert listener.counts.records(sizes) == 230
        # a unit never counts more than its offsets; forgotten units count nothing
        assert listener.counts.records({"t/0/0-1000": 150}) == 150
        listener.counts.forget(["t/0/0-1000"])
        assert listener.counts.records(sizes) == 30


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_closing_the_listener_wakes_its_thread(monkeypatch: pytest.MonkeyPatch, bind: str) -> None:
    """close() does not wait out the thread's poll for a datagram (a run's end waited ~0.2 s),
    and the wake-up is not taken for a report."""
    monkeypatch.setattr(ProgressListener, "POLL_S", 60.0)
    listener = ProgressListener(bind, "127.0.0.1")
    thread = listener._thread
    time.sleep(0.05)  # the thread is waiting in recvfrom
    listener.close()
    assert not thread.is_alive()
    assert (listener.counts.received, listener.counts.dropped) == (0, 0)


def test_a_reporter_never_fails_its_task() -> None:
    """No listener on the port, an unresolvable host, no address at all: counting goes on."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (
        ProgressAddress("127.0.0.1", port, "c"),
        ProgressAddress("no-such-host.invalid", 9, "c"),
        None,
    ):
        with TaskReporter(address, every_s=0.0) as reporter:
            for _ in range(50):
                reporter.add("t/0/0-10", 1)


reports = st.lists(
    st.tuples(st.sampled_from(["0", "1", "2"]), st.integers(0, 3), st.integers(0, 700)), max_size=40
)


@given(reports, st.integers(1, 2000))
def test_counts_follow_the_latest_attempt_of_each_split_in_any_order(
    sent: list[tuple[str, int, int]], size: int
) -> None:
    """Datagrams are cumulative and may arrive in any order: per split, the highest attempt
    wins (a retried task restarts its count), within it the highest count; splits add up;
    the unit is capped at its offsets."""
    counts = InFlightCounts("run")
    for split, attempt, count in sent:
        counts.take(f'{{"c": "run", "r": [["u", "{split}", {attempt}, {count}]]}}'.encode())
    expected = 0
    for split in {s for s, _a, _c in sent}:
        last = max(a for s, a, _c in sent if s == split)
        expected += max(c for s, a, c in sent if s == split and a == last)
    assert counts.records({"u": size}) == min(size, expected)
    assert counts.received == len(sent)


def test_the_rate_is_measured_over_a_sliding_window_from_when_reading_began() -> None:
    now = [0.0]
    meter = RateMeter(window_s=10.0, clock=lambda: now[0])

    def at(second: float, records: int) -> float | None:
        now[0] = second
        return meter.measure(records)

    assert at(0.0, 5_000) is None  # a resumed run's committed records are the start
    assert at(0.5, 5_000) is None  # under a second: not measurable
    for second in range(2, 11):  # Spark starts its job: nothing read for 10 s
        assert at(second, 5_000) == 0.0
    # reading at 400 rec/s: the start-up does not count against the rate
    assert at(11, 5_400) == pytest.approx(400.0)
    assert at(12, 5_800) == pytest.approx(400.0)
    for second in range(13, 31):
        rate = at(second, 5_000 + 400 * (second - 10))
    assert rate == pytest.approx(400.0)
    # a stall after reading began lowers it: the last 5 s of the 10 s window read nothing
    for second in range(31, 36):
        rate = at(second, 13_000)
    assert rate == pytest.approx(200.0)


def progress(run_id: str, done: int, read: int, *, rate: float | None = None, left: int = 0) -> RunProgress:
    return RunProgress(
        run_id, 4, done, 4000, RecordCounts(records_read=read, emitted=read), 0.0,
        offsets_left=left, rate=rate, eta_s=left / rate if rate else None,
    )


def scrape(address: str, port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=2) as resp:
        body = resp.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("rewind_")
    }


def test_the_console_serves_metrics_from_entry_and_prints_the_run_id_first() -> None:
    port, out = free_port(), io.StringIO()
    label = '{run_id="r-1"}'
    with CliConsole(stream=out, metrics_port=port, metrics_address="127.0.0.2") as console:
        assert scrape("127.0.0.2", port) == {}  # answers before any run is known
        with pytest.raises(OSError):  # bound where told, not on 127.0.0.1
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        console.run_started(progress("r-1", 0, 0, left=4000))
        metrics = scrape("127.0.0.2", port)
        assert metrics[f"rewind_records_read{label}"] == 0
        assert metrics[f"rewind_units_done{label}"] == 0
        assert metrics[f"rewind_offsets_to_planned_end{label}"] == 4000
        for read in (100, 200, 300):  # three updates within a second: one line
            console.wave_progress(progress("r-1", 0, read, rate=250.0, left=4000 - read))
        assert scrape("127.0.0.2", port)[f"rewind_records_read{label}"] == 300
        console.run_progress(progress("r-1", 4, 4000, rate=400.0))  # the last commit: always a line
    lines = out.getvalue().splitlines()
    assert lines == [
        "run r-1: 4 units, 4,000 offsets planned",
        "r-1: 0/4 units, 100 records read, 250 rec/s, 0 quarantined, eta 16s",
        "r-1: 4/4 units, 4,000 records read, 400 rec/s, 0 quarantined, eta 0s",
    ]
    with pytest.raises(OSError):  # the server stopped with the console
        urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=2)


def test_a_metrics_port_in_use_is_one_line_naming_the_options() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as caught, CliConsole(enabled=False, metrics_port=port):
            pass
    assert str(caught.value).startswith(f"metrics on 127.0.0.1:{port}: ")
    assert "--metrics-port" in str(caught.value) and "metrics.address" in str(caught.value)
