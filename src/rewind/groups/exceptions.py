"""Errors of group offset resets: each one line, naming the group, option or partition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from rewind.errors import RewindError


class ResetError(RewindError):
    """Base of the reset errors raised above the Kafka layer."""


class ResetInputError(ResetError):
    """The options of a reset do not make one reset (none or two modes, no topics, bad value)."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        self.option = option
        super().__init__(message)


class TopicNotConsumed(ResetError):
    """A topic named for a reset that the group has no offsets for and no member reads."""

    def __init__(self, group: str, topic: str, consumed: Sequence[str]) -> None:
        self.group = group
        self.topic = topic
        shown = ", ".join(consumed[:10]) + (" ..." if len(consumed) > 10 else "") if consumed else "none"
        super().__init__(
            f"consumer group '{group}' does not consume topic '{topic}' (no committed offset, no member "
            f"assigned); the topics it consumes: {shown}"
        )


class TimeBeforeLogStart(ResetError):
    """A time reset reaches below the log start: records the group would re-read are gone.

    ``missing`` maps each partition to the offsets no longer in Kafka that may hold records
    at or after the time (an upper bound: their timestamps are gone with them).
    """

    def __init__(
        self, group: str, option: str, when: str, missing: Mapping[tuple[str, int], tuple[int, int]]
    ) -> None:
        self.group = group
        self.missing = dict(missing)
        total = sum(end - start for start, end in missing.values())
        (topic, partition), (start, end) = sorted(missing.items())[0]
        others = len(missing) - 1
        more = f" and {others} more partition{'s' if others != 1 else ''}" if others else ""
        super().__init__(
            f"{option} {when} is before the log start of {topic}/{partition} (offset {end}){more}: up to "
            f"{total:,} records the group would re-read are no longer in Kafka (offsets [{start}, {end}) of "
            f"{topic}/{partition}{more and ', ...'}); pass --allow-gaps to start at the log start anyway"
        )


class TimeAfterNewestRecord(ResetError):
    """A time reset after the newest record of every partition: it lands on the log end.

    Almost always a wrong year or zone, so it is refused; ``newest`` maps each partition to
    its newest record (offset, timestamp in ms). ``consequence`` says what the reset would do
    and ``instead`` what to use to mean it.
    """

    def __init__(
        self,
        option: str,
        when: str,
        newest: Mapping[tuple[str, int], tuple[int, int]],
        consequence: str,
        instead: str,
    ) -> None:
        self.newest = dict(newest)
        (topic, partition), (offset, ts) = max(newest.items(), key=lambda item: (item[1][1], item[0]))
        at = datetime.fromtimestamp(ts / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        others = len(newest) - 1
        of = f"{others + 1} partitions" if others else "its partition"
        super().__init__(
            f"{option} {when} is after the newest record of {of} ({at}, {topic}/{partition} offset "
            f"{offset:,}): {consequence}; a time after every record is usually a wrong year or time "
            f"zone; {instead}"
        )


class OffsetsMoved(ResetError):
    """The group's committed offsets changed between the plan and its execution."""

    def __init__(self, group: str, moved: Mapping[tuple[str, int], tuple[int | None, int | None]]) -> None:
        self.group = group
        self.moved = dict(moved)
        parts = [
            f"{t}/{p} planned from {'none' if was is None else was}, now {'none' if now is None else now}"
            for (t, p), (was, now) in sorted(moved.items())[:5]
        ]
        more = f" and {len(moved) - 5} more" if len(moved) > 5 else ""
        super().__init__(
            f"the committed offsets of consumer group '{group}' moved since the plan: "
            f"{'; '.join(parts)}{more}; plan the reset again"
        )


class LogStartMoved(ResetError):
    """Retention moved a partition's log start past a planned offset between plan and execution."""

    def __init__(self, group: str, moved: Mapping[tuple[str, int], tuple[int, int]]) -> None:
        self.group = group
        (topic, partition), (planned, low) = sorted(moved.items())[0]
        more = f" and {len(moved) - 1} more" if len(moved) > 1 else ""
        super().__init__(
            f"the log start of {topic}/{partition} moved to {low}, past the planned offset {planned}{more}; "
            f"plan the reset of consumer group '{group}' again"
        )
