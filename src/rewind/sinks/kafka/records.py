"""The record format of the Kafka topic sink: output rows ↔ Kafka records, both ways.

One output row (user columns + lineage columns, see ``docs/design-backfill.md``) becomes one
Kafka record:

* **value**: with ``sink.kafka.encode: avro``, the user columns as Avro in the Confluent wire
  format (see :mod:`rewind.sinks.kafka.avro_values`); otherwise (``json``, the default) a
  JSON object of the user columns (every output column not starting with ``_rewind_``),
  compact, UTF-8. Types: strings, integers, booleans and floats as JSON
  (NaN and infinities become ``null``: JSON has none); timestamps as ISO-8601 strings with
  microseconds (``2026-10-01T00:00:00.000000Z`` when the column has a time zone, no ``Z``
  when it has none); dates, times and decimals as strings (``"2026-10-01"``, ``"12.50"``,
  exact); binary as base64 strings. Nested columns (lists, structs) as JSON arrays/objects.
* **key**: the business key (``spec.key``): one column → its text as UTF-8 (string), its
  bytes (binary) or its JSON text (``1001`` for a number); several columns → a JSON object
  of them in key order (``{"order_id":1001,"line":2}``); no key → the event id, so records
  are still spread deterministically.
* **headers** (lineage, values UTF-8): ``rewind.event-id``, ``rewind.source``
  (``<topic>/<partition>/<offset>`` of the source record), ``rewind.transform``,
  ``rewind.version``, ``rewind.run-id``, ``rewind.synthetic`` (``true``),
  ``rewind.extracted-at`` (ISO-8601).
* **timestamp**: the source record's timestamp (CreateTime), so time-based consumers see
  event time, not backfill time.

:func:`decode_records` is the inverse: it turns records read back from the topic (the
``rewind-kafka`` reader's columns with ``includeHeaders``) into the output schema, so a
verification can compare the topic with a reference row by row.
"""

from __future__ import annotations

import base64
import io
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from rewind.core.arrow import is_constant
from rewind.core.columns import (
    EFFECTIVE_TIME,
    EVENT_ID,
    EXTRACTED_AT,
    LINEAGE_PREFIX,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_SYSTEM,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    SYNTHETIC,
    TRANSFORM,
    TRANSFORM_VERSION,
)
from rewind.core.json_fallback import json_default
from rewind.sinks.kafka.json_values import _iso, _plain, json_ready, json_values

if TYPE_CHECKING:
    import pyarrow as pa

H_EVENT_ID = "rewind.event-id"
H_SOURCE = "rewind.source"
H_TRANSFORM = "rewind.transform"
H_VERSION = "rewind.version"
H_RUN_ID = "rewind.run-id"
H_SYNTHETIC = "rewind.synthetic"
H_EXTRACTED_AT = "rewind.extracted-at"

HEADER_NAMES = (H_EVENT_ID, H_SOURCE, H_TRANSFORM, H_VERSION, H_RUN_ID, H_SYNTHETIC, H_EXTRACTED_AT)
"""Every lineage header, in the order they are written."""
H_SOURCE_SYSTEM = "rewind.source-system"
H_EFFECTIVE_TIME = "rewind.effective-time"
OPTIONAL_HEADERS = {SOURCE_SYSTEM: H_SOURCE_SYSTEM, EFFECTIVE_TIME: H_EFFECTIVE_TIME}
"""Headers of the optional lineage columns (``lineage:``, a reconstruction), written after the
others when the output has the column."""


HeaderColumn = tuple[str, Any] | list[tuple[str, Any]]
"""A header for every row: one shared ``(name, value)`` tuple, or one tuple per row."""


@dataclass
class EncodedBatch:
    """Aligned per-row lists of one batch, ready for :meth:`RecordEncoder.produce`.

    ``columns`` holds one list: the batch's values, JSON made a column at a time
    (:mod:`rewind.sinks.kafka.json_values`) or Avro.
    """

    columns: list[list[Any]]
    keys: list[Any]
    timestamps: list[int]
    topics: pa.Array
    partitions: pa.Array
    event_ids: list[str]
    sources: list[str]
    lineage: list[HeaderColumn]
    """The other five headers (and the optional ones): one shared tuple when constant, else one
    tuple per row."""

    def __len__(self) -> int:
        return len(self.event_ids)

    @property
    def source_topics(self) -> list[str]:
        """Each row's source topic (made when asked: a re-produce's units never ask)."""
        return _plain(self.topics)

    @property
    def source_partitions(self) -> list[int]:
        return _plain(self.partitions)

    @property
    def headers(self) -> list[list[tuple[str, Any]]]:
        """Per-row header lists (the produce loop builds them one at a time instead)."""
        n = len(self.event_ids)
        rest = [h if isinstance(h, list) else [h] * n for h in self.lineage]
        return [
            [(H_EVENT_ID, eid), (H_SOURCE, src), *others]
            for eid, src, *others in zip(self.event_ids, self.sources, *rest, strict=True)
        ]


def user_columns(schema: pa.Schema) -> list[str]:
    """The output columns that go into the JSON value (everything but lineage)."""
    return [name for name in schema.names if not name.startswith(LINEAGE_PREFIX)]


ProduceFn = Callable[..., None]
"""``Producer.produce`` called as ``produce(topic, value, key, partition, None, None, timestamp, headers)``:
positional (its on_delivery and callback None), which spares a keyword dict per record."""


class RecordEncoder:
    """Encodes Arrow batches of output rows into Kafka records (see the module docstring).

    ``values``, when given, makes each batch's values (Avro); otherwise they are JSON objects
    of the user columns, made a column at a time (:func:`~rewind.sinks.kafka.json_values.json_values`).
    """

    def __init__(
        self,
        schema: pa.Schema,
        key_columns: Sequence[str],
        values: Callable[[pa.RecordBatch], list[bytes]] | None = None,
    ) -> None:
        self.schema = schema
        self.user = user_columns(schema)
        self.key_columns = tuple(key_columns)
        missing = [k for k in self.key_columns if k not in self.user]
        if missing:
            raise ValueError(f"key column(s) {missing} are not output columns")
        self._values = values if values is not None else self._json_values
        self._optional = [(c, h) for c, h in OPTIONAL_HEADERS.items() if c in schema.names]
        count = len(HEADER_NAMES) + len(self._optional)
        self._loops = (_produce_loop(keep=False, headers=count), _produce_loop(keep=True, headers=count))
        self._composite_key = _row_json(list(self.key_columns)) if len(self.key_columns) > 1 else None

    def encode(self, batch: pa.RecordBatch) -> EncodedBatch:
        """Everything but the values, column-wise (cheap: Arrow kernels and list conversions)."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa
        import pyarrow.compute as pc

        event_ids = _plain(batch.column(EVENT_ID))
        topics = batch.column(SOURCE_TOPIC)
        partitions = batch.column(SOURCE_PARTITION)
        millis = batch.column(SOURCE_TIMESTAMP).cast(pa.timestamp("ms", "UTC"), safe=False).cast(pa.int64())
        synthetic = pc.if_else(batch.column(SYNTHETIC), "true", "false")
        return EncodedBatch(
            columns=[self._values(batch)],
            keys=self._keys(batch, event_ids),
            timestamps=_same_or_each(pc.fill_null(millis, 0)),
            topics=topics,
            partitions=partitions,
            event_ids=event_ids,
            sources=_sources(topics, partitions, batch.column(SOURCE_OFFSET)),
            lineage=[
                _header_values(H_TRANSFORM, batch.column(TRANSFORM)),
                _header_values(H_VERSION, batch.column(TRANSFORM_VERSION)),
                _header_values(H_RUN_ID, batch.column(RUN_ID)),
                _header_values(H_SYNTHETIC, synthetic),
                _header_values(H_EXTRACTED_AT, batch.column(EXTRACTED_AT)),
                *(_header_values(h, batch.column(c)) for c, h in self._optional),
            ],
        )

    def values(self, encoded: EncodedBatch) -> list[bytes]:
        """The values of a batch as a list (for tests and small batches)."""
        return list(encoded.columns[0])

    def _json_values(self, batch: pa.RecordBatch) -> list[bytes]:
        return json_values(batch, self.user)

    def produce(
        self,
        encoded: EncodedBatch,
        produce: ProduceFn,
        when_full: ProduceFn,
        topic: str,
        partitions: Iterable[int],
        keep: Iterable[bool] | None = None,
    ) -> int:
        """Produce the rows of ``encoded`` (those where ``keep`` is true); returns how many.

        ``when_full`` is called with the same arguments when ``produce`` raises BufferError
        (librdkafka's queue is full): it must serve deliveries and retry.
        """
        repeat = itertools.repeat
        headers = [  # strict=False: repeat() never ends
            zip(repeat(H_EVENT_ID), encoded.event_ids, strict=False),
            zip(repeat(H_SOURCE), encoded.sources, strict=False),
            *(repeat(h) if isinstance(h, tuple) else h for h in encoded.lineage),
        ]
        flags = () if keep is None else (keep,)
        loop = self._loops[keep is not None]
        rows = (encoded.keys, partitions, encoded.timestamps, encoded.columns[0])
        return int(loop(produce, when_full, topic, *rows, *headers, *flags))

    def _keys(self, batch: pa.RecordBatch, event_ids: list[str]) -> list[Any]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if not self.key_columns:
            return event_ids
        if self._composite_key is not None:
            return self._composite_key(*(json_ready(batch.column(n)) for n in self.key_columns))
        name = self.key_columns[0]
        kind = batch.schema.field(name).type
        if (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind)
        ):
            return _plain(batch.column(name))
        if pa.types.is_integer(kind):  # JSON of an int: its decimal text, cast by Arrow at once
            return _plain(batch.column(name).cast(pa.string()).cast(pa.binary()))
        dumps = orjson.dumps
        return [None if v is None else dumps(v, default=json_default) for v in json_ready(batch.column(name))]


def _same_or_each(column: pa.Array) -> list[Any]:
    """A column without nulls as Python values: one object repeated when every value is the same
    (a re-produce's timestamps are its extraction time), else one per value."""
    if is_constant(column):
        return [column[0].as_py()] * len(column)
    return _plain(column)


def _sources(topics: pa.Array, partitions: pa.Array, offsets: pa.Array) -> list[str]:
    """``<topic>/<partition>/<offset>`` of each row; when the batch holds one topic and partition
    (a work unit's batch), the offsets' text is joined to that one prefix."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    if is_constant(topics) and is_constant(partitions):
        prefix = pa.scalar(f"{topics[0].as_py()}/{partitions[0].as_py()}/", pa.string())
        return _plain(pc.binary_join_element_wise(prefix, offsets.cast(pa.string()), ""))
    each = pc.binary_join_element_wise(topics, partitions.cast(pa.string()), offsets.cast(pa.string()), "/")
    return _plain(each)


def _header_values(name: str, column: pa.Array) -> HeaderColumn:
    """``(name, value)`` header tuples of a column: ONE shared tuple when the column is constant
    (run id, transform, version, synthetic and usually extracted-at are), else one per row."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    if is_constant(column):  # the usual case: ~6x cheaper than the dictionary below for text
        value = _iso(column[:1]) if pa.types.is_timestamp(column.type) else _plain(column[:1])
        return (name, value[0])
    encoded = pc.dictionary_encode(column)
    dictionary = encoded.dictionary
    values = _iso(dictionary) if pa.types.is_timestamp(dictionary.type) else _plain(dictionary)
    tuples = [(name, v) for v in values]
    if len(tuples) == 1 and encoded.null_count == 0:
        return tuples[0]
    tuples.append((name, None))
    indices = pc.fill_null(encoded.indices, len(tuples) - 1)
    return [tuples[i] for i in _plain(indices)]


def _dict_literal(names: list[str], params: list[str]) -> str:
    # repr() quotes any column name safely as a string literal
    return "{" + ", ".join(f"{name!r}: {p}" for name, p in zip(names, params, strict=True)) + "}"


def _compile(source: str, name: str) -> Callable[..., Any]:
    scope: dict[str, Any] = {
        "dumps": orjson.dumps,
        "default": json_default,
    }
    exec(compile(source, f"<rewind {name}>", "exec"), scope)
    function: Callable[..., Any] = scope[name]
    return function


def _row_json(names: list[str]) -> Callable[..., list[bytes]]:
    """A function of per-column lists returning one compact JSON object per row.

    The dict literal is generated code (``{"a": c0, "b": c1}``): about twice as fast per
    row as ``dict(zip(names, row))``.
    """
    params = [f"c{i}" for i in range(len(names))]
    source = (
        f"def row_json({', '.join(params)}):\n"
        f"    return [dumps({_dict_literal(names, params)}, default=default) "
        f"for ({', '.join(params)},) in zip({', '.join(params)})]\n"
    )
    return _compile(source, "row_json")


def _produce_loop(keep: bool, headers: int = len(HEADER_NAMES)) -> Callable[..., int]:
    """The hot loop: one ``produce`` per row of values made before it. Each header arrives as a
    ready ``(name, value)`` tuple (``zip`` builds the per-row ones in C: ~13% of the loop saved);
    ``keep``: a column of flags says which rows to produce."""
    names = ", ".join(f"h{i}" for i in range(headers))
    flag, test = (", ok", "        if not ok:\n            continue\n") if keep else ("", "")
    source = (
        f"def produce_loop(produce, when_full, topic, keys, partitions, stamps, values, {names}{flag}):\n"
        f"    n = 0\n"
        f"    for k, p, ts, v, {names}{flag} in zip(keys, partitions, stamps, values, {names}{flag}):\n"
        f"{test}"
        f"        h = [{names}]\n"
        f"        try:\n"
        f"            produce(topic, v, k, p, None, None, ts, h)\n"
        f"        except BufferError:\n"
        f"            when_full(topic, v, k, p, timestamp=ts, headers=h)\n"
        f"        n += 1\n"
        f"    return n\n"
    )
    return _compile(source, "produce_loop")


# -- reading back ---------------------------------------------------------------------------


def _json_type(kind: pa.DataType) -> pa.DataType:
    """The type Arrow's JSON reader reads a column as (text for what JSON has no type for)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if (
        pa.types.is_timestamp(kind)
        or pa.types.is_date(kind)
        or pa.types.is_time(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        return pa.string()
    return kind


def _from_text(column: pa.ChunkedArray | pa.Array, kind: pa.DataType) -> pa.Array | pa.ChunkedArray:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if column.type == kind:
        return column
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        decoded = [None if v is None else base64.b64decode(v) for v in column.to_pylist()]
        return pa.array(decoded, kind)
    if pa.types.is_timestamp(kind):
        zone = kind.tz
        return column.cast(pa.timestamp("us", zone)).cast(kind)
    return column.cast(kind)


ValueDecoder = Callable[[list[Any]], list[dict[str, Any]]]
"""Values read back → one record (dict) per value (the Avro sink's; JSON is read by Arrow)."""


def decode_records(
    batch: pa.RecordBatch,
    schema: pa.Schema,
    run_id: str | None = None,
    value_decoder: ValueDecoder | None = None,
) -> pa.RecordBatch:
    """Records read back (``key``, ``value``, ``timestamp``, ``headers``) → output rows of ``schema``.

    Records without Rewind's lineage headers, or of another run when ``run_id`` is given,
    are left out (a topic named in the spec may hold other records).
    """
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    headers = _header_columns(batch)
    keep = pc.is_valid(headers[H_EVENT_ID])
    if run_id is not None:
        keep = pc.and_(keep, pc.fill_null(pc.equal(headers[H_RUN_ID], run_id), False))
    if not pc.all(keep).as_py():
        index = np.flatnonzero(keep.to_numpy(zero_copy_only=False))
        batch = batch.take(pa.array(index))
        headers = {k: v.take(pa.array(index)) for k, v in headers.items()}
    out: dict[str, Any] = {}
    user = user_columns(schema)
    if user and batch.num_rows and value_decoder is not None:
        records = value_decoder(batch.column("value").to_pylist())
        for name in user:
            out[name] = _typed([r.get(name) for r in records], schema.field(name).type)
    elif user and batch.num_rows:
        json_schema = pa.schema([pa.field(n, _json_type(schema.field(n).type)) for n in user])
        values = batch.column("value").to_pylist()
        table = pj.read_json(
            io.BytesIO(b"\n".join(values)),
            read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * sum(map(len, values)))),
            parse_options=pj.ParseOptions(explicit_schema=json_schema, unexpected_field_behavior="ignore"),
        )
        for name in user:
            out[name] = _from_text(table.column(name), schema.field(name).type)
    else:
        for name in user:
            out[name] = pa.nulls(batch.num_rows, schema.field(name).type)
    source = headers[H_SOURCE]
    parts = pc.split_pattern(source, "/", max_splits=None, reverse=False)
    count = pc.list_value_length(parts)
    # a topic has no "/", so "<topic>/<partition>/<offset>" has exactly three parts
    if batch.num_rows and pc.min(count).as_py() != 3:
        raise ValueError("a rewind.source header is not <topic>/<partition>/<offset>")
    out[EVENT_ID] = headers[H_EVENT_ID]
    out[SOURCE_TOPIC] = pc.list_element(parts, 0)
    out[SOURCE_PARTITION] = pc.list_element(parts, 1)
    out[SOURCE_OFFSET] = pc.list_element(parts, 2)
    out[SOURCE_TIMESTAMP] = batch.column("timestamp")
    out[EXTRACTED_AT] = headers[H_EXTRACTED_AT]
    out[TRANSFORM] = headers[H_TRANSFORM]
    out[TRANSFORM_VERSION] = headers[H_VERSION]
    out[RUN_ID] = headers[H_RUN_ID]
    out[SYNTHETIC] = pc.equal(headers[H_SYNTHETIC], "true")
    for name, header in OPTIONAL_HEADERS.items():
        if name in schema.names:
            out[name] = headers[header]
    arrays = []
    for field in schema:
        column = out.get(field.name)
        if column is None:
            column = pa.nulls(batch.num_rows, field.type)
        elif column.type != field.type:
            column = (
                _from_text(column, field.type) if pa.types.is_string(column.type) else column.cast(field.type)
            )
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _typed(values: list[Any], kind: pa.DataType) -> pa.Array:
    """Python values → an Arrow column of ``kind`` (through the values' own type when a
    promotion was written, like an int column read back from a double field)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    try:
        return pa.array(values, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(values).cast(kind)


def _header_columns(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    """Each lineage header as a string column aligned with the batch (null where absent)."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    headers = batch.column("headers")
    every = (*HEADER_NAMES, *OPTIONAL_HEADERS.values())
    if n == 0:
        return {name: pa.array([], pa.string()) for name in every}
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    names = flat.field("key")
    values = flat.field("value").cast(pa.string())
    out: dict[str, pa.Array] = {}
    for name in every:
        mask = pc.fill_null(pc.equal(names, name), False)
        rows = parents[mask.to_numpy(zero_copy_only=False)]
        picked = values.filter(mask)
        if len(rows) == n and (n < 2 or bool(np.all(np.diff(rows) > 0))):
            out[name] = picked  # the usual case: exactly one such header per record, in order
            continue
        column: list[Any] = [None] * n
        for row, value in zip(rows.tolist(), picked.to_pylist(), strict=True):
            column[row] = value  # the last one wins, as in a Kafka consumer's lastHeader()
        out[name] = pa.array(column, pa.string())
    return out
