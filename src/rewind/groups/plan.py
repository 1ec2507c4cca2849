"""A reset of a consumer group's offsets as data: what each partition moves from and to.

:class:`ResetPlan` is frozen and JSON-serializable; ``rewind groups reset`` prints it on a dry
run and executes the very same plan with ``--execute``. The pure parts live here (the target
offset of one partition, clamping, parsing ``--topic`` and the reset options) so they can be
tested without a broker; :mod:`rewind.groups.service` fills a plan from the broker.

Clamping follows kafka-consumer-groups: a new offset below the log start becomes the log
start, one above the end of the log becomes the end, each with a note. Counts of records
re-read or skipped are offset differences: transaction markers and compacted records
occupy offsets too, so on such topics they are an upper bound.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from rewind.core.windows import TP
from rewind.groups.exceptions import ResetInputError

Mode = Literal["to-datetime", "to-offset", "shift-by", "to-earliest", "to-latest", "from-file", "offsets"]
MODES: tuple[Mode, ...] = (
    "to-datetime",
    "to-offset",
    "shift-by",
    "to-earliest",
    "to-latest",
    "from-file",
    "offsets",
)

_TOPIC_ARG = re.compile(r"^(?P<topic>[^:]+)(?::(?P<parts>\d+(?:,\d+)*))?$")


@dataclass(frozen=True)
class PartitionReset:
    """One partition of a reset.

    ``current`` is the committed offset when planned (``None``: nothing committed);
    ``requested`` the offset asked for before clamping (the checked time lookup's answer for
    ``to-datetime``); ``new`` the offset to commit, inside ``[low, high]``. ``missing`` is
    the number of offsets below the log start that the reset would have re-read.
    """

    topic: str
    partition: int
    current: int | None
    requested: int
    new: int
    low: int
    high: int
    method: str = "offset"
    missing: int = 0
    notes: tuple[str, ...] = ()

    @property
    def reread(self) -> int | None:
        """Records the group reads again (``None`` when it has no committed offset)."""
        return None if self.current is None else max(0, self.current - self.new)

    @property
    def skipped(self) -> int | None:
        """Records the group never reads (``None`` when it has no committed offset)."""
        return None if self.current is None else max(0, self.new - self.current)

    @property
    def lag_after(self) -> int:
        return self.high - self.new

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "current": self.current,
            "requested": self.requested,
            "new": self.new,
            "low": self.low,
            "high": self.high,
            "method": self.method,
            "missing": self.missing,
            "reread": self.reread,
            "skipped": self.skipped,
            "lag_after": self.lag_after,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PartitionReset:
        return cls(
            topic=str(d["topic"]),
            partition=int(d["partition"]),
            current=None if d.get("current") is None else int(d["current"]),
            requested=int(d["requested"]),
            new=int(d["new"]),
            low=int(d["low"]),
            high=int(d["high"]),
            method=str(d.get("method", "offset")),
            missing=int(d.get("missing", 0)),
            notes=tuple(d.get("notes", ())),
        )


@dataclass(frozen=True)
class ResetPlan:
    """A whole reset: the group, how it was asked for, and one row per partition."""

    group: str
    mode: Mode
    args: Mapping[str, Any]
    partitions: tuple[PartitionReset, ...]
    group_state: str = ""
    allow_gaps: bool = False
    notes: tuple[str, ...] = ()
    planned_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def offsets(self) -> dict[TP, int]:
        return {(p.topic, p.partition): p.new for p in self.partitions}

    @property
    def current(self) -> dict[TP, int | None]:
        return {(p.topic, p.partition): p.current for p in self.partitions}

    @property
    def reread(self) -> int:
        return sum(p.reread or 0 for p in self.partitions)

    @property
    def skipped(self) -> int:
        return sum(p.skipped or 0 for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "mode": self.mode,
            "args": dict(self.args),
            "group_state": self.group_state,
            "allow_gaps": self.allow_gaps,
            "planned_at": self.planned_at,
            "partitions": [p.to_dict() for p in self.partitions],
            "reread": self.reread,
            "skipped": self.skipped,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResetPlan:
        mode = d["mode"]
        if mode not in MODES:
            raise ResetInputError(f"reset plan mode {mode!r} is not one of {', '.join(MODES)}")
        return cls(
            group=str(d["group"]),
            mode=mode,
            args=dict(d.get("args", {})),
            partitions=tuple(PartitionReset.from_dict(p) for p in d["partitions"]),
            group_state=str(d.get("group_state", "")),
            allow_gaps=bool(d.get("allow_gaps", False)),
            notes=tuple(d.get("notes", ())),
            planned_at=str(d.get("planned_at", "")),
        )


def clamp(requested: int, low: int, high: int, name: str) -> tuple[int, str | None]:
    """``requested`` moved into ``[low, high]``, with kafka-consumer-groups' note when moved."""
    if requested > high:
        return high, f"{name}: new offset {requested} is after the end of the log ({high}); set to {high}"
    if requested < low:
        gone = low - requested
        return low, (
            f"{name}: new offset {requested} is before the log start ({low}); set to {low} "
            f"({gone:,} records below it are no longer in Kafka)"
        )
    return requested, None


def target_offset(
    mode: Mode, value: int | None, current: int | None, low: int, high: int, name: str = "partition"
) -> tuple[int, int, str | None]:
    """``(requested, new, note)`` of one partition for an offset-based mode.

    ``to-offset`` and ``offsets``/``from-file`` take ``value``; ``shift-by`` adds ``value`` to
    the committed offset (an error where there is none, as in Kafka); ``to-earliest`` and
    ``to-latest`` are the log start and end. ``new`` is always inside ``[low, high]``.
    """
    if low > high:
        raise ValueError(f"{name}: log start {low} is after the end {high}")
    if mode in ("to-offset", "offsets", "from-file"):
        if value is None:
            raise ValueError(f"{mode} needs an offset")
        requested = value
    elif mode == "shift-by":
        if value is None:
            raise ValueError("shift-by needs a shift")
        if current is None:
            raise ResetInputError(
                f"--shift-by cannot shift {name}: the group has no committed offset there; "
                "use --to-offset, --to-datetime, --to-earliest or --to-latest",
                option="--shift-by",
            )
        requested = current + value
    elif mode == "to-earliest":
        requested = low
    elif mode == "to-latest":
        requested = high
    else:
        raise ValueError(f"target_offset does not handle {mode}")
    new, note = clamp(requested, low, high, name)
    return requested, new, note


def parse_topic_args(args: Iterable[str]) -> dict[str, tuple[int, ...] | None]:
    """``--topic`` values (``T`` or ``T:0,2``, repeatable) as topic → partitions (None: all)."""
    out: dict[str, tuple[int, ...] | None] = {}
    for raw in args:
        text = raw.strip()
        m = _TOPIC_ARG.match(text)
        if not m or not m.group("topic").strip():
            raise ResetInputError(
                f"--topic {raw!r} is not a topic: expected TOPIC or TOPIC:0,2 (partitions)", option="--topic"
            )
        topic = m.group("topic")
        parts = tuple(sorted({int(p) for p in m.group("parts").split(",")})) if m.group("parts") else None
        if topic in out:
            before = out[topic]
            out[topic] = None if before is None or parts is None else tuple(sorted({*before, *parts}))
        else:
            out[topic] = parts
    return out


def parse_when(value: datetime | int | str, option: str = "--to-datetime") -> datetime:
    """A reset time: an aware datetime, epoch milliseconds, or ISO-8601 text with a zone."""
    if isinstance(value, bool):
        raise ResetInputError(f"{option} {value!r} is not a time", option=option)
    if isinstance(value, int):
        if value < 0:
            raise ResetInputError(f"{option} {value} is before 1970", option=option)
        return datetime.fromtimestamp(value / 1000, UTC)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+", text):
            return parse_when(int(text), option)
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ResetInputError(
                f"{option} {value!r} is not a time: expected ISO-8601 with a zone, "
                "like 2026-10-01T00:00:00Z, or epoch milliseconds",
                option=option,
            ) from None
        value = parsed
    if value.tzinfo is None:
        raise ResetInputError(
            f"{option} {value.isoformat()} has no time zone: add one, like {value.isoformat()}Z",
            option=option,
        )
    return value.astimezone(UTC)


def choose_mode(
    *,
    to_datetime: Any = None,
    to_offset: int | None = None,
    shift_by: int | None = None,
    to_earliest: bool = False,
    to_latest: bool = False,
    from_file: Any = None,
    offsets: Mapping[TP, int] | None = None,
) -> Mode:
    """The one reset mode given; a one-line error for none or several."""
    candidates: tuple[tuple[Mode, str, bool], ...] = (
        ("to-datetime", "--to-datetime", to_datetime is not None),
        ("to-offset", "--to-offset", to_offset is not None),
        ("shift-by", "--shift-by", shift_by is not None),
        ("to-earliest", "--to-earliest", to_earliest),
        ("to-latest", "--to-latest", to_latest),
        ("from-file", "--from-file", from_file is not None),
        ("offsets", "offsets", offsets is not None),
    )
    given = [(mode, option) for mode, option, present in candidates if present]
    if len(given) != 1:
        which = "none was given" if not given else "got " + " and ".join(o for _m, o in given)
        raise ResetInputError(
            "a reset needs exactly one of --to-datetime, --to-offset, --shift-by, --to-earliest, "
            f"--to-latest, --from-file; {which}",
            option="--to-datetime",
        )
    return given[0][0]
