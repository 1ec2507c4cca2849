"""Spark type names (DDL) of a spec, parsed once, and their Arrow types.

The one grammar: the spec validates ``translate.output_schema`` and ``decode.schema`` with
:func:`parse_spark_type`, and the plan turns the same parsed type into Arrow with
:func:`arrow_type`, so every name the spec accepts is one the plan can use (nested types,
``timestamp_ntz``, ``varchar(n)`` and ``decimal(p,s)`` included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewind.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

SIMPLE_TYPES = frozenset(
    {
        *("string", "binary", "boolean", "date", "timestamp", "timestamp_ntz", "timestamp_ltz"),
        *("tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long"),
        *("float", "real", "double"),
    }
)
DECIMAL_DEFAULT = (10, 0)
"""Spark's ``decimal`` without arguments."""

_TOKENS = re.compile(r"`[^`]*`|[A-Za-z_][A-Za-z0-9_]*|\d+|\S")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SparkTypeError(ValueError):
    """The text is not a Spark type; the message says what is wrong (without the text)."""


@dataclass(frozen=True)
class SparkType:
    """A parsed Spark type: ``name`` in lower case, and what it is made of.

    ``params`` holds numbers (decimal precision and scale, a char length); ``children`` the
    element type of an array, the key and value of a map, or the fields of a struct (whose
    names are in ``fields``).
    """

    name: str
    params: tuple[int, ...] = ()
    children: tuple[SparkType, ...] = ()
    fields: tuple[str, ...] = ()

    def ddl(self) -> str:
        """The canonical text: keywords lower case, no spaces."""
        if self.name == "decimal":
            return f"decimal({self.params[0]},{self.params[1]})" if self.params else "decimal"
        if self.name in ("char", "varchar"):
            return f"{self.name}({self.params[0]})"
        if self.name == "array":
            return f"array<{self.children[0].ddl()}>"
        if self.name == "map":
            return f"map<{self.children[0].ddl()},{self.children[1].ddl()}>"
        if self.name == "struct":
            inner = ",".join(f"{n}:{c.ddl()}" for n, c in zip(self.fields, self.children, strict=True))
            return f"struct<{inner}>"
        return self.name


def parse_spark_type(text: str) -> SparkType:
    """Parse a Spark DDL type (``long``, ``decimal(10,2)``, ``array<struct<a:int>>``...)."""
    tokens = _TOKENS.findall(text)
    pos = 0

    def take(expected: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens) or (expected is not None and tokens[pos] != expected):
            raise SparkTypeError("not a Spark type")
        pos += 1
        return tokens[pos - 1]

    def number() -> int:
        token = take()
        if not token.isdigit():
            raise SparkTypeError("not a Spark type")
        return int(token)

    def parse() -> SparkType:
        word = take().lower()
        if word in SIMPLE_TYPES:
            return SparkType(word)
        if word in ("decimal", "dec", "numeric"):
            if tokens[pos : pos + 1] != ["("]:
                return SparkType("decimal")
            take("(")
            precision, scale = number(), 0
            if tokens[pos : pos + 1] == [","]:
                take(",")
                scale = number()
            take(")")
            if not 1 <= precision <= 38 or scale > precision:
                raise SparkTypeError("a decimal needs 1 <= precision <= 38 and scale <= precision")
            return SparkType("decimal", (precision, scale))
        if word in ("char", "varchar"):
            take("(")
            length = number()
            take(")")
            return SparkType(word, (length,))
        if word == "array":
            take("<")
            element = parse()
            take(">")
            return SparkType("array", children=(element,))
        if word == "map":
            take("<")
            key = parse()
            take(",")
            value = parse()
            take(">")
            return SparkType("map", children=(key, value))
        if word == "struct":
            take("<")
            names: list[str] = []
            children: list[SparkType] = []
            while True:
                name = take()
                if not (name.startswith("`") or _NAME.fullmatch(name)):
                    raise SparkTypeError("not a Spark type")
                if tokens[pos : pos + 1] == [":"]:
                    take(":")
                names.append(name)
                children.append(parse())
                end = take()
                if end == ">":
                    break
                if end != ",":
                    raise SparkTypeError("not a Spark type")
            return SparkType("struct", children=tuple(children), fields=tuple(names))
        raise SparkTypeError("not a Spark type")

    result = parse()
    if pos != len(tokens):
        raise SparkTypeError("not a Spark type")
    return result


def arrow_type(spark_type: str | SparkType) -> pa.DataType:
    """The Arrow type of a Spark type (text or parsed)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa  # pyarrow only where a plan needs it, not for the spec's validation

    try:
        parsed = spark_type if isinstance(spark_type, SparkType) else parse_spark_type(spark_type)
    except SparkTypeError as exc:
        raise ConfigError(f"type {spark_type!r}: {exc}") from None
    simple: dict[str, pa.DataType] = {
        "string": pa.string(),
        "long": pa.int64(),
        "bigint": pa.int64(),
        "int": pa.int32(),
        "integer": pa.int32(),
        "short": pa.int16(),
        "smallint": pa.int16(),
        "byte": pa.int8(),
        "tinyint": pa.int8(),
        "double": pa.float64(),
        "float": pa.float32(),
        "real": pa.float32(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ltz": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),  # a wall-clock time: no zone
        "date": pa.date32(),
        "binary": pa.binary(),
        "char": pa.string(),
        "varchar": pa.string(),
    }
    name = parsed.name
    if name in simple:
        return simple[name]
    if name == "decimal":
        precision, scale = parsed.params or DECIMAL_DEFAULT
        return pa.decimal128(precision, scale)
    if name == "array":
        return pa.list_(arrow_type(parsed.children[0]))
    if name == "map":
        return pa.map_(arrow_type(parsed.children[0]), arrow_type(parsed.children[1]))
    fields = [
        pa.field(field_name.strip("`"), arrow_type(child))
        for field_name, child in zip(parsed.fields, parsed.children, strict=True)
    ]
    return pa.struct(fields)
