"""How far the shadow is behind: per partition against the log end and the live group.

A sample is taken from the truth on each side: v2's position from the units its sink
committed (:mod:`rewind.shadow.positions`), the log end from a fetch (the true high
watermark), the live group's committed offsets from the broker. The shadow is
``caught-up`` when every sample of the last ``caught_up_for_s`` seconds (and at least one
that old) had every partition's lag against the log end at most ``lag_threshold``.

The tail's speed is read off the same samples (:func:`tail_speed`): v2's positions' growth per
second against the log ends' growth, as a multiple of it ("x real-time", as a replay's plan and
progress show it). A tail that has caught up can only read as fast as records arrive (~1x).
:func:`judge_tail` says whether a tail that has not caught up will: red when it reads no faster
than the topic is written (its lag cannot shrink), yellow below ``live.min_multiple``, with the
time left to catch up at the measured rates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from rewind.core.cost import human_seconds
from rewind.core.live_speed import Verdict, describe_speed, format_multiple, multiple
from rewind.kafka import groups
from rewind.shadow.positions import coverage

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.ledger.shadows import ShadowEvent
    from rewind.spec.shadow import Shadow


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    position: int  # every offset below it is in v2
    log_end: int
    group: int | None  # the live group's committed offset (None: nothing committed)

    @property
    def lag(self) -> int:
        return max(0, self.log_end - self.position)

    @property
    def group_lag(self) -> int | None:
        return None if self.group is None else self.group - self.position

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "position": self.position,
            "log_end": self.log_end,
            "group_offset": self.group,
            "lag": self.lag,
            "group_lag": self.group_lag,
        }


def sample(
    settings: Settings, topics: Sequence[str], live_group: str, committed_units: Sequence[str]
) -> list[PartitionLag]:
    """One lag sample of every partition of ``topics``."""
    conf = settings.kafka_config()
    covered = coverage(committed_units)
    committed = groups.committed_offsets(conf, live_group, list(topics))  # every partition of topics
    tps = sorted(committed)
    bounds = groups.log_bounds(conf, tps)
    out = []
    for tp in tps:
        cov = covered.get(tp)
        out.append(PartitionLag(tp[0], tp[1], cov.end if cov else 0, bounds[tp].high, committed.get(tp)))
    return out


def caught_up(samples: Sequence[ShadowEvent], config: Shadow, now: datetime) -> tuple[bool, str]:
    """Whether the lag stayed under the threshold for ``caught_up_for_s``, and why (not)."""
    if not samples:
        return False, "no lag sample yet"
    window_start = now - timedelta(seconds=config.caught_up_for_s)
    recent = [s for s in samples if s.at >= window_start]
    older = [s for s in samples if s.at < window_start]
    if not recent or (config.caught_up_for_s > 0 and not older):
        return False, f"lag measured for less than {config.caught_up_for_s:g} s"
    for s in [older[-1], *recent] if older else recent:
        worst = max_lag(s.details)
        if worst > config.lag_threshold:
            return False, (
                f"lag {worst} > threshold {config.lag_threshold} at {s.at.isoformat(timespec='seconds')}"
            )
    return True, f"every partition's lag <= {config.lag_threshold} for {config.caught_up_for_s:g} s"


def max_lag(details: Mapping[str, Any]) -> int:
    return max((int(p["lag"]) for p in details.get("partitions", [])), default=0)


SPEED_WINDOW_S = 60.0
"""The tail's speed is measured over the lag samples of about this many of the last seconds."""


def tail_speed(samples: Sequence[ShadowEvent], window_s: float = SPEED_WINDOW_S) -> dict[str, Any] | None:
    """The tail's records per second and the live produce rate over the samples of about the
    last ``window_s`` seconds (at least the last two), and the first as a multiple of the second
    (None: no live writes). None when there are fewer than two samples."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    first = next((e for e in samples if e.at >= last.at - timedelta(seconds=window_s)), samples[-2])
    if first is last:
        first = samples[-2]
    seconds = (last.at - first.at).total_seconds()
    if seconds <= 0:
        return None

    def total(event: ShadowEvent, key: str) -> int:
        return sum(int(p[key]) for p in event.details.get("partitions", []))

    tail = max(0, total(last, "position") - total(first, "position")) / seconds
    live = max(0, total(last, "log_end") - total(first, "log_end")) / seconds
    m = multiple(tail, live)
    return {
        "records_per_second": round(tail, 3),
        "live_records_per_second": round(live, 3),
        "multiple": None if m is None else round(m, 3),
        "over_s": round(seconds, 3),
        "summary": f"tail {tail:,.0f} rec/s, {describe_speed(tail, live)} over {seconds:.0f}s",
    }


CATCH_UP_NEVER_S = 365 * 24 * 3600.0
"""A catch-up this far off is not given as a time: the rates will have changed long before."""


def judge_tail(
    speed: Mapping[str, Any] | None, caught_up: bool, lag: int, min_multiple: float
) -> Verdict | None:
    """Whether the tail keeps up (see the module docstring); None before its speed is measured."""
    if speed is None:
        return None
    if caught_up:
        return Verdict("ok", "caught up: it reads records as they arrive")
    tail, live = float(speed["records_per_second"]), float(speed["live_records_per_second"])
    m = speed.get("multiple")
    over = f"over the last {float(speed['over_s']):.0f}s"
    if tail <= live:
        return Verdict(
            "red",
            f"the tail reads {tail:,.0f} rec/s, no faster than the topic is written ({live:,.0f} rec/s) "
            f"{over}: its lag of {lag:,} records cannot shrink; give the tail more resources "
            "(Spark's cores; shadow.max_offsets_per_trigger raised or removed)",
        )
    eta = lag / (tail - live)
    when = f"in about {human_seconds(eta)}" if eta < CATCH_UP_NEVER_S else "not within a year at this rate"
    left = f"{lag:,} records behind, caught up {when}"
    if m is not None and float(m) < min_multiple:
        return Verdict(
            "yellow",
            f"{format_multiple(float(m))} real-time {over}, below {format_multiple(min_multiple)} "
            f"(live.min_multiple): {left}",
        )
    return Verdict("ok", f"{speed['summary']}: {left}")
