"""A shadow's Iceberg v2 kept as sorted key ranges, so an upsert reads only the files of its keys.

v2 is upserted on the key once per history unit and per micro-batch of the tail. Finding v2's
rows of a batch's keys by reading every file's key column would make a tail batch cost grow
with v2. Instead every data file of v2 holds a range of the first key column, its rows sorted
by the key, and the ranges do not overlap; the files' column bounds (written exact: the
table's ``write.metadata.metrics.column.<key>`` is ``full``) say which file holds which range.
An upsert of some keys then:

1. plans v2's files (the manifests: no data read) and decodes each file's bounds;
2. picks the files to read (:meth:`KeyedFiles.touched`): every file whose range holds one of the
   batch's key values, and for a value no range holds (a new key) the file whose range is
   nearest below it (the first file for a value below all), which will hold it from now on;
3. reads those files whole, and the caller decides which of their rows stay;
4. writes each touched file again with its kept rows and the new rows of its keys, sorted by
   the key (:meth:`KeyedFiles.write`), split into files of about :data:`ROWS_PER_FILE` rows when
   it grew past twice that; a v2 with no files yet (the history's first commit) is written as
   sorted files of that size.

So a batch reads and writes about ``touched files x ROWS_PER_FILE`` rows, whatever v2's size:
few files when the keys in flight are near each other (new and recent orders), at most one per
key otherwise. The ranges only steer which files are read; correctness never rests on them: a
file without bounds, or ranges that overlap (a v2 written before this layout), is read whenever
its range might hold a key.
"""

from __future__ import annotations

import bisect
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.sinks.iceberg.staging import IcebergSinkError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import FileScanTask, Table, Transaction

ROWS_PER_FILE = 25_000
"""Rows a file of v2 is written with (a touched file is read and written whole per commit)."""
METRICS_FULL = "write.metadata.metrics.column."
FILE_COLUMN = "_rewind_file"
"""Index (into :attr:`KeyedFiles.tasks`) of the file a row was read from."""
NEW = -1
"""The home of a key when v2 has no file yet."""


def key_properties(key: Sequence[str]) -> dict[str, str]:
    """Table properties that make the key columns' bounds exact (not truncated to 16 chars)."""
    return {f"{METRICS_FULL}{k}": "full" for k in key}


def comparable(values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """The values of a key column as the Python values its Iceberg bounds decode to."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    t = values.type
    if pa.types.is_timestamp(t):
        values = values.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        values = values.cast(pa.date32()).cast(pa.int32())
    return values.to_pylist()


@dataclass
class KeyedFiles:
    """v2's data files at its current snapshot with the range of the first key column of each."""

    table: Table
    key: list[str]
    tasks: list[FileScanTask]
    lows: list[Any]
    highs: list[Any]

    @classmethod
    def read(cls, table: Table, key: Sequence[str]) -> KeyedFiles:
        """Step 1: plan the files of ``main`` and decode their bounds (None: unbounded)."""
        # lazy: avoids pyiceberg at import
        from pyiceberg.conversions import from_bytes
        from pyiceberg.types import PrimitiveType

        head = table.current_snapshot()
        tasks = list(table.scan(snapshot_id=head.snapshot_id).plan_files()) if head is not None else []
        if any(t.delete_files for t in tasks):
            raise IcebergSinkError(
                f"{table.name()} has row-level delete files; a shadow's v2 rewrites data files only: "
                "compact the table first"
            )
        field = table.schema().find_field(key[0])
        lows, highs = [], []
        for task in tasks:
            low = (task.file.lower_bounds or {}).get(field.field_id)
            high = (task.file.upper_bounds or {}).get(field.field_id)
            kind = field.field_type
            assert isinstance(kind, PrimitiveType), "a key column is a primitive type (the spec checks)"
            lows.append(None if low is None else from_bytes(kind, low))
            highs.append(None if high is None else from_bytes(kind, high))
        return cls(table, list(key), tasks, lows, highs)

    def homes(self, values: Sequence[Any]) -> dict[Any, set[int]]:
        """Step 2 per distinct value: the files that may hold it; for a value no range holds, the
        one file it goes to (the nearest range below it, else the first; :data:`NEW` if none)."""
        if not self.tasks:  # every row goes to new files (:meth:`write` needs no home per value)
            return {}
        unbounded = {i for i in range(len(self.tasks)) if self.lows[i] is None or self.highs[i] is None}
        ranged = sorted((self.lows[i], i) for i in range(len(self.tasks)) if i not in unbounded)
        lows = [lo for lo, _ in ranged]
        # the highest upper bound among the files sorted before each position: the walk down
        # from a value's position stops where no earlier range reaches it
        reach, top = [], None
        for _, i in ranged:
            top = self.highs[i] if top is None or self.highs[i] > top else top
            reach.append(top)
        out: dict[Any, set[int]] = {}
        for value in values:
            found = set(unbounded)
            if value is not None:
                j = bisect.bisect_right(lows, value) - 1
                k = j
                while k >= 0 and reach[k] >= value:
                    if self.highs[ranged[k][1]] >= value:
                        found.add(ranged[k][1])
                    k -= 1
                if not found and ranged:
                    found.add(ranged[max(j, 0)][1])
            elif not found:
                found.add(ranged[0][1] if ranged else next(iter(unbounded)))
            out[value] = found
        return out

    def touched(self, homes: dict[Any, set[int]]) -> list[int]:
        return sorted({i for found in homes.values() for i in found if i != NEW})

    def read_rows(self, touched: Sequence[int]) -> pa.Table:
        """Step 3: the touched files' rows, whole, with :data:`FILE_COLUMN`."""
        # lazy: avoids pyarrow, pyiceberg at import
        import pyarrow as pa
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        scan = ArrowScan(self.table.metadata, self.table.io, self.table.schema(), AlwaysTrue())
        parts = []
        for index in touched:
            part = scan.to_table([self.tasks[index]])
            parts.append(part.append_column(FILE_COLUMN, pa.array([index] * part.num_rows, pa.int32())))
        if not parts:
            empty = self.table.schema().as_arrow().empty_table()
            return empty.append_column(FILE_COLUMN, pa.array([], pa.int32()))
        return pa.concat_tables(parts, promote_options="permissive")

    def write(
        self,
        tx: Transaction,
        touched: Sequence[int],
        kept: pa.Table,
        rows: pa.Table,
        homes: dict[Any, set[int]],
        properties: dict[str, str],
    ) -> None:
        """Step 4, ONE overwrite snapshot: every touched file is replaced by its ``kept`` rows
        (they carry :data:`FILE_COLUMN`) and the ``rows`` whose key it is home to, sorted by key."""
        # lazy: avoids numpy, pyarrow, pyiceberg at import
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        kept_files = kept.column(FILE_COLUMN).to_numpy()
        kept = kept.drop_columns([FILE_COLUMN])
        rows = rows.select(kept.schema.names).cast(kept.schema)
        if self.tasks:
            home_of = np.array([min(homes[v]) for v in comparable(rows.column(self.key[0]))], dtype=np.int64)
        else:
            home_of = np.full(rows.num_rows, NEW, dtype=np.int64)
        groups = sorted(set(touched) | set(home_of.tolist()))
        write_uuid, counter = uuid.uuid4(), itertools.count(0)
        with tx.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for index in touched:
                overwrite.delete_data_file(self.tasks[index].file)
            for group in groups:
                part = pa.concat_tables(
                    [kept.filter(pa.array(kept_files == group)), rows.filter(pa.array(home_of == group))]
                )
                if not part.num_rows:
                    continue
                part = part.take(pc.sort_indices(part, [(k, "ascending") for k in self.key]))
                size = part.num_rows if part.num_rows <= 2 * ROWS_PER_FILE else ROWS_PER_FILE
                for start in range(0, part.num_rows, size):
                    for data_file in _dataframe_to_data_files(
                        table_metadata=self.table.metadata,
                        df=part.slice(start, size),
                        io=self.table.io,
                        write_uuid=write_uuid,
                        counter=counter,
                    ):
                        overwrite.append_data_file(data_file)
