"""The JSON decoder: values parsed by orjson (or the stdlib), columns typed by ``decode.schema``."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rewind.core.columns import (
    RESERVED_PREFIXES,
    is_reserved,
)
from rewind.translate.decoder import (
    TOMBSTONE_REASON,
    Decoded,
    Decoder,
    NullPolicy,
    as_batch,
    describe_value,
    events_frame,
    infer_column,
    null_policy,
    object_array,
)
from rewind.translate.exceptions import DecoderConfigError
from rewind.translate.failures import Failure
from rewind.translate.json_bulk import FLOAT32_OVERFLOW, bulk_decode

_STDLIB_JSON_DECODE = json.JSONDecoder().decode
_NOT_PARSED = object()
# orjson turns an integer beyond 64 bits into a float (silently losing digits) where the stdlib
# keeps it exact; such a value has a run of at least 19 digits (-9223372036854775809 is the
# shortest), so any value with one is left to the stdlib (a long digit run in a string or a
# long fraction merely takes the slow path).
_LONG_DIGITS = re.compile(rb"\d{19}").search


def _never(raw: bytes) -> None:
    return None


def _has_long_digits(batch: pa.RecordBatch) -> bool:
    """Whether any value of the batch may hold a run of 19 digits (NumPy over the data buffer).

    The buffer holds the values back to back, so a run across two values is a false alarm
    (the batch merely takes the per-value check), never a miss. Runs are found by doubling:
    after the step for k, ``run[i]`` says the k bytes from i are all digits; about 20 ms for
    17 MB, where a regex takes 300 ms.
    """
    buffers = batch.column("value").buffers()
    data = buffers[2] if len(buffers) > 2 else None
    if data is None or data.size < 19:
        return False
    raw = np.frombuffer(data, dtype=np.uint8)
    run = np.subtract(raw, 48, dtype=np.uint8) < 10  # b"0".."9" (others wrap around to >= 10)
    for shift in (1, 2, 4, 8):  # runs of 2, 4, 8, 16
        run = run[:-shift] & run[shift:]
        if not run.any():
            return False
    return bool((run[:-3] & run[3:]).any())  # 16 + 3 = 19


def _fast_json_loads() -> Callable[[bytes], Any] | None:
    """orjson's ``loads`` when installed (about 3x faster than the stdlib here), else None.

    It only ever accelerates, never changes a result: a value orjson refuses is parsed again by
    the stdlib (orjson refuses NaN, infinities, lone surrogates, a BOM, which the stdlib reads or
    words differently), and values where orjson would lose integer digits never reach it. So
    what is accepted, what it decodes to and every quarantine reason are the stdlib's, with or
    without orjson installed.
    """
    try:
        import orjson  # lazy: optional here, the stdlib decodes without it
    except ImportError:
        return None
    return orjson.loads


def kafka_values(batch: pa.RecordBatch) -> list[bytes | None]:
    """The value bytes as a list (via NumPy: about 4x faster than ``to_pylist`` for binaries)."""
    return batch.column("value").to_numpy(zero_copy_only=False).tolist()


_JSON_KINDS = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _to_string(v: Any) -> str:
    if type(v) is str:
        return v
    if type(v) in (int, float):
        return str(v)
    raise TypeError


def _int_caster(bits: int) -> Callable[[Any], int]:
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1)

    def cast(v: Any) -> int:
        t = type(v)
        if t is int:
            out = v
        elif t is float and v.is_integer():
            out = int(v)
        elif t is str:
            out = int(v.strip())
        else:
            raise TypeError
        if not lo <= out < hi:
            raise OverflowError
        return out

    return cast


def _to_float(v: Any) -> float:
    if type(v) in (int, float, str):
        return float(v)
    raise TypeError


def _to_float32(v: Any) -> float:
    out = _to_float(v)
    if abs(out) >= FLOAT32_OVERFLOW and math.isfinite(out):
        raise OverflowError  # it would be stored as infinity: a cast failure, not a lost value
    return out


def _to_bool(v: Any) -> bool:
    if type(v) is bool:
        return v
    if type(v) is str and v.lower() in ("true", "false"):
        return v.lower() == "true"
    raise TypeError


def _to_timestamp(v: Any) -> datetime:
    """ISO-8601 text (naive means UTC) or epoch milliseconds, the Kafka convention."""
    if type(v) is str:
        ts = datetime.fromisoformat(v)
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    if type(v) in (int, float):
        return datetime.fromtimestamp(v / 1000.0, tz=UTC)
    raise TypeError


def _to_date(v: Any) -> date:
    if type(v) is str:
        return date.fromisoformat(v)
    raise TypeError


def _keep(v: Any) -> Any:
    return v


# canonical type → (caster, pandas dtype of the column)
_JSON_TYPES: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "string": (_to_string, object),
    "int": (_int_caster(32), "Int32"),
    "long": (_int_caster(64), "Int64"),
    "float": (_to_float32, "float32"),
    "double": (_to_float, "float64"),
    "boolean": (_to_bool, "boolean"),
    "timestamp": (_to_timestamp, "datetime64[us, UTC]"),
    "date": (_to_date, object),
    "json": (_keep, object),
}
_TYPE_ALIASES = {
    "str": "string",
    "integer": "int",
    "int32": "int",
    "bigint": "long",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    "bool": "boolean",
    "any": "json",
    "object": "json",
}
JSON_TYPE_NAMES: tuple[str, ...] = tuple(_JSON_TYPES) + tuple(_TYPE_ALIASES)


def typed_column(values: list[Any], dtype: Any, flat: bool = False) -> Any:
    """A column of ``dtype`` from cast values; ``flat`` says no value is a list or dict."""
    if dtype is object:
        return np.array(values, dtype=object) if flat else object_array(values)
    if dtype in ("float32", "float64"):
        return np.array([np.nan if v is None else v for v in values], dtype=dtype)
    return pd.array(values, dtype=dtype)


class JsonDecoder(Decoder):
    """JSON objects, one per record value; their top-level keys become columns.

    ``schema`` (field → type name, see :data:`JSON_TYPE_NAMES`) fixes the columns and their
    types: fields outside it are ignored, a missing field is null, and a record whose field
    cannot be cast is quarantined naming the field. Without a schema the columns are the union
    of the keys seen in the batch, typed from the values (nested objects stay dicts).
    ``null_value`` says what a tombstone (a record with a null value) is: quarantined, or
    skipped and counted as filtered.
    """

    def __init__(
        self, schema: Mapping[str, str] | None = None, null_value: NullPolicy = "quarantine"
    ) -> None:
        self.null_value = null_policy(null_value, ("quarantine", "skip"), "decode (json)")
        self.schema: dict[str, str] | None = None
        if schema is not None:
            resolved: dict[str, str] = {}
            for name, type_name in schema.items():
                if is_reserved(name):
                    raise DecoderConfigError(
                        f"decode.schema.{name}: the prefixes {', '.join(RESERVED_PREFIXES)} are reserved "
                        "for Rewind's columns; read such fields with the raw decoder and parse them in the "
                        "translate"
                    )
                canonical = _TYPE_ALIASES.get(str(type_name).lower(), str(type_name).lower())
                if canonical not in _JSON_TYPES:
                    raise DecoderConfigError(
                        f"decode.schema.{name}: unknown type {type_name!r}; "
                        f"use one of {', '.join(_JSON_TYPES)}"
                    )
                resolved[name] = canonical
            self.schema = resolved

    def field_dtypes(self) -> dict[str, Any]:
        if self.schema is None:
            return {}
        return {name: _JSON_TYPES[t][1] for name, t in self.schema.items()}

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        batch = as_batch(batch)
        if not _has_long_digits(batch):  # Arrow would round an integer beyond 64 bits
            bulk = bulk_decode(batch, self.schema, self.null_value == "quarantine", cast_columns)
            if bulk is not None:
                return bulk
        return self.decode_each(batch)

    def decode_each(self, batch: pa.RecordBatch) -> Decoded:
        """Decode record by record (the path for batches the bulk reader cannot take)."""
        batch = as_batch(batch)
        failures: list[Failure] = []
        skipped: list[int] = []
        rows: list[int] = []
        objs: list[dict[str, Any]] = []
        fast = _fast_json_loads()
        # one scan of the whole value buffer usually clears the batch; else check value by value
        long_digits = _LONG_DIGITS if fast is not None and _has_long_digits(batch) else _never
        decode_json = _STDLIB_JSON_DECODE
        quarantine_nulls = self.null_value == "quarantine"
        for i, raw in enumerate(kafka_values(batch)):
            if raw is None:
                if quarantine_nulls:
                    failures.append(Failure(i, "decode", TOMBSTONE_REASON, "tombstone"))
                else:
                    skipped.append(i)
                continue
            obj = _NOT_PARSED
            if fast is not None and not long_digits(raw):
                try:
                    obj = fast(raw)
                except Exception:  # orjson is stricter than the stdlib in places: ask the stdlib
                    obj = _NOT_PARSED
            if obj is _NOT_PARSED:
                try:
                    obj = decode_json(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    failures.append(
                        Failure(i, "decode", f"invalid UTF-8: {e.reason} at byte {e.start}", "invalid UTF-8")
                    )
                    continue
                except json.JSONDecodeError as e:
                    failures.append(
                        Failure(i, "decode", f"invalid JSON: {e.msg} at char {e.pos}", "invalid JSON")
                    )
                    continue
                except RecursionError:
                    failures.append(Failure(i, "decode", "invalid JSON: nested too deeply", "invalid JSON"))
                    continue
            if type(obj) is not dict:
                kind = _JSON_KINDS.get(type(obj), type(obj).__name__)
                failures.append(
                    Failure(
                        i, "decode", f"JSON value is {kind}, expected an object", "JSON value not an object"
                    )
                )
                continue
            rows.append(i)
            objs.append(obj)

        if self.schema is None:
            fields, rows, objs = self._schemaless_columns(rows, objs, failures)
        else:
            fields, rows = self._schema_columns(self.schema, rows, objs, failures)
        failures.sort(key=lambda f: f.row)
        return Decoded(events_frame(fields, batch, rows), failures, skipped)

    @staticmethod
    def _schemaless_columns(
        rows: list[int], objs: list[dict[str, Any]], failures: list[Failure]
    ) -> tuple[dict[str, Any], list[int], list[dict[str, Any]]]:
        if not objs:
            return {}, rows, objs
        first = objs[0].keys()
        if all(o.keys() == first for o in objs):
            names = list(first)
        else:  # key order of first appearance
            names = list(dict.fromkeys(k for o in objs for k in o))
        reserved = [n for n in names if is_reserved(n)]
        if reserved:
            keep_rows, keep_objs = [], []
            for r, o in zip(rows, objs, strict=True):
                bad = next((n for n in reserved if n in o), None)
                if bad is None:
                    keep_rows.append(r)
                    keep_objs.append(o)
                else:
                    failures.append(
                        Failure(
                            r,
                            "decode",
                            f"field {bad!r} has a reserved name (prefixes {', '.join(RESERVED_PREFIXES)})",
                            "reserved field name",
                        )
                    )
            rows, objs = keep_rows, keep_objs
            names = list(dict.fromkeys(k for o in objs for k in o))
        fields = {n: infer_column([o.get(n) for o in objs]) for n in names}
        return fields, rows, objs

    @staticmethod
    def _schema_columns(
        schema: dict[str, str], rows: list[int], objs: list[dict[str, Any]], failures: list[Failure]
    ) -> tuple[dict[str, Any], list[int]]:
        return cast_columns(schema, rows, lambda name: [o.get(name) for o in objs], failures, {})


def cast_columns(
    schema: dict[str, str],
    rows: list[int],
    values_of: Callable[[str], list[Any]],
    failures: list[Failure],
    ready: Mapping[str, Any],
) -> tuple[dict[str, Any], list[int]]:
    """The schema's columns cast value by value, except those already typed in ``ready``.

    A record whose field cannot be cast is a failure naming its first failing field (schema
    order) and is dropped from every column; ``values_of(name)`` gives a field's values in
    record order (None where missing).
    """
    raw: dict[str, list[Any]] = {}
    bad: dict[int, Failure] = {}  # position in the batch's records → first failing field
    for name, type_name in schema.items():
        if name in ready:
            continue
        cast = _JSON_TYPES[type_name][0]
        values = values_of(name)
        try:
            raw[name] = [None if v is None else cast(v) for v in values]
            continue
        except Exception:
            pass
        out: list[Any] = []
        for j, v in enumerate(values):
            if v is None:
                out.append(None)
                continue
            try:
                out.append(cast(v))
            except Exception:
                out.append(None)
                if j not in bad:
                    bad[j] = Failure(
                        rows[j],
                        "decode",
                        f"field {name!r}: cannot cast {describe_value(v)} to {type_name}",
                        f"cast failed: {name}",
                    )
        raw[name] = out
    typed = dict(ready)
    if bad:
        failures.extend(bad.values())
        keep = [j for j in range(len(rows)) if j not in bad]
        rows = [rows[j] for j in keep]
        raw = {name: [col[j] for j in keep] for name, col in raw.items()}
        take = np.asarray(keep, dtype=np.int64)
        typed = {name: col[take] for name, col in typed.items()}
    fields = {
        name: typed[name] if name in typed else typed_column(raw[name], _JSON_TYPES[t][1], flat=t != "json")
        for name, t in schema.items()
    }
    return fields, rows
