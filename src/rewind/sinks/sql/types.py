"""Arrow types of the output against SQL column types: what to create, what an existing column accepts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rewind.sinks.sql.exceptions import SqlSinkError

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class SqlColumn:
    name: str
    type: str
    notnull: bool
    has_default: bool
    generated: bool = False


def base_type(sql_type: str) -> str:
    return re.sub(r"\(.*\)", "", sql_type).strip().lower()


def type_modifiers(sql_type: str) -> tuple[int, int] | None:
    m = re.search(r"\((\d+)\s*(?:,\s*(\d+))?\)", sql_type)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def is_nested(t: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_nested(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_duration(t)
        or pa.types.is_interval(t)
    )


def pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type a new table gets for an Arrow type."""
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_time(t):
        return "time without time zone"
    raise SqlSinkError(f"Arrow type {t} has no SQL column type here")


SQLITE_TYPES = {
    "boolean": "BOOLEAN",
    "smallint": "SMALLINT",
    "integer": "INTEGER",
    "bigint": "BIGINT",
    "real": "REAL",
    "double precision": "DOUBLE",
    "text": "TEXT",
    "bytea": "BLOB",
    "date": "DATE",
    "timestamp with time zone": "TIMESTAMP",
    "timestamp without time zone": "TIMESTAMP",
    "time without time zone": "TIME",
}


def sqlite_type(t: pa.DataType) -> str:
    pg = pg_type(t)
    return SQLITE_TYPES.get(pg, pg.upper())


TEXT_TYPES = {
    "text",
    "character varying",
    "character",
    "varchar",
    "char",
    "bpchar",
    "name",
    "citext",
    "json",
    "jsonb",
    "uuid",
    "xml",
}
NUMBER_TYPES = {"smallint", "integer", "bigint", "numeric", "decimal", "real", "double precision"}


def pg_compatible(t: pa.DataType, sql_type: str) -> bool:
    """Can a column of ``sql_type`` hold every value of Arrow type ``t`` (no silent loss)?"""
    import pyarrow as pa

    base = base_type(sql_type)
    if pa.types.is_null(t):
        return True
    if pa.types.is_boolean(t):
        return base == "boolean"
    if pa.types.is_integer(t):
        width = t.bit_width + (1 if pa.types.is_unsigned_integer(t) else 0)
        sizes = {"smallint": 16, "integer": 32, "bigint": 64}
        if base in sizes:
            return width <= sizes[base]
        if base in ("numeric", "decimal"):
            mod = type_modifiers(sql_type)
            return (
                mod is None or mod[0] - mod[1] >= 20 if width > 32 else mod is None or mod[0] - mod[1] >= 10
            )
        return (base == "double precision" and width <= 32) or (base == "real" and width <= 16)
    if pa.types.is_floating(t):
        return base in ("double precision", "numeric", "decimal") or (base == "real" and t.bit_width <= 32)
    if pa.types.is_decimal(t):
        if base not in ("numeric", "decimal"):
            return False
        mod = type_modifiers(sql_type)
        return mod is None or (mod[1] >= t.scale and mod[0] - mod[1] >= t.precision - t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return base in TEXT_TYPES
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return base == "bytea"
    if pa.types.is_date(t):
        return base in ("date", "timestamp with time zone", "timestamp without time zone")
    if pa.types.is_timestamp(t):
        return base in ("timestamp with time zone", "timestamp without time zone")
    if pa.types.is_time(t):
        return base.startswith("time")
    return False


def sqlite_affinity(declared: str) -> str:
    d = declared.upper()
    if "INT" in d:
        return "INTEGER"
    if any(s in d for s in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if "BLOB" in d or not d:
        return "BLOB"
    if any(s in d for s in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def sqlite_compatible(t: pa.DataType, declared: str) -> bool:
    import pyarrow as pa

    aff = sqlite_affinity(declared)
    if aff == "BLOB" and not declared:
        return True
    if pa.types.is_null(t):
        return True
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return aff in ("INTEGER", "NUMERIC", "REAL")
    if pa.types.is_floating(t):
        return aff in ("REAL", "NUMERIC")
    if pa.types.is_decimal(t):
        return aff in ("NUMERIC", "REAL", "TEXT")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return aff in ("TEXT", "BLOB")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return aff == "BLOB"
    if pa.types.is_temporal(t):
        return aff in ("TEXT", "NUMERIC")
    return False


def arrow_of(sql_type: str) -> pa.DataType:
    """The Arrow type a column reads back as (PostgreSQL or SQLite declared names)."""
    import pyarrow as pa

    base = base_type(sql_type)
    simple: dict[str, pa.DataType] = {
        "boolean": pa.bool_(),
        "smallint": pa.int16(),
        "integer": pa.int32(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "real": pa.float32(),
        "double precision": pa.float64(),
        "double": pa.float64(),
        "float": pa.float64(),
        "bytea": pa.binary(),
        "blob": pa.binary(),
        "date": pa.date32(),
        "timestamp with time zone": pa.timestamp("us", tz="UTC"),
        "timestamptz": pa.timestamp("us", tz="UTC"),
        "timestamp without time zone": pa.timestamp("us"),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "datetime": pa.timestamp("us", tz="UTC"),
    }
    if base in simple:
        return simple[base]
    if base in ("numeric", "decimal"):
        mod = type_modifiers(sql_type)
        if mod is not None and 0 < mod[0] <= 38:
            return pa.decimal128(mod[0], mod[1])
    return pa.string()


def from_text(text: pa.Array, t: pa.DataType) -> pa.Array:
    """Text as SQLite keeps it (ISO-8601, with or without a zone) to ``t``."""
    import pyarrow as pa

    if pa.types.is_timestamp(t) and t.tz:
        try:
            return text.cast(pa.timestamp(t.unit)).cast(t)  # naive text is UTC (as written)
        except pa.ArrowInvalid:
            return text.cast(t)
    return text.cast(t)
