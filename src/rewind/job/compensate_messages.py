"""The messages of ``rewind compensate``, made a batch of changes at a time by Arrow kernels.

A change is a row of the diff: the key columns, ``old`` (production's row, a struct, null when
the key is only in staging) and ``new`` (staging's). Its messages, in the order they are applied
(all on the key's partition, so a consumer applies them in this order):

* ``retract-and-correct``: ``{"key":{...},"op":"retract","row":{...old}}`` when there is an old
  row, then ``{"key":{...},"op":"correct","row":{...new}}`` when there is a new one;
* ``correction``: one ``{"key":{...},"new":{...}|null,"old":{...}|null,"op":"correction"}``.

Compact JSON with the object keys sorted (the key's columns and a row's columns by name too), a
column's value as the Kafka sink writes it (:mod:`rewind.sinks.kafka.json_values`: text quoted
and escaped, integers and floats as numbers, non-finite floats ``null``, timestamps ISO-8601 with
microseconds, dates, times and decimals as text, binary as base64). The key and headers are
:mod:`rewind.kafka.compensation`'s. Built over whole columns and joined once per batch: a
``dumps`` and a dict per message cost ~10x more than producing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.kafka.compensation import Messages, op_headers
from rewind.sinks.kafka.json_values import json_texts

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class MessageEncoder:
    """Plain data pickled to the tasks: a slice of changes (one unit's) → its :class:`Messages`."""

    key: tuple[str, ...]
    shape: str
    run_id: str

    def __call__(self, batch: pa.RecordBatch, keys: pa.Array, partitions: pa.Array) -> Messages:
        """``batch``: the key columns, ``old`` and ``new``; ``keys`` and ``partitions``: each
        change's message key and target partition."""
        # lazy: avoids pyarrow / numpy at import
        import numpy as np
        import pyarrow as pa

        n = batch.num_rows
        key = _object([(k, batch.column(k)) for k in self.key])
        old, new = _row(batch.column("old")), _row(batch.column("new"))
        if self.shape == "correction":
            values = _join(b'{"key":', key, b',"new":', new, b',"old":', old, b',"op":"correction"}')
            return Messages(
                _plain(values),
                _plain(keys),
                _plain(partitions),
                [op_headers(self.run_id, "correction")] * n,
                {"correction": n} if n else {},
            )
        has_old = batch.column("old").is_valid().to_numpy(zero_copy_only=False)
        has_new = batch.column("new").is_valid().to_numpy(zero_copy_only=False)
        retract = _join(b'{"key":', key, b',"op":"retract","row":', old, b"}")
        correct = _join(b'{"key":', key, b',"op":"correct","row":', new, b"}")
        # message j of row i: 2i the retraction, 2i+1 the correction, each where its row is
        order = np.stack([np.arange(n), np.arange(n) + n], axis=1).ravel()
        order = order[np.stack([has_old, has_new], axis=1).ravel()]
        rows = pa.array(order % max(n, 1))
        ops = np.empty(2, dtype=object)
        ops[0], ops[1] = op_headers(self.run_id, "retract"), op_headers(self.run_id, "correct")
        counts = {"retract": int(has_old.sum()), "correct": int(has_new.sum())}
        return Messages(
            _plain(pa.concat_arrays([retract, correct]).take(pa.array(order))),
            _plain(keys.take(rows)),
            _plain(partitions.take(rows)),
            ops[(order >= n).astype(np.int64)].tolist(),
            {op: c for op, c in counts.items() if c},
        )


def _row(column: pa.Array) -> pa.Array:
    """A struct column as JSON objects (``null`` where the struct is null)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    struct = column.type
    fields = column.flatten()
    obj = _object([(struct.field(i).name, fields[i]) for i in range(struct.num_fields)], len(column))
    return pc.if_else(column.is_valid(), obj, pa.scalar(b"null", pa.binary()))


def _object(columns: list[tuple[str, pa.Array]], n: int | None = None) -> pa.Array:
    """One compact JSON object of ``columns`` (sorted by name) per row."""
    # lazy: avoids pyarrow at import
    import orjson
    import pyarrow as pa

    if not columns:
        return pa.array([b"{}"] * (n or 0), pa.binary())
    pieces: list[bytes | pa.Array] = []
    text = b"{"
    for i, (name, column) in enumerate(sorted(columns, key=lambda c: c[0])):
        text += (b"," if i else b"") + orjson.dumps(name) + b":"
        pieces += [text, json_texts(column)]
        text = b""
    pieces.append(b"}")
    return _join(*pieces)


def _join(*pieces: bytes | pa.Array) -> pa.Array:
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = [pa.scalar(p, pa.binary()) if isinstance(p, bytes) else p for p in pieces]
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))


def _plain(column: pa.Array) -> list[Any]:
    return list(column.to_numpy(zero_copy_only=False).tolist())
