"""Benchmark: the Kafka sink's Avro values against fastavro's own schemaless writer loop.

Same run, same rows (default 200,000 order rows of 9 columns: longs, ints, doubles, strings,
a nullable string, an enum, a timestamp-millis; the schema has one more field, filled by its
default), same schema, same output bytes (checked):

  (a) ``AvroValues.encode``: Arrow batches of 20,000 rows (the commit's batch size) →
      Confluent-framed values (5-byte header + Avro body), column-wise;
  (b) fastavro's ``schemaless_writer`` called per row on the rows as Python dicts, built
      before the clock starts, each into a fresh ``BytesIO`` holding the same header.

Prints rows/s of both (best of ``--repeat`` runs each) and the ratio a/b (target ≥ 0.7).
``--nested`` adds an ``array<string>`` field, which (a) writes with fastavro value by value.
Usage: ``python bench/avro_encode.py [--rows N] [--repeat R] [--nested]``.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from common import machine, stamp  # noqa: E402

BATCH_ROWS = 20_000
SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "amount", "type": "double"},
        {"name": "tax", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["placed", "paid", "shipped", "cancelled"]},
        },
        {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "channel", "type": "string", "default": "web"},
    ],
}


NESTED = {"name": "tags", "type": {"type": "array", "items": "string"}}


def rows_table(n: int, nested: bool) -> Any:
    import numpy as np
    import pyarrow as pa

    i = np.arange(n, dtype=np.int64)
    statuses = np.array(["placed", "paid", "shipped", "cancelled"], dtype=object)
    tags = {"tags": pa.array([["gift", "express"][: k % 3] for k in range(n)])} if nested else {}
    return pa.table(
        {
            **tags,
            "order_id": pa.array(i * 7919 + 1_000_000),
            "customer": pa.array([f"c-{k % 50_000:06d}" for k in range(n)]),
            "qty": pa.array((i % 12 + 1).astype(np.int32)),
            "amount": pa.array((i % 9973) / 7),
            "tax": pa.array((i % 9973) / 7 * 0.2),
            "currency": pa.array(np.where(i % 5 == 0, "USD", "EUR").astype(object), pa.string()),
            "note": pa.array([None if k % 3 else f"gift wrap {k}" for k in range(n)], pa.string()),
            "status": pa.array(statuses[i % 4], pa.string()),
            "placed_at": pa.array(1_790_000_000_000_000 + i * 1000, pa.timestamp("us", "UTC")),
        }
    )


def best(fn: Any, repeat: int) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs (garbage collector paused, as in the sink's commit)."""
    times = []
    out = None
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - started)
        finally:
            gc.enable()
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--nested", action="store_true")
    args = parser.parse_args()
    schema = {**SCHEMA, "fields": [NESTED, *SCHEMA["fields"]]} if args.nested else SCHEMA

    import fastavro

    from rewind.sinks.kafka.avro_values import AvroValues
    from rewind.translate.avro_schemas import WriterSchema

    table = rows_table(args.rows, args.nested)
    batches = table.to_batches(max_chunksize=BATCH_ROWS)
    values = AvroValues(WriterSchema(3, schema, "bench"), table.schema, table.column_names)
    header = values.header

    def rewind() -> list[bytes]:
        out: list[bytes] = []
        for batch in batches:
            out.extend(values.encode(batch))
        return out

    parsed = fastavro.parse_schema(schema)
    records = [{**r, "channel": "web"} for r in table.to_pylist()]  # before the clock

    def fastavro_loop() -> list[bytes]:
        write = fastavro.schemaless_writer
        out: list[bytes] = []
        for record in records:
            buffer = io.BytesIO()
            buffer.write(header)
            write(buffer, parsed, record)
            out.append(buffer.getvalue())
        return out

    a_s, a_out = best(rewind, args.repeat)
    b_s, b_out = best(fastavro_loop, args.repeat)
    assert a_out == b_out, "the two encoders disagree"
    a_rate, b_rate = args.rows / a_s, args.rows / b_s
    size = sum(map(len, a_out)) / len(a_out)
    print(f"{stamp()}  {machine()}  load average {os.getloadavg()[0]:.1f}")
    print(f"{args.rows:,} rows, {len(schema['fields'])} fields, {size:.0f} B a value, best of {args.repeat}")
    print(f"(a) AvroValues.encode (column-wise)      {a_rate:>12,.0f} rows/s  {a_s:.3f} s")
    print(f"(b) fastavro schemaless_writer per row   {b_rate:>12,.0f} rows/s  {b_s:.3f} s")
    print(f"a/b = {a_rate / b_rate:.2f} (target >= 0.7); outputs identical")


if __name__ == "__main__":
    main()
