"""Does a run's backfill topic still hold every record its commits wrote?

A broker can lose records it acknowledged (one that restarts without the last writes it
made durable, noida-db after SIGKILL, a cluster whose leader fails over to a replica that
was behind with ``acks=1``) and records can be removed (retention, DeleteRecords). The run's
bookkeeping knows what its commits wrote, so the run's conclusion and its promotion compare
it with the topic's watermarks (a fetch's true high watermark, not ListOffsets ``latest``):

1. every unit the run's ledger says is done still has its commit marker in the bookkeeping
   (a broker that lost a unit's transaction lost its marker with it): the units are named,
   and the runner reopens them for ``rewind resume``;
2. the topic is there;
3. nothing was removed from its front: where a commit wrote records, the log start has not
   moved past the offset the run's records begin at (:attr:`KafkaStaging.start_offsets`);
4. nothing was lost from its tail: every commit made by the driver recorded the high
   watermarks before (``from_offsets``) and after (``to_offsets``) its records; the topic
   still reaches the last commit's end, and no commit started below the end of the one
   before it (a broker that came back without acknowledged records hands their offsets out
   again);
5. the offsets can hold the rows: per partition, those units committed from tasks recorded
   (``partitions``), and in all the run's rows.

Offsets are not records: transaction markers and the records of aborted attempts take
offsets too, so (5) can miss a loss smaller than them; ``rewind verify`` reads the records.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from rewind.sinks.kafka.exceptions import KafkaSinkError
from rewind.sinks.kafka.topics import partition_watermarks, topic_is_there

if TYPE_CHECKING:
    from rewind.sinks.kafka.bookkeeping import KafkaStaging, RunLog


class StagingLost(KafkaSinkError):
    """The backfill topic no longer holds records a commit of the run wrote; ``units``: those
    done units whose commit marker is gone (empty when the loss is of records only)."""

    def __init__(self, message: str, units: list[str] | None = None) -> None:
        super().__init__(message)
        self.units = list(units or [])


def check_held(
    conf: dict[str, Any], staging: KafkaStaging, runlog: RunLog, done: set[str] | None = None
) -> None:
    """Raise :class:`StagingLost` in one line when the topic lacks committed records, or the
    bookkeeping lacks the marker of a unit in ``done`` (the units the ledger says are done)."""
    gone = sorted((done or set()) - runlog.units())
    if gone:
        raise StagingLost(
            f"run {staging.run_id}: the commits of {len(gone)} finished unit(s) are gone from "
            f"{staging.bookkeeping} (first: {gone[0]}): the broker lost records it had acknowledged "
            f"(a restart without its data); `rewind resume {staging.run_id}` writes them again",
            gone,
        )
    if not runlog.commits:
        return
    if not topic_is_there(conf, staging.topic):
        raise _lost(staging, "the topic does not exist")
    marks = partition_watermarks(conf, staging.topic)
    problem = _problem(staging, runlog, marks)
    if problem is not None:
        raise _lost(staging, problem)


def _problem(staging: KafkaStaging, runlog: RunLog, marks: dict[int, tuple[int, int]]) -> str | None:
    starts = staging.start_offsets
    per_partition: Counter[int] = Counter()  # rows of unit transactions, per partition
    written: set[int] = set()  # partitions some commit wrote records to
    ends: dict[int, int] = {}  # the end of the driver's last commit, per partition
    for commit in runlog.commits:
        for p, n in (commit.get("partitions") or {}).items():
            per_partition[int(p)] += int(n)
            if int(n) > 0:
                written.add(int(p))
        begun = {int(p): int(o) for p, o in (commit.get("from_offsets") or {}).items()}
        for p, end in (commit.get("to_offsets") or {}).items():
            p, end = int(p), int(end)
            if p in ends and begun.get(p, ends[p]) < ends[p]:
                return (
                    f"partition {p}: a commit began at offset {begun[p]}, below the end {ends[p]} "
                    "of the commit before it (the broker handed out acknowledged offsets again)"
                )
            if end > begun.get(p, end):
                written.add(p)
            ends[p] = end
    for p in sorted(set(marks) | set(ends) | written):
        low, high = marks.get(p, (0, 0))
        start = starts.get(p, 0)
        if p in written and low > start:
            return f"partition {p} starts at offset {low}, past {start} where the run's records begin"
        if p in ends and high < ends[p]:
            return f"partition {p} ends at offset {high}, before {ends[p]} where a commit's records end"
        span = max(0, high - max(low, start))
        if span < per_partition.get(p, 0):
            return f"partition {p} spans {span} offsets for {per_partition[p]} committed rows"
    span = sum(max(0, high - max(low, starts.get(p, 0))) for p, (low, high) in marks.items())
    if span < runlog.rows:
        return f"it spans {span} offsets for {runlog.rows} committed rows"
    return None


def _lost(staging: KafkaStaging, problem: str) -> StagingLost:
    return StagingLost(
        f"topic {staging.topic} no longer holds every record run {staging.run_id} committed: {problem}; "
        "the broker lost or removed them (a restart without its data, retention, DeleteRecords): "
        f"`rewind cleanup {staging.run_id}` and run the backfill again"
    )
