"""A table source's part of ``rewind plan``: selection, placement, key ranges, sample.

Steps, in order (nothing is written anywhere):

1. open the source: the database answers, the table (or query) and the key column exist, the
   key is an integer or text (gate ``source``); the selection's ids have the key's type;
2. count the selection (``SELECT COUNT(*) ... WHERE <selection>``): none is refused (gate
   ``selection``), more than ``guards.max_records`` is refused before any key is fetched
   (gate ``max-records``);
3. fetch the selected keys in the database's order; place each on the target topic's partition
   (the topic's partition count, or ``sink.kafka.partitions`` for a new topic; gate
   ``placement``), count them per partition, leave out ``skip_partitions`` (a reconstruction
   into an Iceberg or SQL table places nothing: a table has no partitions);
4. cut the keys into ``key_ranges`` ranges (default: one per ``run.work_unit_records``
   entities): each is a work unit ``<label>/<range>/0-<entities>`` whose rows one task reads
   with ``key >= lo AND key < hi`` and produces in one transaction;
5. with ``stuck_check_group``, warn about selected entities on stuck partitions;
6. read a sample (the first rows of the first range) as Kafka-shaped records, for the output
   schema and the translate's gate.
"""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.kafka.clients import cluster_metadata
from rewind.tables import reconstruct_plan
from rewind.tables.exceptions import TableSourceError
from rewind.tables.iceberg import IcebergReader
from rewind.tables.placement import (
    counts_by_partition,
    cut_ranges,
    placement,
    stuck_partitions,
)
from rewind.tables.readers import Key, TableReader
from rewind.tables.records import as_records
from rewind.tables.selection import choose
from rewind.tables.sql import SqlReader
from rewind.tables.table_plan import TablePlan

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.spec import JobSpec

SAMPLE_ROWS = 2_000


def catalog_of(settings: Settings) -> tuple[str, dict[str, str]]:
    """The catalog's name and properties (plain data for the tasks); makes the embedded
    warehouse folder as :func:`rewind.catalog.load_catalog` does."""
    if not settings.catalog.properties:
        (settings.state_path / "warehouse").mkdir(parents=True, exist_ok=True)
    return settings.catalog.name, settings.catalog_properties()


def reader_of(settings: Settings, spec: JobSpec) -> TableReader:
    """The reader of the spec's ``source.table`` (plain data: it is pickled to the tasks)."""
    table = spec.source.table
    assert table is not None
    if table.iceberg is not None:
        name, properties = catalog_of(settings)
        return IcebergReader(name, properties, table.iceberg.table, table.key, table.label)

    sql = table.postgres or table.sqlite
    assert sql is not None
    return SqlReader(table.kind, sql.url, sql.table, sql.query, table.key, table.label)


def plan_table(settings: Settings, spec: JobSpec) -> TablePlan:
    """Steps 1-6 of the module docstring."""
    table, kafka = spec.source.table, spec.sink.kafka
    assert table is not None and (kafka is None or kafka.topic is not None)
    out = TablePlan()
    reader = reader_of(settings, spec)
    try:
        # 1-2. source, selection, count
        try:
            key_type = reader.key_type()
            chosen = choose(table, key_type)
            selected = reader.count(chosen.selection)
        except TableSourceError as exc:
            out.gates.append(("source", False, str(exc)))
            return out
        out.gates.append(
            (
                "source",
                True,
                f"{table.label}, key {table.key} ({key_type or 'no row yet'}), {table.selection}",
            )
        )
        rec = table.reconstruct
        if rec is not None and not reconstruct_plan.entity_gate(out, reader, chosen.selection, table.key):
            return out
        facts: dict[str, Any] = {
            "label": table.label,
            "key": table.key,
            "key_type": key_type,
            "selection": table.selection,
            "selected": selected,
            "topic": kafka.topic if kafka is not None else None,
            "partitioner": kafka.partitioner if kafka is not None else None,
        }
        if chosen.ids_digest:
            facts["ids_digest"] = chosen.ids_digest
        out.read_plan = {"table": facts}
        if selected == 0:
            out.gates.append(
                (
                    "selection",
                    False,
                    f"{table.selection} selects no entity of {table.label}; check the ids or the predicate",
                )
            )
            return out
        limit = spec.guards.max_records
        if limit is not None and selected > limit:
            out.gates.append(
                (
                    "max-records",
                    False,
                    f"the selection holds {selected} entities, more than guards.max_records={limit}; "
                    "narrow the selection or raise the guard",
                )
            )
            return out
        out.gates.append(("selection", True, f"{selected} {'states' if rec else 'entities'} selected"))
        # 3. keys, placement
        keys = reader.keys(chosen.selection)
        placed = keys if rec is None else reconstruct_plan.entities(out, keys)  # a state per key
        _note_ids(out, chosen.selection.ids, placed, chosen.repeated)
        if kafka is None:  # a reconstruction into a table: no partition to place an entity on
            into = spec.sink.iceberg or spec.sink.postgres
            assert into is not None
            facts.update(partitions=0, target=f"{spec.sink.kind}:{into.table}")
            parts: list[int] = []
        else:
            placed_on = _placed(out, settings, spec, placed, facts)
            if placed_on is None:
                return out
            parts = placed_on
        # 4. key ranges = work units
        count = table.key_ranges or default_ranges(len(keys), spec.run.work_unit_records)
        ranges = cut_ranges(keys, count)
        facts["ranges"] = [r.to_dict() for r in ranges]
        out.units = tuple(WorkUnit(table.label, i, 0, r.entities, "table") for i, r in enumerate(ranges))
        # 5. stuck partitions
        if table.stuck_check_group:
            _stuck(out, settings, spec, parts, set(table.skip_partitions))
        # 6. sample
        if rec is not None:
            if rec.mode == "snapshots" and not reconstruct_plan.snapshots_gate(
                out, reader, spec, chosen.selection
            ):
                return out
            reconstruct_plan.sample(out, reader, spec, chosen.selection, ranges[0].lo, ranges[0].hi)
            return out
        _sample(out, reader, chosen.selection, ranges[0].lo, ranges[0].hi, table.key, table.label)
        return out
    finally:
        reader.close()


def _placed(
    out: TablePlan, settings: Settings, spec: JobSpec, placed: list[Key], facts: dict[str, Any]
) -> list[int] | None:
    """Step 3's placement: each entity's partition of the target topic (None: the gate failed)."""
    table, kafka = spec.source.table, spec.sink.kafka
    assert table is not None and kafka is not None and kafka.topic is not None
    partitions = _partition_count(settings, kafka.topic, kafka.partitions)
    if partitions is None:
        out.gates.append(
            (
                "placement",
                False,
                f"topic {kafka.topic} does not exist and sink.kafka.partitions is not given: the "
                "partitions of the entities are unknown",
            )
        )
        return None
    parts = placement(placed, partitions, kafka.partitioner)
    by_partition = counts_by_partition(parts)
    wrong = [p for p in table.skip_partitions if p >= partitions]
    if wrong:
        out.gates.append(
            (
                "placement",
                False,
                f"source.table.skip_partitions names partition {wrong[0]}; topic {kafka.topic} has "
                f"{partitions} (0-{partitions - 1})",
            )
        )
        return None
    skipped = {p: by_partition[p] for p in table.skip_partitions if p in by_partition}
    facts.update(
        partitions=partitions,
        placement={str(p): n for p, n in by_partition.items()},
        skipped={str(p): n for p, n in skipped.items()},
    )
    shown = ", ".join(f"{p}: {n}" for p, n in by_partition.items())
    out.gates.append(
        ("placement", True, f"{kafka.partitioner} over {partitions} partitions of {kafka.topic}: {shown}")
    )
    if skipped:
        out.notes.append(
            f"skip_partitions {table.skip_partitions}: {sum(skipped.values())} selected entities land "
            "there and are left out (counted as filtered)"
        )
    return parts


def default_ranges(entities: int, unit_records: int) -> int:
    """One range per ``unit_records`` entities, and at least one per core once each holds
    10,000 (so every core reads and produces)."""
    cores = os.cpu_count() or 1
    return max(1, math.ceil(entities / unit_records), min(cores, entities // 10_000))


def _partition_count(settings: Settings, topic: str, given: int | None) -> int | None:
    meta = cluster_metadata(settings.kafka_config()).topics.get(topic)
    if meta is not None and meta.partitions:
        return len(meta.partitions)
    return given


def _note_ids(out: TablePlan, ids: tuple[Key, ...] | None, keys: list[Key], repeated: int) -> None:
    if repeated:
        out.notes.append(f"source.table.ids_file repeats {repeated} ids; each is re-produced once")
    if ids is None:
        return
    found = set(keys)
    missing = [i for i in ids if i not in found]
    if missing:
        first = ", ".join(repr(m) for m in missing[:5])
        out.notes.append(f"{len(missing)} of the {len(ids)} ids are not in the table (first: {first})")


def _stuck(out: TablePlan, settings: Settings, spec: JobSpec, parts: list[int], skip: set[int]) -> None:
    table, kafka = spec.source.table, spec.sink.kafka
    assert table is not None and table.stuck_check_group and kafka is not None and kafka.topic
    group = table.stuck_check_group
    try:
        stuck = stuck_partitions(settings.kafka_config(), kafka.topic, group, table.stuck_after_s)
    except RewindError as exc:
        out.notes.append(f"warning: the stuck check of group {group} failed: {exc}")
        return
    out.read_plan["table"]["stuck"] = {str(p): facts for p, facts in stuck.items()}
    hit = {p: parts.count(p) for p in stuck if p not in skip and p in parts}
    for p, n in sorted(hit.items()):
        f = stuck[p]
        out.notes.append(
            f"warning: {n} selected entities land on partition {p}, where group {group} has {f['lag']} "
            f"unconsumed records, the oldest {f['oldest_age_s']} s old: their re-produced messages wait "
            f"behind them (skip_partitions: [{p}] leaves them out)"
        )
    if stuck and not hit:
        out.notes.append(
            f"group {group} is stuck on partitions {sorted(stuck)}: no selected entity lands there"
        )


def _sample(
    out: TablePlan, reader: TableReader, selection: Any, lo: Key | None, hi: Key | None, key: str, label: str
) -> None:
    t0 = time.monotonic()
    rows = reader.read(selection, lo, hi, batch_rows=SAMPLE_ROWS)
    try:
        first = next(rows, None)
    except TableSourceError as exc:
        out.gates.append(("source", False, str(exc)))
        return
    finally:
        rows.close()  # ends the query (a generator left open would hold its connection)
    if first is None or not len(first):
        out.facts = {"sample_records": 0}
        return
    batch = as_records(first, key, label, 0, 0, datetime.now(UTC))
    out.sample = pa.Table.from_batches([batch])
    out.facts = {
        "sample_records": batch.num_rows,
        "sample_seconds": round(time.monotonic() - t0, 3),
        "avg_record_bytes": round(out.sample.nbytes / batch.num_rows, 1),
    }
