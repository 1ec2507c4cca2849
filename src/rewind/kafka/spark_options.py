"""Spark's Kafka source options (``subscribe``, ``startingOffsets``...) parsed into a WindowRequest.

The same options Spark takes, with the same rules (JSON offsets name every partition of the
subscription); a bad value is a :class:`~rewind.errors.PlanError` naming the option and what
it expects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from rewind.core.windows import EARLIEST, LATEST, TP, Bound, BoundSpec, Timestamp, WindowRequest
from rewind.errors import PlanError

if TYPE_CHECKING:
    pass


_START_OFFSETS_HELP = (
    'expected "earliest", "latest" or JSON like {"topic":{"0":23,"1":-2}} (-2 earliest, -1 latest)'
)
_END_OFFSETS_HELP = 'expected "latest" or JSON like {"topic":{"0":23,"1":-1}} (-1 latest)'
_BY_TIMESTAMP_HELP = 'expected JSON like {"topic":{"0":1700000000000}} (milliseconds since the epoch)'
_TIMESTAMP_HELP = "expected milliseconds since the epoch, like 1700000000000"
_ASSIGN_HELP = 'expected JSON like {"topic":[0,1]}'


def _show(value: str, limit: int = 120) -> str:
    """The value on one line, shortened: it goes into a one-line error message."""
    text = str(value)
    flat = " ".join(text.split()) if any(c in text for c in "\r\n\t\v\f") else text
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _bad(option: str, value: str, why: str, allowed: str) -> PlanError:
    return PlanError(f"bad {option} '{_show(value)}': {why}; {allowed}", option=option)


class _Options:
    """Spark's options, looked up case-insensitively (as Spark's CaseInsensitiveMap does)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.values: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        for key, value in options.items():
            low = str(key).lower()
            text = value if isinstance(value, str) else str(value)
            if low in self.values and self.values[low] != text:
                raise PlanError(
                    f"option {key} is given twice with different values "
                    f"({self.keys[low]}='{_show(self.values[low])}', {key}='{_show(text)}')",
                    option=str(key),
                )
            self.values[low] = text
            self.keys[low] = str(key)

    def get(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def given(self, name: str) -> bool:
        return name.lower() in self.values


def _parse_json(option: str, raw: str, allowed: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        why = (
            f"not valid JSON ({exc.msg} at column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else "not valid JSON"
        )
        raise _bad(option, raw, why, allowed) from None


def _parse_int(option: str, raw: str, *, minimum: int, allowed: str) -> int:
    text = raw.strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise _bad(option, raw, "not an integer", allowed)
    number = int(text)
    if number < minimum:
        raise _bad(option, raw, f"must be >= {minimum}", allowed)
    return number


def _partition_key(option: str, raw: str, topic: str, key: object, allowed: str) -> int:
    if not isinstance(key, str) or not re.fullmatch(r"\d+", key.strip()):
        raise _bad(option, raw, f"partition {key!r} of topic {topic!r} is not a partition number", allowed)
    return int(key)


def _parse_partition_map(
    option: str, raw: str, allowed: str, *, kind: Literal["start", "end", "time"]
) -> dict[TP, Bound]:
    """``{"topic":{"0":value}}`` into per-partition bounds, validating every value."""
    data = _parse_json(option, raw, allowed)
    if not isinstance(data, dict):
        raise _bad(option, raw, "not a JSON object of topics", allowed)
    out: dict[TP, Bound] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise _bad(option, raw, f"topic {topic!r} must map partitions to values", allowed)
        for key, value in parts.items():
            partition = _partition_key(option, raw, topic, key, allowed)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(option, raw, f"{topic}/{partition}: {value!r} is not an integer", allowed)
            if kind == "time":
                if value < 0:
                    raise _bad(option, raw, f"{topic}/{partition}: timestamp {value} is negative", allowed)
                out[(topic, partition)] = Timestamp(value)
                continue
            if kind == "end" and value == EARLIEST:
                raise _bad(
                    option, raw, f"{topic}/{partition}: an ending offset can't be earliest (-2)", allowed
                )
            if value < EARLIEST:
                raise _bad(option, raw, f"{topic}/{partition}: offset {value} is negative", allowed)
            out[(topic, partition)] = value
    return out


def _parse_side(opts: _Options, side: Literal["starting", "ending"], notes: list[str]) -> BoundSpec:
    """One side of the window with Spark's precedence: timestamp > by-timestamp JSON > offsets."""
    ts_opt, by_opt, off_opt = f"{side}Timestamp", f"{side}OffsetsByTimestamp", f"{side}Offsets"
    chosen = next((o for o in (ts_opt, by_opt, off_opt) if opts.given(o)), None)
    for other in (ts_opt, by_opt, off_opt):
        if chosen and other != chosen and opts.given(other):
            notes.append(f"{other} is ignored: {chosen} takes precedence")
    if chosen == ts_opt:
        ts_raw = opts.get(ts_opt) or ""
        return BoundSpec(
            Timestamp(_parse_int(ts_opt, ts_raw, minimum=0, allowed=_TIMESTAMP_HELP)), option=ts_opt
        )
    if chosen == by_opt:
        by_raw = opts.get(by_opt) or ""
        return BoundSpec(
            None, _parse_partition_map(by_opt, by_raw, _BY_TIMESTAMP_HELP, kind="time"), option=by_opt
        )
    raw = opts.get(off_opt)
    if side == "starting":
        if raw is None or raw.strip().lower() == "earliest":
            return BoundSpec(EARLIEST, option=off_opt)
        if raw.strip().lower() == "latest":
            return BoundSpec(LATEST, option=off_opt)
        return BoundSpec(
            None, _parse_partition_map(off_opt, raw, _START_OFFSETS_HELP, kind="start"), option=off_opt
        )
    if raw is None or raw.strip().lower() == "latest":
        return BoundSpec(LATEST, option=off_opt)
    if raw.strip().lower() == "earliest":
        raise _bad(off_opt, raw, "a window can't end at earliest", _END_OFFSETS_HELP)
    return BoundSpec(None, _parse_partition_map(off_opt, raw, _END_OFFSETS_HELP, kind="end"), option=off_opt)


def _parse_subscription(opts: _Options) -> dict[str, Any]:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if opts.given(name)]
    if len(given) != 1:
        which = "none was given" if not given else f"got {' and '.join(given)}"
        raise PlanError(
            f"exactly one of the options subscribe, subscribePattern, assign is required; {which}",
            option="subscribe",
        )
    [name] = given
    raw = opts.get(name) or ""
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise _bad(
                name, raw, "no topic named", "expected comma-separated topic names, like orders,payments"
            )
        return {"subscribe": topics}
    if name == "subscribePattern":
        if not raw.strip():
            raise _bad(name, raw, "the pattern is empty", "expected a regular expression, like orders-.*")
        try:
            re.compile(raw.strip())
        except re.error as exc:
            raise _bad(
                name, raw, f"not a regular expression ({exc})", "expected a regular expression"
            ) from None
        return {"subscribe_pattern": raw.strip()}
    data = _parse_json(name, raw, _ASSIGN_HELP)
    if not isinstance(data, dict) or not data:
        raise _bad(name, raw, "no topic named", _ASSIGN_HELP)
    pairs: list[TP] = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not parts:
            raise _bad(name, raw, f"topic {topic!r} needs a non-empty list of partitions", _ASSIGN_HELP)
        for part in parts:
            if isinstance(part, bool) or not isinstance(part, int) or part < 0:
                raise _bad(
                    name,
                    raw,
                    f"partition {part!r} of topic {topic!r} is not a partition number",
                    _ASSIGN_HELP,
                )
            pairs.append((topic, part))
    return {"assign": tuple(sorted(set(pairs)))}


def parse_spark_options(options: Mapping[str, str]) -> WindowRequest:
    """A :class:`WindowRequest` from the options of Spark's Kafka source, with Spark's semantics.

    Keys are case-insensitive. Exactly one of ``subscribe``, ``subscribePattern``, ``assign``;
    ``startingOffsets`` (default ``earliest``), ``endingOffsets`` (default ``latest``),
    ``startingTimestamp``/``endingTimestamp`` and ``startingOffsetsByTimestamp``/
    ``endingOffsetsByTimestamp``, where a global timestamp wins over the JSON by timestamp,
    which wins over offsets; ``startingOffsetsByTimestampStrategy``, ``minPartitions``,
    ``maxRecordsPerPartition``, ``failOnDataLoss`` and ``kafka.*`` are carried for the reader.
    Unknown options are ignored, as Spark does. Every bad value is a one-line
    :class:`PlanError` naming the option, the value and what is allowed.
    """
    opts = _Options(options)
    notes: list[str] = []
    subscription = _parse_subscription(opts)
    start = _parse_side(opts, "starting", notes)
    end = _parse_side(opts, "ending", notes)

    strategy_raw = opts.get("startingOffsetsByTimestampStrategy")
    strategy: Literal["latest", "error"] = "latest"
    if strategy_raw is not None:
        value = strategy_raw.strip().lower()
        if value not in ("latest", "error"):
            raise _bad(
                "startingOffsetsByTimestampStrategy",
                strategy_raw,
                "unknown strategy",
                'expected "error" or "latest"',
            )
        strategy = "error" if value == "error" else "latest"

    def positive(name: str) -> int | None:
        raw = opts.get(name)
        return (
            None if raw is None else _parse_int(name, raw, minimum=1, allowed="expected a positive integer")
        )

    fail_raw = opts.get("failOnDataLoss")
    fail_on_data_loss = True
    if fail_raw is not None:
        if fail_raw.strip().lower() not in ("true", "false"):
            raise _bad("failOnDataLoss", fail_raw, "not a boolean", 'expected "true" or "false"')
        fail_on_data_loss = fail_raw.strip().lower() == "true"

    kafka_params = {
        opts.keys[k][len("kafka.") :]: v for k, v in opts.values.items() if k.startswith("kafka.")
    }
    return WindowRequest(
        **subscription,
        start=start,
        end=end,
        start_timestamp_strategy=strategy,
        notes=tuple(notes),
        min_partitions=positive("minPartitions"),
        max_records_per_partition=positive("maxRecordsPerPartition"),
        fail_on_data_loss=fail_on_data_loss,
        kafka_params=kafka_params,
    )
