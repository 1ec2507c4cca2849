"""Per-key order when Spark tasks load their units into the sink themselves.

With a unit loader (:attr:`~rewind.spark.job_stage.StageContext.unit_loader`: the Kafka sink's
:mod:`rewind.sinks.kafka.task_load`, one transaction per unit), each task loads its units when
its input ends. The reader groups a wave's ranges layer by layer (one consumer cannot read two
chunks of one partition), so consecutive units of one source partition would land in different
tasks running at once, and a later unit could commit before an earlier one: records of one key
would reach the target out of their source order. So such a wave reads the units of one source
partition as ONE range (:func:`read_ranges`) in ONE task, which gets them in offset order and
loads them one after the other in that order. Tasks of different source partitions run in
parallel; waves run one after the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.core.ranges import OffsetRange

if TYPE_CHECKING:
    from rewind.core.units import WorkUnit


def first_attempt(unit_id: str, attempted: frozenset[str]) -> bool:
    """No attempt of the unit can have committed: the run never started it, and this is the
    Spark task's first attempt (a retried or speculative task may follow a committed one)."""
    # lazy: avoids pyspark at import
    from pyspark import TaskContext

    task = TaskContext.get()
    return unit_id not in attempted and task is not None and task.attemptNumber() == 0


def read_ranges(units: list[WorkUnit], whole_partitions: bool) -> list[OffsetRange]:
    """The ranges the reader gets for a wave's Kafka units: one per unit, or (``whole_partitions``)
    one per source partition, from its first unit's start to its last unit's end, so that one
    task reads them in order. Units done already that lie between are read and left out."""
    if not whole_partitions:
        return [u.range for u in units]
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for u in units:
        lo, hi = spans.get((u.topic, u.partition), (u.start, u.end))
        spans[(u.topic, u.partition)] = (min(lo, u.start), max(hi, u.end))
    return [OffsetRange(t, p, lo, hi) for (t, p), (lo, hi) in sorted(spans.items())]
