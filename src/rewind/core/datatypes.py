"""Spark type names of a spec and their Arrow types.

A leaf: the spec validates ``translate.output_schema`` with it and the plan turns the same
names into Arrow types, so a name the spec accepts is one the plan can use.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rewind.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

_DECIMAL = re.compile(r"decimal\((\d+)\s*,\s*(\d+)\)")


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a spec's Spark type name (the spec validates the names)."""
    import pyarrow as pa

    name = spark_type.strip().lower()
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
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
        "binary": pa.binary(),
    }
    if name in simple:
        return simple[name]
    match = _DECIMAL.fullmatch(name)
    if match:
        return pa.decimal128(int(match.group(1)), int(match.group(2)))
    raise ConfigError(f"type {spark_type!r} has no Arrow equivalent here; use a simple Spark type")
