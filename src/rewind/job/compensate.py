"""``rewind compensate RUN --topic T``: correction events instead of a full reprocessing.

A verified run's staging holds the right rows; production (the Iceberg target's ``main``, or
the PostgreSQL/SQLite target table) holds what consumers downstream already saw. For every key
whose user columns differ this writes, to a Kafka topic the consumers read, either a
retraction of the old row and the corrected row (``retract-and-correct``) or one ``correction``
with both:

* a key only in production: a retraction (``correction`` with ``new`` null);
* a key only in staging: a correction (``retract`` is not needed; ``old`` null);
* a key in both with other values: both (or one ``correction``).

Messages are keyed and partitioned like the live producer (:mod:`rewind.kafka.compensation`:
the key's text, murmur2 over the topic's partitions), marked synthetic in headers, and written
exactly once, in Spark (:mod:`rewind.spark.compensate_stage`) with the driver holding counts and
unit ids only:

1. refuse, in one line and before anything is read or written, a run whose last verification
   did not pass, a run without a table staging and a key, a topic that does not exist, one with
   fewer partitions than ``partitions`` (what the live producer places keys by) or than an
   interrupted compensate of the run placed them by, and an unknown shape;
2. (not for ``--dry-run``) an interrupted compensate of the run to this topic (its
   ``compensate-planned`` audit entry, not followed by ``compensated``): fence its units'
   transactional ids and the final one, so that nothing it left open hides partition 0; read
   partition 0 (read committed) for the run's markers: the final one means done before, nothing
   is written again (``already_done``); unit markers name the units done;
3. ``--dry-run``: diff production and staging in Spark and count the changes, and stop;
4. the units: the sides' rows (a bound on the messages, known without a pass over the data)
   over ``unit_messages``, a unit being the keys that hash to it; or the interrupted attempt's,
   refused if its sides changed since (other Iceberg snapshots, other SQL row counts); recorded
   in the audit entry ``compensate-planned`` before anything is written;
5. in one Spark job: the sides read and diffed, the changes in one Spark partition per unit
   (the join's own, or shuffled again: :func:`rewind.spark.compensate_stage.run_units`), and
   the tasks write every unit not done yet in a transaction of its own with its marker;
6. the final marker (the counts the units' tasks and markers report), in a transaction of its
   own; then the audit entry ``compensated``.

A compensate killed anywhere and run again finishes what was left: every message once for a
read_committed consumer, who never sees part of a unit. Consumers skip records with a
``rewind-marker`` header.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rewind import faults
from rewind.catalog import load_catalog
from rewind.errors import RewindError
from rewind.job.compensate_messages import MessageEncoder
from rewind.job.components import make_sink
from rewind.job.plan import JobPlan
from rewind.kafka.clients import topic_metadata
from rewind.kafka.compensation import (
    MARKER_HEADER,
    MARKER_KEY,
    PRODUCER_DEFAULTS,
    UnitWriter,
    fence,
    final_transactional_id,
    read_markers,
    unit_transactional_id,
    write_final_marker,
)
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.sinks.iceberg import read_iceberg
from rewind.sinks.sql import sides
from rewind.spark import session
from rewind.spark.compensate_stage import change_counts, changes, join_defaults, run_units, unit_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.ledger import Ledger
    from rewind.spec import JobSpec

__all__ = ["MARKER_HEADER", "MARKER_KEY", "SHAPES", "CompensateRefused", "Shape", "compensate_run"]

Shape = Literal["retract-and-correct", "correction"]
SHAPES: tuple[str, ...] = ("retract-and-correct", "correction")
UNIT_MESSAGES = 200_000
"""Messages per unit (one transaction): a killed compensate redoes at most one unit per task."""
PLANNED = "compensate-planned"
log = logging.getLogger(__name__)


class _Clock:
    """Seconds per step of one compensate (the result's ``seconds``, logged at debug level): where
    the time goes, driver steps and the tasks' own per-unit steps summed over the units."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = round(self.seconds.get(name, 0.0) + seconds, 3)


class CompensateRefused(RewindError):
    """The run cannot be compensated (not verified, not an Iceberg read model with a key...)."""


@emits(lineage.compensate, lineage.compensated)
def compensate_run(
    settings: Settings,
    run_id: str,
    topic: str,
    shape: Shape = "retract-and-correct",
    dry_run: bool = False,
    *,
    partitions: int | None = None,
    unit_messages: int = UNIT_MESSAGES,
) -> dict[str, Any]:
    """Steps 1-6 of the module docstring; returns the counts per op and what was written."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger

    if shape not in SHAPES:
        raise CompensateRefused(f"--shape {shape!r}: use one of {', '.join(SHAPES)}")
    conf = settings.kafka_config()
    with Ledger.open(settings.ledger) as ledger:
        run = ledger.get_run(run_id)
        verdicts = [e for e in ledger.audit_log(run_id) if e.action == "verify"]
        if not verdicts or not verdicts[-1].details.get("passed"):
            why = "its last verification failed" if verdicts else "it was never verified"
            raise CompensateRefused(
                f"run {run_id} is not verified ({why}); run `rewind verify {run_id}` until it passes"
            )
        spec = JobPlan.from_dict(ledger.get_plan(run.plan_id).plan).job_spec()
        if (spec.sink.iceberg is None and spec.sink.postgres is None) or not spec.key or not run.staging:
            raise CompensateRefused(
                f"run {run_id}: compensation diffs a table staging (Iceberg, PostgreSQL or SQLite) "
                "with production by key; this run has none"
            )
        have = _partitions(conf, topic)  # 1.
        if partitions is not None and have < partitions:
            raise CompensateRefused(
                f"--topic {topic} has {have} partition(s), fewer than the {partitions} the live producer "
                "places keys by (--partitions): add partitions to the topic or name the right count"
            )
        count = partitions or have
        planned = _planned(ledger, run_id, topic)
        if planned is not None and planned["partitions"] != count:
            raise CompensateRefused(
                f"--topic {topic}: an interrupted compensate of {run_id} placed keys over "
                f"{planned['partitions']} partitions, the topic now has {have}; give --partitions "
                f"{planned['partitions']} (or restore the topic's partitions)"
            )
        out: dict[str, Any] = {"run_id": run_id, "topic": topic, "shape": shape, "dry_run": dry_run}
        done: dict[str, dict[str, Any]] = {}
        clock = _Clock()
        if not dry_run:  # 2.
            with clock.step("markers"):
                if planned is not None:
                    _fence(conf, run_id, topic, _unit_ids(planned), final_transactional_id)
                markers = read_markers(conf, topic, run_id)
            if markers.final is not None:
                final = markers.final
                counts = dict(final.get("counts") or {})
                return {
                    **out,
                    "keys": int(final.get("keys") or 0),
                    "messages": int(final.get("messages", sum(counts.values()))),
                    "counts": counts,
                    "already_done": True,
                }
            done = dict(markers.units)
        return _compensate(
            settings, ledger, spec, run.staging, out, count, planned, done, unit_messages, clock
        )


def _compensate(
    settings: Settings,
    ledger: Ledger,
    spec: JobSpec,
    staging: dict[str, Any],
    out: dict[str, Any],
    partitions: int,
    planned: dict[str, Any] | None,
    done: dict[str, dict[str, Any]],
    unit_messages: int,
    clock: _Clock,
) -> dict[str, Any]:
    """Steps 3-6."""
    run_id, topic, shape = out["run_id"], out["topic"], out["shape"]
    key = list(spec.key or [])
    with clock.step("session"):
        spark = session(settings)
    with ExitStack() as stack:  # the sides' reading (a SQL transaction) open until the units are done
        with clock.step("sides"):
            sides = stack.enter_context(_sides(spark, settings, spec, staging))
        diff = changes(sides.old, sides.new, key)
        if out["dry_run"]:
            with clock.step("diff"):  # 3. the sides read, joined and counted
                keys, olds, news = change_counts(diff)
            counts = _counts(shape, keys, olds, news)
            out.update(keys=keys, messages=sum(counts.values()), counts=counts, seconds=clock.seconds)
            return out
        rows, state = sides.size()  # 4.
        if planned is None:
            units = max(1, math.ceil(rows / unit_messages))
            cut = "join" if join_defaults(diff.schema, key) is not None else "key-hash"
            ledger.audit(
                run_id,
                PLANNED,
                {
                    "topic": topic,
                    "shape": shape,
                    "partitions": partitions,
                    "units": units,
                    "cut": cut,
                    "sides": state,
                },
            )
        else:
            units = _planned_units(planned, run_id, topic, state)
            cut = str(planned.get("cut", "key-hash"))  # an entry without it: cut by key-hash
        writer = UnitWriter(settings.kafka_config(), topic, run_id, shape, tuple(key))
        encoder = MessageEncoder(tuple(key), shape, run_id)
        with clock.step("units"):  # 5. the sides read and joined, the shuffle(s), the tasks
            results = run_units(diff, key, units, partitions, writer, encoder, frozenset(done), cut)
    for r in results:
        for name, seconds in r.seconds.items():
            clock.add(f"task_{name}", seconds)
    counts, keys = {}, 0
    for body in [*done.values(), *({"counts": r.counts, "keys": r.keys} for r in results)]:
        keys += int(body.get("keys") or 0)
        for op, n in (body.get("counts") or {}).items():
            counts[op] = counts.get(op, 0) + int(n)
    written = len(done) + len(results)  # the units with changes: each has its marker
    out.update(keys=keys, messages=sum(counts.values()), counts=counts)
    faults.point("compensate-before-final-marker")
    body = {"run_id": run_id, "counts": counts, "keys": keys, "messages": out["messages"], "units": written}
    with clock.step("final"):
        write_final_marker(settings.kafka_config(), topic, run_id, body)  # 6.
    before = len(done) + sum(1 for r in results if r.repeat)
    out.update(already_done=False, units=written, units_done_before=before)
    ledger.audit(run_id, "compensated", {k: v for k, v in out.items() if k != "already_done"})
    out["seconds"] = clock.seconds
    log.debug("compensate %s to %s: seconds %s", run_id, topic, clock.seconds)
    return out


def _counts(shape: str, keys: int, olds: int, news: int) -> dict[str, int]:
    """The messages per op of ``keys`` changes, ``olds`` with an old row, ``news`` with a new one."""
    counts = {"correction": keys} if shape == "correction" else {"retract": olds, "correct": news}
    return {op: n for op, n in counts.items() if n}


def _planned_units(planned: dict[str, Any], run_id: str, topic: str, state: dict[str, Any]) -> int:
    """The unit count of an interrupted compensate, if it can be finished exactly once: the same
    sides (their snapshots, or row counts) and units cut the way this Rewind cuts them."""
    if not isinstance(planned.get("units"), int):
        raise CompensateRefused(
            f"run {run_id}: the interrupted compensate to {topic} was planned by an earlier Rewind "
            "(units by partition); finish it with that version, or compensate to a new topic"
        )
    if planned.get("sides") != state:
        raise CompensateRefused(
            f"run {run_id}: production or staging changed since the interrupted compensate to {topic} "
            f"(then {planned.get('sides')}, now {state}); its units cannot be finished exactly once"
        )
    return int(planned["units"])


def _planned(ledger: Ledger, run_id: str, topic: str) -> dict[str, Any] | None:
    """The units of the run's last compensate to ``topic`` if it did not finish."""
    last = None
    for entry in ledger.audit_log(run_id):
        if entry.details.get("topic") != topic:
            continue
        if entry.action == PLANNED:
            last = dict(entry.details)
        elif entry.action == "compensated":
            last = None
    return last


def _unit_ids(planned: dict[str, Any]) -> list[str]:
    """The ids of a planned compensate's units (an earlier Rewind's list of units, too)."""
    units = planned.get("units")
    if isinstance(units, int):
        return [unit_id(i, units) for i in range(units)]
    return [str(u.get("id")) for u in units or [] if isinstance(u, dict)]


def _fence(conf: dict[str, Any], run_id: str, topic: str, unit_ids: list[str], final_id: Any) -> None:
    ids = [unit_transactional_id(run_id, topic, u) for u in unit_ids] + [final_id(run_id, topic)]
    fence({**PRODUCER_DEFAULTS, **conf}, ids)


@dataclass(frozen=True)
class _Sides:
    old: DataFrame
    new: DataFrame
    size: Callable[[], tuple[int, dict[str, Any]]]
    """The rows of both sides (a bound on the messages, which sizes the units) and what
    identifies their contents (Iceberg snapshot ids, or SQL row counts: an interrupted
    compensate is finished only over the same sides). Asked only when units are cut: a SQL
    side is counted by Spark, a read a ``--dry-run`` does not need."""


@contextmanager
def _sides(
    spark: SparkSession, settings: Settings, spec: JobSpec, staging: dict[str, Any]
) -> Iterator[_Sides]:
    """Production's rows and the run's staged rows as DataFrames read by the tasks: the Iceberg
    target's ``main`` and the staging branch (or table), files planned by pyiceberg
    (:func:`rewind.sinks.iceberg.read_iceberg`), their rows from the snapshots' summaries; or
    slices of the SQL target table and the staging table, both of one moment
    (:func:`rewind.sinks.sql.sides.open_sides`: the driver's transaction stays open until the
    block ends), their rows counted by Spark."""
    if spec.sink.postgres is not None:
        sink = make_sink(settings, spec)
        try:
            with sides.open_sides(spark, sink, sink.staging_from_dict(staging)) as (old, new):  # type: ignore[arg-type]

                def counted() -> tuple[int, dict[str, Any]]:
                    rows = [old.count(), new.count()]
                    return sum(rows), {"rows": rows}

                yield _Sides(old, new, counted)
        finally:
            sink.close()
        return

    assert spec.sink.iceberg is not None
    catalog = load_catalog(settings)
    staged = catalog.load_table(staging["table"])
    ref = staging.get("branch") or "main"
    new = read_iceberg(spark, staged, ref)
    target = spec.sink.iceberg.table
    if not catalog.table_exists(target):
        old = spark.createDataFrame([], new.schema)
        yield _Sides(old, new, lambda: (_records(new, staged, ref), {"staging": _snapshot(staged, ref)}))
        return
    live = catalog.load_table(target)
    old = read_iceberg(spark, live, "main")
    yield _Sides(
        old,
        new,
        lambda: (
            _records(old, live, "main") + _records(new, staged, ref),
            {"production": _snapshot(live, "main"), "staging": _snapshot(staged, ref)},
        ),
    )


def _snapshot(table: Any, ref: str) -> int | None:
    snapshot = table.snapshot_by_name(ref)
    return None if snapshot is None else int(snapshot.snapshot_id)


def _records(df: DataFrame, table: Any, ref: str) -> int:
    """The rows of an Iceberg table at ``ref``: its snapshot's summary, else Spark's count (of
    Parquet files: their footers)."""
    snapshot = table.snapshot_by_name(ref)
    if snapshot is None:
        return 0
    total = (snapshot.summary or {}).get("total-records")
    return int(total) if total is not None else df.count()


def _partitions(conf: dict[str, Any], topic: str) -> int:
    meta = topic_metadata(conf, topic, timeout_s=15)
    if meta is None:
        raise CompensateRefused(
            f"--topic {topic}: no such topic on the broker; create it as the live producer's"
        )
    return len(meta.partitions)
