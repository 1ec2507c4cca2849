"""Decoders: a Kafka Arrow batch → a pandas frame of decoded events, plus the records that failed.

Every decoder returns one row per decodable record with the translator input columns
(``_rewind_row``, ``_src_topic``, ``_src_partition``, ``_src_offset``, ``_src_timestamp``,
``_src_key``) after the decoded fields; its index is named ``_rewind_index`` and holds the same
values as ``_rewind_row``. A record that cannot be decoded is a :class:`Failure` with stage
``decode``; a tombstone is a failure or, under ``null_value="skip"``, a *skipped* record that
the caller counts as filtered. Problems that are not about one record (a missing schema
folder, an unreachable registry) raise and fail the task.

Columns are built once per batch from Python lists (one comprehension per column), never by
appending rows: this loop is what bounds a task's decode rate. JSON is parsed by orjson when it
is installed and by the stdlib otherwise, with identical results (see ``_fast_json_loads``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from rewind.core.arrow import kafka_record_schema
from rewind.core.columns import (
    INPUT_COLUMNS,
    RESERVED_PREFIXES,
    ROW,
    ROW_INDEX,
    SRC_KEY,
    SRC_OFFSET,
    SRC_PARTITION,
    SRC_TIMESTAMP,
    SRC_TOPIC,
    is_reserved,
)
from rewind.translate.exceptions import DecoderConfigError, SchemaRegistryUnavailable, SchemaSourceError
from rewind.translate.failures import Failure

log = logging.getLogger(__name__)

NullPolicy = Literal["quarantine", "skip"]
RawNullPolicy = Literal["keep", "quarantine", "skip"]

TOMBSTONE_REASON = "null value (tombstone)"


@dataclass(slots=True)
class Decoded:
    """What a decoder made of one batch.

    ``events`` holds the decoded records; ``failures`` the records to quarantine;
    ``skipped`` the positions of records dropped on purpose (counted as filtered).
    """

    events: pd.DataFrame
    failures: list[Failure] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


class Decoder(ABC):
    """Turns the ``value`` (and ``key``) bytes of a Kafka batch into typed columns."""

    @abstractmethod
    def decode(self, batch: pa.RecordBatch) -> Decoded:
        """Decode every record of ``batch``; never raises for a bad record."""

    @abstractmethod
    def field_dtypes(self) -> dict[str, Any]:
        """The decoded columns known without data, with their pandas dtypes.

        Schemaless JSON knows none; the frame :meth:`empty_events` builds from this is what a
        translate function is called on to learn its output schema at plan time.
        """

    def empty_events(self) -> pd.DataFrame:
        """An empty events frame with the decoded columns and the input columns."""
        data: dict[str, Any] = {
            name: pd.array([], dtype=dtype) if dtype is not object else np.empty(0, dtype=object)
            for name, dtype in self.field_dtypes().items()
        }
        data.update(_input_columns(_empty_kafka_batch(), np.empty(0, dtype=np.int64)))
        return pd.DataFrame(data, index=pd.Index(np.empty(0, dtype=np.int64), name=ROW_INDEX))


# -- shared helpers ---------------------------------------------------------------------------


def _empty_kafka_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=kafka_record_schema(False))


def as_batch(data: pa.RecordBatch | pa.Table) -> pa.RecordBatch:
    """One record batch from a batch or a (possibly chunked) table."""
    if isinstance(data, pa.RecordBatch):
        return data
    combined = data.combine_chunks()
    batches = combined.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=data.schema)
    return batches[0]


def _input_columns(batch: pa.RecordBatch, rows: np.ndarray) -> dict[str, Any]:
    """The translator input columns for the records at ``rows`` (positions in ``batch``)."""
    sub = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows, type=pa.int64()))
    return {
        ROW: rows,
        SRC_TOPIC: sub.column("topic").to_numpy(zero_copy_only=False),
        SRC_PARTITION: sub.column("partition").to_numpy(zero_copy_only=False),
        SRC_OFFSET: sub.column("offset").to_numpy(zero_copy_only=False),
        SRC_TIMESTAMP: sub.column("timestamp").to_pandas().array,
        SRC_KEY: sub.column("key").to_numpy(zero_copy_only=False),
    }


def _events_frame(
    fields: Mapping[str, Any], batch: pa.RecordBatch, rows: Sequence[int] | np.ndarray
) -> pd.DataFrame:
    rows_arr = np.asarray(rows, dtype=np.int64)
    data: dict[str, Any] = dict(fields)
    data.update(_input_columns(batch, rows_arr))
    return pd.DataFrame(data, index=pd.Index(rows_arr, name=ROW_INDEX), copy=False)


def _object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise: lists and dicts must stay whole objects
        arr[i] = v
    return arr


def _infer_column(values: list[Any]) -> Any:
    """A typed column from the Python values of one JSON field (schemaless decode).

    Integers become nullable ``Int64`` and booleans nullable ``boolean`` whether or not this
    batch has a null, so a column's dtype does not depend on which batch a task saw; numbers
    mixing ints and floats become ``float64``; anything else (strings, nested objects, mixed
    types) stays a Python object column.
    """
    kinds = {type(v) for v in values}
    kinds.discard(type(None))
    try:
        if kinds == {int}:
            return pd.array(values, dtype="Int64")
        if kinds == {bool}:
            return pd.array(values, dtype="boolean")
        if kinds and kinds <= {int, float}:
            return np.array(values, dtype=np.float64)  # None → NaN
    except (OverflowError, TypeError, ValueError):
        pass  # an int beyond 64 bits: keep the exact Python value
    if kinds <= {str, type(None)}:
        return np.array(values, dtype=object)
    return _object_array(values)


def _null_policy(value: str, allowed: tuple[str, ...], where: str) -> Any:
    if value not in allowed:
        raise DecoderConfigError(f"{where}: null_value {value!r} is not one of {', '.join(allowed)}")
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- JSON -------------------------------------------------------------------------------------

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
        import orjson
    except ImportError:
        return None
    return orjson.loads


def _values(batch: pa.RecordBatch) -> list[bytes | None]:
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
    "float": (_to_float, "float32"),
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


def _typed_column(values: list[Any], dtype: Any, flat: bool = False) -> Any:
    """A column of ``dtype`` from cast values; ``flat`` says no value is a list or dict."""
    if dtype is object:
        return np.array(values, dtype=object) if flat else _object_array(values)
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
        self.null_value = _null_policy(null_value, ("quarantine", "skip"), "decode (json)")
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
        failures: list[Failure] = []
        skipped: list[int] = []
        rows: list[int] = []
        objs: list[dict[str, Any]] = []
        fast = _fast_json_loads()
        # one scan of the whole value buffer usually clears the batch; else check value by value
        long_digits = _LONG_DIGITS if fast is not None and _has_long_digits(batch) else _never
        decode_json = _STDLIB_JSON_DECODE
        quarantine_nulls = self.null_value == "quarantine"
        for i, raw in enumerate(_values(batch)):
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
        return Decoded(_events_frame(fields, batch, rows), failures, skipped)

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
        fields = {n: _infer_column([o.get(n) for o in objs]) for n in names}
        return fields, rows, objs

    @staticmethod
    def _schema_columns(
        schema: dict[str, str], rows: list[int], objs: list[dict[str, Any]], failures: list[Failure]
    ) -> tuple[dict[str, Any], list[int]]:
        raw: dict[str, list[Any]] = {}
        bad: dict[int, Failure] = {}  # position in objs → first failing field (schema order)
        for name, type_name in schema.items():
            cast = _JSON_TYPES[type_name][0]
            values = [o.get(name) for o in objs]
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
                            f"field {name!r}: cannot cast {_describe(v)} to {type_name}",
                            f"cast failed: {name}",
                        )
            raw[name] = out
        if bad:
            failures.extend(bad.values())
            keep = [j for j in range(len(objs)) if j not in bad]
            rows = [rows[j] for j in keep]
            raw = {name: [col[j] for j in keep] for name, col in raw.items()}
        fields = {
            name: _typed_column(raw[name], _JSON_TYPES[t][1], flat=t != "json") for name, t in schema.items()
        }
        return fields, rows


# -- raw --------------------------------------------------------------------------------------


class RawDecoder(Decoder):
    """No decoding: the value bytes become column ``value`` and the key bytes column ``key``.

    A tombstone is kept by default (a raw copy must carry deletes through compaction); it can
    also be quarantined or skipped.
    """

    def __init__(self, null_value: RawNullPolicy = "keep") -> None:
        self.null_value = _null_policy(null_value, ("keep", "quarantine", "skip"), "decode (raw)")

    def field_dtypes(self) -> dict[str, Any]:
        return {"key": object, "value": object}

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        batch = as_batch(batch)
        values = batch.column("value")
        if self.null_value == "keep" or values.null_count == 0:
            rows = np.arange(batch.num_rows, dtype=np.int64)
            return Decoded(self._frame(batch, rows))
        nulls = np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        null_rows = np.flatnonzero(nulls).tolist()
        rows = np.flatnonzero(~nulls).astype(np.int64)
        if self.null_value == "skip":
            return Decoded(self._frame(batch, rows), skipped=null_rows)
        return Decoded(
            self._frame(batch, rows), [Failure(i, "decode", TOMBSTONE_REASON, "tombstone") for i in null_rows]
        )

    @staticmethod
    def _frame(batch: pa.RecordBatch, rows: np.ndarray) -> pd.DataFrame:
        sub = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows, type=pa.int64()))
        fields = {
            "key": sub.column("key").to_numpy(zero_copy_only=False),
            "value": sub.column("value").to_numpy(zero_copy_only=False),
        }
        return _events_frame(fields, batch, rows)


# -- Avro -------------------------------------------------------------------------------------


class SchemaSource(ABC):
    """Where Avro schemas come from: writer schemas by id, and the reader ("latest") schema.

    Schemas are returned as parsed JSON (dict, list or str), not yet given to fastavro.
    Implementations do no I/O in ``__init__`` and are picklable, so a decoder built on the
    driver can be shipped to Spark tasks.
    """

    @abstractmethod
    def writer_schema(self, schema_id: int) -> Any | None:
        """The schema registered under ``schema_id``, or None if there is no such id.

        Raises :class:`SchemaSourceError` when the source itself cannot be read.
        """

    @abstractmethod
    def reader_schema(self) -> Any:
        """The schema every record is evolved to."""

    @abstractmethod
    def describe(self) -> str:
        """Where the schemas come from, for messages."""


def _load_avsc(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SchemaSourceError(
            f"Avro schema file {path}: cannot read it ({e}); fix or remove the file"
        ) from e


class LocalSchemaSource(SchemaSource):
    """A folder of ``<id>.avsc`` files; the reader schema is ``latest.avsc`` or an explicit file."""

    def __init__(
        self, folder: str | os.PathLike[str], reader_schema_path: str | os.PathLike[str] | None = None
    ):
        self.folder = Path(folder)
        self.reader_schema_path = Path(reader_schema_path) if reader_schema_path is not None else None
        self._cache: dict[int, Any | None] = {}

    def describe(self) -> str:
        return f"schema folder {self.folder}"

    def _check_folder(self) -> None:
        if not self.folder.is_dir():
            raise SchemaSourceError(
                f"Avro schema folder {self.folder} does not exist; check translate.avro.schema_dir"
            )

    def writer_schema(self, schema_id: int) -> Any | None:
        if schema_id not in self._cache:
            self._check_folder()
            path = self.folder / f"{schema_id}.avsc"
            self._cache[schema_id] = _load_avsc(path) if path.is_file() else None
        return self._cache[schema_id]

    def reader_schema(self) -> Any:
        path = self.reader_schema_path
        if path is None:
            self._check_folder()
            path = self.folder / "latest.avsc"
            if not path.is_file():
                raise SchemaSourceError(
                    f"no reader schema: put latest.avsc in {self.folder} or set translate.avro.reader_schema"
                )
        elif not path.is_file():
            raise SchemaSourceError(
                f"Avro reader schema {path} does not exist; check translate.avro.reader_schema"
            )
        return _load_avsc(path)


# One registry client per process and configuration: Spark workers fork, so a client made in a
# parent is never reused in a child (the pid is part of the key).
_REGISTRY_CLIENTS: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any] = {}
_REGISTRY_LOCK = threading.Lock()


def _registry_client(url: str, config: Mapping[str, Any]) -> Any:
    key = (os.getpid(), url, tuple(sorted((k, str(v)) for k, v in config.items())))
    with _REGISTRY_LOCK:
        client = _REGISTRY_CLIENTS.get(key)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as e:
                raise SchemaSourceError(
                    f"the schema registry client cannot be imported ({e}); install confluent-kafka's "
                    "registry dependencies: pip install attrs authlib httpx2 cachetools certifi"
                ) from e
            client = SchemaRegistryClient({**config, "url": url})
            _REGISTRY_CLIENTS[key] = client
        return client


class RegistrySchemaSource(SchemaSource):
    """A Confluent-compatible schema registry (confluent-kafka's ``SchemaRegistryClient``).

    Writer schemas are fetched by id; the reader schema is ``subject``'s latest version (or
    ``reader_version``). "Not found" for an id makes its records quarantined; any other failure
    (refused connection, timeout, 5xx, bad credentials) raises :class:`SchemaRegistryUnavailable`,
    failing the task rather than quarantining good records.
    """

    def __init__(
        self,
        url: str,
        subject: str | None = None,
        config: Mapping[str, Any] | None = None,
        reader_version: int | Literal["latest"] = "latest",
    ) -> None:
        self.url = url
        self.subject = subject
        self.config = dict(config or {})
        self.reader_version = reader_version
        self._cache: dict[int, Any | None] = {}

    def describe(self) -> str:
        return f"schema registry {self.url}"

    def _client(self) -> Any:
        return _registry_client(self.url, self.config)

    def writer_schema(self, schema_id: int) -> Any | None:
        if schema_id in self._cache:
            return self._cache[schema_id]
        from_registry = self._call(
            lambda: self._client().get_schema(schema_id), f"cannot fetch schema id {schema_id}"
        )
        if from_registry is None:
            self._cache[schema_id] = None
            return None
        schema_type = (from_registry.schema_type or "AVRO").upper()
        if schema_type != "AVRO":
            log.warning("schema id %d in %s is a %s schema, not Avro", schema_id, self.url, schema_type)
            self._cache[schema_id] = None
            return None
        if from_registry.references:
            raise SchemaSourceError(
                f"schema id {schema_id} in {self.url} uses schema references, which Rewind does not resolve; "
                "use a self-contained schema or a local schema folder"
            )
        schema = json.loads(from_registry.schema_str)
        self._cache[schema_id] = schema
        return schema

    def reader_schema(self) -> Any:
        if self.subject is None:
            raise SchemaSourceError(
                "no reader schema: set translate.avro.subject (its latest version is the reader schema) "
                "or translate.avro.reader_schema"
            )
        subject = self.subject
        version = self.reader_version
        what = f"cannot fetch the {version} version of subject {subject}"
        if version == "latest":
            registered = self._call(lambda: self._client().get_latest_version(subject), what)
        else:
            registered = self._call(lambda: self._client().get_version(subject, version), what)
        if registered is None:
            raise SchemaSourceError(
                f"schema registry at {self.url}: subject {subject} not found; check translate.avro.subject"
            )
        return json.loads(registered.schema.schema_str)

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one registry request: None for 'not found', :class:`SchemaRegistryUnavailable` otherwise."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn()
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                return None
            raise SchemaRegistryUnavailable(
                self.url, f"{what} (HTTP {e.http_status_code}: {e.error_message})"
            ) from e
        except SchemaSourceError:
            raise
        except Exception as e:  # transport errors of the HTTP client, timeouts, DNS
            raise SchemaRegistryUnavailable(self.url, f"{what} ({type(e).__name__}: {e})") from e


_AVRO_DTYPES: dict[str, Any] = {
    "int": "Int32",
    "long": "Int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": object,
}


def _avro_dtype(avro_type: Any) -> Any:
    """The pandas dtype of a reader-schema field: primitives (nullable or not), else objects."""
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        return _avro_dtype(branches[0]) if len(branches) == 1 else object
    if isinstance(avro_type, dict):
        logical = avro_type.get("logicalType")
        if logical in ("timestamp-millis", "timestamp-micros"):
            return "datetime64[us, UTC]"
        if logical is None and isinstance(avro_type.get("type"), str):
            return _AVRO_DTYPES.get(avro_type["type"], object)
        return object
    return _AVRO_DTYPES.get(avro_type, object)


def _avro_flat(avro_type: Any) -> bool:
    """True when the field's values are scalars (primitives, or a nullable primitive)."""
    if isinstance(avro_type, list):
        return all(_avro_flat(b) for b in avro_type)
    if isinstance(avro_type, dict):
        return avro_type.get("type") in _AVRO_DTYPES or avro_type.get("type") in ("enum", "fixed", "bytes")
    return avro_type in (*_AVRO_DTYPES, "null", "bytes")


@dataclass(slots=True)
class _Writer:
    schema_id: int
    parsed: Any
    reader: Any  # the parsed reader schema, or None when writer and reader are the same


class AvroDecoder(Decoder):
    """Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro binary body).

    Each record is read with its writer schema and evolved to the reader schema (the latest
    version, or ``reader_schema`` if given) by fastavro, so every row has the reader's fields.
    Per-record problems are quarantined: "no magic byte", "unknown schema id 42",
    "Avro decode failed: ..."; a schema source that cannot be reached raises.
    """

    def __init__(
        self,
        source: SchemaSource,
        reader_schema: Any | None = None,
        null_value: NullPolicy = "quarantine",
    ) -> None:
        self.source = source
        self.null_value = _null_policy(null_value, ("quarantine", "skip"), "decode (avro)")
        self._reader_json = reader_schema
        self._reader: Any | None = None
        self._fields: list[tuple[str, Any]] | None = None
        self._writers: dict[int, _Writer | None] = {}

    def _load_reader(self) -> tuple[Any, list[tuple[str, Any]]]:
        if self._reader is None or self._fields is None:
            import fastavro

            schema = self._reader_json if self._reader_json is not None else self.source.reader_schema()
            if not isinstance(schema, dict) or schema.get("type") != "record":
                raise SchemaSourceError(
                    f"Avro reader schema from {self.source.describe()} is not a record schema; "
                    "rows need named fields"
                )
            try:
                parsed = fastavro.parse_schema(schema)
            except Exception as e:
                raise SchemaSourceError(
                    f"Avro reader schema from {self.source.describe()} is invalid: {e}"
                ) from e
            fields = [(f["name"], f["type"]) for f in schema.get("fields", [])]
            reserved = [n for n, _ in fields if is_reserved(n)]
            if reserved:
                raise SchemaSourceError(
                    f"Avro reader schema field {reserved[0]!r} uses a reserved prefix "
                    f"({', '.join(RESERVED_PREFIXES)})"
                )
            self._reader_json, self._reader, self._fields = schema, parsed, fields
        return self._reader, self._fields

    def field_dtypes(self) -> dict[str, Any]:
        _, fields = self._load_reader()
        return {name: _avro_dtype(t) for name, t in fields}

    def _writer(self, schema_id: int) -> _Writer | None:
        if schema_id in self._writers:
            return self._writers[schema_id]
        import fastavro
        from fastavro.schema import to_parsing_canonical_form

        reader, _ = self._load_reader()
        schema = self.source.writer_schema(schema_id)
        writer: _Writer | None = None
        if schema is not None:
            try:
                parsed = fastavro.parse_schema(schema)
            except Exception as e:
                raise SchemaSourceError(
                    f"Avro schema id {schema_id} from {self.source.describe()} is invalid: {e}"
                ) from e
            same = to_parsing_canonical_form(parsed) == to_parsing_canonical_form(reader)
            writer = _Writer(schema_id, parsed, None if same else reader)
        self._writers[schema_id] = writer
        return writer

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        from fastavro import schemaless_reader

        batch = as_batch(batch)
        _, fields = self._load_reader()
        failures: list[Failure] = []
        skipped: list[int] = []
        rows: list[int] = []
        records: list[dict[str, Any]] = []
        quarantine_nulls = self.null_value == "quarantine"
        for i, raw in enumerate(_values(batch)):
            if raw is None:
                if quarantine_nulls:
                    failures.append(Failure(i, "decode", TOMBSTONE_REASON, "tombstone"))
                else:
                    skipped.append(i)
                continue
            if not raw or raw[0] != 0:
                failures.append(Failure(i, "decode", "no magic byte", "no magic byte"))
                continue
            if len(raw) < 5:
                failures.append(
                    Failure(
                        i,
                        "decode",
                        "Avro decode failed: shorter than the 5-byte header",
                        "Avro decode failed",
                    )
                )
                continue
            schema_id = int.from_bytes(raw[1:5], "big")
            writer = self._writers[schema_id] if schema_id in self._writers else self._writer(schema_id)
            if writer is None:
                failures.append(Failure(i, "decode", f"unknown schema id {schema_id}", "unknown schema id"))
                continue
            fo = io.BytesIO(raw)
            fo.seek(5)
            try:
                record = schemaless_reader(fo, writer.parsed, writer.reader)
            except Exception as e:
                failures.append(
                    Failure(i, "decode", f"Avro decode failed: {type(e).__name__}: {e}", "Avro decode failed")
                )
                continue
            left = len(raw) - fo.tell()
            if left:
                failures.append(
                    Failure(
                        i,
                        "decode",
                        f"Avro decode failed: {left} bytes left after the record (schema id {schema_id} "
                        "does not match the payload)",
                        "Avro decode failed",
                    )
                )
                continue
            if type(record) is not dict:  # pragma: no cover - the reader schema is a record
                failures.append(
                    Failure(i, "decode", "Avro decode failed: not a record", "Avro decode failed")
                )
                continue
            rows.append(i)
            records.append(record)
        columns = {
            name: _typed_column([r.get(name) for r in records], _avro_dtype(t), flat=_avro_flat(t))
            for name, t in fields
        }
        return Decoded(_events_frame(columns, batch, rows), failures, skipped)


__all__ = [
    "INPUT_COLUMNS",
    "JSON_TYPE_NAMES",
    "TOMBSTONE_REASON",
    "AvroDecoder",
    "Decoded",
    "Decoder",
    "JsonDecoder",
    "LocalSchemaSource",
    "RawDecoder",
    "RegistrySchemaSource",
    "SchemaSource",
    "as_batch",
]
