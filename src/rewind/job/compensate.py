"""``rewind compensate RUN --topic T``: correction events instead of a full reprocessing.

A verified run's staging holds the right rows; production (the Iceberg target's ``main``) holds
what consumers downstream already saw. For every key whose user columns differ this writes, to
a Kafka topic the consumers read, either a retraction of the old row and the corrected row
(``retract-and-correct``) or one ``correction`` with both:

* a key only in production: a retraction (``correction`` with ``new`` null);
* a key only in staging: a correction (``retract`` is not needed; ``old`` null);
* a key in both with other values: both (or one ``correction``).

Messages are keyed and partitioned like the live producer (the key's UTF-8 text, or a JSON
list for a composite key; murmur2 over the topic's partitions, :mod:`rewind.kafka.partitioner`),
marked synthetic in headers (``rewind-synthetic: true``, ``rewind-run-id``, ``rewind-op``), and
written exactly once:

1. refuse unless the run's last verification passed (one line);
2. diff production and staging (``--dry-run`` stops here and shows the counts);
3. look for this run's marker in the topic (partition 0, read committed): found → done before,
   nothing written again;
4. one transaction (id ``rewind-compensate-<run>-<topic>``, fencing a zombie): every message,
   then the marker (key ``rewind-compensate``, header ``rewind-marker: <run>``, the counts);
   commit; then the audit entry ``compensated``.

Production is the Iceberg target's ``main`` against the run's staging branch (or table), or a
PostgreSQL/SQLite target table against the run's staging table (both read in one transaction).
Consumers skip records with a ``rewind-marker`` header. The diff reads both sides into memory
(pyiceberg, or through the SQL driver): fine for repairs of up to a few million rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rewind.core.columns import LINEAGE_PREFIX
from rewind.errors import RewindError

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.spec import JobSpec

Shape = Literal["retract-and-correct", "correction"]
SHAPES: tuple[str, ...] = ("retract-and-correct", "correction")
MARKER_KEY = b"rewind-compensate"
MARKER_HEADER = "rewind-marker"


class CompensateRefused(RewindError):
    """The run cannot be compensated (not verified, not an Iceberg read model with a key...)."""


@dataclass(frozen=True)
class Change:
    key: tuple[Any, ...]
    old: dict[str, Any] | None
    new: dict[str, Any] | None


def diff(old: list[dict[str, Any]], new: list[dict[str, Any]], key: list[str]) -> list[Change]:
    """The keys whose user columns differ between ``old`` and ``new`` rows, sorted by key."""

    def user(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if not k.startswith(LINEAGE_PREFIX)}

    before = {tuple(r[k] for k in key): user(r) for r in old}
    after = {tuple(r[k] for k in key): user(r) for r in new}
    out = []
    for k in sorted(before.keys() | after.keys(), key=lambda t: tuple(str(v) for v in t)):
        a, b = before.get(k), after.get(k)
        if a != b:
            out.append(Change(k, a, b))
    return out


def messages(
    changes: list[Change], key: list[str], shape: Shape, run_id: str
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], str]]:
    """(key bytes, value bytes, headers, op) of every compensating message, in key order."""
    out = []
    for c in changes:
        kb = str(c.key[0]).encode() if len(key) == 1 else json.dumps(list(c.key), default=str).encode()
        keyed = dict(zip(key, c.key, strict=True))
        if shape == "correction":
            ops: list[tuple[str, dict[str, Any]]] = [("correction", {"old": c.old, "new": c.new})]
        else:
            ops = ([("retract", {"row": c.old})] if c.old is not None else []) + (
                [("correct", {"row": c.new})] if c.new is not None else []
            )
        for op, body in ops:
            value = json.dumps({"op": op, "key": keyed, **body}, default=str, sort_keys=True).encode()
            headers = [
                ("rewind-synthetic", b"true"),
                ("rewind-run-id", run_id.encode()),
                ("rewind-op", op.encode()),
            ]
            out.append((kb, value, headers, op))
    return out


def compensate_run(
    settings: Settings, run_id: str, topic: str, shape: Shape = "retract-and-correct", dry_run: bool = False
) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns the counts per op and what was written."""
    from rewind.job.plan import JobPlan
    from rewind.ledger import Ledger

    if shape not in SHAPES:
        raise CompensateRefused(f"--shape {shape!r}: use one of {', '.join(SHAPES)}")
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
        _partitions(settings.kafka_config(), topic)  # a missing topic: refused before the diff
        old, new = _sides(settings, spec, run.staging)
        changes = diff(old, new, list(spec.key))
        msgs = messages(changes, list(spec.key), shape, run_id)
        counts = {op: sum(1 for m in msgs if m[3] == op) for op in ("retract", "correct", "correction")}
        out: dict[str, Any] = {
            "run_id": run_id,
            "topic": topic,
            "shape": shape,
            "keys": len(changes),
            "messages": len(msgs),
            "counts": {k: v for k, v in counts.items() if v},
            "dry_run": dry_run,
        }
        if dry_run:
            return out
        out["already_done"] = _marker_found(settings.kafka_config(), topic, run_id)
        if not out["already_done"]:
            _produce(settings.kafka_config(), topic, run_id, msgs, out)
            ledger.audit(run_id, "compensated", {k: v for k, v in out.items() if k != "already_done"})
        return out


def _sides(
    settings: Settings, spec: JobSpec, staging: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Production's rows and the run's staged rows: the Iceberg target's ``main`` and the
    staging branch (or table), or the SQL target table and the staging table (read in one
    transaction)."""
    if spec.sink.postgres is not None:
        from rewind.job.components import make_sink
        from rewind.sinks.sql.publish import read_sides

        sink = make_sink(settings, spec)
        try:
            before, after = read_sides(sink, sink.staging_from_dict(staging))  # type: ignore[arg-type]
        finally:
            sink.close()
        return (before.to_pylist() if before is not None else []), after.to_pylist()
    from rewind.catalog import load_catalog

    assert spec.sink.iceberg is not None
    catalog = load_catalog(settings)
    staged = catalog.load_table(staging["table"])
    ref = staged.snapshot_by_name(staging.get("branch") or "main")
    new = staged.scan(snapshot_id=ref.snapshot_id).to_arrow().to_pylist() if ref is not None else []
    target = spec.sink.iceberg.table
    prod = catalog.load_table(target) if catalog.table_exists(target) else None
    head = prod.current_snapshot() if prod is not None else None
    old = prod.scan(snapshot_id=head.snapshot_id).to_arrow().to_pylist() if prod and head else []
    return old, new


def _partitions(conf: dict[str, Any], topic: str) -> int:
    from rewind.kafka.clients import topic_metadata

    meta = topic_metadata(conf, topic, timeout_s=15)
    if meta is None:
        raise CompensateRefused(
            f"--topic {topic}: no such topic on the broker; create it as the live producer's"
        )
    return len(meta.partitions)


def _marker_found(conf: dict[str, Any], topic: str, run_id: str) -> bool:
    """Step 3: a committed marker of ``run_id`` in partition 0 of ``topic``."""
    from confluent_kafka import Consumer, TopicPartition

    _partitions(conf, topic)
    consumer = Consumer(
        {
            **conf,
            "group.id": f"rewind-compensate-check-{run_id}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        if high <= low:
            return False
        consumer.assign([TopicPartition(topic, 0, low)])
        while True:
            msg = consumer.poll(5.0)
            if msg is None:
                return False
            if msg.error() is not None:
                continue
            if dict(msg.headers() or []).get(MARKER_HEADER) == run_id.encode():
                return True
            if (msg.offset() or 0) >= high - 1:
                return False
    finally:
        consumer.close()


def _produce(
    conf: dict[str, Any],
    topic: str,
    run_id: str,
    msgs: list[tuple[bytes, bytes, list[tuple[str, bytes]], str]],
    out: dict[str, Any],
) -> None:
    """Step 4: the messages and the marker in one transaction."""
    from rewind.kafka.partitioner import partition_of
    from rewind.kafka.producer import TransactionalProducer

    partitions = _partitions(conf, topic)
    writer = TransactionalProducer(
        conf, transactional_id=f"rewind-compensate-{run_id}-{topic}", error=CompensateRefused
    )
    try:
        client = writer.open()
        writer.begin()
        for i, (key, value, headers, _op) in enumerate(msgs):
            sent: list[tuple[str, str | bytes | None]] = list(headers)
            client.produce(topic, value=value, key=key, partition=partition_of(key, partitions), headers=sent)
            if i % 1000 == 0:
                client.poll(0)
        marker = json.dumps({"run_id": run_id, "counts": out["counts"]}, sort_keys=True).encode()
        client.produce(
            topic, value=marker, key=MARKER_KEY, partition=0, headers=[(MARKER_HEADER, run_id.encode())]
        )
        writer.flush()
        writer.commit()
    except Exception:
        writer.abort()
        raise
    finally:
        writer.close()
