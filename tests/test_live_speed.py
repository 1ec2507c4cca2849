"""A replay's speed against the live stream, without a broker: the judgement (yellow below the
multiple, red when retention wins the race), the shadow tail's speed from its lag samples, and
how the progress line and /metrics show the multiple (a real console and HTTP server).

The measurements against real brokers, with a producer writing at a known rate, are in
tests/test_live_rate.py; the whole path through a run in tests/test_job_progress.py.
"""

from __future__ import annotations

import io
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.core.console import RunProgress
from rewind.core.cost import describe
from rewind.core.counts import RecordCounts
from rewind.core.live_speed import (
    describe_speed,
    expected_eta,
    expected_rate,
    judge,
    multiple,
    seconds_until_gone,
)
from rewind.job.live import LiveProgress
from rewind.ledger.shadows import ShadowEvent
from rewind.progress import CliConsole
from rewind.shadow.lag import judge_tail, tail_speed
from tests.conftest import free_port

COST = {
    "records": 1_000_000,
    "compute_seconds": 8.0,
    "commit_seconds": 1.5,
    "wave_overhead_seconds": 0.5,
    "spark_startup_seconds": 12.0,
    "eta_seconds": 22.0,
}


def test_the_multiple_is_the_rate_over_the_live_rate_and_no_live_writes_divide_nothing() -> None:
    assert multiple(5_000.0, 250.0) == 20.0
    assert multiple(5_000.0, 0.0) is None and multiple(None, 250.0) is None
    assert describe_speed(5_000.0, 250.0) == "20.0x real-time (live 250 rec/s)"
    assert describe_speed(123_456.0, 50.0) == "2,469x real-time (live 50 rec/s)"
    assert describe_speed(30.0, 2.5) == "12.0x real-time (live 2.5 rec/s)"
    assert describe_speed(5_000.0, 0.0) == "no live writes"
    assert describe_speed(5_000.0, None) == "live rate not measured"


def test_the_expected_speed_leaves_out_spark_start_up_and_obeys_the_rate_guard() -> None:
    assert expected_rate(COST) == 100_000.0  # 1M records in 10 s of work
    assert expected_rate(COST, max_records_per_second=2_000) == 2_000.0
    assert expected_rate({"records": 0}) is None
    assert expected_eta(COST) == 22.0
    assert expected_eta(COST, max_records_per_second=2_000) == 12.0 + 500.0  # the guard holds it longer


def test_retention_by_time_and_by_size_says_when_the_first_record_may_go() -> None:
    now = 1_800_000_000_000
    hour = 3_600_000
    # a record 50 minutes old under 1 h of retention: 10 minutes left
    assert seconds_until_gone(now_ms=now, first_ts_ms=now - 50 * 60_000, retention_ms=hour) == 600.0
    assert seconds_until_gone(now_ms=now, first_ts_ms=now - 2 * hour, retention_ms=hour) == 0.0  # overdue
    assert seconds_until_gone(now_ms=now, first_ts_ms=now - 2 * hour, retention_ms=-1) is None  # infinite
    # 1 MB per partition of 100-byte records holds 10,000; 4,000 after the window's first: 6,000 more
    # at 100 rec/s is 60 s, sooner than the hour
    size = {"retention_bytes": 1_000_000, "offsets_to_end": 4_000, "avg_record_bytes": 100.0}
    assert seconds_until_gone(now_ms=now, first_ts_ms=now, retention_ms=hour, live_rate=100.0, **size) == 60.0
    # size retention without live writes never deletes it: the hour is all
    assert seconds_until_gone(now_ms=now, first_ts_ms=now, retention_ms=hour, live_rate=0.0, **size) == 3600.0


def test_the_verdict_is_yellow_below_the_multiple_and_red_when_retention_wins() -> None:
    fast = judge(100_000.0, 1_000.0, eta_s=22.0, seconds_left=None, min_multiple=10)
    assert fast.status == "ok" and fast.detail == "100x real-time (live 1,000 rec/s), at least 10.0x"
    slow = judge(5_000.0, 1_000.0, eta_s=22.0, seconds_left=None, min_multiple=10)
    assert slow.status == "yellow" and slow.detail.startswith(
        "5.0x real-time (live 1,000 rec/s): below 10.0x"
    )
    assert judge(5_000.0, 1_000.0, 22.0, None, min_multiple=4).status == "ok"  # a configurable multiple
    late = judge(100_000.0, 1_000.0, eta_s=700.0, seconds_left=600.0)
    assert late.status == "red" and "ETA 11m 40s, retention deletes them in 10m 00s" in late.detail
    idle = judge(5_000.0, 0.0, 22.0, None)
    assert idle.status == "ok" and idle.detail == "no live writes"


rates = st.floats(min_value=0.001, max_value=1e7, allow_nan=False)
maybe_seconds = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)
RANK = {"ok": 0, "yellow": 1, "red": 2}


@given(
    rates,
    st.none() | st.floats(min_value=0, max_value=1e6),
    st.floats(0, 1e6),
    maybe_seconds,
    st.floats(min_value=0.5, max_value=100),
    st.floats(min_value=1, max_value=100),
)
def test_the_verdict_follows_its_rules_and_a_faster_run_is_never_judged_worse(
    expected: float, live: float | None, eta: float, left: float | None, floor: float, speedup: float
) -> None:
    verdict = judge(expected, live, eta, left, floor)
    red = left is not None and eta > left
    yellow = not red and live is not None and live > 0 and expected / live < floor
    assert verdict.status == ("red" if red else "yellow" if yellow else "ok")
    faster = judge(expected * speedup, live, eta / speedup, left, floor)
    assert RANK[faster.status] <= RANK[verdict.status]


def test_the_plan_shows_the_multiple_beside_its_eta() -> None:
    est = {
        **COST,
        "bytes_from_broker": None,
        "bytes_from_archive": None,
        "records_per_core_second": 50_000.0,
        "rate_source": "default",
        "cores": 2,
        "core_seconds": 20.0,
        "live": {"summary": "100x real-time (live 1,000 rec/s) over 2.0s"},
    }
    eta = next(line for line in describe(est) if line.startswith("ETA"))
    assert eta.endswith("; 100x real-time (live 1,000 rec/s) over 2.0s"), eta


def lag_sample(at: datetime, positions: tuple[int, int], ends: tuple[int, int]) -> ShadowEvent:
    parts = [{"position": p, "log_end": e, "lag": e - p} for p, e in zip(positions, ends, strict=True)]
    return ShadowEvent(0, at, "lag", {"partitions": parts})


def test_a_shadow_tail_speed_is_its_positions_growth_over_the_log_ends_growth() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    samples = [
        lag_sample(t0 - timedelta(seconds=300), (0, 0), (0, 0)),  # outside the last minute: left out
        lag_sample(t0, (1_000, 1_000), (50_000, 50_000)),
        lag_sample(t0 + timedelta(seconds=30), (31_000, 31_000), (50_750, 50_750)),
        lag_sample(t0 + timedelta(seconds=60), (61_000, 61_000), (51_500, 51_500)),
    ]
    speed = tail_speed(samples)
    assert speed is not None
    assert speed["records_per_second"] == 2_000.0 and speed["live_records_per_second"] == 50.0
    assert speed["multiple"] == 40.0 and speed["over_s"] == 60.0
    assert speed["summary"] == "tail 2,000 rec/s, 40.0x real-time (live 50 rec/s) over 60s"
    idle = [lag_sample(t0, (10, 10), (10, 10)), lag_sample(t0 + timedelta(seconds=5), (10, 10), (10, 10))]
    assert tail_speed(idle)["multiple"] is None  # type: ignore[index]
    assert "no live writes" in tail_speed(idle)["summary"]  # type: ignore[index]
    assert tail_speed(samples[:1]) is None


def tail(rate: float, live: float, over_s: float = 60.0) -> dict[str, object]:
    """A tail_speed result: records per second read, written live, over ``over_s``."""
    return {
        "records_per_second": rate,
        "live_records_per_second": live,
        "multiple": multiple(rate, live),
        "over_s": over_s,
        "summary": f"tail {rate:,.0f} rec/s, {describe_speed(rate, live)} over {over_s:.0f}s",
    }


def test_a_tail_behind_is_red_when_it_cannot_gain_and_yellow_below_the_multiple() -> None:
    assert judge_tail(None, False, 5_000, 10.0) is None  # not measured yet: nothing to judge
    caught = judge_tail(tail(20, 20), True, 3, 10.0)
    assert caught is not None and caught.status == "ok" and "caught up" in caught.detail  # ~1x is right
    losing = judge_tail(tail(150, 200), False, 40_000, 10.0)
    assert losing is not None and losing.status == "red"
    assert "cannot shrink" in losing.detail and "40,000" in losing.detail
    slow = judge_tail(tail(1_540, 200), False, 182_000, 10.0)
    assert slow is not None and slow.status == "yellow"
    assert slow.detail == (
        "7.7x real-time over the last 60s, below 10.0x (live.min_multiple): 182,000 records behind, "
        "caught up in about 2m 16s"
    )
    fast = judge_tail(tail(4_000, 200), False, 38_000, 10.0)
    assert fast is not None and fast.status == "ok" and fast.detail.endswith("caught up in about 10.0s")
    quiet = judge_tail(tail(500, 0), False, 1_000, 10.0)  # no live writes: it only gains
    assert quiet is not None and quiet.status == "ok" and "no live writes" in quiet.detail
    stalled = judge_tail(tail(0, 0), False, 1_000, 10.0)  # reads nothing, nothing written
    assert stalled is not None and stalled.status == "red"
    barely = judge_tail(tail(200.0001, 200), False, 10**9, 10.0)  # gains, but not within a year
    assert barely is not None and barely.detail.endswith("caught up not within a year at this rate")


@given(
    st.floats(0, 1e5),
    st.floats(0, 1e4),
    st.integers(0, 10**9),
    st.floats(min_value=1, max_value=100),
    st.floats(min_value=1, max_value=100),
)
def test_a_faster_tail_is_never_judged_worse(
    rate: float, live: float, lag: int, floor: float, speedup: float
) -> None:
    verdict = judge_tail(tail(rate, live), False, lag, floor)
    assert verdict is not None
    red = rate <= live
    yellow = not red and live > 0 and rate / live < floor
    assert verdict.status == ("red" if red else "yellow" if yellow else "ok")
    faster = judge_tail(tail(rate * speedup, live), False, lag, floor)
    assert faster is not None and RANK[faster.status] <= RANK[verdict.status]


def progress(read: int, rate: float | None, live: float | None) -> RunProgress:
    # every unit done: the console prints each one (while a wave runs, at most one line in 5 s)
    return RunProgress(
        "r-9",
        4,
        4,
        4000,
        RecordCounts(records_read=read, emitted=read),
        0.0,
        offsets_left=4000 - read,
        rate=rate,
        eta_s=(4000 - read) / rate if rate else None,
        live_rate=live,
    )


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        body = resp.read().decode()
    return {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("rewind_") and 'run_id="r-9"' in line
    }


def test_the_progress_line_and_metrics_show_the_multiple_or_no_live_writes() -> None:
    port, out = free_port(), io.StringIO()
    with CliConsole(stream=out, metrics_port=port) as console:
        console.run_progress(progress(1000, 400.0, 40.0))
        metrics = scrape(port)
        assert metrics["rewind_realtime_multiple"] == 10.0
        assert metrics["rewind_live_records_per_second"] == 40.0
        console.run_progress(progress(2000, 400.0, 0.0))
        metrics = scrape(port)
        assert "rewind_realtime_multiple" not in metrics  # no live writes: no series, not a division by 0
        assert metrics["rewind_live_records_per_second"] == 0.0
        console.run_progress(progress(3000, 400.0, None))
        assert "rewind_live_records_per_second" not in scrape(port)  # not measured
    assert out.getvalue().splitlines() == [
        "r-9: 4/4 units, 1,000 records read, 400 rec/s, 0 quarantined, eta 8s, "
        "10.0x real-time (live 40 rec/s)",
        "r-9: 4/4 units, 2,000 records read, 400 rec/s, 0 quarantined, eta 5s, no live writes",
        "r-9: 4/4 units, 3,000 records read, 400 rec/s, 0 quarantined, eta 2s",
    ]


class Seen:
    def __init__(self) -> None:
        self.progress: list[RunProgress] = []

    def run_started(self, p: RunProgress) -> None:
        self.progress.append(p)

    run_progress = wave_progress = run_started


def test_the_run_keeps_the_plans_live_rate_until_its_own_meter_has_one() -> None:
    class Meter:
        def __init__(self) -> None:
            self.answers: list[float | None] = [None, 55.0]

        def rate(self) -> float | None:
            return self.answers.pop(0) if self.answers else 60.0

    seen = Seen()
    live = LiveProgress(seen, 0.0, live_rate=40.0, live_meter=Meter())  # type: ignore[arg-type]
    live.run_started(progress(0, None, None))
    live.committed(progress(1000, None, None))
    live.committed(progress(2000, None, None))
    assert [p.live_rate for p in seen.progress] == [40.0, 55.0, 60.0]


@pytest.mark.parametrize("rate", [None, 0.0])
def test_a_plan_without_a_live_measure_shows_nothing_of_it(rate: float | None) -> None:
    seen = Seen()
    LiveProgress(seen, 0.0, live_rate=rate).run_started(progress(0, None, None))  # type: ignore[arg-type]
    assert seen.progress[0].live_rate == rate
