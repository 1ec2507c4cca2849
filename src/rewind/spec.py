"""The declarative job spec: what the user asked for, from a YAML file or from Python.

A spec names a source window, how to decode it, how to translate it, where the output goes
and the limits of the run::

    name: repair-order-totals
    source:
      kafka: {topics: [orders], from: "2026-10-01T00:00:00Z", to: "2026-10-08T00:00:00Z"}
    decode: json
    translate:
      function: my_pkg.orders:to_order_total
      version: "2"
    key: [order_id]
    sink:
      iceberg: {table: analytics.order_totals}
    guards:
      max_records_per_second: 50000
      max_records: 50000000

:func:`load_spec` reads a file, :func:`parse_spec` a mapping; both return a frozen
:class:`JobSpec` or raise a one-line :class:`~rewind.errors.SpecError`::

    spec.yaml: translate.fucntion: unknown field; allowed: function, sql, version, name, output_schema, fold
    spec.yaml: source.kafka.from: a time without a time zone (got '2026-10-01T00:00:00'); add Z ...

From Python, ``JobSpec(...)`` and ``JobSpec.model_validate(data)`` validate the same way and
raise pydantic's ``ValidationError`` (fields keep their Python names: ``from_`` for ``from``).

What the spec checks and what it leaves to the planner. The spec validates shapes and
everything that can be known without a broker or an import: names, window order, formats,
exactly-one choices, unknown fields (anywhere), secrets out of error messages. It does not
import the translate function, reach the broker or the catalog: those are plan-time gates.

Derived defaults are filled in at validation and are part of the spec from then on
(``translate.name``, ``decode.null_value``, ``sink.iceberg.window_column`` for ``replace-window``,
``quarantine.table``),
so :meth:`JobSpec.to_yaml` prints them and :meth:`JobSpec.fingerprint` does not depend on
whether they were written out.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeAlias, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from rewind.core.columns import SOURCE_TIMESTAMP
from rewind.core.windows import EARLIEST, LATEST, Bound, BoundSpec, Timestamp, WindowRequest
from rewind.errors import SpecError
from rewind.secrets import mask

__all__ = [
    "Assertion",
    "Buckets",
    "Decode",
    "Guards",
    "IcebergSink",
    "JobSpec",
    "KafkaBound",
    "KafkaSink",
    "KafkaSource",
    "PostgresReference",
    "PostgresSink",
    "Quarantine",
    "Reference",
    "RunSettings",
    "Scope",
    "Sink",
    "Source",
    "SpecError",
    "SqlReference",
    "Tolerance",
    "Translate",
    "Verify",
    "load_spec",
    "parse_spec",
    "spec_reference_markdown",
]

Offsets: TypeAlias = dict[str, dict[int, int]]
"""Per-partition offsets: ``{topic: {partition: offset}}``; -2 earliest, -1 latest (Spark's)."""
KafkaBound: TypeAlias = Union[Literal["earliest", "latest"], datetime, Offsets]  # noqa: UP007
"""One side of a window once validated: a word, an aware UTC datetime, or offsets."""

EXAMPLE_SPEC = """\
name: repair-order-totals
description: Recompute order totals after the rounding bug of October
source:
  kafka: {topics: [orders], from: "2026-10-01T00:00:00Z", to: "2026-10-08T00:00:00Z"}
decode: json                     # or avro (Confluent wire format), or raw
translate:
  function: my_pkg.orders:to_order_total    # or sql: "SELECT ... FROM events"
  version: "2"
key: [order_id]                  # business key of the output
sink:
  iceberg: {table: analytics.order_totals}
guards:
  max_records_per_second: 50000
  max_records: 50000000
"""

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


# -- one-line errors ------------------------------------------------------------------------

_UNSET: Any = object()


class _Plain(str):
    """Text shown as is in a message (not quoted like a user's string)."""


class _Bad(ValueError):
    """A validation failure carrying the parts of a one-line message.

    ``at`` extends the location pydantic reports (a validator of ``source.kafka`` can point
    at ``source.kafka.to.orders.1``).
    """

    def __init__(
        self, what: str, allowed: str = "", *, got: Any = _UNSET, at: tuple[str | int, ...] = ()
    ) -> None:
        self.what = what
        self.allowed = allowed
        self.got = got
        self.at = at
        super().__init__(_compose(what, got, allowed))


def _compose(what: str, got: Any, allowed: str, key: str = "") -> str:
    text = what
    if got is not _UNSET:
        text += f" (got {_show(got, key)})"
    if allowed:
        text += f"; {allowed}"
    return text


def _show(value: Any, key: str = "", limit: int = 120) -> str:
    """A value on one line, shortened and with secrets masked: it goes into an error message."""
    value = value if isinstance(value, _Plain) else mask(value, key)
    if isinstance(value, datetime | date):
        text = value.isoformat()
    elif isinstance(value, _Plain):
        text = str(value)
    elif isinstance(value, str):
        text = f"'{value}'"
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, Mapping | list | tuple):
        text = json.dumps(value, default=str, ensure_ascii=False, separators=(", ", ": "))
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _alias(name: str, info: FieldInfo) -> str:
    return info.validation_alias if isinstance(info.validation_alias, str) else (info.alias or name)


def _allowed_fields(model: type[BaseModel]) -> str:
    return ", ".join(_alias(n, f) for n, f in model.model_fields.items())


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that validates the value at ``loc`` (by aliases), or None if not a model."""
    current: Any = JobSpec
    parts = list(loc)
    while parts:
        part = parts.pop(0)
        if isinstance(current, type) and issubclass(current, BaseModel):
            found = next(
                (f for n, f in current.model_fields.items() if part in (n, _alias(n, f))),
                None,
            )
            if found is None:
                return None
            current = _unwrap(found.annotation)
        elif get_origin(current) in (dict, list):
            current = _unwrap(get_args(current)[-1])
        else:
            return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


_TYPE_ERRORS: dict[str, tuple[str, str]] = {
    "int_type": ("not an integer", "expected a whole number"),
    "int_parsing": ("not an integer", "expected a whole number"),
    "int_from_float": ("not a whole number", "expected a whole number"),
    "float_type": ("not a number", "expected a number"),
    "float_parsing": ("not a number", "expected a number"),
    "finite_number": ("not a finite number", "expected a number"),
    "bool_type": ("not a boolean", "expected true or false"),
    "bool_parsing": ("not a boolean", "expected true or false"),
    "string_type": ("not a string", "expected text (quote it in YAML)"),
    "list_type": ("not a list", "expected a list, like [a, b]"),
    "dict_type": ("not a mapping", "expected a mapping, like {a: b}"),
}


def _describe(err: Mapping[str, Any]) -> tuple[tuple[str | int, ...], str]:
    """The location and the message (without location) of one pydantic error."""
    loc: tuple[str | int, ...] = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input", _UNSET)
    key = str(loc[-1]) if loc else ""
    ctx = err.get("ctx") or {}
    error = ctx.get("error")
    if isinstance(error, _Bad):
        loc = loc + error.at
        key = str(loc[-1]) if loc else ""
        return loc, _compose(error.what, error.got, error.allowed, key)
    if kind == "missing":
        return loc, "required"
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = f"; allowed: {_allowed_fields(parent)}" if parent else ""
        return loc, f"unknown field{allowed}"
    if kind in ("model_type", "model_attributes_type"):
        model = _model_at(loc)
        allowed = f"expected a mapping with fields: {_allowed_fields(model)}" if model else ""
        return loc, _compose("not a mapping", value, allowed, key)
    if kind == "literal_error":
        words = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return loc, _compose("not allowed", value, f"allowed: {', '.join(words)}", key)
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        sign = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
        limit = next(iter(ctx.values()), "")
        return loc, _compose("out of range", value, f"must be {sign[kind]} {limit}", key)
    if kind in _TYPE_ERRORS:
        what, allowed = _TYPE_ERRORS[kind]
        return loc, _compose(what, value, allowed, key)
    message = str(err.get("msg", kind)).removeprefix("Value error, ")
    return loc, _compose(message[:1].lower() + message[1:], value, "", key)


def _spec_error(exc: ValidationError, source_name: str) -> SpecError:
    # An unknown field first: it is often a typo that also makes a required field "missing".
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    loc, text = _describe(errors[0])
    path = ".".join(str(p) for p in loc)
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    where = f"{path}: " if path else ""
    return SpecError(" ".join(f"{source_name}: {where}{text}{more}".split()), field=path or None)


# -- values ---------------------------------------------------------------------------------


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


_SIMPLE_TYPES = frozenset(
    {
        *("string", "binary", "boolean", "date", "timestamp", "timestamp_ntz", "timestamp_ltz"),
        *("tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"),
        *("float", "real", "double"),
    }
)
_TYPES_HELP = (
    "expected a Spark type: string, long, int, double, boolean, timestamp, date, binary, "
    "decimal(p,s), array<T>, map<K,V> or struct<name:T,...>"
)


def _spark_type(text: Any, at: tuple[str | int, ...]) -> str:
    """Check a Spark DDL type (``long``, ``decimal(10,2)``, ``array<struct<a:int>>``...).

    Returns it canonical: keywords lower case, no spaces.
    """
    if not isinstance(text, str):
        raise _Bad("not a type name", _TYPES_HELP, got=text, at=at)
    tokens = re.findall(r"`[^`]*`|[A-Za-z_][A-Za-z0-9_]*|\d+|\S", text)
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens) or (expected is not None and tokens[pos] != expected):
            raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)
        pos += 1
        return tokens[pos - 1]

    def number() -> int:
        token = take()
        if not token.isdigit():
            raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)
        return int(token)

    def parse() -> str:
        word = take().lower()
        if word in _SIMPLE_TYPES:
            return word
        if word in ("decimal", "dec", "numeric"):
            if pos < len(tokens) and tokens[pos] == "(":
                take("(")
                precision, scale = number(), 0
                if tokens[pos : pos + 1] == [","]:
                    take(",")
                    scale = number()
                take(")")
                if not 1 <= precision <= 38 or scale > precision:
                    raise _Bad(
                        "a decimal needs 1 <= precision <= 38 and scale <= precision",
                        _TYPES_HELP,
                        got=text,
                        at=at,
                    )
                return f"decimal({precision},{scale})"
            return "decimal"
        if word in ("char", "varchar"):
            take("(")
            length = number()
            take(")")
            return f"{word}({length})"
        if word == "array":
            take("<")
            inner = parse()
            take(">")
            return f"array<{inner}>"
        if word == "map":
            take("<")
            key = parse()
            take(",")
            val = parse()
            take(">")
            return f"map<{key},{val}>"
        if word == "struct":
            take("<")
            fields = []
            while True:
                name = take()
                if not (name.startswith("`") or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
                    raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)
                if tokens[pos : pos + 1] == [":"]:
                    take(":")
                fields.append(f"{name}:{parse()}")
                if take() == ">":
                    break
                if tokens[pos - 1] != ",":
                    raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)
            return f"struct<{','.join(fields)}>"
        raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)

    result = parse()
    if pos != len(tokens):
        raise _Bad("not a Spark type", _TYPES_HELP, got=text, at=at)
    return result


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


# -- the models -----------------------------------------------------------------------------


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


class KafkaSource(_Model):
    """Records of Kafka topics in the window ``[from, to)``.

    Times are resolved per partition to *the first record whose timestamp is >= the time*, so
    ``from: T1, to: T2`` reads exactly the records stamped in ``[T1, T2)`` when timestamps
    grow along each partition (see ``rewind.kafka.offsets`` for the policies).
    """

    topics: list[str] = Field(
        description="Topics to read, each listed once. Every partition of each topic is read.",
    )
    from_: KafkaBound = Field(
        default="earliest",
        validation_alias="from",
        serialization_alias="from",
        description=(
            'Start of the window, included: "earliest" (the first record still in Kafka), '
            '"latest", an ISO-8601 time with a zone (`2026-10-01T00:00:00Z`; a time without one '
            "is an error), epoch milliseconds (`1790812800000`), or offsets per partition "
            '(`{orders: {"0": 1200, "1": 1300}}`, Spark\'s JSON shape, as a mapping or a JSON '
            "string; -2 earliest, -1 latest). An offsets mapping names every partition of every "
            "topic, as in Spark."
        ),
        json_schema_extra={"doc_type": "window bound"},
    )
    to: KafkaBound = Field(
        default="latest",
        description=(
            'End of the window, excluded: "latest" (the high watermark at planning time), a '
            "time, epoch milliseconds or offsets per partition as for `from` (not earliest). "
            "Two times need `to` after `from`; two offsets mappings need each partition's "
            "`to` >= its `from`."
        ),
        json_schema_extra={"doc_type": "window bound"},
    )
    declared_log_start: dict[str, dict[int, int]] | None = Field(
        default=None,
        description=(
            'Offsets per partition (`{orders: {"0": 500}}`) below which records count as no '
            "longer in Kafka, as if retention had removed them; used when above the broker's "
            "log start. Simulates retention on brokers that cannot expire records."
        ),
        json_schema_extra={"doc_type": "offsets per partition"},
    )

    @field_validator("topics")
    @classmethod
    def _topics(cls, topics: list[str]) -> list[str]:
        allowed = "a topic name is 1-249 of letters, digits, '.', '_' and '-'"
        if not topics:
            raise _Bad("no topic", "list at least one topic, like [orders]", got=topics)
        for i, topic in enumerate(topics):
            if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
                raise _Bad("not a topic name", allowed, got=topic, at=(i,))
            if topic in topics[:i]:
                raise _Bad(f"topic '{topic}' is listed twice", "list each topic once", got=topics)
        return topics

    @field_validator("from_", mode="plain")
    @classmethod
    def _from(cls, value: Any) -> KafkaBound:
        return _parse_bound(value, "from")

    @field_validator("to", mode="plain")
    @classmethod
    def _to(cls, value: Any) -> KafkaBound:
        return _parse_bound(value, "to")

    @field_validator("declared_log_start", mode="plain")
    @classmethod
    def _declared(cls, value: Any) -> Offsets | None:
        allowed = 'expected offsets per partition, like {orders: {"0": 500}}'
        return None if value is None else _parse_offsets(value, "declared", allowed)

    @field_serializer("from_", "to")
    def _dump_bounds(self, value: KafkaBound) -> str | dict[str, dict[str, int]]:
        return _dump_bound(value)

    @field_serializer("declared_log_start")
    def _dump_declared(self, value: Offsets | None) -> dict[str, dict[str, int]] | None:
        return None if value is None else _dump_offsets(value)

    @model_validator(mode="after")
    def _window(self) -> KafkaSource:
        topics = set(self.topics)
        for side, bound in (("from", self.from_), ("to", self.to)):
            if not isinstance(bound, dict):
                continue
            for topic in bound:
                if topic not in topics:
                    raise _Bad(
                        "topic is not in topics",
                        f"offsets name only topics of topics ({', '.join(self.topics)})",
                        got=topic,
                        at=(side, topic),
                    )
            for topic in self.topics:
                if topic not in bound:
                    raise _Bad(
                        f"names no partition of topic '{topic}'",
                        "as in Spark, offsets name every partition of every topic (-2 earliest, -1 latest)",
                        got=_dump_offsets(bound),
                        at=(side,),
                    )
        if isinstance(self.from_, datetime) and isinstance(self.to, datetime) and self.to <= self.from_:
            relation = "is before" if self.to < self.from_ else "is equal to"
            raise _Bad(
                f"{relation} from",
                "the window is [from, to): to must be after from",
                got=_Plain(f"{_iso(self.to)}, from is {_iso(self.from_)}"),
                at=("to",),
            )
        if isinstance(self.from_, dict) and isinstance(self.to, dict):
            starts = {(t, p): o for t, parts in self.from_.items() for p, o in parts.items()}
            ends = {(t, p): o for t, parts in self.to.items() for p, o in parts.items()}
            for topic, partition in sorted(starts.keys() ^ ends.keys()):
                side, other = ("to", "from") if (topic, partition) in starts else ("from", "to")
                raise _Bad(
                    f"names no partition {partition} of {topic}, which {other} names",
                    "both sides name the same partitions (-2 earliest, -1 latest)",
                    got=_dump_offsets(getattr(self, "from_" if side == "from" else "to")),
                    at=(side,),
                )
            for (topic, partition), start in sorted(starts.items()):
                end = ends[(topic, partition)]
                if 0 <= end < start:
                    raise _Bad(
                        f"is before from's offset {start}",
                        "the window is [from, to): each partition's to must be >= its from",
                        got=end,
                        at=("to", topic, str(partition)),
                    )
        for topic in self.declared_log_start or {}:
            if topic not in topics:
                raise _Bad(
                    "topic is not in topics",
                    f"declare log starts only of topics ({', '.join(self.topics)})",
                    got=topic,
                    at=("declared_log_start", topic),
                )
        return self

    def window_request(self) -> WindowRequest:
        """The exact :class:`~rewind.kafka.offsets.WindowRequest` of this window.

        Times become :class:`Timestamp` bounds, offsets per-partition overrides (no default,
        so every partition must be named, as in Spark), words ``EARLIEST``/``LATEST``. The
        bounds' ``option`` names the spec field (``source.kafka.from``), so the resolver's
        errors point at the spec.
        """
        return WindowRequest(
            subscribe=tuple(self.topics),
            start=_bound_spec(self.from_, "source.kafka.from"),
            end=_bound_spec(self.to, "source.kafka.to"),
        )

    def declared_start(self) -> dict[tuple[str, int], int]:
        """``declared_log_start`` keyed by (topic, partition), for ``offsets.resolve``."""
        return {(t, p): o for t, parts in (self.declared_log_start or {}).items() for p, o in parts.items()}


class HistorySource(KafkaSource):
    """Records of Kafka topics in ``[from, to)``, read across the lake archive and the log.

    Offsets below the log's start (or ``declared_log_start``) come from the archive written
    by ``rewind archive``, the rest from Kafka; the overlap is read once. Offsets missing from
    both are classified: ``skipped`` (the broker itself skipped them while the archive read the
    partition contiguously: transaction markers, compaction) or ``lost`` (below the log start
    and never archived). Lost ranges refuse the plan unless ``allow_gaps``.
    """

    archive: str = Field(description="The archive table (`namespace.table`) written by `rewind archive`.")
    allow_gaps: bool = Field(
        default=False,
        description="Run even when offsets were lost (never archived, gone from Kafka); they are recorded.",
    )


class Source(_Model):
    """Where the records come from: exactly one kind of source."""

    KINDS: ClassVar[tuple[str, ...]] = ("kafka", "history")

    kafka: KafkaSource | None = Field(default=None, description="Read a window of Kafka topics.")
    history: HistorySource | None = Field(
        default=None, description="Read a window across the lake archive and the Kafka log."
    )

    @property
    def window(self) -> KafkaSource:
        """The window of either kind (a history source is a Kafka window plus an archive)."""
        found = self.kafka or self.history
        assert found is not None
        return found

    @model_validator(mode="after")
    def _one(self) -> Source:
        _exactly_one(self, self.KINDS, "source")
        return self

    @property
    def kind(self) -> str:
        """The name of the source given (``"kafka"``)."""
        return next(k for k in self.KINDS if getattr(self, k) is not None)


class Decode(_Model):
    """How record values become columns. ``decode: json`` is short for ``decode: {format: json}``."""

    AVRO_ONLY: ClassVar[tuple[str, ...]] = ("registry_url", "schema_dir", "reader_schema", "subject")

    format: Literal["json", "avro", "raw"] = Field(
        description=(
            "`json`: a JSON object per value; `avro`: Confluent wire format (magic byte, schema "
            "id, Avro body); `raw`: no decoding, the value stays bytes."
        ),
    )
    registry_url: str | None = Field(
        default=None,
        description="Avro: URL of a Confluent-compatible schema registry (default: from the settings).",
    )
    schema_dir: str | None = Field(
        default=None,
        description="Avro: a folder of `.avsc` files to use instead of a registry.",
    )
    reader_schema: str | None = Field(
        default=None,
        description=(
            "Avro: the schema every record is evolved to, from its writer schema: a path to an "
            '`.avsc` file, or "latest" (the subject\'s latest version in a registry, `latest.avsc` '
            "in a schema_dir). Default: latest."
        ),
    )
    subject: str | None = Field(
        default=None,
        description="Avro: the registry subject (default: `<topic>-value`, the TopicNameStrategy).",
    )
    schema_: dict[str, str] | None = Field(
        default=None,
        validation_alias="schema",
        serialization_alias="schema",
        description=(
            "JSON: the fields to read and their types, `{field: type}`: `string`, `int`, `long`, "
            "`float`, `double`, `boolean`, `timestamp`, `date` or `json` (kept as parsed); other "
            "fields are ignored and a value that does not cast is quarantined. Default: every "
            "field, typed from the values."
        ),
        json_schema_extra={"doc_type": "mapping field → type"},
    )
    null_value: Literal["quarantine", "skip", "keep"] | None = Field(
        default=None,
        description=(
            "What to do with a record whose value is null (a tombstone): `quarantine` it, "
            "`skip` it (counted as filtered), or (format raw only) `keep` it as a null value. "
            "Default: `keep` for raw, `quarantine` otherwise."
        ),
        json_schema_extra={"doc_default": "`keep` for raw, else `quarantine`"},
    )

    @field_validator("registry_url")
    @classmethod
    def _registry(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"https?://[^/\s]+", url):
            raise _Bad("not an http(s) URL", "like http://registry:8081", got=url)
        return url

    @field_validator("schema_dir", "reader_schema", "subject")
    @classmethod
    def _non_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "remove the field or give a value", got=value)
        return value

    @field_validator("schema_", mode="plain")
    @classmethod
    def _schema(cls, value: Any) -> dict[str, str] | None:
        return _json_schema(value)

    @model_validator(mode="after")
    def _format_fields(self) -> Decode:
        if self.null_value is None:
            _fill(self, "null_value", "keep" if self.format == "raw" else "quarantine")
        elif self.null_value == "keep" and self.format != "raw":
            raise _Bad(
                f"not used by format {self.format}",
                "a decoded format quarantines or skips a null value: use quarantine or skip",
                got=self.null_value,
                at=("null_value",),
            )
        for name in self.AVRO_ONLY:
            if self.format != "avro" and getattr(self, name) is not None:
                raise _Bad(
                    f"not used by format {self.format}",
                    f"only format avro reads {', '.join(self.AVRO_ONLY)}",
                    got=getattr(self, name),
                    at=(name,),
                )
        if self.format != "json" and self.schema_ is not None:
            raise _Bad(
                f"not used by format {self.format}",
                "only format json reads schema",
                got=self.schema_,
                at=("schema",),
            )
        if self.registry_url is not None and self.schema_dir is not None:
            raise _Bad(
                "given with registry_url",
                "give a registry_url or a schema_dir, not both",
                got=self.schema_dir,
                at=("schema_dir",),
            )
        return self


class Translate(_Model):
    """The user's transformation: a Python function or a SQL query, and its version."""

    function: str | None = Field(
        default=None,
        description=(
            "`package.module:callable`, called with a pandas DataFrame of decoded events; "
            "imported at plan time and in every task."
        ),
    )
    sql: str | None = Field(
        default=None,
        description=(
            "A Spark SQL query reading the decoded records as the view `events` (`SELECT ... FROM events`)."
        ),
    )
    version: str = Field(
        description=(
            'Version of the transformation, like "2": it goes into every event id, so a new '
            "version yields new ids. Quote it in YAML (1.10 is the number 1.1)."
        ),
    )
    name: str | None = Field(
        default=None,
        description="Transform name in lineage and event ids. Default: the callable's name, or `sql`.",
        json_schema_extra={"doc_default": "derived"},
    )
    output_schema: dict[str, str] | None = Field(
        default=None,
        description=(
            "Output columns and their Spark types. Default: learnt at plan time by calling the "
            "function on an empty frame (or from the query)."
        ),
        json_schema_extra={"doc_type": "mapping column → Spark type"},
    )
    fold: str | None = Field(
        default=None,
        description=(
            "`package.module:callable` that combines the rows of each `key` into one row, for read "
            "models (per-order totals...): the translate emits partial rows, one per event, and once "
            "every unit is committed the run's rows are folded across the whole window. Called with a "
            "pandas DataFrame holding every row of some keys (sorted by key, then source time and "
            "offset); returns one row per key with the same columns. Iceberg sinks, and PostgreSQL "
            "sinks in upsert mode (the partial rows then wait in a scratch Iceberg table)."
        ),
    )

    @field_validator("function", "fold")
    @classmethod
    def _function(cls, value: str | None) -> str | None:
        if value is not None and not _FUNCTION.fullmatch(value.strip()):
            raise _Bad(
                "not a function reference",
                "expected package.module:callable, like my_pkg.orders:to_total",
                got=value,
            )
        return None if value is None else value.strip()

    @field_validator("sql")
    @classmethod
    def _sql(cls, value: str | None) -> str | None:
        if value is not None and not _EVENTS_VIEW.search(value):
            raise _Bad(
                "does not read the view events",
                "Rewind registers the decoded records as the temporary view events: "
                "write SELECT ... FROM events",
                got=value,
            )
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_type(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise _Bad("a number, which YAML may have changed", 'quote it, like version: "1.10"', got=value)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("version", "name")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and not _TRANSFORM_NAME.fullmatch(value):
            raise _Bad(
                "empty or has characters that are not allowed" if value else "empty",
                "it goes into event ids: use letters, digits and . _ : -",
                got=value,
            )
        return value

    @field_validator("output_schema", mode="plain")
    @classmethod
    def _output_schema(cls, value: Any) -> dict[str, str] | None:
        return _schema(value)

    @model_validator(mode="after")
    def _one(self) -> Translate:
        if self.function is not None and self.sql is not None:
            raise _Bad("both function and sql given", "give exactly one of: function, sql")
        if self.function is None and self.sql is None:
            raise _Bad("neither function nor sql given", "give exactly one of: function, sql")
        if self.name is None:
            _fill(
                self,
                "name",
                "sql" if self.function is None else self.function.rsplit(":", 1)[1].split(".")[-1],
            )
        return self

    @property
    def kind(self) -> Literal["function", "sql"]:
        return "function" if self.function is not None else "sql"


def _check_window_order(start: datetime | None, end: datetime | None, what: str) -> None:
    """A sink's ``window_from`` must come before its ``window_to`` (both sinks that take them)."""
    if start and end and start >= end:
        raise _Bad(
            "window_from is not before window_to",
            f"the {what} window is [window_from, window_to)",
            got=_Plain(f"{_iso(start)} .. {_iso(end)}"),
        )


class IcebergSink(_Model):
    """Write to an Iceberg table of the catalog in the settings."""

    table: str = Field(description="`namespace.table` (nested namespaces: `a.b.table`).")
    mode: Literal["append", "replace-window"] = Field(
        default="append",
        description=(
            "`append` adds the output; `replace-window` replaces the rows whose `window_column` "
            "falls in the window with the output, in one snapshot."
        ),
    )
    window_column: str | None = Field(
        default=None,
        description=(
            "`replace-window` only: the time column that places a row in the window. "
            f"Default: `{_LINEAGE_TIME}`."
        ),
        json_schema_extra={"doc_default": f"`{_LINEAGE_TIME}` for replace-window"},
    )
    window_from: datetime | None = Field(
        default=None,
        description=(
            "`replace-window` only: start of the replaced window when it is not the source window "
            "(a read model keyed by order time reads a few days past the window so every order in it "
            "is whole). Output rows outside the replaced window are dropped and counted. Default: the "
            "source window's start."
        ),
    )
    window_to: datetime | None = Field(
        default=None,
        description=(
            "`replace-window` only: end (exclusive) of the replaced window. Default: the source window's end."
        ),
    )

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        if not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.order_totals", got=table)
        return table

    @field_validator("window_from", "window_to", mode="plain")
    @classmethod
    def _window_time(cls, value: Any, info: Any) -> datetime | None:
        return _verify_time(value, info.field_name)

    @field_serializer("window_from", "window_to")
    def _dump_window_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _window(self) -> IcebergSink:
        for name in ("window_column", "window_from", "window_to"):
            if self.mode == "append" and getattr(self, name) is not None:
                raise _Bad(
                    "used only by mode replace-window",
                    "remove it or set mode: replace-window",
                    got=getattr(self, name),
                    at=(name,),
                )
        if self.mode == "replace-window" and self.window_column is None:
            _fill(self, "window_column", _LINEAGE_TIME)
        _check_window_order(self.window_from, self.window_to, "replaced")
        return self

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]


class PostgresSink(_Model):
    """Write to a PostgreSQL table (a service's read model)."""

    table: str = Field(description="`schema.table` or `table` (in the search path).")
    url: str | None = Field(
        default=None,
        description=(
            "`postgresql://user@host/db` (or `sqlite:///file.db`, the embedded SQL sink). Default: "
            "the ledger's URL when it is PostgreSQL. Keep passwords out of "
            "spec files (use the settings or PGPASSWORD)."
        ),
    )
    mode: Literal["upsert", "append"] = Field(
        default="upsert",
        description="`upsert` on `key` (on the event id when `key` is empty), or `append`.",
    )
    window_column: str | None = Field(
        default=None,
        description=(
            "With `translate.fold`: the output column that places a folded row in the repaired window. "
            "Folded rows outside `[window_from, window_to)` are dropped and counted (an entity cut by "
            "the window's edge would be folded from part of its events)."
        ),
    )
    window_from: datetime | None = Field(
        default=None,
        description="With `window_column`: start of the repaired window. Default: the source window's start.",
    )
    window_to: datetime | None = Field(
        default=None,
        description=(
            "With `window_column`: end (exclusive) of the repaired window. Default: the source window's end."
        ),
    )

    @field_validator("window_from", "window_to", mode="plain")
    @classmethod
    def _window_time(cls, value: Any, info: Any) -> datetime | None:
        return _verify_time(value, info.field_name)

    @field_serializer("window_from", "window_to")
    def _dump_window_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _window(self) -> PostgresSink:
        for name in ("window_from", "window_to"):
            if getattr(self, name) is not None and self.window_column is None:
                raise _Bad(
                    "needs window_column", "name the column that places a row in the window", at=(name,)
                )
        _check_window_order(self.window_from, self.window_to, "repaired")
        return self

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(p) and len(p) <= 63 for p in parts):
            raise _Bad(
                "not a schema.table name",
                "like public.order_totals: 1 or 2 identifiers of at most 63 letters, digits, _ or $",
                got=table,
            )
        return table

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        # sqlite:/// is the embedded SQL sink (the same table semantics, one process)
        if url is not None and not re.match(r"(postgres(ql)?(\+\w+)?|sqlite)://", url):
            raise _Bad(
                "not a PostgreSQL or SQLite URL",
                "like postgresql://user@host:5432/db or sqlite:///path/to/file.db",
                got=url,
            )
        return url


class KafkaSink(_Model):
    """Produce the output to a Kafka topic dedicated to the backfill."""

    topic: str | None = Field(
        default=None,
        description="Target topic; never a source topic. Default: `<source topic>.backfill.<run id>`.",
        json_schema_extra={"doc_default": "`<source topic>.backfill.<run id>`"},
    )
    partitions: int | None = Field(
        default=None,
        gt=0,
        description="Partitions of the topic when Rewind creates it. Default: as the source topic.",
    )
    transactional: bool = Field(
        default=False,
        description=(
            "Write each commit (a wave of work units, with its bookkeeping marker) in one Kafka "
            "transaction; consumers read with read_committed."
        ),
    )
    configs: dict[str, str] = Field(
        default_factory=dict,
        description="Topic configs when Rewind creates the topic, like `{retention.ms: 604800000}`.",
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str | None) -> str | None:
        if topic is not None and (not _TOPIC.fullmatch(topic) or topic in (".", "..")):
            raise _Bad(
                "not a topic name", "a topic name is 1-249 of letters, digits, '.', '_' and '-'", got=topic
            )
        return topic

    @field_validator("configs", mode="before")
    @classmethod
    def _configs(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {
            str(k): (str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v)
            for k, v in value.items()
        }


class Sink(_Model):
    """Where the output goes: exactly one kind of sink."""

    KINDS: ClassVar[tuple[str, ...]] = ("iceberg", "postgres", "kafka")

    iceberg: IcebergSink | None = Field(default=None, description="An Iceberg table.")
    postgres: PostgresSink | None = Field(default=None, description="A PostgreSQL table.")
    kafka: KafkaSink | None = Field(default=None, description="A Kafka topic.")

    @property
    def window_column(self) -> str | None:
        """The output column that places a row in the repaired window, when the sink has one."""
        if self.iceberg is not None and self.iceberg.mode == "replace-window":
            return self.iceberg.window_column
        return self.postgres.window_column if self.postgres is not None else None

    @property
    def window_bounds(self) -> tuple[datetime | None, datetime | None]:
        """``window_from``/``window_to`` of the sink (None where the source window applies)."""
        found = self.iceberg or self.postgres
        if found is None:
            return None, None
        return found.window_from, found.window_to

    @model_validator(mode="after")
    def _one(self) -> Sink:
        _exactly_one(self, self.KINDS, "sink")
        return self

    @property
    def kind(self) -> Literal["iceberg", "postgres", "kafka"]:
        """The name of the sink given."""
        if self.iceberg is not None:
            return "iceberg"
        return "postgres" if self.postgres is not None else "kafka"

    @property
    def target(self) -> IcebergSink | PostgresSink | KafkaSink:
        """The one sink model given."""
        target = next(t for t in (self.iceberg, self.postgres, self.kafka) if t is not None)
        return target


class Guards(_Model):
    """Limits that protect the systems a backfill touches. Unset means no limit."""

    max_records_per_second: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Cap on records per second for the whole job (all tasks together).",
    )
    max_records: int | None = Field(
        default=None, gt=0, description="The plan is refused when its window holds more records than this."
    )
    max_bytes: int | None = Field(
        default=None,
        gt=0,
        description=(
            "The plan is refused when its window is estimated above this many bytes "
            "(`500MB`, `10GiB` allowed)."
        ),
    )

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return _size(value)


class RunSettings(_Model):
    """How a run is cut into work units and leased."""

    work_unit_records: int = Field(
        default=250_000,
        gt=0,
        description="Offsets per work unit: each partition's range is cut into chunks of at most this many.",
    )
    lease_ttl_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a runner's lease on the run lasts without renewal before another may take over.",
    )


class Quarantine(_Model):
    """Where rejected records go, with their reason: an Iceberg table."""

    table: str | None = Field(
        default=None,
        description=(
            "`namespace.table` of the quarantine. Default: `<sink namespace>.rewind_quarantine` "
            "for an Iceberg sink, `rewind.rewind_quarantine` otherwise."
        ),
        json_schema_extra={"doc_default": "derived"},
    )

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is not None and not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.rewind_quarantine", got=table)
        return table


# -- verification (rewind verify) -----------------------------------------------------------

_VIEW_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_VIEWS = ("staging", "reference", "target")
_PRECISIONS = ("us", "ms", "s", "min", "h", "d")


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


class PostgresReference(_Model):
    """A PostgreSQL table, or a query, holding the expected rows (a source of truth).

    Read through the driver with ``COPY ... TO STDOUT`` into a temporary Parquet file that
    Spark then reads: fine for reference tables up to tens of millions of rows.
    """

    url: str | None = Field(
        default=None,
        description=(
            "`postgresql://user@host:5432/db`. Default: `sink.postgres.url`, else the ledger's URL "
            "when it is PostgreSQL. Keep passwords out of spec files (settings or PGPASSWORD)."
        ),
        json_schema_extra={"doc_default": "the sink's, else the ledger's"},
    )
    table: str | None = Field(
        default=None, description="`schema.table` or `table`; exactly one of `table` and `query`."
    )
    query: str | None = Field(
        default=None,
        description="A PostgreSQL `SELECT` whose rows are the reference (run in a read-only transaction).",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"postgres(ql)?(\+\w+)?://", url):
            raise _Bad("not a PostgreSQL URL", "like postgresql://user@host:5432/db", got=url)
        return url

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is None:
            return None
        parts = table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(p) and len(p) <= 63 for p in parts):
            raise _Bad("not a schema.table name", "like public.order_totals", got=table)
        return table

    @model_validator(mode="after")
    def _one(self) -> PostgresReference:
        _exactly_one(self, ("table", "query"), "table or query")
        return self


class SqlReference(_Model):
    """A recomputation: a Spark SQL query whose result is what staging should hold.

    The query sees the temporary views ``staging`` (the run's whole staging), ``target`` (the
    production target, when it exists) and every view named in ``views``; the scope is applied
    to its result like to any reference. Recomputing straight from the Kafka window (a view
    of decoded events) is not offered yet: archive the history into Iceberg and name it in
    ``views``.
    """

    query: str = Field(
        description="Spark SQL, like `SELECT order_id, sum(amount) AS total FROM lines GROUP BY 1`."
    )
    views: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra views for the query: view name → Iceberg table (`namespace.table`) of the "
            "catalog in the settings, like `{lines: lake.order_lines}`."
        ),
        json_schema_extra={"doc_type": "mapping view → Iceberg table"},
    )

    @field_validator("query")
    @classmethod
    def _query(cls, query: str) -> str:
        if not query.strip():
            raise _Bad("empty", "write a SELECT over the views staging, target or your own views", got=query)
        return query

    @field_validator("views")
    @classmethod
    def _views(cls, views: dict[str, str]) -> dict[str, str]:
        for name, table in views.items():
            if not _VIEW_NAME.fullmatch(name) or name.lower() in _RESERVED_VIEWS:
                raise _Bad(
                    "not a free view name",
                    f"a SQL identifier other than {', '.join(_RESERVED_VIEWS)}",
                    got=name,
                    at=(name,),
                )
            if not _ICEBERG_TABLE.fullmatch(table):
                raise _Bad("not a namespace.table name", "like lake.order_lines", got=table, at=(name,))
        return views


class Reference(_Model):
    """What staging is compared with: exactly one of `target`, `iceberg`, `postgres`, `sql`."""

    KINDS: ClassVar[tuple[str, ...]] = ("target", "iceberg", "postgres", "sql")

    target: bool | None = Field(
        default=None,
        description=(
            "`true`: the production target as it is now, i.e. what promotion would replace (the usual "
            "case; an absent target, for a new read model, counts as empty)."
        ),
    )
    iceberg: str | None = Field(
        default=None, description="`namespace.table` of the catalog in the settings (its `main`)."
    )
    postgres: PostgresReference | None = Field(default=None, description="A PostgreSQL table or query.")
    sql: SqlReference | None = Field(
        default=None,
        description="A recomputation in Spark SQL; a string is short for `{query: ...}`.",
        json_schema_extra={"doc_type": "string or mapping, see `verify.reference.sql`"},
    )

    @field_validator("target")
    @classmethod
    def _target(cls, target: bool | None) -> bool | None:
        if target is False:
            raise _Bad("not true", "write target: true, or name another reference", got=target)
        return target

    @field_validator("iceberg")
    @classmethod
    def _iceberg(cls, table: str | None) -> str | None:
        if table is not None and not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.order_totals_truth", got=table)
        return table

    @field_validator("sql", mode="before")
    @classmethod
    def _sql(cls, value: Any) -> Any:
        return {"query": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one(self) -> Reference:
        _exactly_one(self, self.KINDS, "reference")
        return self

    @property
    def kind(self) -> Literal["target", "iceberg", "postgres", "sql"]:
        """The name of the reference given."""
        if self.target:
            return "target"
        if self.iceberg is not None:
            return "iceberg"
        return "postgres" if self.postgres is not None else "sql"


class Scope(_Model):
    """Which rows are compared: a time window, a filter and a key range, applied to both sides."""

    time_column: str | None = Field(
        default=None,
        description=(
            "Time column of the window. Default: the sink's `window_column` (Iceberg replace-window, "
            f"PostgreSQL with a fold), else `{_LINEAGE_TIME}` when staging has it."
        ),
        json_schema_extra={"doc_default": "derived"},
    )
    from_: datetime | None = Field(
        default=None,
        validation_alias="from",
        serialization_alias="from",
        description=(
            "Start of the window, included: an ISO-8601 time with a zone or epoch milliseconds. "
            "Default: the sink's `window_from`, else the source's `from` when it is a time, else unbounded."
        ),
        json_schema_extra={"doc_type": "time", "doc_default": "the job's window"},
    )
    to: datetime | None = Field(
        default=None,
        description=(
            "End of the window, excluded. Default: the sink's `window_to`, else the source's `to` when it "
            "is a time, else unbounded."
        ),
        json_schema_extra={"doc_type": "time", "doc_default": "the job's window"},
    )
    filter: str | None = Field(
        default=None,
        description="A Spark SQL condition both sides must meet, like `status != 'test'`.",
    )
    key_from: int | str | None = Field(
        default=None,
        description="Smallest value of the first key column compared (included).",
        json_schema_extra={"doc_type": "integer or string"},
    )
    key_to: int | str | None = Field(
        default=None,
        description="End of the key range on the first key column (excluded).",
        json_schema_extra={"doc_type": "integer or string"},
    )

    @field_validator("time_column", "filter")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _check_column(value, "a value")

    @field_validator("from_", mode="plain")
    @classmethod
    def _from(cls, value: Any) -> datetime | None:
        return _verify_time(value, "from")

    @field_validator("to", mode="plain")
    @classmethod
    def _to(cls, value: Any) -> datetime | None:
        return _verify_time(value, "to")

    @field_serializer("from_", "to")
    def _dump_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @model_validator(mode="after")
    def _order(self) -> Scope:
        if self.from_ is not None and self.to is not None and self.to <= self.from_:
            raise _Bad(
                "is not after from",
                "the window is [from, to): to must be after from",
                got=_Plain(f"{_iso(self.to)}, from is {_iso(self.from_)}"),
                at=("to",),
            )
        if (
            self.key_from is not None
            and self.key_to is not None
            and type(self.key_from) is type(self.key_to)
            and self.key_to <= self.key_from  # type: ignore[operator]
        ):
            raise _Bad(
                "is not after key_from",
                "the key range is [key_from, key_to)",
                got=self.key_to,
                at=("key_to",),
            )
        return self


class Tolerance(_Model):
    """How one column is compared. `exact` (the string) is short for no tolerance at all.

    Numbers are equal when ``|staging - reference| <= abs + rel * |reference|`` (numpy's
    ``isclose``); timestamps when they are equal once truncated to ``timestamp_precision``.
    """

    abs: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Absolute tolerance of a numeric column."
    )
    rel: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description=(
            "Relative tolerance of a numeric column, a fraction of the reference value (0.001 = 0.1%)."
        ),
    )
    timestamp_precision: Literal["us", "ms", "s", "min", "h", "d"] | None = Field(
        default=None,
        description="Timestamps are compared truncated to this unit: `us`, `ms`, `s`, `min`, `h` or `d`.",
    )
    nulls_equal: bool | None = Field(
        default=None, description="Overrides `verify.nulls_equal` for this column."
    )

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().lower() != "exact":
                raise _Bad(
                    "not a tolerance",
                    "write exact, or a mapping like {abs: 0.01}, {rel: 0.001} or {timestamp_precision: s}",
                    got=value,
                )
            return {}
        return {} if value is None else value

    @model_validator(mode="after")
    def _kinds(self) -> Tolerance:
        numeric = self.abs is not None or self.rel is not None
        if numeric and self.timestamp_precision is not None:
            raise _Bad(
                "numeric and timestamp tolerances given together",
                "a column is a number (abs, rel) or a timestamp (timestamp_precision)",
            )
        return self

    @property
    def exact(self) -> bool:
        """No tolerance: equal means equal (after truncation for timestamps)."""
        return not self.abs and not self.rel


class Buckets(_Model):
    """Row counts and checksums per time bucket (and per category) in the report."""

    time_column: str | None = Field(
        default=None,
        description="Time column that places a row in a bucket. Default: the scope's time column.",
        json_schema_extra={"doc_default": "`scope.time_column`"},
    )
    granularity: Literal["hour", "day"] = Field(
        default="day", description="Bucket size: `hour` or `day` (UTC)."
    )
    category: str | None = Field(
        default=None, description="A column whose values the report breaks drift down by, like `status`."
    )

    @field_validator("time_column", "category")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        return _check_column(value)


class Assertion(_Model):
    """A check of the outcome in Spark SQL over the views `staging` and `reference` (in scope).

    Three forms: with `expect`, the query returns one value that must equal it (within `abs`
    / `rel`); with `compare_to_reference`, the query is run once as written and once with
    `staging` meaning the reference, and both results must agree (numbers within `abs` /
    `rel`, rows matched on their other columns); with neither, the query lists offending rows
    and must return none.
    """

    name: str = Field(description="Shown in the report, like `no negative totals`.")
    sql: str = Field(description="Spark SQL over the views `staging` and `reference`.")
    expect: float | None = Field(
        default=None, allow_inf_nan=False, description="The single value the query must return."
    )
    compare_to_reference: bool = Field(
        default=False, description="Run the query over the reference too and compare the two results."
    )
    abs: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="Absolute tolerance.")
    rel: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Relative tolerance (0.0001 = 0.01%)."
    )

    @field_validator("name", "sql")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise _Bad("empty", "give a value", got=value)
        return value

    @model_validator(mode="after")
    def _form(self) -> Assertion:
        if self.expect is not None and self.compare_to_reference:
            raise _Bad(
                "expect given with compare_to_reference",
                "compare with a fixed value (expect) or with the reference, not both",
                got=self.expect,
                at=("expect",),
            )
        return self


class Verify(_Model):
    """Reconciliation of a run's staging with a reference, run by `rewind verify RUN`.

    Three levels: records (every key of the reference is in staging and vice versa), state
    (per-key values of the compared columns, with tolerances) and outcome (SQL assertions).
    A missing `verify` section means `{reference: {target: true}}` with every default.
    """

    reference: Reference = Field(
        default_factory=lambda: Reference(target=True),
        description="What staging is compared with. Default: `{target: true}`.",
        json_schema_extra={"doc_default": "`{target: true}`"},
    )
    mode: Literal["match", "repair"] | None = Field(
        default=None,
        description=(
            "`match`: inside the scope staging must equal the reference; rows outside the window are "
            "not compared. `repair`: staging replaces the reference: differences inside the window "
            "are the repair (reported as changes), outside it staging must equal the reference. "
            "Default: `repair` for `target`, `match` otherwise."
        ),
        json_schema_extra={"doc_default": "derived"},
    )
    scope: Scope = Field(default_factory=lambda: Scope(), description="Which rows are compared.")
    key: list[str] = Field(
        default_factory=list,
        description=(
            "Columns identifying a row on both sides. Default: the job's `key` (or `_rewind_event_id`)."
        ),
        json_schema_extra={"doc_default": "the job's key"},
    )
    compare: dict[str, Tolerance] | None = Field(
        default=None,
        description=(
            "Columns compared and how: `{total: {abs: 0.01}, status: exact}`; a list means exact. "
            "Default: every column on both sides but the key and Rewind's `_rewind_*` columns, exact."
        ),
        json_schema_extra={
            "doc_type": "list, or mapping column → `exact` or see `verify.compare.<name>`",
            "doc_default": "common columns, exact",
        },
    )
    ignore: list[str] = Field(
        default_factory=list, description="Columns left out of the default `compare` set."
    )
    nulls_equal: bool = Field(
        default=True, description="A null equals a null; `false` follows SQL (null never equals anything)."
    )
    buckets: Buckets = Field(default_factory=lambda: Buckets(), description="Time buckets and category.")
    assertions: list[Assertion] = Field(
        default_factory=list,
        description="Checks of the outcome in SQL.",
        json_schema_extra={"doc_type": "list of mappings, see `verify.assertions[]`"},
    )
    samples: int = Field(
        default=20, ge=0, le=10_000, description="Differing rows (and missing, extra keys) shown per kind."
    )
    drill_rows: int = Field(
        default=500_000,
        gt=0,
        description=(
            "Differing buckets are split further (bisection) until they hold at most this many rows, "
            "which are then compared row by row."
        ),
    )

    @field_validator("scope", "buckets", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("compare", mode="before")
    @classmethod
    def _compare_list(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return {str(column): "exact" for column in value}
        if isinstance(value, Mapping):
            return {k: ("exact" if v is None else v) for k, v in value.items()}
        return value

    @field_validator("compare")
    @classmethod
    def _compare(cls, value: dict[str, Tolerance] | None) -> dict[str, Tolerance] | None:
        if value is not None and not value:
            raise _Bad("empty", "name the columns to compare, or remove compare to compare all", got={})
        for column in value or {}:
            if not column.strip():
                raise _Bad("empty column name", "name the columns to compare", got=column)
        return value

    @field_validator("key", "ignore")
    @classmethod
    def _columns(cls, columns: list[str]) -> list[str]:
        for i, column in enumerate(columns):
            if not column.strip():
                raise _Bad("empty column name", "list column names", got=column, at=(i,))
            if column in columns[:i]:
                raise _Bad(f"column '{column}' is listed twice", "list each column once", got=columns)
        return columns

    @model_validator(mode="after")
    def _across(self) -> Verify:
        if self.mode is None:
            _fill(self, "mode", "repair" if self.reference.target else "match")
        names = [a.name for a in self.assertions]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _Bad(
                    "name used twice",
                    "give each assertion its own name",
                    got=name,
                    at=("assertions", i, "name"),
                )
        for column in self.key:
            if self.compare and column in self.compare:
                raise _Bad(
                    "a key column is compared",
                    "key columns identify rows; list only the other columns in compare",
                    got=column,
                    at=("compare", column),
                )
        return self


class JobSpec(_Model):
    """A backfill job: read a window, decode, translate, write, within guards."""

    name: str = Field(
        description=(
            "Job name: lowercase letters, digits, `-` and `_` (at most 63); used in ids and topic names."
        ),
    )
    description: str | None = Field(
        default=None, description="Free text for people; not part of the fingerprint."
    )
    source: Source = Field(description="Where the records come from.")
    decode: Decode = Field(
        description="How values are decoded: `json`, `avro`, `raw`, or a mapping with `format` and options.",
        json_schema_extra={"doc_type": "string or mapping, see `decode`"},
    )
    translate: Translate = Field(description="The transformation and its version.")
    key: list[str] = Field(
        default_factory=list,
        description=(
            "Business key of the output rows (column names). Empty: append-only, keyed by the "
            "event id `_rewind_event_id`."
        ),
    )
    sink: Sink = Field(description="Where the output goes.")
    guards: Guards = Field(default_factory=lambda: Guards(), description="Limits of the run.")
    run: RunSettings = Field(default_factory=lambda: RunSettings(), description="Work units and leases.")
    quarantine: Quarantine = Field(
        default_factory=lambda: Quarantine(), description="Where rejected records go."
    )
    verify: Verify | None = Field(
        default=None,
        description=(
            "How `rewind verify` reconciles staging with a reference; absent: `{reference: {target: true}}`."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _SLUG.fullmatch(name):
            raise _Bad(
                "not a slug",
                "use 1-63 lowercase letters, digits, - and _, starting with a letter or digit "
                "(it goes into ids and topic names), like repair-order-totals",
                got=name,
            )
        return name

    @field_validator("decode", mode="before")
    @classmethod
    def _decode(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value.strip().lower() not in ("json", "avro", "raw"):
                raise _Bad(
                    "unknown format",
                    "allowed: json, avro, raw, or a mapping with format: and options",
                    got=value,
                )
            return {"format": value.strip().lower()}
        return value

    @field_validator("guards", "run", "quarantine", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        return {} if value is None else value  # `guards:` with nothing under it

    @field_validator("key")
    @classmethod
    def _key(cls, key: list[str]) -> list[str]:
        for i, column in enumerate(key):
            if not column.strip():
                raise _Bad("empty column name", "list column names of the output", got=column, at=(i,))
            if column in key[:i]:
                raise _Bad(f"column '{column}' is listed twice", "list each column once", got=key)
        return key

    @model_validator(mode="after")
    def _across(self) -> JobSpec:
        schema = self.translate.output_schema
        if schema is not None:
            for i, column in enumerate(self.key):
                if column not in schema:
                    raise _Bad(
                        "not a column of translate.output_schema",
                        f"key columns are output columns: {', '.join(schema)}",
                        got=column,
                        at=("key", i),
                    )
        iceberg = self.sink.iceberg
        if self.quarantine.table is None:
            namespace = iceberg.namespace if iceberg else "rewind"
            _fill(self, "quarantine", Quarantine(table=f"{namespace}.{_QUARANTINE_NAME}"))
        if iceberg and iceberg.table == self.quarantine.table:
            raise _Bad(
                "the sink table is the quarantine table",
                "give the quarantine its own table",
                got=self.quarantine.table,
                at=("quarantine", "table"),
            )
        if any(self.sink.window_bounds):
            self._replaced_within_source()
        postgres = self.sink.postgres
        if postgres is not None and postgres.window_column and self.translate.fold is None:
            raise _Bad(
                "used only with translate.fold",
                "a fold's rows are kept inside the window; remove it or add translate.fold",
                got=postgres.window_column,
                at=("sink", "postgres", "window_column"),
            )
        if self.translate.fold is not None and not (iceberg or (postgres and postgres.mode == "upsert")):
            raise _Bad(
                "needs an Iceberg sink or a PostgreSQL sink in upsert mode",
                "a fold writes one row per key: write the read model to sink.iceberg or sink.postgres",
                got=self.translate.fold,
                at=("translate", "fold"),
            )
        kafka_sink, kafka_source = self.sink.kafka, self.source.window
        if kafka_sink and kafka_source and kafka_sink.topic in kafka_source.topics:
            raise _Bad(
                "is a source topic",
                f"a backfill writes to its own topic, like {kafka_sink.topic}.backfill",
                got=kafka_sink.topic,
                at=("sink", "kafka", "topic"),
            )
        return self

    def _replaced_within_source(self) -> None:
        # rows of a replaced window the source does not cover would be deleted and never rewritten
        window = self.source.window
        lo, hi = window.from_, window.to
        kind = self.sink.kind
        start, end = self.sink.window_bounds
        if not (isinstance(lo, datetime) and isinstance(hi, datetime)):
            raise _Bad(
                "needs a source window given as times",
                "give source from/to as ISO times, or drop window_from/window_to",
                at=("sink", kind, "window_from" if start else "window_to"),
            )
        for name, value in (("window_from", start), ("window_to", end)):
            if value is not None and not lo <= value <= hi:
                raise _Bad(
                    "outside the source window",
                    f"the replaced window must lie within the source window {_iso(lo)} .. {_iso(hi)}",
                    got=_Plain(_iso(value)),
                    at=("sink", kind, name),
                )

    # -- derived ----------------------------------------------------------------------------

    def replaced_window(self) -> tuple[datetime, datetime] | None:
        """The repaired window: the sink's ``window_from``/``window_to``, else the source window;
        None unless both ends are times."""
        window = self.source.window
        start, end = self.sink.window_bounds
        lo, hi = start or window.from_, end or window.to
        if isinstance(lo, datetime) and isinstance(hi, datetime):
            return lo, hi
        return None

    def window_request(self) -> WindowRequest:
        """The Kafka source's :meth:`KafkaSource.window_request`."""
        return self.source.window.window_request()

    def canonical(self) -> dict[str, Any]:
        """The spec as JSON-ready data: aliases, derived defaults filled in, no nulls."""
        return self.model_dump(mode="json", exclude_none=True)

    def public(self) -> dict[str, Any]:
        """:meth:`canonical` with secrets masked (URL passwords, secret configs): safe to print or store."""
        data: dict[str, Any] = mask(self.canonical())
        return data

    def fingerprint(self) -> str:
        """sha256 (hex) of the canonical JSON (sorted keys, aliases, no nulls, no description).

        The same job gives the same fingerprint whether it came from YAML or Python, with any
        key order and with derived defaults written out or not; a deterministic plan id can be
        built on it. ``description`` is left out: rewording it does not make a new job.
        """
        data = self.canonical()
        data.pop("description", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_yaml(self) -> str:
        """The spec as YAML that :func:`parse_spec` reads back into an equal spec."""
        return yaml.safe_dump(self.canonical(), sort_keys=False, allow_unicode=True, width=100)


# -- loading --------------------------------------------------------------------------------


class _DuplicateKey(Exception):
    def __init__(self, key: str, line: int, first: int) -> None:
        self.key, self.line, self.first = key, line, first


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in a mapping is an error."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                ident = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if ident in seen:
                    raise _DuplicateKey(key_node.value, line, seen[ident])
                seen[ident] = line
        return super().construct_mapping(node, deep=deep)


def parse_spec(data: Any, source_name: str = "<spec>") -> JobSpec:
    """Validate ``data`` (a mapping, as loaded from YAML) into a :class:`JobSpec`.

    Raises :class:`SpecError` with one line: ``<source_name>: <field.path>: <what is wrong>
    (got <value>); <what is allowed>``, plus ``(+N more)`` when other fields are wrong too.
    """
    if not isinstance(data, Mapping):
        got = "an empty file" if data is None else _show(data)
        raise SpecError(
            f"{source_name}: expected a mapping of fields at the top level (got {got}); "
            f"allowed: {_allowed_fields(JobSpec)}"
        )
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise _spec_error(exc, source_name) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read a YAML spec file into a :class:`JobSpec`; every problem is a one-line :class:`SpecError`."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{name}: no such spec file; check the path") from None
    except IsADirectoryError:
        raise SpecError(f"{name}: is a directory, not a spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(f"{name}: can't read the spec file ({' '.join(reason.split())})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except _DuplicateKey as dup:
        raise SpecError(
            f"{name}: line {dup.line}: '{dup.key}' is given twice (first at line {dup.first}); "
            "give each field once"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise SpecError(
            f"{name}: {where}not valid YAML ({' '.join(str(problem).split())}); fix the syntax"
        ) from None
    return parse_spec(data, name)


# -- reference ------------------------------------------------------------------------------


def _walk(model: type[BaseModel], path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    yield path, model
    for name, info in model.model_fields.items():
        inner = _unwrap(info.annotation)
        here = f"{path}.{_alias(name, info)}" if path else _alias(name, info)
        if get_origin(inner) in (list, dict):  # models inside a list or a mapping: `x[]`, `x.<name>`
            here += "[]" if get_origin(inner) is list else ".<name>"
            inner = _unwrap(get_args(inner)[-1])
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _walk(inner, here)


def _type_text(annotation: Any, info: FieldInfo | None = None, path: str = "") -> str:
    extra = info.json_schema_extra if info is not None and isinstance(info.json_schema_extra, dict) else {}
    if "doc_type" in extra:
        return str(extra["doc_type"])
    annotation = _unwrap(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        text = " \\| ".join(f"`{a}`" for a in get_args(annotation))
    elif origin is list:
        text = f"list of {_type_text(get_args(annotation)[0])}"
    elif origin is dict:
        key, value = get_args(annotation)
        text = "mapping" if value is Any else f"mapping {_type_text(key)} → {_type_text(value)}"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        text = f"mapping, see `{path}`" if path else "mapping"
    else:
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        text = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    for rule in info.metadata if info is not None else ():
        for attr, sign in (("gt", ">"), ("ge", ">=")):
            if getattr(rule, attr, None) is not None:
                text += f" {sign} {getattr(rule, attr)}"
    return text


def _default_text(info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "doc_default" in extra:
        return str(extra["doc_default"])
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        made = info.default_factory()  # type: ignore[call-arg]
        return "all defaults" if isinstance(made, BaseModel) else f"`{json.dumps(made)}`"
    if info.default is None or info.default is PydanticUndefined:
        return "none"
    return f"`{json.dumps(info.default)}`" if not isinstance(info.default, str) else f"`{info.default}`"


def spec_reference_markdown() -> str:
    """The reference of every spec field (type, default, description), in Markdown.

    Generated from the models, so it cannot drift from what :func:`load_spec` accepts.
    """
    out = [
        "# Job spec reference",
        "",
        "<!-- Generated by rewind.spec.spec_reference_markdown(); edit the models, not this file. -->",
        "",
        "A job spec is a YAML file (`rewind plan SPEC`, `rewind run SPEC`) or a `rewind.spec.JobSpec`",
        "built in Python. Unknown fields are errors at every level; every error is one line naming",
        "the file, the field, the bad value and what is allowed.",
        "",
        "```yaml",
        EXAMPLE_SPEC.rstrip(),
        "```",
    ]
    for path, model in _walk(JobSpec, ""):
        doc = inspect.cleandoc(model.__doc__ or "").replace("``", "`")
        out += ["", f"## `{path}`" if path else "## Top level", ""]
        if doc:
            out += [doc, ""]
        out += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            description = (info.description or "").replace("|", "\\|")
            default = _default_text(info).replace("|", "\\|")
            alias = _alias(name, info)
            kind = _type_text(info.annotation, info, f"{path}.{alias}" if path else alias)
            out.append(f"| `{alias}` | {kind} | {default} | {description} |")
    return "\n".join(out) + "\n"
