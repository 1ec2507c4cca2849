"""Decoders: a Kafka Arrow batch → a pandas frame of decoded events, plus the records that failed.

Every decoder returns one row per decodable record with the translator input columns
(``_rewind_row``, ``_src_topic``, ``_src_partition``, ``_src_offset``, ``_src_timestamp``,
``_src_key``) after the decoded fields; its index is named ``_rewind_index`` and holds the same
values as ``_rewind_row``. A record that cannot be decoded is a :class:`Failure` with stage
``decode``; a tombstone is a failure or, under ``null_value="skip"``, a *skipped* record that
the caller counts as filtered. Problems that are not about one record (a missing schema
folder, an unreachable registry) raise and fail the task.

Columns are built once per batch from Python lists (one comprehension per column), never by
appending rows: this loop is what bounds a task's decode rate. JSON is read a whole batch at a
time by Arrow's JSON reader (:mod:`rewind.translate.json_bulk`); a batch it could read
differently is parsed value by value by orjson when it is installed and by the stdlib
otherwise, with identical results (see :mod:`rewind.translate.json_decoder`).

The formats: :mod:`~rewind.translate.json_decoder`, :mod:`~rewind.translate.avro_decoder` (with
:mod:`~rewind.translate.avro_schemas`) and :class:`RawDecoder` here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from rewind.core.arrow import is_constant, kafka_record_schema
from rewind.core.columns import (
    ROW,
    ROW_INDEX,
    SRC_KEY,
    SRC_OFFSET,
    SRC_PARTITION,
    SRC_TIMESTAMP,
    SRC_TOPIC,
)
from rewind.translate.exceptions import DecoderConfigError
from rewind.translate.failures import Failure

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
        SRC_TOPIC: _objects(sub.column("topic")),
        SRC_PARTITION: sub.column("partition").to_numpy(zero_copy_only=False),
        SRC_OFFSET: sub.column("offset").to_numpy(zero_copy_only=False),
        SRC_TIMESTAMP: pandas_timestamps(sub.column("timestamp")),
        SRC_KEY: sub.column("key").to_numpy(zero_copy_only=False),
    }


def _objects(column: pa.Array) -> np.ndarray:
    """A column as Python objects; a column of one value (the topic of a batch, nearly always)
    holds that one object n times instead of n equal copies."""
    if is_constant(column):
        out = np.empty(len(column), dtype=object)
        out.fill(column[0].as_py())  # np.full would copy the value into n new objects, 13x slower
        return out
    return column.to_numpy(zero_copy_only=False)


_ZONES: dict[str, Any] = {}


def pandas_timestamps(column: pa.Array) -> Any:
    """A zoned timestamp column as ``column.to_pandas().array`` makes it (the same unit, values
    and time zone object), ~100x cheaper: pyarrow's pandas conversion costs ~2 ms a call
    whatever the length (0.2-0.5 µs a row of a 10,000-row batch), so it runs once per zone."""
    zone_name = column.type.tz
    if zone_name is None:
        return column.to_pandas().array
    zone = _ZONES.get(zone_name)
    if zone is None:
        zone = _ZONES[zone_name] = column[:0].to_pandas().dtype.tz
    utc = pd.DatetimeIndex(column.to_numpy(zero_copy_only=False)).tz_localize("UTC")
    return utc.tz_convert(zone).array


def events_frame(
    fields: Mapping[str, Any], batch: pa.RecordBatch, rows: Sequence[int] | np.ndarray
) -> pd.DataFrame:
    rows_arr = np.asarray(rows, dtype=np.int64)
    data: dict[str, Any] = dict(fields)
    data.update(_input_columns(batch, rows_arr))
    return pd.DataFrame(data, index=pd.Index(rows_arr, name=ROW_INDEX), copy=False)


def object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise: lists and dicts must stay whole objects
        arr[i] = v
    return arr


def infer_column(values: list[Any]) -> Any:
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
    return object_array(values)


def null_policy(value: str, allowed: tuple[str, ...], where: str) -> Any:
    if value not in allowed:
        raise DecoderConfigError(f"{where}: null_value {value!r} is not one of {', '.join(allowed)}")
    return value


def describe_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class RawDecoder(Decoder):
    """No decoding: the value bytes become column ``value`` and the key bytes column ``key``.

    A tombstone is kept by default (a raw copy must carry deletes through compaction); it can
    also be quarantined or skipped.
    """

    def __init__(self, null_value: RawNullPolicy = "keep") -> None:
        self.null_value = null_policy(null_value, ("keep", "quarantine", "skip"), "decode (raw)")

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
        return events_frame(fields, batch, rows)
