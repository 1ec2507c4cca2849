"""``decode: rows``: rows of a table source, handed to the translate as the database typed them.

A table source (:mod:`rewind.tables`) reads rows, not serialized values: its Kafka-shaped
batches carry each table column beside the record columns, named ``row:<column>``, and this
decoder makes them the events' columns, with no parsing: integers stay ``int64`` (nullable
``Int64`` when the batch has a null), floats ``float64``, booleans ``bool`` (``boolean``),
text pandas' ``str`` dtype (below), timestamps ``datetime64`` (with their zone), dates
``datetime64`` (no zone), decimals and bytes Python objects. No row can fail to decode. A
column named with a reserved prefix (``_src_``, ``_rewind_``) is refused, as a JSON field
would be.

Text is :data:`TEXT_DTYPE`, the string dtype pandas 3 gives every text column: the batch's own
Arrow strings, with no Python object per value, and null as ``NaN``; comparisons give NumPy
booleans, ``.str`` works as on ``object`` text, and a value read out is a Python ``str``. A
translate pays only for the columns it reads: as ``object``, each text value became a Python
string on the way in and was read back into Arrow on the way out, ~0.1 µs a value; the
decode and translate of ``bench/reproduce_cpu.py``'s rows (four text columns) went from 1.25
to 0.68 µs a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rewind.core.columns import RESERVED_PREFIXES, is_reserved
from rewind.translate.decoder import Decoded, Decoder, as_batch, events_frame, pandas_timestamps
from rewind.translate.exceptions import DecoderConfigError

ROW_PREFIX = "row:"
"""Prefix of a table column in a Kafka-shaped batch of rows."""

TEXT_DTYPE = pd.StringDtype("pyarrow", na_value=np.nan)
"""The dtype of a text column (see the module docstring): pandas 3's default ``str``."""


def row_columns(schema: pa.Schema) -> list[str]:
    """The table columns a batch carries, without their prefix, in order."""
    return [name[len(ROW_PREFIX) :] for name in schema.names if name.startswith(ROW_PREFIX)]


def pandas_column(column: pa.Array | pa.ChunkedArray) -> Any:
    """One Arrow column as the events frame holds it (see the module docstring)."""
    kind = column.type
    nulls = column.null_count
    if pa.types.is_integer(kind):
        if nulls:
            return pd.array(column.to_pylist(), dtype="Int64")
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if pa.types.is_boolean(kind):
        return (
            pd.array(column.to_pylist(), dtype="boolean") if nulls else column.to_numpy(zero_copy_only=False)
        )
    if pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if pa.types.is_timestamp(kind):
        return pandas_timestamps(column)
    if pa.types.is_null(kind):
        return np.full(len(column), None, dtype=object)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pd.array(column, dtype=TEXT_DTYPE)  # the Arrow strings themselves, no copy of the text
    return column.to_numpy(zero_copy_only=False)  # dates: datetime64; decimals, bytes: Python objects


class RowsDecoder(Decoder):
    """See the module docstring."""

    def field_dtypes(self) -> dict[str, Any]:
        return {}  # known only from the rows (the plan learns the schema from its sample)

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        batch = as_batch(batch)
        fields: dict[str, Any] = {}
        for name in row_columns(batch.schema):
            if is_reserved(name):
                raise DecoderConfigError(
                    f"table column {name!r} starts with a reserved prefix ({', '.join(RESERVED_PREFIXES)}); "
                    "rename it in a query (SELECT ... AS ...)"
                )
            fields[name] = pandas_column(batch.column(ROW_PREFIX + name))
        rows = np.arange(batch.num_rows, dtype=np.int64)
        return Decoded(events_frame(fields, batch, rows))
