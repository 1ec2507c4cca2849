"""The Spark part of an Iceberg merge whose contested set is large: decide on the executors.

The merge step (:mod:`rewind.job.merge_iceberg`) finds the *contested* rows in the driver from
key columns alone (the run writes the key twice, or live holds it). Deciding them needs their
lineage (all their columns when ambiguous rows are routed) and the live rows of their keys;
below a threshold the driver reads and decides them itself. Above it, this stage:

1. reads, in tasks, the files holding contested rows (pyarrow through the warehouse's
   :class:`~rewind.core.store.WarehouseStore`, as :mod:`rewind.spark.parquet_files` does), and
   takes only the contested rows out of each (positions given by the driver);
2. repartitions them by the key, so every contested row of a key, the run's and live's, is in
   one task;
3. in each task, orders the rows as the driver would (the run's first, each side in the order
   the driver found them) and calls the same :func:`rewind.core.merge.decide` (decisions are per
   key, so deciding a task's keys is deciding those keys);
4. returns per task only the decision's small result: the driver's indices of the rows to
   delete (the run's not applied, live's replaced) and of the routed rows, and the counts.

The driver then rewrites the losing files and commits, as below the threshold. Nothing here is
visible until then: a failed stage leaves the branch as it was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rewind.core.arrow import schema_from_b64
from rewind.core.merge import MergePolicy, decide, key_array
from rewind.core.merge_keys import key_codes
from rewind.core.parquet import write_parquet
from rewind.core.store import WarehouseStore, active_store, remove_files_under
from rewind.spark.job_stage import StageError, task_error
from rewind.spark.parquet_files import read_parquet_files

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession

AT = "_rewind_merge_at"
"""A contested row's index among the rows the driver found (its order, and its name back)."""
MINE = "_rewind_merge_mine"
"""The row is the run's (else live's)."""
RESULT_SCHEMA = "drop binary, routed binary, counts string"
_ROWS_PER_TASK = 250_000
"""Contested rows a deciding task gets at most (more tasks when the set is larger)."""


@dataclass(frozen=True)
class FileRows:
    """The contested rows of one data file: where they are in it and who they are."""

    path: str
    positions: np.ndarray
    """Row positions in the file (int64)."""
    at: np.ndarray
    """The driver's index of each (int64)."""
    mine: np.ndarray
    """The run's rows (bool)."""


@dataclass(frozen=True)
class MergeContext:
    """What the stage's tasks need, as plain data (pickled to every task)."""

    key: tuple[str, ...]
    policy: MergePolicy
    schema_b64: str
    """The columns read (the table's Arrow types), without :data:`AT` and :data:`MINE`."""
    store: WarehouseStore = field(default_factory=active_store)


@dataclass(frozen=True)
class Decided:
    """The stage's result: driver indices of the rows to delete and of the routed rows."""

    drop: np.ndarray
    routed: np.ndarray
    counts: dict[str, int]


class ReadContested:
    """``mapInArrow``: rows naming files (path, positions, indices, sides) in, their contested
    rows out, with :data:`AT` and :data:`MINE`."""

    def __init__(self, ctx: MergeContext, out: pa.Schema) -> None:
        self.ctx, self.out = ctx, out

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids numpy, pyarrow at import
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = schema_from_b64(self.ctx.schema_b64)
        for batch in batches:
            for row in batch.to_pylist():
                fs, path = self.ctx.store.filesystem(row["path"])
                with fs.open_input_file(path) as handle:
                    parquet = pq.ParquetFile(handle)
                    present = set(parquet.schema_arrow.names)
                    got = parquet.read(columns=[n for n in schema.names if n in present])
                positions = pa.array(np.frombuffer(row["positions"], dtype=np.int64))
                got = got.take(positions)
                arrays = [
                    got.column(f.name).cast(f.type) if f.name in present else pa.nulls(got.num_rows, f.type)
                    for f in schema
                ]
                arrays.append(pa.array(np.frombuffer(row["at"], dtype=np.int64)))
                arrays.append(pa.array(np.frombuffer(row["mine"], dtype=np.bool_)))
                for part in pa.Table.from_arrays(arrays, names=self.out.names).to_batches(131_072):
                    yield part.cast(self.out)


class DecideContested:
    """``mapInArrow``: every contested row of some keys in, one result row out (see
    :data:`RESULT_SCHEMA`)."""

    def __init__(self, ctx: MergeContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        parts = [b for b in batches if b.num_rows]
        if not parts:
            return
        found = decide_rows(pa.Table.from_batches(parts), self.ctx)
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "drop": found.drop.tobytes(),
                    "routed": found.routed.tobytes(),
                    "counts": json.dumps(found.counts),
                }
            ],
            schema=pa.schema([("drop", pa.binary()), ("routed", pa.binary()), ("counts", pa.string())]),
        )


def decide_rows(rows: pa.Table, ctx: MergeContext) -> Decided:
    """Step 3 on some keys' contested rows (with :data:`AT` and :data:`MINE`): the run's in the
    driver's order, then live's, through :func:`decide`; pure Arrow, testable without Spark."""
    # lazy: avoids numpy, pyarrow at import
    import numpy as np
    import pyarrow as pa

    schema = schema_from_b64(ctx.schema_b64)
    key = list(ctx.key)
    mine = rows.column(MINE).to_numpy(zero_copy_only=False).astype(bool)
    at = rows.column(AT).to_numpy(zero_copy_only=False).astype(np.int64)
    order = np.lexsort((at, ~mine))  # the run's first, each side by the driver's index
    rows = rows.take(pa.array(order))
    mine, at = mine[order], at[order]
    n_ours = int(mine.sum())
    data = rows.select(schema.names).cast(schema)  # Spark's nullability and time zone back
    ours, theirs = data.slice(0, n_ours), data.slice(n_ours)
    result = decide(ours, theirs, key, ctx.policy)
    ours_at, theirs_at = at[:n_ours], at[n_ours:]
    lost = np.ones(n_ours, dtype=bool)
    lost[result.applied_positions] = False
    drop = [ours_at[lost]]
    if result.replaced.num_rows:
        live_codes, gone = key_codes(key_array(theirs, key), key_array(result.replaced, key))
        drop.append(theirs_at[np.isin(live_codes, gone)])
    return Decided(
        drop=np.concatenate(drop).astype(np.int64),
        routed=ours_at[np.asarray(result.routed_positions, dtype=np.int64)],
        counts=dict(result.counts),
    )


def decide_in_spark(
    spark: SparkSession, files: Sequence[FileRows], ctx: MergeContext, partitions: int, folder: str
) -> Decided:
    """Steps 1-4 of the module docstring over ``files``; the merged result of all tasks.

    The files' positions reach the tasks as one Parquet file under ``folder`` (removed after),
    not inside the plan: a local relation is serialized into every task, and the JVM driver's
    heap is the limit there (a re-drive's ran out at a million rows)."""
    # lazy: avoids numpy, pyarrow, pyspark at import
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema


    schema = schema_from_b64(ctx.schema_b64)
    wide = pa.schema([*schema, pa.field(AT, pa.int64()), pa.field(MINE, pa.bool_())])
    spark_schema = from_arrow_schema(wide)
    listing = pa.table(
        {
            "path": pa.array([f.path for f in files], pa.string()),
            "positions": pa.array([f.positions.astype(np.int64).tobytes() for f in files], pa.binary()),
            "at": pa.array([f.at.astype(np.int64).tobytes() for f in files], pa.binary()),
            "mine": pa.array([f.mine.astype(np.bool_).tobytes() for f in files], pa.binary()),
        }
    )
    n_rows = sum(len(f.at) for f in files)
    tasks = max(1, partitions, -(-n_rows // _ROWS_PER_TASK))
    path = write_parquet(folder, listing, "contested", ctx.store)
    try:
        source = read_parquet_files(spark, [path], from_arrow_schema(listing.schema), store=ctx.store)
        source = source.repartition(max(1, min(len(files), tasks)))
        contested = source.mapInArrow(ReadContested(ctx, to_arrow_schema(spark_schema)), spark_schema)
        grouped = contested.repartition(tasks, *ctx.key)
        results = grouped.mapInArrow(DecideContested(ctx), RESULT_SCHEMA).collect()
    except Exception as exc:
        raise StageError(f"merge decisions in Spark failed: {task_error(exc)}") from exc
    finally:
        remove_files_under(folder, [path], ctx.store)
    counts: dict[str, int] = {}
    drop, routed = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for row in results:
        for name, n in json.loads(row["counts"]).items():
            counts[name] = counts.get(name, 0) + int(n)
        drop.append(np.frombuffer(row["drop"], dtype=np.int64))
        routed.append(np.frombuffer(row["routed"], dtype=np.int64))
    return Decided(np.concatenate(drop), np.sort(np.concatenate(routed)), counts)
