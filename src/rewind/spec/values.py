"""Parsing and checking of the spec's values (times, offsets, bounds, sizes, Spark types).

Also the models' base class: unknown fields are an error, models are frozen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, TypeAlias, Union

from pydantic import (
    BaseModel,
    ConfigDict,
)

from rewind.core.columns import SOURCE_TIMESTAMP
from rewind.core.datatypes import SparkTypeError, parse_spark_type
from rewind.core.windows import EARLIEST, LATEST, Bound, BoundSpec, Timestamp
from rewind.secrets import mask
from rewind.spec.errors import _UNSET, _Bad, _Plain

Offsets: TypeAlias = dict[str, dict[int, int]]
"""Per-partition offsets: ``{topic: {partition: offset}}``; -2 earliest, -1 latest (Spark's)."""
KafkaBound: TypeAlias = Union[Literal["earliest", "latest"], datetime, Offsets]  # noqa: UP007
"""One side of a window once validated: a word, an aware UTC datetime, or offsets."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Integers below this (1973-03-03) are far more likely epoch seconds or offsets than epoch ms.
_MIN_EPOCH_MS = 100_000_000_000
_MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_LINEAGE_TIME = SOURCE_TIMESTAMP
_QUARANTINE_NAME = "rewind_quarantine"
_SLUG = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_FUNCTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_TRANSFORM_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_ICEBERG_PART = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
_ICEBERG_TABLE = re.compile(rf"{_ICEBERG_PART}(\.{_ICEBERG_PART})+")
_PG_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_EVENTS_VIEW = re.compile(r"\bevents\b", re.IGNORECASE)
_TO_WORDS = '"latest", an ISO-8601 time with a zone (2026-10-08T00:00:00Z)'
_BOUND_FORMS = (
    ", epoch milliseconds (1790812800000) or offsets per partition like "
    '{orders: {"0": 1200}} (-2 earliest, -1 latest)'
)
_FROM_HELP = f'expected "earliest", {_TO_WORDS}{_BOUND_FORMS}'
_TO_HELP = f"expected {_TO_WORDS}{_BOUND_FORMS}"


def _epoch_ms(value: int, raw: Any, allowed: str) -> datetime:
    if value < _MIN_EPOCH_MS:
        raise _Bad(
            "too small for epoch milliseconds",
            "epoch milliseconds have 13 digits (1790812800000 is 2026-10-01T00:00:00Z); "
            'for offsets write {topic: {"partition": offset}}',
            got=raw,
        )
    if value > _MAX_EPOCH_MS:
        raise _Bad("too large for epoch milliseconds (after year 9999)", allowed, got=raw)
    return _EPOCH + value * _MS


def _aware(value: datetime, raw: Any) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        example = value.isoformat(timespec="seconds")
        raise _Bad(
            "a time without a time zone",
            f"add Z or an offset, like {example}Z or {example}+02:00",
            got=raw,
        )
    utc = value.astimezone(UTC)
    if utc.microsecond % 1000:
        raise _Bad("finer than a millisecond", "Kafka timestamps are milliseconds: round the time", got=raw)
    if utc < _EPOCH:
        raise _Bad("before 1970-01-01T00:00:00Z", "Kafka timestamps start at the epoch", got=raw)
    return utc


def _to_ms(value: datetime) -> int:
    return (value - _EPOCH) // _MS


def _iso(value: datetime) -> str:
    """``2026-10-01T00:00:00Z``, with ``.123`` when the time has milliseconds."""
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    if utc.microsecond:
        text += f".{utc.microsecond // 1000:03d}"
    return text + "Z"


def _partition_number(key: Any, raw: Any, at: tuple[str | int, ...], allowed: str) -> int:
    if isinstance(key, bool) or not isinstance(key, int | str) or not re.fullmatch(r"\d+", str(key).strip()):
        raise _Bad("not a partition number", allowed, got=key, at=at)
    return int(str(key).strip())


def _parse_offsets(
    value: Any, kind: Literal["from", "to", "declared"], allowed: str
) -> dict[str, dict[int, int]]:
    """``{topic: {partition: offset}}`` from YAML or JSON, every value checked, sorted."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _Bad(f"not valid JSON ({exc.msg} at column {exc.colno})", allowed, got=value) from None
    if not isinstance(value, Mapping) or not value:
        raise _Bad("not a mapping of topics to partitions" if value else "empty", allowed, got=value)
    out: dict[str, dict[int, int]] = {}
    for topic, parts in value.items():
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
            raise _Bad("not a topic name", allowed, got=topic)
        if not isinstance(parts, Mapping) or not parts:
            raise _Bad("expected a mapping of partitions to offsets", allowed, got=parts, at=(topic,))
        per: dict[int, int] = {}
        for key, offset in parts.items():
            partition = _partition_number(key, value, (topic, str(key)), allowed)
            at = (topic, str(partition))
            if partition in per:
                raise _Bad("partition given twice", "name each partition once", got=key, at=at)
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise _Bad("not an offset", allowed, got=offset, at=at)
            if kind == "declared" and offset < 0:
                raise _Bad(
                    "a negative log start", "a declared log start is an offset >= 0", got=offset, at=at
                )
            if kind == "to" and offset == EARLIEST:
                raise _Bad(
                    "a window can't end at earliest (-2)",
                    "use an offset, or -1 for latest",
                    got=offset,
                    at=at,
                )
            if offset < EARLIEST:
                raise _Bad(
                    "a negative offset",
                    "use an offset >= 0, -2 for earliest or -1 for latest",
                    got=offset,
                    at=at,
                )
            per[partition] = offset
        out[topic] = dict(sorted(per.items()))
    return dict(sorted(out.items()))


def _parse_bound(value: Any, side: Literal["from", "to"]) -> KafkaBound:
    allowed = _FROM_HELP if side == "from" else _TO_HELP
    if isinstance(value, bool):
        raise _Bad("not a window bound", allowed, got=value)
    if isinstance(value, int):
        return _epoch_ms(value, value, allowed)
    if isinstance(value, datetime):
        return _aware(value, value)
    if isinstance(value, date):
        raise _Bad(
            "a date without a time and time zone",
            f"add a time and Z or an offset, like {value.isoformat()}T00:00:00Z",
            got=value,
        )
    if isinstance(value, Mapping):
        return _parse_offsets(value, side, allowed)
    if not isinstance(value, str):
        raise _Bad("not a window bound", allowed, got=value)
    text = value.strip()
    word = text.lower()
    if word == "earliest" and side == "to":
        raise _Bad("a window can't end at earliest", f"expected {_TO_WORDS}{_BOUND_FORMS}", got=value)
    if word in ("earliest", "latest"):
        return "earliest" if word == "earliest" else "latest"
    if text.startswith("{"):
        return _parse_offsets(text, side, allowed)
    if re.fullmatch(r"\d+", text):
        return _epoch_ms(int(text), value, allowed)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise _Bad("not a window bound", allowed, got=value) from None
    return _aware(parsed, value)


def _dump_bound(value: KafkaBound) -> str | dict[str, dict[str, int]]:
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, dict):
        return _dump_offsets(value)
    return value


def _dump_offsets(value: Offsets) -> dict[str, dict[str, int]]:
    return {t: {str(p): o for p, o in parts.items()} for t, parts in value.items()}


def _bound_spec(value: KafkaBound, option: str) -> BoundSpec:
    if value == "earliest":
        return BoundSpec(EARLIEST, option=option)
    if value == "latest":
        return BoundSpec(LATEST, option=option)
    if isinstance(value, datetime):
        return BoundSpec(Timestamp(_to_ms(value)), option=option)
    assert isinstance(value, dict)
    overrides: dict[tuple[str, int], Bound] = {
        (t, p): o for t, parts in value.items() for p, o in parts.items()
    }
    return BoundSpec(None, overrides, option=option)


_TYPES_HELP = (
    "expected a Spark type: string, long, int, double, boolean, timestamp, date, binary, "
    "decimal(p,s), array<T>, map<K,V> or struct<name:T,...>"
)


def _spark_type(text: Any, at: tuple[str | int, ...]) -> str:
    """Check a Spark DDL type with the one grammar (:mod:`rewind.core.datatypes`); returns it
    canonical: keywords lower case, no spaces."""
    if not isinstance(text, str):
        raise _Bad("not a type name", _TYPES_HELP, got=text, at=at)
    try:
        return parse_spark_type(text).ddl()
    except SparkTypeError as exc:
        raise _Bad(str(exc), _TYPES_HELP, got=text, at=at) from None


def _schema(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise _Bad(
            "expected a non-empty mapping of column to type",
            "like {order_id: string, total: double}",
            got=value,
        )
    out: dict[str, str] = {}
    for column, kind in value.items():
        if not isinstance(column, str) or not column.strip():
            raise _Bad("not a column name", "column names are non-empty text", got=column)
        out[column] = _spark_type(kind, (column,))
    return out


# The JSON decoder's types (rewind.translate.decode), with their aliases → canonical name.
_JSON_TYPES = {
    **{t: t for t in ("string", "int", "long", "float", "double", "boolean", "timestamp", "date", "json")},
    **{"str": "string", "integer": "int", "int32": "int", "bigint": "long", "int64": "long"},
    **{"float32": "float", "float64": "double", "bool": "boolean", "any": "json", "object": "json"},
}
# Column prefixes of Rewind's own columns (rewind.core.columns.RESERVED_PREFIXES).
_RESERVED_PREFIXES = ("_src_", "_rewind_")


def _json_schema(value: Any) -> dict[str, str] | None:
    """``decode.schema``: field → a type of the JSON decoder, canonical."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise _Bad("expected a non-empty mapping of field to type", "like {order_id: string}", got=value)
    out: dict[str, str] = {}
    for name, kind in value.items():
        if not isinstance(name, str) or not name.strip():
            raise _Bad("not a field name", "field names are non-empty text", got=name)
        if name.startswith(_RESERVED_PREFIXES):
            raise _Bad(
                f"the prefixes {', '.join(_RESERVED_PREFIXES)} are reserved for Rewind's columns",
                "decode such fields with format raw and parse them in the translate",
                got=name,
                at=(name,),
            )
        canonical = _JSON_TYPES.get(kind.strip().lower()) if isinstance(kind, str) else None
        if canonical is None:
            allowed = ", ".join(dict.fromkeys(_JSON_TYPES.values()))
            raise _Bad("not a JSON decode type", f"use one of {allowed}", got=kind, at=(name,))
        out[name] = canonical
    return out


def _size(value: Any) -> Any:
    """``10GiB``, ``500 MB``, ``1.5TB`` → bytes; anything else goes on to the int check."""
    if not isinstance(value, str):
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)b?\s*", value, re.IGNORECASE)
    if not match:
        raise _Bad("not a size", "expected bytes, or a size like 500MB or 10GiB", got=value)
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    power = " kmgtp".index(unit.lower() or " ")
    return int(float(number) * base**power)


def _exactly_one(model: BaseModel, kinds: tuple[str, ...], what: str) -> str:
    given = [k for k in kinds if getattr(model, k) is not None]
    if len(given) != 1:
        raise _Bad(
            f"no {what} given" if not given else f"more than one {what} given",
            f"give exactly one of: {', '.join(kinds)}",
            got=_UNSET if not given else _Plain(", ".join(given)),
        )
    return given[0]


def _fill(model: BaseModel, name: str, value: Any) -> None:
    """Set a derived default on a frozen model, once, during its validation."""
    object.__setattr__(model, name, value)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # A spec may hold a URL with a password or a secret config: never let a repr leak it.
        for name, value in super().__repr_args__():
            yield name, value if isinstance(value, BaseModel) else mask(value, name or "")


def _check_window_order(start: datetime | None, end: datetime | None, what: str) -> None:
    """A sink's ``window_from`` must come before its ``window_to`` (both sinks that take them)."""
    if start and end and start >= end:
        raise _Bad(
            "window_from is not before window_to",
            f"the {what} window is [window_from, window_to)",
            got=_Plain(f"{_iso(start)} .. {_iso(end)}"),
        )


def _check_column(value: str | None, what: str = "a column name") -> str | None:
    if value is not None and not value.strip():
        raise _Bad("empty", f"give {what} or remove the field", got=value)
    return value


def _verify_time(value: Any, side: str) -> datetime | None:
    """``scope.from`` / ``scope.to``: an aware ISO time or epoch milliseconds, like the window."""
    if value is None:
        return None
    allowed = "expected an ISO-8601 time with a zone (2026-10-01T00:00:00Z) or epoch milliseconds"
    if isinstance(value, bool):
        raise _Bad(f"not a time for {side}", allowed, got=value)
    if isinstance(value, int) or (isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value)):
        return _epoch_ms(int(value), value, allowed)
    if isinstance(value, datetime):
        return _aware(value, value)
    if isinstance(value, str):
        try:
            return _aware(datetime.fromisoformat(value.strip()), value)
        except ValueError:
            pass
    raise _Bad(f"not a time for {side}", allowed, got=value)
