"""The Spark side of ``rewind compensate``: the diff, the units, and the tasks that produce them.

1. :func:`changes`: production and staging (DataFrames) in a full outer join on the key columns
   (null-safe); a key is changed when it is on one side only or when a user column (all but
   ``_rewind_*``; a column one side lacks reads as null there) differs, null-safe. A change is
   the key's columns, ``old`` (production's user columns, a struct, null when absent) and
   ``new`` (staging's);
2. :func:`placed`: each change gets its message key (:func:`rewind.kafka.compensation.key_text`),
   its target partition (murmur2 of the key over the partitions, as the live producer's) and a
   bucket (crc32 of the key, one of :data:`BUCKETS`);
3. :func:`bucket_counts`: changes per (partition, bucket), and how many have an old and a new
   row: the driver turns these counts (never a row) into units, runs of buckets of one
   partition of about ``unit_messages`` messages each;
4. :func:`run_units`: the changes of the units not done yet are shuffled into one Spark partition
   per unit; each task writes its unit in one transaction (:mod:`rewind.kafka.compensation`) and
   returns one row: its id, messages, counts, whether an earlier attempt had committed it, and
   where the task's seconds went.
"""

from __future__ import annotations

import itertools
import json
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.core.columns import LINEAGE_PREFIX
from rewind.errors import RewindError
from rewind.kafka.compensation import Messages, UnitTransaction, UnitWriter, key_text
from rewind.kafka.partitioner import partitions_for
from rewind.spark.job_stage import task_error

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

BUCKETS = 1024
KEY_BYTES, PARTITION, BUCKET, UNIT = (
    "_rewind_c_key",
    "_rewind_c_partition",
    "_rewind_c_bucket",
    "_rewind_c_unit",
)
_PLACE, _LABEL = "_rewind_c_place", "_rewind_c_label"
RESULT_SCHEMA = "unit string, messages long, counts string, repeat boolean, seconds string"
TASK_STEPS = ("wait", "open", "encode", "produce", "commit")
"""What a task's seconds go to: waiting for the next batch (the shuffle read and sort upstream),
opening units' transactions, encoding the messages, producing them, committing."""


class CompensateStageError(RewindError):
    """The sides cannot be compared, or a task of the compensation failed."""


def changes(old: DataFrame, new: DataFrame, key: list[str]) -> DataFrame:
    """Step 1 of the module docstring."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    old_cols = [c for c in old.columns if not c.startswith(LINEAGE_PREFIX)]
    new_cols = [c for c in new.columns if not c.startswith(LINEAGE_PREFIX)]
    for side, cols in (("production", old_cols), ("staging", new_cols)):
        missing = [k for k in key if k not in cols]
        if missing:
            raise CompensateStageError(f"{side} lacks the key column(s) {', '.join(missing)}")
    o = old.select(*[F.col(k).alias(f"_o{i}") for i, k in enumerate(key)], F.struct(*old_cols).alias("old"))
    n = new.select(*[F.col(k).alias(f"_n{i}") for i, k in enumerate(key)], F.struct(*new_cols).alias("new"))
    on = None
    for i in range(len(key)):
        cond = o[f"_o{i}"].eqNullSafe(n[f"_n{i}"])
        on = cond if on is None else on & cond
    joined = o.join(n, on, "full_outer")
    same = None
    for c in sorted(set(old_cols) | set(new_cols)):
        a = F.col(f"old.{c}") if c in old_cols else F.lit(None)
        b = F.col(f"new.{c}") if c in new_cols else F.lit(None)
        eq = a.eqNullSafe(b)
        same = eq if same is None else same & eq
    assert same is not None  # the key columns are user columns of both sides
    differ = F.col("old").isNull() | F.col("new").isNull() | ~same
    keys = [F.coalesce(F.col(f"_o{i}"), F.col(f"_n{i}")).alias(k) for i, k in enumerate(key)]
    return joined.where(differ).select(*keys, "old", "new")


@dataclass(frozen=True)
class _Place:
    """The Arrow UDF of step 2 (pickled to the tasks): the key columns in, the message key and its
    target partition out. Only the key columns cross into Python; the rows stay in the JVM."""

    partitions: int

    def __call__(self, *columns: pa.Array) -> pa.Array:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        kb = key_texts(columns)
        parts = partitions_for(kb.to_numpy(zero_copy_only=False).tolist(), self.partitions)
        return pa.StructArray.from_arrays([kb, pa.array(parts, pa.int32())], names=["k", "p"])


def key_texts(columns: tuple[pa.Array, ...]) -> pa.Array:
    """:func:`rewind.kafka.compensation.key_text` of each row, as a binary column: a single text
    or integer key column by Arrow's cast (the same text as ``str``), anything else row by row."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    if len(columns) == 1:
        kind = columns[0].type
        if columns[0].null_count == 0 and (
            pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
        ):
            return columns[0].cast(pa.string()).cast(pa.binary())
    rows = zip(*(c.to_pylist() for c in columns), strict=True)
    return pa.array([key_text(values) for values in rows], pa.binary())


def placed(diff: DataFrame, key: list[str], partitions: int) -> DataFrame:
    """Step 2 of the module docstring: the key's text and partition by an Arrow UDF over the key
    columns; the bucket by Spark's ``crc32`` (zlib's)."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F
    from pyspark.sql.functions import ArrowUDFType

    with warnings.catch_warnings():  # "prefer type hints": a callable object has none to give
        warnings.simplefilter("ignore", UserWarning)
        place = F.arrow_udf(_Place(partitions), "k binary, p int", ArrowUDFType.SCALAR)
    return diff.withColumn(_PLACE, place(*[F.col(k) for k in key])).select(
        *[F.col(c) for c in diff.columns],
        F.col(f"{_PLACE}.k").alias(KEY_BYTES),
        F.col(f"{_PLACE}.p").alias(PARTITION),
        (F.crc32(F.col(f"{_PLACE}.k")) % BUCKETS).cast("int").alias(BUCKET),
    )


def bucket_counts(df: DataFrame) -> list[tuple[int, int, int, int, int]]:
    """Step 3: (partition, bucket, changes, with an old row, with a new row), sorted."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    rows = (
        df.groupBy(PARTITION, BUCKET)
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.count("old").alias("old"),
            F.count("new").alias("new"),
        )
        .collect()
    )
    return sorted((r[PARTITION], r[BUCKET], r["n"], r["old"], r["new"]) for r in rows)


MessagesOf = Callable[["pa.RecordBatch", "pa.Array", "pa.Array"], Messages]
"""The job's message encoder: changes (key columns, ``old``, ``new``), their message keys and
partitions → the :class:`~rewind.kafka.compensation.Messages` to produce."""


@dataclass(frozen=True)
class _Produce:
    """The ``mapInArrow`` function of step 4: sorted changes in, one result row per unit out."""

    writer: UnitWriter
    messages: MessagesOf
    unit_ids: tuple[str, ...]
    done: frozenset[str]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids numpy at import
        import numpy as np

        clock = dict.fromkeys(TASK_STEPS, 0.0)
        current: int | None = None
        seen: set[int | None] = set()
        unit: Any = None
        try:
            it = iter(batches)
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                clock["wait"] += time.perf_counter() - t0
                if batch is None:
                    break
                units = batch.column(UNIT).to_numpy(zero_copy_only=False)
                cuts = [0, *(np.flatnonzero(units[1:] != units[:-1]) + 1).tolist(), len(units)]
                changes = batch.select([*self.writer.key, "old", "new"])
                for start, end in itertools.pairwise(cuts):
                    if start == end:
                        continue
                    if int(units[start]) != current:
                        if unit is not None:
                            yield self._finish(unit, clock)
                            seen.add(current)
                        current = int(units[start])
                        if current in seen:  # a unit's rows are never split (run_units)
                            raise CompensateStageError(
                                f"unit {self.unit_ids[current]}'s rows came apart in its task"
                            )
                        t0 = time.perf_counter()
                        unit = self._open(current)
                        clock["open"] += time.perf_counter() - t0
                    if isinstance(unit, _Skipped):
                        continue
                    t0 = time.perf_counter()
                    messages = self.messages(
                        changes.slice(start, end - start),
                        batch.column(KEY_BYTES).slice(start, end - start),
                        batch.column(PARTITION).slice(start, end - start),
                    )
                    t1 = time.perf_counter()
                    unit.produce(messages)
                    clock["encode"] += t1 - t0
                    clock["produce"] += time.perf_counter() - t1
            if unit is not None:
                yield self._finish(unit, clock)
                unit = None
        except BaseException:
            if unit is not None:
                unit.abort()
            raise

    def _open(self, index: int) -> Any:
        unit_id = self.unit_ids[index]
        if unit_id in self.done:  # the driver read its marker: skip its rows
            return _Skipped(unit_id)
        opened: UnitTransaction = self.writer.open(unit_id, _first_attempt())
        return _Skipped(unit_id, opened.done) if opened.done is not None else opened

    def _finish(self, unit: Any, clock: dict[str, float]) -> pa.RecordBatch:
        """The unit's result row, with the task's seconds since the previous one (then reset)."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if isinstance(unit, _Skipped):
            row = {"unit": unit.unit_id, "messages": 0, "counts": json.dumps(unit.counts), "repeat": True}
        else:
            t0 = time.perf_counter()
            unit.commit()
            clock["commit"] += time.perf_counter() - t0
            row = {
                "unit": unit.unit_id,
                "messages": unit.messages,
                "counts": json.dumps(unit.counts),
                "repeat": False,
            }
        row["seconds"] = json.dumps(clock)
        clock.update(dict.fromkeys(clock, 0.0))
        schema = pa.schema(
            [
                ("unit", pa.string()),
                ("messages", pa.int64()),
                ("counts", pa.string()),
                ("repeat", pa.bool_()),
                ("seconds", pa.string()),
            ]
        )
        return pa.RecordBatch.from_pylist([row], schema=schema)


class _Skipped:
    """A unit committed before: its rows are read past, nothing is produced."""

    def __init__(self, unit_id: str, marker: dict[str, Any] | None = None) -> None:
        self.unit_id = unit_id
        self.counts = dict((marker or {}).get("counts") or {})

    def produce(self, *_: Any) -> None:
        return None

    def abort(self) -> None:
        return None


def _first_attempt() -> bool:
    """The Spark task's first attempt: no earlier attempt of this task can have committed a unit
    the driver did not see (a retried or speculative one may follow one that did)."""
    # lazy: avoids pyspark at import
    from pyspark import TaskContext

    task = TaskContext.get()
    return task is not None and task.attemptNumber() == 0


def run_units(
    df: DataFrame,
    unit_of: dict[tuple[int, int], int],
    unit_ids: list[str],
    writer: UnitWriter,
    messages: MessagesOf,
    done: frozenset[str],
) -> list[tuple[str, int, dict[str, int], bool, dict[str, float]]]:
    """Step 4: (unit, messages, counts per op, written before, the task's seconds per step of
    :data:`TASK_STEPS`) of every unit not in ``done`` that has rows.

    ``unit_of`` maps (partition, bucket) to a unit's index in ``unit_ids``. The changes are
    shuffled into one Spark partition per unit (a label per unit that Spark's hash partitioning
    sends to the unit's own partition, :func:`_labels`), so a task holds exactly one unit and
    needs no sort; Spark runs the units' tasks as cores free up, which balances them. Units in
    ``done`` are left out before the shuffle."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    todo = [i for i, u in enumerate(unit_ids) if u not in done]
    if not todo:
        return []
    spark = df.sparkSession
    labels = _labels(spark, len(todo))
    slot = {u: labels[j] for j, u in enumerate(todo)}
    lookup = spark.createDataFrame(
        [(p, b, u, slot[u]) for (p, b), u in sorted(unit_of.items()) if u in slot],
        f"{PARTITION} int, {BUCKET} int, {UNIT} int, {_LABEL} int",
    )
    with_unit = df.join(F.broadcast(lookup), [PARTITION, BUCKET])
    produce: Any = _Produce(writer, messages, tuple(unit_ids), done)
    try:
        rows = with_unit.repartition(len(todo), _LABEL).mapInArrow(produce, RESULT_SCHEMA).collect()
    except Exception as exc:
        if isinstance(exc, RewindError):
            raise
        raise CompensateStageError(f"a Spark task of the compensation failed: {task_error(exc)}") from exc
    return [
        (r.unit, int(r.messages), json.loads(r.counts), bool(r.repeat), json.loads(r.seconds)) for r in rows
    ]


def _labels(spark: SparkSession, count: int) -> list[int]:
    """For each partition ``i < count`` of a ``repartition(count, column)``, an int that Spark's
    hash partitioning (``pmod(hash(value), count)``, the SQL ``hash``'s murmur3) sends there:
    asked of Spark itself over a few candidates per partition (a tiny job)."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    start, span = 0, max(64, 16 * count)
    while len(found) < count:
        value = F.col("id").cast("int")
        rows = (
            spark.range(start, start + span)
            .select(value.alias("v"), F.pmod(F.hash(value), F.lit(count)).alias("p"))
            .groupBy("p")
            .agg(F.min("v").alias("v"))
            .collect()
        )
        for r in rows:
            found.setdefault(int(r["p"]), int(r["v"]))
        start += span
    return [found[i] for i in range(count)]
