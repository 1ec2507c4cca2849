"""Does the output fit an Avro schema? The plan-time gate of ``sink.kafka.encode: avro``.

Output columns map to the fields of the writer schema (a record) by name. The rules, checked
before anything is produced, each refused in one line naming the column, the field and both
types:

* every output column (lineage aside: it goes to headers) has a field of its name;
* a field without a column has a default, which every record then carries;
* a column fits its field when the column's own Avro type is the field's type or promotes to
  it under Avro's resolution rules (int → long → float → double, string → bytes): an
  ``int64`` column does not fit an ``int`` field, an ``int32`` column fits a ``long`` one.
  Timestamps fit ``timestamp-*``/``local-timestamp-*`` longs, dates ``date`` ints, times
  ``time-*``, decimals a ``decimal`` of the same scale and at least their precision, strings
  an ``enum`` (each value is checked when it is written), lists an ``array``, structs a
  ``record`` (by the same rules, recursively), maps with string keys a ``map``;
* a union fits when one of its branches does; a column that may hold nulls needs ``null``
  among the branches. Columns from pandas are all nullable, so the plan cannot know that a
  column holds no null: for a field without ``null``, a null is refused when the commit
  checks its files, before any record of the commit is produced.

:func:`plan_fields` returns one :class:`FieldCodec` per field, in the schema's order (the
order of the binary encoding), which :mod:`rewind.sinks.kafka.avro_values` encodes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.sinks.kafka.exceptions import KafkaSinkError

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.translate.avro_schemas import WriterSchema

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROMOTES = {
    "int": ("int", "long", "float", "double"),
    "long": ("long", "float", "double"),
    "float": ("float", "double"),
    "double": ("double",),
    "string": ("string", "bytes"),
    "bytes": ("bytes",),
    "boolean": ("boolean",),
}
"""A value of the key's type may be written to a field of these types (Avro's promotions)."""


class AvroSchemaMismatch(KafkaSinkError):
    """The output does not fit the writer schema; nothing is produced."""


@dataclass(frozen=True)
class FieldCodec:
    """How one field of the writer schema is written.

    ``kind`` is the vectorized encoding of the value branch (``long``, ``int``, ``float``,
    ``double``, ``boolean``, ``string``, ``bytes``, ``enum``, ``fixed``), or ``generic``: the
    field's whole type written by fastavro value by value (nested types, decimals).
    """

    name: str
    column: str | None
    avro: Any
    """The field's type with named types expanded (a union stays a list)."""
    kind: str = "generic"
    branch: int | None = None
    """Index of the value branch when the type is a union."""
    null_branch: int | None = None
    """Index of ``null`` when the type is a union that has it."""
    logical: str | None = None
    symbols: tuple[str, ...] = ()
    size: int | None = None
    default: bytes | None = None
    """The encoded default, for a field without a column."""
    arrow: str = ""
    """The column's Arrow type, for messages."""

    @property
    def nullable(self) -> bool:
        return self.null_branch is not None or self.avro == "null"


def type_text(avro: Any) -> str:
    """A short text of an Avro type for messages: ``long``, ``["null","string"]``, ``array<int>``."""
    if isinstance(avro, list):
        return "[" + ",".join(type_text(b) for b in avro) + "]"
    if isinstance(avro, dict):
        kind = avro.get("type")
        if avro.get("logicalType"):
            return f"{kind} ({avro['logicalType']})"
        if kind == "array":
            return f"array<{type_text(avro.get('items'))}>"
        if kind == "map":
            return f"map<{type_text(avro.get('values'))}>"
        if kind in ("record", "enum", "fixed"):
            return f"{kind} {avro.get('name')}"
        return type_text(kind)
    return str(avro)


# -- named types ----------------------------------------------------------------------------


def _full_name(node: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
    name = str(node.get("name"))
    if "." in name:
        return name, name.rsplit(".", 1)[0]
    space = node.get("namespace", namespace) or None
    return (f"{space}.{name}" if space else name), space


_IN_PROGRESS: Any = object()


def expand(avro: Any, names: dict[str, Any] | None = None, namespace: str | None = None) -> Any:
    """``avro`` with every reference to a named type replaced by its definition, and every
    definition named by its full name (so a part of the schema keeps its meaning on its own).

    A recursive type (a record that holds itself) cannot be expanded and is refused.
    """
    names = {} if names is None else names
    if isinstance(avro, str):
        if avro in PRIMITIVES:
            return avro
        found = names.get(f"{namespace}.{avro}") if namespace and "." not in avro else None
        found = found if found is not None else names.get(avro)
        if found is None:
            raise AvroSchemaMismatch(
                f"sink.kafka: the writer schema names type {avro}, which it never defines"
            )
        if found is _IN_PROGRESS:
            raise AvroSchemaMismatch(
                f"sink.kafka: the writer schema's type {avro} contains itself; "
                "recursive types are not supported"
            )
        return found
    if isinstance(avro, list):
        return [expand(b, names, namespace) for b in avro]
    if not isinstance(avro, dict):
        return avro
    kind = avro.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        full, space = _full_name(avro, namespace)
        out = {k: v for k, v in avro.items() if k != "namespace"}
        out["name"] = full
        if kind in ("record", "error"):
            names[full] = _IN_PROGRESS
            out["fields"] = [
                {**f, "type": expand(f.get("type"), names, space)} for f in avro.get("fields", [])
            ]
        names[full] = out
        return out
    if kind == "array":
        return {**avro, "items": expand(avro.get("items"), names, namespace)}
    if kind == "map":
        return {**avro, "values": expand(avro.get("values"), names, namespace)}
    if isinstance(kind, list) or (isinstance(kind, dict) and "logicalType" not in avro):
        return expand(kind, names, namespace)  # {"type": [...]} or {"type": {...}}
    if isinstance(kind, str) and kind not in PRIMITIVES:
        return expand(kind, names, namespace)  # {"type": "com.acme.Money"}
    return avro


def standalone(expanded: Any, seen: set[str] | None = None) -> Any:
    """An expanded type as a schema fastavro parses on its own: each named type is defined
    once, where it first occurs, and referred to by its full name after that."""
    seen = set() if seen is None else seen
    if isinstance(expanded, list):
        return [standalone(b, seen) for b in expanded]
    if not isinstance(expanded, dict):
        return expanded
    kind = expanded.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        if expanded["name"] in seen:
            return expanded["name"]
        seen.add(expanded["name"])
        if kind in ("record", "error"):
            fields = [{**f, "type": standalone(f["type"], seen)} for f in expanded.get("fields", [])]
            return {**expanded, "fields": fields}
        return expanded
    if kind == "array":
        return {**expanded, "items": standalone(expanded["items"], seen)}
    if kind == "map":
        return {**expanded, "values": standalone(expanded["values"], seen)}
    return expanded


# -- Arrow → Avro ------------------------------------------------------------------------------


def _primitive_of(kind: pa.DataType) -> str | None:
    """The Avro type a column of ``kind`` is written as without logical types, or None."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    t = pa.types
    if t.is_boolean(kind):
        return "boolean"
    if t.is_int8(kind) or t.is_int16(kind) or t.is_int32(kind) or t.is_uint8(kind) or t.is_uint16(kind):
        return "int"
    if t.is_int64(kind) or t.is_uint32(kind):
        return "long"
    if t.is_float16(kind) or t.is_float32(kind):
        return "float"
    if t.is_float64(kind):
        return "double"
    if t.is_string(kind) or t.is_large_string(kind):
        return "string"
    if t.is_binary(kind) or t.is_large_binary(kind) or t.is_fixed_size_binary(kind):
        return "bytes"
    return None


def _branches(avro: Any) -> list[Any]:
    return list(avro) if isinstance(avro, list) else [avro]


def _value_kind(kind: pa.DataType, avro: Any) -> tuple[str, str | None] | None:
    """``(codec kind, logical type)`` when a column of ``kind`` fits the (non-union) ``avro``."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(kind):
        return _value_kind(kind.value_type, avro)
    base = avro.get("type") if isinstance(avro, dict) else avro
    logical = avro.get("logicalType") if isinstance(avro, dict) else None
    if t.is_timestamp(kind):
        ok = logical in (
            "timestamp-millis",
            "timestamp-micros",
            "local-timestamp-millis",
            "local-timestamp-micros",
        )
        return ("long", logical) if ok and base == "long" else None
    if t.is_date(kind):
        return ("int", "date") if logical == "date" and base == "int" else None
    if t.is_time(kind):
        if logical == "time-millis" and base == "int":
            return "int", logical
        return ("long", logical) if logical == "time-micros" and base == "long" else None
    if t.is_decimal(kind):
        if logical != "decimal" or base not in ("bytes", "fixed"):
            return None
        fits = avro.get("scale", 0) == kind.scale and avro.get("precision", 0) >= kind.precision
        return ("generic", logical) if fits else None
    if base == "enum":
        return ("enum", None) if (t.is_string(kind) or t.is_large_string(kind)) else None
    if base == "fixed":
        size = avro.get("size")
        if t.is_fixed_size_binary(kind):
            return ("fixed", None) if kind.byte_width == size else None
        return ("fixed", None) if (t.is_binary(kind) or t.is_large_binary(kind)) else None
    if t.is_list(kind) or t.is_large_list(kind):
        if base != "array":
            return None
        inner = _fit_type(kind.value_type, avro.get("items"))
        return ("generic", None) if inner is None else None
    if t.is_map(kind):
        if base != "map" or not (t.is_string(kind.key_type) or t.is_large_string(kind.key_type)):
            return None
        inner = _fit_type(kind.item_type, avro.get("values"))
        return ("generic", None) if inner is None else None
    if t.is_struct(kind):
        if base not in ("record", "error"):
            return None
        return ("generic", None) if _struct_misfit(kind, avro) is None else None
    if logical in (
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    ):
        return None  # a number is not a time: cast the column to a timestamp
    if logical in ("date", "time-millis", "time-micros", "decimal"):
        return None
    own = _primitive_of(kind)
    if own is None or not isinstance(base, str) or base not in _PROMOTES.get(own, ()):
        return None
    return base, logical


def _fit_type(kind: pa.DataType, avro: Any) -> str | None:
    """None when values of ``kind`` fit ``avro``, else why not (nulls are checked per value)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    branches = _branches(avro)
    if pa.types.is_null(kind):
        return None if "null" in branches else "the column holds only nulls and the field has no null"
    if any(_value_kind(kind, b) is not None for b in branches if b != "null"):
        return None
    return "types differ"


def _struct_misfit(kind: pa.StructType, record: dict[str, Any]) -> str | None:
    fields = {f["name"]: f for f in record.get("fields", [])}
    for i in range(kind.num_fields):
        child = kind.field(i)
        if child.name not in fields:
            return f"struct field {child.name} has no field in record {record.get('name')}"
        if _fit_type(child.type, fields[child.name]["type"]) is not None:
            return f"struct field {child.name} does not fit"
    names = {kind.field(i).name for i in range(kind.num_fields)}
    missing = [n for n, f in fields.items() if n not in names and "default" not in f]
    return f"record field {missing[0]} has no struct field and no default" if missing else None


# -- the plan -------------------------------------------------------------------------------


def plan_fields(schema: pa.Schema, columns: list[str], writer: WriterSchema) -> list[FieldCodec]:
    """One codec per field of ``writer`` in its order; raises :class:`AvroSchemaMismatch`."""
    record = expand(writer.schema)
    if not isinstance(record, dict) or record.get("type") not in ("record", "error"):
        raise AvroSchemaMismatch(
            f"sink.kafka: the writer schema ({writer.where}) is a {type_text(record)}, not a record; "
            "output rows need a record of named fields"
        )
    fields = record.get("fields", [])
    by_name = {f["name"]: f for f in fields}
    extra = [c for c in columns if c not in by_name]
    if extra:
        have = ", ".join(f["name"] for f in fields)
        raise AvroSchemaMismatch(
            f"sink.kafka: output column {extra[0]} ({schema.field(extra[0]).type}) has no field in the "
            f"writer schema ({writer.where}; fields: {have}); drop the column in the translate or use a "
            "schema that has it"
        )
    return [_codec(schema, columns, f, writer) for f in fields]


def _codec(
    schema: pa.Schema, columns: list[str], avro_field: dict[str, Any], writer: WriterSchema
) -> FieldCodec:
    name = avro_field["name"]
    avro = avro_field["type"]
    if name not in columns:
        if "default" not in avro_field:
            raise AvroSchemaMismatch(
                f"sink.kafka: Avro field {name} ({type_text(avro)}) of the writer schema ({writer.where}) "
                "has no output column and no default; add the column to the output or a default to the field"
            )
        return FieldCodec(
            name, None, avro, default=_encode_default(avro, avro_field["default"], name, writer)
        )
    column = schema.field(name)
    kind = column.type
    branches = _branches(avro)
    null_branch = branches.index("null") if "null" in branches else None
    if _fit_type(kind, avro) is not None:
        raise AvroSchemaMismatch(
            f"sink.kafka: output column {name} ({kind}) does not fit Avro field {name} ({type_text(avro)}) "
            f"of the writer schema ({writer.where}); cast the column in the translate or write with a "
            "schema whose field takes it"
        )
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if pa.types.is_null(kind):
        return FieldCodec(
            name, name, avro, kind="null", branch=null_branch, null_branch=null_branch, arrow=str(kind)
        )
    for i, branch in enumerate(branches):
        if branch == "null":
            continue
        found = _value_kind(kind, branch)
        if found is None:
            continue
        codec_kind, logical = found
        if codec_kind == "generic":
            return FieldCodec(name, name, avro, null_branch=null_branch, logical=logical, arrow=str(kind))
        return FieldCodec(
            name,
            name,
            avro,
            kind=codec_kind,
            branch=i if isinstance(avro, list) else None,
            null_branch=null_branch,
            logical=logical,
            symbols=tuple(branch.get("symbols", ())) if codec_kind == "enum" else (),
            size=branch.get("size") if codec_kind == "fixed" else None,
            arrow=str(kind),
        )
    raise AssertionError("unreachable: the type fits one branch")  # pragma: no cover


def _encode_default(avro: Any, default: Any, name: str, writer: WriterSchema) -> bytes:
    """The binary encoding of a field's default (a union's default is of its first branch)."""
    # lazy: avoids fastavro at import
    import fastavro

    value = _default_value(avro[0] if isinstance(avro, list) else avro, default)
    try:
        parsed = fastavro.parse_schema(
            {"type": "record", "name": "rewind_default", "fields": [{"name": "v", "type": standalone(avro)}]},
            _force=True,
        )
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {"v": value})
    except Exception as e:
        raise AvroSchemaMismatch(
            f"sink.kafka: the default of Avro field {name} ({type_text(avro)}) of the writer schema "
            f"({writer.where}) cannot be written ({type(e).__name__}: {e}); fix the default"
        ) from e
    return out.getvalue()


def _default_value(avro: Any, default: Any) -> Any:
    """A default as JSON gives it → the Python value fastavro writes (bytes are latin-1 text)."""
    base = avro.get("type") if isinstance(avro, dict) else avro
    if base in ("bytes", "fixed") and isinstance(default, str):
        return default.encode("latin-1")
    if base in ("record", "error") and isinstance(default, dict):
        kinds = {f["name"]: f["type"] for f in avro.get("fields", [])}
        return {k: _default_value(kinds.get(k), v) for k, v in default.items()}
    if base == "array" and isinstance(default, list):
        return [_default_value(avro.get("items"), v) for v in default]
    if base == "map" and isinstance(default, dict):
        return {k: _default_value(avro.get("values"), v) for k, v in default.items()}
    return default
