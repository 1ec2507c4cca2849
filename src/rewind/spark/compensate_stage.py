"""The Spark side of ``rewind compensate``: the diff, its units, and the tasks that produce them.

1. :func:`changes`: production and staging (DataFrames) in a full outer join on the key columns
   (null-safe); a key is changed when it is on one side only or when a user column (all but
   ``_rewind_*``; a column one side lacks reads as null there) differs, null-safe. A change is
   the key's columns, ``old`` (production's user columns, a struct, null when absent) and
   ``new`` (staging's);
2. :func:`change_counts`: how many changes, with an old and with a new row (``--dry-run``);
3. :func:`run_units`: each change's unit is a Spark ``hash`` of its key modulo the number of
   units (fixed before anything is written, and recorded with the way it is cut, :data:`CUTS`,
   so that every attempt cuts the same units). Cut as the join cuts its partitions (``join``),
   the units are the join's own partitions when the join has one per unit and nothing
   reshuffles its output (:func:`units_are_join_partitions`): one shuffle, the join's. Else the
   changes of the units not done yet are shuffled again into one Spark partition per unit. Each
   task writes its unit in one transaction
   (:mod:`rewind.kafka.compensation`): the message keys and their partitions (murmur2, as the
   live producer's) are computed there, a batch at a time. A task returns one row: its unit,
   messages, changed keys, counts, whether an earlier attempt had committed it, and where its
   seconds went.

One pass over the sides: nothing is cached and nothing counted before the units are written. A
key's messages are all in its unit, in their order, on the key's partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from rewind.core.columns import LINEAGE_PREFIX
from rewind.errors import RewindError
from rewind.kafka.compensation import Messages, UnitTransaction, UnitWriter, key_text
from rewind.kafka.partitioner import partitions_for
from rewind.spark.job_stage import task_error
from rewind.spark.physical_plan import plan_nodes

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

UNIT, _LABEL = "_rewind_c_unit", "_rewind_c_label"
RESULT_SCHEMA = "unit string, messages long, keys long, counts string, repeat boolean, seconds string"
TASK_STEPS = ("wait", "open", "place", "encode", "produce", "commit")
"""What a task's seconds go to: waiting for rows (the shuffle read upstream), opening the unit's
transaction, the message keys and their partitions, encoding the messages, producing them,
committing."""


CUTS = ("key-hash", "join")
"""How changes are cut into units, recorded in ``compensate-planned`` (an entry without it was
cut by ``key-hash``): ``key-hash`` is ``pmod(hash(key columns), N)``; ``join`` is the partition
that Spark's null-safe join on the key sends the key to among N, ``pmod(hash(coalesce(k,
default), isnull(k), ...), N)`` (:func:`join_defaults`), which lets the join's partitions be the
units (no second shuffle of every change)."""
JOIN_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"}
"""Set (with ``spark.sql.shuffle.partitions`` = the units) while a ``join`` cut is planned and
run, then restored: adaptive execution would coalesce or split the join's partitions, and a
broadcast join keeps production's partitions, not the key's."""


def unit_id(index: int, units: int) -> str:
    """The id of unit ``index`` of ``units`` (its transactional id and marker derive from it)."""
    return f"u{index}-of-{units}"


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


def change_counts(df: DataFrame) -> tuple[int, int, int]:
    """Step 2: (changes, with an old row, with a new row), in one Spark job."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.lit(1)).alias("n"), F.count("old").alias("o"), F.count("new").alias("w")).first()
    return (int(row["n"]), int(row["o"]), int(row["w"])) if row is not None else (0, 0, 0)


def unit_of(key: list[str], units: int, defaults: list[Column] | None = None) -> Column:
    """A change's unit: Spark's ``hash`` (murmur3, seed 42) of its key modulo ``units``, computed
    in the JVM, the same in every attempt and every Spark version (bucketed tables rely on it).
    Without ``defaults`` the ``key-hash`` cut (the key columns hashed); with them (one per key
    column, :func:`join_defaults`) the ``join`` cut, the expressions of Spark's null-safe join."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    if defaults is None:
        return F.pmod(F.hash(*[F.col(k) for k in key]), F.lit(units))
    hashed = []
    for k, default in zip(key, defaults, strict=True):
        hashed += [F.coalesce(F.col(k), default), F.col(k).isNull()]
    return F.pmod(F.hash(*hashed), F.lit(units))


def join_defaults(schema: StructType, key: list[str]) -> list[Column] | None:
    """What Spark's null-safe join hashes in place of a null key column (``Literal.default`` of
    its type), per key column; None when a column's type is not one of these (floating point
    keys are normalised by the join first, and nested types are not keys): the ``key-hash`` cut."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    defaults = []
    for k in key:
        kind = schema[k].dataType
        if isinstance(kind, T.ByteType | T.ShortType | T.IntegerType | T.LongType | T.DecimalType):
            defaults.append(F.lit(0).cast(kind))
        elif isinstance(kind, T.StringType) and kind == T.StringType():  # the default collation
            defaults.append(F.lit(""))
        elif isinstance(kind, T.BinaryType):
            defaults.append(F.lit(bytearray()))
        elif isinstance(kind, T.BooleanType):
            defaults.append(F.lit(False))
        elif isinstance(kind, T.DateType):
            defaults.append(F.lit(date(1970, 1, 1)))
        elif type(kind) is T.TimestampType:
            defaults.append(F.lit(datetime(1970, 1, 1, tzinfo=UTC)))
        else:
            return None
    return defaults


def units_are_join_partitions(df: DataFrame, units: int) -> bool:
    """Whether ``df`` (the changes, then row-by-row work) keeps the partitions of a join that
    shuffled both sides into ``units`` partitions: one shuffled join, its two exchanges, no other
    exchange and no adaptive execution. Spark Connect shows no plan: no."""
    nodes = plan_nodes(df)
    if nodes is None:
        return False
    names = [str(node.nodeName()) for node in nodes]
    exchanges = [node for node, name in zip(nodes, names, strict=True) if name == "Exchange"]
    return (
        sum(name in ("SortMergeJoin", "ShuffledHashJoin") for name in names) == 1
        and len(exchanges) == 2
        and all(int(e.outputPartitioning().numPartitions()) == units for e in exchanges)
        and not any(name in ("AdaptiveSparkPlan", "AQEShuffleRead", "BroadcastExchange") for name in names)
    )


MessagesOf = Callable[["pa.RecordBatch", "pa.Array", "pa.Array"], Messages]
"""The job's message encoder: changes (key columns, ``old``, ``new``), their message keys and
partitions → the :class:`~rewind.kafka.compensation.Messages` to produce."""


@dataclass(frozen=True)
class _Produce:
    """The ``mapInArrow`` function of step 3: the changes of one unit in (a Spark partition holds
    one unit, or none), its result row out."""

    writer: UnitWriter
    messages: MessagesOf
    units: int
    partitions: int
    done: frozenset[str]
    in_join: bool = False
    """The units are the join's partitions: a task's unit is its partition's index."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        clock = dict.fromkeys(TASK_STEPS, 0.0)
        unit: Any = None
        current = -1
        keys = 0
        try:
            it = iter(batches)
            while True:
                t0 = time.perf_counter()
                batch = next(it, None)
                clock["wait"] += time.perf_counter() - t0
                if batch is None:
                    break
                if not batch.num_rows:
                    continue
                index = self._index(batch)
                if unit is None:
                    t0 = time.perf_counter()
                    unit, current = self._open(index), index
                    clock["open"] += time.perf_counter() - t0
                elif index != current:
                    raise CompensateStageError(f"unit {unit.unit_id}'s task got rows of unit {index}")
                keys += batch.num_rows
                if isinstance(unit, _Skipped):
                    continue
                t0 = time.perf_counter()
                kb = key_texts(tuple(batch.column(k) for k in self.writer.key))
                parts = partitions_for(kb.to_numpy(zero_copy_only=False).tolist(), self.partitions)
                t1 = time.perf_counter()
                messages = self.messages(
                    batch.select([*self.writer.key, "old", "new"]), kb, pa.array(parts, pa.int32())
                )
                t2 = time.perf_counter()
                unit.produce(messages)
                clock["place"] += t1 - t0
                clock["encode"] += t2 - t1
                clock["produce"] += time.perf_counter() - t2
            if unit is not None:
                yield self._finish(unit, keys, clock)
                unit = None
        except BaseException:
            if unit is not None:
                unit.abort()
            raise

    def _index(self, batch: pa.RecordBatch) -> int:
        # lazy: avoids pyarrow at import
        import pyarrow.compute as pc

        bounds = pc.min_max(batch.column(UNIT))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low != high:  # a unit per Spark partition (run_units' labels): never two
            raise CompensateStageError(f"units {low} and {high} came to one task")
        if self.in_join:
            # lazy: pyspark's task context, in the task only
            from pyspark import TaskContext

            task = TaskContext.get()
            if task is not None and task.partitionId() != low:  # the join cut its partitions otherwise
                raise CompensateStageError(
                    f"unit {low}'s changes came to the join's partition {task.partitionId()}: the units "
                    "are not the join's partitions (nothing was written for this unit)"
                )
        return int(low)

    def _open(self, index: int) -> Any:
        uid = unit_id(index, self.units)
        if uid in self.done:  # the driver read its marker (run_units leaves its rows out)
            return _Skipped(uid)
        opened: UnitTransaction = self.writer.open(uid, _first_attempt())
        return _Skipped(uid, opened.done) if opened.done is not None else opened

    def _finish(self, unit: Any, keys: int, clock: dict[str, float]) -> pa.RecordBatch:
        """The unit's result row."""
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        if isinstance(unit, _Skipped):
            row = {
                "unit": unit.unit_id,
                "messages": 0,
                "keys": keys,
                "counts": json.dumps(unit.counts),
                "repeat": True,
            }
        else:
            t0 = time.perf_counter()
            unit.commit(keys)
            clock["commit"] += time.perf_counter() - t0
            row = {
                "unit": unit.unit_id,
                "messages": unit.messages,
                "keys": keys,
                "counts": json.dumps(unit.counts),
                "repeat": False,
            }
        row["seconds"] = json.dumps(clock)
        schema = pa.schema(
            [
                ("unit", pa.string()),
                ("messages", pa.int64()),
                ("keys", pa.int64()),
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


@dataclass(frozen=True)
class UnitResult:
    """What a unit's task reports (step 3)."""

    unit: str
    messages: int
    keys: int
    counts: dict[str, int]
    repeat: bool
    """An earlier attempt had committed the unit: its task wrote nothing."""
    seconds: dict[str, float]


def run_units(
    df: DataFrame,
    key: list[str],
    units: int,
    partitions: int,
    writer: UnitWriter,
    messages: MessagesOf,
    done: frozenset[str],
    cut: str = "key-hash",
) -> list[UnitResult]:
    """Step 3, for every unit of ``units`` that has changes and is not in ``done``; ``df`` is
    :func:`changes`, not planned yet; ``cut`` one of :data:`CUTS`.

    ``join``: the join is planned with one partition per unit (:data:`JOIN_CONF`) and, when its
    partitions reach the tasks as they are (:func:`units_are_join_partitions`), each task writes
    the unit of its partition's index. Otherwise the changes are shuffled into one Spark
    partition per unit: a label per unit that Spark's hash partitioning sends to the unit's own
    partition (:func:`_labels`). Either way a task holds exactly one unit and needs no sort;
    Spark runs the units' tasks as cores free up, which balances them. The changes of units in
    ``done`` are left out before any task writes."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    todo = [i for i in range(units) if unit_id(i, units) not in done]
    if not todo:
        return []
    defaults = join_defaults(df.schema, key) if cut == "join" else None
    if cut == "join" and defaults is None:
        raise CompensateStageError(f"the key {key} was cut by the join, but its types take no join cut now")
    spark = df.sparkSession
    saved = {name: spark.conf.get(name) for name in [*JOIN_CONF, "spark.sql.shuffle.partitions"]}
    try:
        if cut == "join":
            for name, value in {**JOIN_CONF, "spark.sql.shuffle.partitions": str(units)}.items():
                spark.conf.set(name, value)
            with_unit = df.withColumn(UNIT, unit_of(key, units, defaults))
            if len(todo) < units:
                with_unit = with_unit.where(F.col(UNIT).isin(todo))
            in_join: Any = _Produce(writer, messages, units, partitions, done, in_join=True)
            job = with_unit.mapInArrow(in_join, RESULT_SCHEMA)
            if units_are_join_partitions(job, units):
                return _collect(job)
            _restore(spark, saved)  # planned otherwise: the general path, as configured
        labels = _labels(len(todo))
        slot = dict.fromkeys(range(units), -1) | {u: labels[j] for j, u in enumerate(todo)}
        label = F.element_at(F.array(*[F.lit(slot[i]) for i in range(units)]), F.col(UNIT) + 1)
        with_unit = df.withColumn(UNIT, unit_of(key, units, defaults)).withColumn(_LABEL, label)
        if len(todo) < units:
            with_unit = with_unit.where(F.col(_LABEL) >= 0)
        produce: Any = _Produce(writer, messages, units, partitions, done)
        return _collect(with_unit.repartition(len(todo), _LABEL).mapInArrow(produce, RESULT_SCHEMA))
    finally:
        _restore(spark, saved)


def _restore(spark: Any, saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            spark.conf.unset(name)
        else:
            spark.conf.set(name, value)


def _collect(job: DataFrame) -> list[UnitResult]:
    try:
        rows = job.collect()
    except Exception as exc:
        if isinstance(exc, RewindError):
            raise
        raise CompensateStageError(f"a Spark task of the compensation failed: {task_error(exc)}") from exc
    return [
        UnitResult(
            r.unit, int(r.messages), int(r.keys), json.loads(r.counts), bool(r.repeat), json.loads(r.seconds)
        )
        for r in rows
    ]


def _labels(count: int) -> list[int]:
    """For each partition ``i < count`` of a ``repartition(count, column)`` of an int column, an
    int that Spark's hash partitioning sends there (``pmod(hash(value), count)``): the smallest
    value found by :func:`spark_hash_int`, computed here rather than asked of Spark in a job
    (three tiny jobs, about 0.3 s in a cold session)."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < count:
        found.setdefault(spark_hash_int(value) % count, value)  # Python's % is Spark's pmod
        value += 1
    return [found[i] for i in range(count)]


_MASK32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark SQL's ``hash`` of an ``int`` (``Murmur3_x86_32.hashInt`` with the seed 42 that
    ``hash`` and hash partitioning use), as the signed 32-bit int Spark returns."""
    k = (value & _MASK32) * 0xCC9E2D51 & _MASK32
    k = _rotl32(k, 15) * 0x1B873593 & _MASK32
    h = _rotl32(seed ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _MASK32
    h ^= 4  # the input's length in bytes
    h ^= h >> 16
    h = h * 0x85EBCA6B & _MASK32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _MASK32
    h ^= h >> 16
    return h - (1 << 32) if h & 0x80000000 else h
