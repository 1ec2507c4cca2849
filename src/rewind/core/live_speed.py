"""A replay's speed against the live stream: "x real-time", and whether it is fast enough.

Operators judge a backfill by how many times faster it reads than the topic is written
("sustain >= 10x real-time throughput to complete within the operational SLA"): a run at 1x
never catches up with the log end, and a slow run may still be reading a window whose oldest
records retention deletes first. Pure arithmetic over measured numbers: the live produce rate
comes from the log ends' growth (:mod:`rewind.kafka.live_rate`), the run's speed from the cost
model at plan time and from the run's own rate meter while it runs.

A topic with no live writes has no multiple (nothing to outrun): it says "no live writes"
rather than dividing by zero, and is never judged too slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rewind.core.cost import human_seconds

DEFAULT_MIN_MULTIPLE = 10.0
NO_LIVE_WRITES = "no live writes"
NOT_MEASURED = "live rate not measured"

Status = Literal["ok", "yellow", "red"]


def multiple(rate: float | None, live_rate: float | None) -> float | None:
    """``rate / live_rate``; None when either is unknown or nothing is written live."""
    if rate is None or live_rate is None or live_rate <= 0:
        return None
    return rate / live_rate


def format_multiple(value: float) -> str:
    """12.345 → '12.3x'; 1234.5 → '1,234x'."""
    return f"{value:,.1f}x" if value < 100 else f"{value:,.0f}x"


def describe_speed(rate: float | None, live_rate: float | None) -> str:
    """What a person reads beside an ETA or a rate: '12.3x real-time (live 1,200 rec/s)',
    'no live writes', or 'live rate not measured'."""
    if live_rate is None:
        return NOT_MEASURED
    if live_rate <= 0:
        return NO_LIVE_WRITES
    m = multiple(rate, live_rate)
    said = "?x" if m is None else format_multiple(m)
    live = f"{live_rate:,.1f}" if live_rate < 10 else f"{live_rate:,.0f}"
    return f"{said} real-time (live {live} rec/s)"


def expected_rate(cost: dict[str, Any], max_records_per_second: float | None = None) -> float | None:
    """The sustained records per second a run is expected to read, from the cost model's
    estimate (:func:`rewind.core.cost.estimate`): its records over the seconds of processing,
    commits and waves (Spark's start-up is paid once, not a throughput), capped by the spec's
    rate guard, which holds the run to it."""
    work = ("compute_seconds", "commit_seconds", "wave_overhead_seconds")
    seconds = sum(float(cost.get(k) or 0.0) for k in work)
    records = int(cost.get("records") or 0)
    rate = records / seconds if records and seconds > 0 else None
    if max_records_per_second:
        rate = max_records_per_second if rate is None else min(rate, max_records_per_second)
    return rate


def expected_eta(cost: dict[str, Any], max_records_per_second: float | None = None) -> float | None:
    """The run's ETA (seconds): the cost model's, or the rate guard's when that is longer."""
    eta = cost.get("eta_seconds")
    records = int(cost.get("records") or 0)
    if max_records_per_second and records:
        guarded = float(cost.get("spark_startup_seconds") or 0.0) + records / max_records_per_second
        eta = guarded if eta is None else max(float(eta), guarded)
    return None if eta is None else float(eta)


def seconds_until_gone(
    *,
    now_ms: int,
    first_ts_ms: int | None,
    retention_ms: int | None,
    retention_bytes: int | None = None,
    offsets_to_end: int = 0,
    avg_record_bytes: float | None = None,
    live_rate: float | None = None,
) -> float | None:
    """Seconds until the first record of a partition's window may leave the log; None: never,
    as far as the topic's config says (-1 is infinite retention).

    Time retention deletes a record no sooner than ``retention.ms`` after its timestamp. Size
    retention (``retention.bytes``, per partition) deletes the oldest records once the log holds
    more bytes: the window's first record goes once the log after it (``offsets_to_end`` records
    now, growing at ``live_rate``) outgrows the retention; without live writes it never does.
    """
    left: list[float] = []
    if retention_ms is not None and retention_ms >= 0 and first_ts_ms is not None:
        left.append((first_ts_ms + retention_ms - now_ms) / 1000)
    if retention_bytes is not None and retention_bytes >= 0 and avg_record_bytes and live_rate:
        room = retention_bytes / avg_record_bytes - offsets_to_end
        left.append(room / live_rate)
    return max(0.0, min(left)) if left else None


@dataclass(frozen=True)
class Verdict:
    status: Status  # ok | yellow | red
    detail: str


def judge(
    expected: float | None,
    live_rate: float | None,
    eta_s: float | None,
    seconds_left: float | None,
    min_multiple: float = DEFAULT_MIN_MULTIPLE,
) -> Verdict:
    """Red when the run cannot finish before the window's oldest records leave the log (its ETA
    is longer than ``seconds_left``); yellow when its expected speed is below ``min_multiple``
    times the live rate; ok otherwise, or when there is nothing to judge."""
    if eta_s is not None and seconds_left is not None and eta_s > seconds_left:
        return Verdict(
            "red",
            f"the run cannot finish before the window's oldest records leave the log: ETA "
            f"{human_seconds(eta_s)}, retention deletes them in {human_seconds(seconds_left)}; read "
            "the window from an archive (source.history), narrow it, or run faster",
        )
    speed = describe_speed(expected, live_rate)
    m = multiple(expected, live_rate)
    if m is not None and m < min_multiple:
        return Verdict(
            "yellow",
            f"{speed}: below {format_multiple(min_multiple)} real-time, the run may not keep ahead "
            "of the live stream (live.min_multiple)",
        )
    if m is not None:
        return Verdict("ok", f"{speed}, at least {format_multiple(min_multiple)}")
    return Verdict("ok", speed)
