"""The driver's rate budget (``rewind.spark.pace_server``): one limit for every task of a job,
however many connect, over real TCP connections; strangers and an unreachable driver fail in
one line, never read unpaced."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.spark.pace_server import PaceAddress, PaceServer, PaceUnreachable, RemotePacer, pace_server_for
from rewind.spark.ratelimit import RateLimit
from tests.conftest import free_port


def _send_all(server: PaceServer, tasks: int, chunks: int, chunk: int) -> list[float]:
    """``tasks`` clients, each with its own connection, each sending ``chunks`` chunks; the
    times (one clock for all) at which every chunk was allowed out."""
    sent: list[float] = []
    lock = threading.Lock()

    def task() -> None:
        pacer = RemotePacer(server.address)
        try:
            for _ in range(chunks):
                pacer.acquire(chunk, 0, time.sleep)
                with lock:
                    sent.append(time.monotonic())
        finally:
            pacer.close()

    threads = [threading.Thread(target=task) for _ in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(sent)


def test_every_task_shares_one_limit_over_any_window() -> None:
    rate, tasks, chunks, chunk = 2_000.0, 4, 10, 100  # 4,000 records: ~2 s at the limit
    server = PaceServer(RateLimit(rate))
    try:
        t0 = time.monotonic()
        sent = _send_all(server, tasks, chunks, chunk)
        elapsed = time.monotonic() - t0
    finally:
        server.close()
    assert len(sent) == tasks * chunks and server.grants == tasks * chunks and server.clients == tasks
    # the last chunk may start once the first 39 have had their time: 39 * 0.05 s
    assert elapsed >= (tasks * chunks - 1) * chunk / rate - 0.01
    # over any window at most the rate's worth, plus one chunk per task in flight
    for i in range(len(sent)):
        for j in range(i, len(sent)):
            assert (j - i + 1) * chunk <= rate * (sent[j] - sent[i]) + tasks * chunk + 1e-6, (i, j)


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(10, 1e6),
    asks=st.lists(st.tuples(st.integers(0, 10_000), st.floats(0, 0.2)), min_size=1, max_size=30),
)
def test_a_grant_never_lets_the_job_run_ahead_of_its_rate(rate: float, asks: list[tuple[int, float]]) -> None:
    """Grants at arbitrary moments (a clock that only moves forward): the records granted before
    any start never exceed what the rate allows since the first start, and a grant never waits
    longer than the records ahead of it need (no burst after a pause, no time lost)."""
    server = PaceServer(RateLimit(rate))
    try:
        clock, granted, first, busy_until = 1_000.0, 0, None, 0.0
        for records, pause in asks:
            clock += pause
            start = clock + server.grant(records, 0, now=clock)
            first = start if first is None else first
            assert granted <= rate * (start - first) * (1 + 1e-9) + 1e-6
            assert start == pytest.approx(max(clock, busy_until), abs=1e-9)
            busy_until = start + records / rate
            granted += records
    finally:
        server.close()


def test_a_client_without_the_wave_token_gets_no_budget() -> None:
    server = PaceServer(RateLimit(100.0))
    try:
        stranger = RemotePacer(PaceAddress("127.0.0.1", server.address.port, "00" * 16))
        with pytest.raises(PaceUnreachable, match="closed the connection"):
            stranger.acquire(1, 0, time.sleep)
        assert server.grants == 0
    finally:
        server.close()


def test_an_unreachable_driver_fails_the_task_in_one_line() -> None:
    port = free_port()  # nothing listens there
    pacer = RemotePacer(PaceAddress("127.0.0.1", port, "ab" * 16))
    with pytest.raises(PaceUnreachable) as caught:
        pacer.acquire(1, 0, time.sleep)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "executors must reach the driver" in message
    assert "\n" not in message


def test_a_local_session_keeps_the_host_pacing_file(spark: object) -> None:
    """On ``local[*]`` every task is on this host: no server, the shared file is exact."""
    with pace_server_for(spark, RateLimit(100.0)) as pace:  # type: ignore[arg-type]
        assert pace is None


def test_a_table_source_task_asks_the_driver_when_it_serves_a_budget(tmp_path: object) -> None:
    """A re-produce's task (``TableUnits``) paces through the driver's budget when the wave
    carries one, and through the host's pacing file otherwise."""
    import dataclasses

    from rewind.spark.ratelimit import SharedFilePacer
    from rewind.tables.stage import TableStageContext, TableUnits

    server = PaceServer(RateLimit(1_000.0))
    try:
        ctx = TableStageContext(
            run_id="r-pace",
            spec_json="{}",
            output_schema_b64="",
            quarantine_folder="",
            reader=None,  # type: ignore[arg-type]  # not read: only the pacer is asked for
            selection=None,  # type: ignore[arg-type]
            units=(),
            ranges=(),
            partitions=1,
            partitioner="murmur2",
            max_records_per_second=1_000.0,
            rate_limit_id="r-pace",
            pace=server.address,
        )
        pacer = TableUnits(ctx, writer=None)._pacer()  # type: ignore[arg-type]
        assert isinstance(pacer, RemotePacer)
        pacer.acquire(10, 0, time.sleep)
        pacer.close()
        assert server.grants == 1 and server.clients == 1
        local = TableUnits(dataclasses.replace(ctx, pace=None), writer=None)._pacer()  # type: ignore[arg-type]
        assert isinstance(local, SharedFilePacer)
    finally:
        server.close()
