"""Arrow schemas Rewind passes around: the Kafka record schema, and schemas as text; and one test
of a column the hot paths share (:func:`is_constant`).

A leaf: the decoders, the Kafka reader, the archive and the sinks all use these. pyarrow is
imported inside the functions so that importing this module stays cheap (the CLI's start).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


def kafka_record_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of Spark's Kafka source schema: what every Kafka read yields."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(header)))
    return pa.schema(fields)


def schema_to_b64(schema: pa.Schema) -> str:
    """A schema as text (Arrow IPC, base64), to store in a plan or a staging's bookkeeping."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def is_constant(column: pa.Array) -> bool:
    """Whether ``column`` holds one value, at least once, and no null: what a batch's topic,
    partition, run id or extraction time usually is, which then needs building only once
    (``equal`` against the first value and ``all``: ~6x cheaper than ``count_distinct``)."""
    # lazy: avoids pyarrow at import
    import pyarrow.compute as pc

    return bool(len(column) and column.null_count == 0 and pc.all(pc.equal(column, column[0])).as_py())
