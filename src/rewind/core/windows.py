"""Read windows as asked for: bounds per partition (offsets, times, earliest, latest).

A leaf shared by the spec (which builds a :class:`WindowRequest` from YAML), the Kafka
resolver (:func:`rewind.kafka.resolve.resolve`, which turns it into exact ranges) and the
history planner. Construction checks what can be checked without a broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from rewind.errors import PlanError

EARLIEST = -2
"""The first offset still in Kafka (Spark's ``-2``)."""
LATEST = -1
"""The high watermark at planning time (Spark's ``-1``)."""

TP: TypeAlias = tuple[str, int]


@dataclass(frozen=True, order=True)
class Timestamp:
    """A bound given as a time: the first record whose timestamp is >= ``ms``."""

    ms: int

    def __post_init__(self) -> None:
        if isinstance(self.ms, bool) or not isinstance(self.ms, int) or self.ms < 0:
            raise PlanError(f"a timestamp bound must be milliseconds since the epoch >= 0, got {self.ms!r}")


Bound: TypeAlias = int | Timestamp
"""``EARLIEST``, ``LATEST``, an offset >= 0, or a :class:`Timestamp`."""


@dataclass(frozen=True)
class BoundSpec:
    """One side of a window: a default bound for every partition plus per-partition overrides.

    ``default=None`` means every partition must be named in ``overrides`` (Spark's rule for
    JSON offsets). ``option`` is the option the bounds came from, named in error messages.
    """

    default: Bound | None
    overrides: Mapping[TP, Bound] = field(default_factory=dict)
    option: str = ""

    def __post_init__(self) -> None:
        for bound in [self.default, *self.overrides.values()]:
            if bound is None or isinstance(bound, Timestamp):
                continue
            if isinstance(bound, bool) or not isinstance(bound, int) or bound < EARLIEST:
                raise PlanError(
                    f"{self.option or 'bound'}: {bound!r} is not a bound; "
                    "expected -2 (earliest), -1 (latest), an offset >= 0 or a Timestamp",
                    option=self.option or None,
                )

    def for_partition(self, topic: str, partition: int) -> Bound | None:
        return self.overrides.get((topic, partition), self.default)


@dataclass(frozen=True)
class WindowRequest:
    """What to read: exactly one of ``subscribe``, ``assign``, ``subscribe_pattern``, and bounds.

    The last four fields are Spark options a reader needs but the resolver does not:
    ``kafka_params`` are the ``kafka.``-prefixed options without the prefix, for the caller
    to merge into its client configuration.
    """

    subscribe: tuple[str, ...] = ()
    assign: tuple[TP, ...] = ()
    subscribe_pattern: str | None = None
    start: BoundSpec = BoundSpec(EARLIEST, option="startingOffsets")
    end: BoundSpec = BoundSpec(LATEST, option="endingOffsets")
    start_timestamp_strategy: Literal["latest", "error"] = "latest"
    notes: tuple[str, ...] = ()
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    kafka_params: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (
                ("subscribe", self.subscribe),
                ("assign", self.assign),
                ("subscribePattern", self.subscribe_pattern),
            )
            if value
        ]
        if len(given) != 1:
            which = "none was given" if not given else f"got {' and '.join(given)}"
            raise PlanError(
                f"exactly one of the options subscribe, subscribePattern, assign is required; {which}",
                option="subscribe",
            )
        end_option = self.end.option or "endingOffsets"
        for tp, bound in [(None, self.end.default), *self.end.overrides.items()]:
            if bound == EARLIEST:
                where = f" for {tp[0]}/{tp[1]}" if tp else ""
                raise PlanError(
                    f"{end_option}{where} can't be earliest (-2): a window ends at latest (-1), "
                    "an offset or a timestamp",
                    option=end_option,
                )
        keys: list[TP | None] = [None, *self.start.overrides, *self.end.overrides]
        for tp in dict.fromkeys(keys):
            start = self.start.default if tp is None else self.start.for_partition(*tp)
            end = self.end.default if tp is None else self.end.for_partition(*tp)
            _check_order(start, end, tp, self.start.option or "start", end_option)


def _check_order(
    start: Bound | None, end: Bound | None, tp: TP | None, start_option: str, end_option: str
) -> None:
    """Reject a reversed window when both sides are the same kind of bound."""
    where = f" on {tp[0]}/{tp[1]}" if tp else ""
    if isinstance(start, int) and isinstance(end, int) and 0 <= end < start:
        raise PlanError(
            f"{start_option} offset {start} is after {end_option} offset {end}{where}; "
            "a window [start, end) needs start <= end",
            option=start_option,
        )
    if isinstance(start, Timestamp) and isinstance(end, Timestamp) and end.ms < start.ms:
        raise PlanError(
            f"{end_option} {end.ms} is before {start_option} {start.ms}{where}; "
            "a window [start, end) needs start <= end",
            option=end_option,
        )
