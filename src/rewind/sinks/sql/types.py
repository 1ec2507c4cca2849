"""Arrow types of the output against SQL column types: what to create, what an existing column accepts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

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
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return bool(
        pa.types.is_nested(t)
        or pa.types.is_dictionary(t)
        or pa.types.is_duration(t)
        or pa.types.is_interval(t)
    )


def pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type a new table gets for an Arrow type."""
    # lazy: avoids pyarrow at import
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
    # lazy: avoids pyarrow at import
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
    """Can a SQLite column declared ``declared`` hold every value of Arrow type ``t`` and read it
    back as such? SQLite stores any value in any column, but its affinity converts some (an
    integer in a REAL column becomes a double; a number text in a NUMERIC column keeps 15
    significant digits), and the declared type is all the read path knows: a timestamp, date or
    time (written as ISO-8601 text) reads back as one only from a column declared as one."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if pa.types.is_temporal(t):
        back = sqlite_arrow_of(declared)
        if back is None:
            return False
        if pa.types.is_date(t):
            return pa.types.is_date(back) or pa.types.is_timestamp(back)
        return bool(
            (pa.types.is_timestamp(t) and pa.types.is_timestamp(back))
            or (pa.types.is_time(t) and pa.types.is_time(back))
        )
    aff = sqlite_affinity(declared)
    if aff == "BLOB" and not declared:
        return True
    if pa.types.is_null(t):
        return True
    if pa.types.is_boolean(t):
        return aff in ("INTEGER", "NUMERIC", "REAL")
    if pa.types.is_integer(t):
        width = t.bit_width + (1 if pa.types.is_unsigned_integer(t) else 0)
        return (aff in ("INTEGER", "NUMERIC") and width <= 64) or (aff == "REAL" and width <= 32)
    if pa.types.is_floating(t):
        return aff in ("REAL", "NUMERIC")
    if pa.types.is_decimal(t):
        return aff == "TEXT" or (aff in ("NUMERIC", "REAL") and t.precision <= SQLITE_DIGITS)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return aff in ("TEXT", "BLOB")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return aff == "BLOB"
    return False


SQLITE_DIGITS = 15
"""Significant digits SQLite keeps of a number text it converts to REAL (NUMERIC affinity)."""


BackendKind = Literal["postgres", "sqlite"]
"""The database a declared column type belongs to: the same name means different types in each
(``REAL`` is a 32-bit float in PostgreSQL and a 64-bit double in SQLite)."""


@overload
def arrow_of(sql_type: str, backend: Literal["postgres"]) -> pa.DataType: ...
@overload
def arrow_of(sql_type: str, backend: Literal["sqlite"]) -> pa.DataType | None: ...
@overload
def arrow_of(sql_type: str, backend: BackendKind) -> pa.DataType | None: ...
def arrow_of(sql_type: str, backend: BackendKind) -> pa.DataType | None:
    """The Arrow type a column of ``backend`` reads back as, from its declared type.

    PostgreSQL: the type ``format_type`` names (``real`` is float32). SQLite: the declared
    type's affinity (https://sqlite.org/datatype3.html#affinity_name_examples) with the names
    Rewind creates for what SQLite has no class for; None when the declaration fixes no type
    (no type, ``NUMERIC`` without precision): such a column is read as its values come.
    """
    return sqlite_arrow_of(sql_type) if backend == "sqlite" else pg_arrow_of(sql_type)


def pg_arrow_of(sql_type: str) -> pa.DataType:
    """The Arrow type a PostgreSQL column (``format_type``'s name) reads back as."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    base = base_type(sql_type)
    simple: dict[str, pa.DataType] = {
        "boolean": pa.bool_(),
        "smallint": pa.int16(),
        "integer": pa.int32(),
        "bigint": pa.int64(),
        "real": pa.float32(),
        "double precision": pa.float64(),
        "bytea": pa.binary(),
        "date": pa.date32(),
        "timestamp with time zone": pa.timestamp("us", tz="UTC"),
        "timestamp without time zone": pa.timestamp("us"),
        "time without time zone": pa.time64("us"),
    }
    if base in simple:
        return simple[base]
    if base in ("numeric", "decimal"):
        mod = type_modifiers(sql_type)
        if mod is not None and 0 < mod[0] <= 38:
            return pa.decimal128(mod[0], mod[1])
    return pa.string()


def sqlite_arrow_of(declared: str) -> pa.DataType | None:
    """The Arrow type a SQLite column reads back as (see :func:`arrow_of`).

    By affinity: ``INT`` anywhere is a 64-bit integer, ``CHAR``/``CLOB``/``TEXT`` text,
    ``BLOB`` bytes, ``REAL``/``FLOA``/``DOUB`` a 64-bit double. Of the NUMERIC rest, the
    names the sink creates (``BOOLEAN``, ``DATE``, ``TIMESTAMP``/``DATETIME``, ``TIME``,
    ``NUMERIC(p,s)``) read as their type; any other is None.
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    affinity = sqlite_affinity(declared)
    d = declared.upper()
    if affinity == "INTEGER":
        return pa.int64()
    if affinity == "TEXT":
        return pa.string()
    if affinity == "REAL":
        return pa.float64()
    if affinity == "BLOB":
        return pa.binary() if d else None
    if "BOOL" in d:
        return pa.bool_()
    if "TIMESTAMP" in d or "DATETIME" in d:
        return pa.timestamp("us", tz="UTC")
    if "DATE" in d:
        return pa.date32()
    if "TIME" in d:
        return pa.time64("us")
    if base_type(declared) in ("numeric", "decimal"):
        mod = type_modifiers(declared)
        if mod is not None and 0 < mod[0] <= 38:
            return pa.decimal128(mod[0], mod[1])
    return None


def from_text(text: pa.Array, t: pa.DataType) -> pa.Array:
    """Text as SQLite keeps it (ISO-8601, with or without a zone) to ``t``."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if pa.types.is_timestamp(t) and t.tz:
        # naive text is UTC (as written); a nanosecond column (pandas' unit) was written with 9
        # digits, which Arrow parses only as nanoseconds
        for unit in dict.fromkeys((t.unit, "ns")):
            try:
                return text.cast(pa.timestamp(unit)).cast(t, safe=False)
            except pa.ArrowInvalid:
                continue
        return text.cast(t)
    return text.cast(t)
