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
3. diff production and staging in Spark and count the changes per target partition and bucket
   (``--dry-run`` stops here with the counts);
4. cut the buckets into units of about ``unit_messages`` messages (or take the interrupted
   attempt's units, refusing if their counts changed) and record them in the audit entry
   ``compensate-planned``;
5. the tasks write every unit not done yet in a transaction of its own with its marker;
6. the final marker (the counts), in a transaction of its own; then the audit entry
   ``compensated``.

A compensate killed anywhere and run again finishes what was left: every message once for a
read_committed consumer, who never sees part of a unit. Consumers skip records with a
``rewind-marker`` header.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
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
from rewind.spark.compensate_stage import bucket_counts, changes, placed, run_units

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
        done: frozenset[str] = frozenset()
        clock = _Clock()
        if not dry_run:  # 2.
            with clock.step("markers"):
                if planned is not None:
                    _fence(conf, run_id, topic, [u["id"] for u in planned["units"]], final_transactional_id)
                markers = read_markers(conf, topic, run_id)
            if markers.final is not None:
                final = markers.final
                counts = dict(final.get("counts") or {})
                return {
                    **out,
                    "keys": int(final.get("keys", planned["keys"] if planned else 0)),
                    "messages": int(final.get("messages", sum(counts.values()))),
                    "counts": counts,
                    "already_done": True,
                }
            done = frozenset(markers.units)
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
    done: frozenset[str],
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
            old, new = stack.enter_context(_sides(spark, settings, spec, staging))
        df = placed(changes(old, new, key), key, partitions).persist()
        stack.callback(df.unpersist)
        with clock.step("diff"):  # the sides read, joined, placed, cached and counted
            buckets = bucket_counts(df)  # 3.
        keys = sum(b[2] for b in buckets)
        if shape == "correction":
            counts = {"correction": keys}
        else:
            counts = {"retract": sum(b[3] for b in buckets), "correct": sum(b[4] for b in buckets)}
        counts = {k: v for k, v in counts.items() if v}
        out.update(keys=keys, messages=sum(counts.values()), counts=counts)
        if out["dry_run"]:
            out["seconds"] = clock.seconds
            return out
        units = planned["units"] if planned is not None else _cut(buckets, shape, unit_messages)  # 4.
        unit_of, sizes = _assign(buckets, units, shape)
        if planned is not None:
            changed = [u["id"] for u in units if sizes.get(u["id"], 0) != u["messages"]]
            if changed:
                raise CompensateRefused(
                    f"run {run_id}: production or staging changed since the interrupted compensate to "
                    f"{topic} (unit {changed[0]} now has {sizes.get(changed[0], 0)} messages, planned "
                    f"{next(u['messages'] for u in units if u['id'] == changed[0])}); its units cannot "
                    "be finished exactly once"
                )
        else:
            ledger.audit(
                run_id,
                PLANNED,
                {"topic": topic, "shape": shape, "partitions": partitions, "keys": keys, "units": units},
            )
        writer = UnitWriter(settings.kafka_config(), topic, run_id, shape, tuple(key))
        encoder = MessageEncoder(tuple(key), shape, run_id)
        ids = [u["id"] for u in units]
        with clock.step("units"):  # the shuffle by unit and the tasks' transactions
            results = run_units(df, unit_of, ids, writer, encoder, done)  # 5.
        for r in results:
            for name, seconds in r[4].items():
                clock.add(f"task_{name}", seconds)
    faults.point("compensate-before-final-marker")
    body = {
        "run_id": run_id,
        "counts": out["counts"],
        "keys": out["keys"],
        "messages": out["messages"],
        "units": len(units),
    }
    with clock.step("final"):
        write_final_marker(settings.kafka_config(), topic, run_id, body)  # 6.
    before = sum(1 for u in units if u["id"] in done) + sum(1 for r in results if r[3])
    out.update(already_done=False, units=len(units), units_done_before=before)
    ledger.audit(run_id, "compensated", {k: v for k, v in out.items() if k != "already_done"})
    out["seconds"] = clock.seconds
    log.debug("compensate %s to %s: seconds %s", run_id, topic, clock.seconds)
    return out


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


def _cut(
    buckets: list[tuple[int, int, int, int, int]], shape: str, unit_messages: int
) -> list[dict[str, Any]]:
    """Runs of non-empty buckets of one partition, each of about ``unit_messages`` messages:
    ``{"id", "partition", "lo", "hi", "messages"}`` (buckets ``[lo, hi)``)."""
    units: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for p, b, n, olds, news in buckets:
        m = n if shape == "correction" else olds + news
        if current is None or current["partition"] != p or current["messages"] >= unit_messages:
            current = {"id": "", "partition": p, "lo": b, "hi": b + 1, "messages": 0}
            units.append(current)
        current["hi"] = b + 1
        current["messages"] += m
    for u in units:
        u["id"] = f"p{u['partition']}-b{u['lo']}-{u['hi']}"
    return units


def _assign(
    buckets: list[tuple[int, int, int, int, int]], units: list[dict[str, Any]], shape: str
) -> tuple[dict[tuple[int, int], int], dict[str, int]]:
    """Each non-empty (partition, bucket)'s unit index, and the messages of each unit."""
    unit_of: dict[tuple[int, int], int] = {}
    sizes: dict[str, int] = {}
    by_partition: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for i, u in enumerate(units):
        by_partition.setdefault(u["partition"], []).append((i, u))
    for p, b, n, olds, news in buckets:
        index = next((i for i, u in by_partition.get(p, []) if u["lo"] <= b < u["hi"]), None)
        if index is None:
            raise CompensateRefused(
                "production or staging changed since the interrupted compensate: a changed key falls "
                f"outside its units (partition {p}); its units cannot be finished exactly once"
            )
        unit_of[(p, b)] = index
        uid = units[index]["id"]
        sizes[uid] = sizes.get(uid, 0) + (n if shape == "correction" else olds + news)
    return unit_of, sizes


def _fence(conf: dict[str, Any], run_id: str, topic: str, unit_ids: list[str], final_id: Any) -> None:
    ids = [unit_transactional_id(run_id, topic, u) for u in unit_ids] + [final_id(run_id, topic)]
    fence({**PRODUCER_DEFAULTS, **conf}, ids)


@contextmanager
def _sides(
    spark: SparkSession, settings: Settings, spec: JobSpec, staging: dict[str, Any]
) -> Iterator[tuple[DataFrame, DataFrame]]:
    """Production's rows and the run's staged rows as DataFrames read by the tasks: the Iceberg
    target's ``main`` and the staging branch (or table), files planned by pyiceberg
    (:func:`rewind.sinks.iceberg.read_iceberg`); or slices of the SQL target table and the
    staging table, both of one moment (:func:`rewind.sinks.sql.sides.open_sides`: the driver's
    transaction stays open until the block ends)."""
    if spec.sink.postgres is not None:
        sink = make_sink(settings, spec)
        try:
            with sides.open_sides(spark, sink, sink.staging_from_dict(staging)) as both:  # type: ignore[arg-type]
                yield both
        finally:
            sink.close()
        return

    assert spec.sink.iceberg is not None
    catalog = load_catalog(settings)
    new = read_iceberg(spark, catalog.load_table(staging["table"]), staging.get("branch") or "main")
    target = spec.sink.iceberg.table
    if not catalog.table_exists(target):
        yield spark.createDataFrame([], new.schema), new
        return
    yield read_iceberg(spark, catalog.load_table(target), "main"), new


def _partitions(conf: dict[str, Any], topic: str) -> int:
    meta = topic_metadata(conf, topic, timeout_s=15)
    if meta is None:
        raise CompensateRefused(
            f"--topic {topic}: no such topic on the broker; create it as the live producer's"
        )
    return len(meta.partitions)
