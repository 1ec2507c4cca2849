"""The throw-away copy of a job that ``rewind rehearse`` runs, its slice, and its cleanup.

Per sink kind, the throw-away target sits beside the real one and carries the rehearsal's tag
(``rh`` + 6 hex digits), so that cleanup can find everything the rehearsal made by name:

* Iceberg: the table ``<table>_<tag>`` (staging branches and scratch tables carry it too);
* PostgreSQL/SQLite: the table ``<table>_<tag>`` in the same schema (shortened with a hash to
  PostgreSQL's 63 bytes); it does not exist before the run, so staging is created empty from
  the output's schema and the promotion creates it by a rename (the real target's rows are
  never copied);
* Kafka: the topic ``<topic>.<tag>`` (for a Kafka source without a named topic,
  ``<source>.backfill.<tag>``), created by the run and deleted by cleanup; a table source's
  re-produce keeps the real topic's partition count, so entities land where they would.

The quarantine is always ``<namespace>.rewind_quarantine_<tag>`` beside the real one.

Slices: a Kafka or history source's units are cut by :func:`rewind.core.slices.slice_units`
(a share of every partition, spread over its window). A table source's units are key ranges,
read with ``key >= lo AND key < hi``: its slice takes, in every range, a proportional share of
the selected keys as evenly spaced pieces over the range (the same placement as a partition's,
:func:`rewind.core.slices.positions`), each piece a key range of its own.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from rewind.core.slices import SliceError, positions, shares, slice_units
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.job.components import make_sink
from rewind.job.plan import plan_id_of
from rewind.kafka.clients import admin, cluster_metadata
from rewind.sinks.sql.names import TableName, short_ident
from rewind.spec import JobSpec
from rewind.spec.verify import Reference, SqlReference, Verify
from rewind.tables.placement import KeyRange
from rewind.tables.selection import choose

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan

EMPTY_REFERENCE = "SELECT * FROM staging WHERE 1 = 0"
"""The reference a throw-away Kafka topic is verified against: the topic held nothing before
the run, so every row is new, as for a throw-away Iceberg or SQL target that did not exist."""


class RehearsalError(RewindError):
    """A rehearsal cannot start (bad slice, unsupported sink, refused plan): one line."""


def throwaway_spec(spec: JobSpec, tag: str, *, partitions: int | None = None) -> JobSpec:
    """The same job under another name, target and quarantine, with the default verify
    (``partitions``: a table source's topic partition count, from the real plan)."""
    data = json.loads(spec.model_dump_json(by_alias=True))
    data["name"] = f"{spec.name[:54]}-{tag}"
    sink = data["sink"]
    if spec.sink.iceberg is not None:
        sink["iceberg"]["table"] = f"{spec.sink.iceberg.table}_{tag}"
    elif spec.sink.postgres is not None:
        schema, _, name = spec.sink.postgres.table.rpartition(".")
        table = short_ident(name, f"_{tag}")
        sink["postgres"]["table"] = f"{schema}.{table}" if schema else table
    else:
        kafka = spec.sink.kafka
        assert kafka is not None
        base = kafka.topic or f"{spec.source.window.topics[0]}.backfill"
        sink["kafka"]["topic"] = f"{base[: 248 - len(tag)]}.{tag}"
        if spec.source.table is not None:
            if partitions is None:
                raise RehearsalError(
                    f"the real plan does not say how many partitions {kafka.topic} has; nothing rehearsed"
                )
            sink["kafka"]["partitions"] = partitions
    namespace = (spec.quarantine.table or "rewind.x").rpartition(".")[0]
    data["quarantine"] = {"table": f"{namespace}.rewind_quarantine_{tag}"}
    data["verify"] = None
    data.pop("shadow", None)
    return JobSpec.model_validate(data)


def target_name(spec: JobSpec) -> str:
    """The table or topic a spec writes to (a Kafka sink's default topic named as a pattern)."""
    target = spec.sink.target
    return str(getattr(target, "table", None) or getattr(target, "topic", None) or spec.sink.kind)


def throwaway_verify(spec: JobSpec) -> Any:
    """The verify section of the rehearsal: the (empty) throw-away target; a Kafka topic has no
    target to read, so it is compared with an empty reference in ``repair`` mode."""
    if spec.sink.kafka is None:
        return Verify()
    return Verify(reference=Reference(sql=SqlReference(query=EMPTY_REFERENCE)), mode="repair")


def slice_plan(
    settings: Settings, plan: JobPlan, spec: JobSpec, *, fraction: float | None, records: int | None
) -> JobPlan:
    """``plan`` (of the throw-away spec) cut down to its slice, under its own plan id."""
    read_plan = plan.read_plan
    try:
        if spec.source.table is not None:
            units, read_plan = _slice_table(settings, plan, spec, fraction=fraction, records=records)
        else:
            units = slice_units(plan.units, fraction=fraction, records=records)
    except SliceError as exc:
        raise RehearsalError(str(exc)) from None
    return dataclasses.replace(
        plan,
        plan_id=plan_id_of(spec.fingerprint() + "/rehearsal", units),
        units=units,
        offsets=sum(u.end - u.start for u in units),
        read_plan=read_plan,
    )


def key_pieces(keys: list[Any], n: int) -> list[tuple[int, int]]:
    """``[a, b)`` index pieces of the sorted ``keys`` holding about ``n`` of them, spread over the
    list; a piece never splits equal keys (its bounds are key values)."""
    out: list[tuple[int, int]] = []
    last = 0
    for a, b in positions(len(keys), n):
        a = max(a, last)
        while 0 < a < len(keys) and keys[a] == keys[a - 1]:
            a += 1
        while 0 < b < len(keys) and keys[b] == keys[b - 1]:
            b += 1
        if a < b:
            out.append((a, b))
            last = b
    return out


def _slice_table(
    settings: Settings, plan: JobPlan, spec: JobSpec, *, fraction: float | None, records: int | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A table plan's key ranges cut to pieces of the selected keys (fetched again, as the plan
    fetched them): the units and the read plan naming their ranges."""
    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.tables.plan import reader_of

    table = spec.source.table
    assert table is not None
    facts = plan.read_plan["table"]
    ranges = [KeyRange.from_dict(r) for r in facts["ranges"]]
    reader = reader_of(settings, spec)
    try:
        chosen = choose(table, facts.get("key_type"), pinned=facts.get("ids_digest"))
        keys = reader.keys(chosen.selection)
    finally:
        reader.close()
    if len(keys) != sum(r.entities for r in ranges):
        raise RehearsalError(
            f"{table.label}: the selection now holds {len(keys)} entities, the plan counted "
            f"{sum(r.entities for r in ranges)}; rehearse again"
        )
    # the keys come in the database's order, as the plan cut them (a collation may sort text
    # otherwise than Python): range i holds the next r.entities of them
    per_range, at = [], 0
    for r in ranges:
        per_range.append(keys[at : at + r.entities])
        at += r.entities
    wanted = shares([len(k) for k in per_range], fraction=fraction, records=records)
    pieces: list[KeyRange] = []
    for r, mine, n in zip(ranges, per_range, wanted, strict=True):
        for a, b in key_pieces(mine, n):
            hi = mine[b] if b < len(mine) else r.hi
            pieces.append(KeyRange(mine[a], hi, b - a))
    units = tuple(WorkUnit(table.label, i, 0, p.entities, "table") for i, p in enumerate(pieces))
    read_plan = {**plan.read_plan, "table": {**facts, "ranges": [p.to_dict() for p in pieces]}}
    return units, read_plan


def cleanup_targets(settings: Settings, throw: JobSpec, tag: str) -> dict[str, Any]:
    """After ``rewind cleanup RUN``: drop what is left of a throw-away SQL table or Kafka topic
    (a rehearsal stopped halfway) and say what still carries the tag (nothing, normally)."""
    out: dict[str, Any] = {"dropped": [], "left": []}
    if throw.sink.postgres is not None:
        _drop_sql(settings, throw, tag, out)
    elif throw.sink.kafka is not None:
        _drop_topics(settings, tag, out)
    return out


def _drop_sql(settings: Settings, throw: JobSpec, tag: str, out: dict[str, Any]) -> None:
    # lazy: avoids sqlalchemy at import
    from sqlalchemy import inspect, text


    sink = make_sink(settings, throw)
    engine = sink._engine()  # type: ignore[attr-defined]
    try:
        schema = TableName.parse(throw.sink.postgres.table).schema  # type: ignore[union-attr]
        with engine.begin() as conn:
            for name in inspect(conn).get_table_names(schema=schema):
                if tag in name:
                    conn.execute(text(f"DROP TABLE {TableName(schema, name).sql}"))
                    out["dropped"].append(str(TableName(schema, name)))
        with engine.connect() as conn:
            out["left"] = [n for n in inspect(conn).get_table_names(schema=schema) if tag in n]
    finally:
        sink.close()


def _drop_topics(settings: Settings, tag: str, out: dict[str, Any]) -> None:
    def tagged() -> list[str]:
        return sorted(t for t in cluster_metadata(settings.kafka_config()).topics if t.endswith(f".{tag}"))

    found = tagged()
    if found:
        client = admin(settings.kafka_config())
        for topic, fut in client.delete_topics(found, operation_timeout=30).items():
            try:
                fut.result(timeout=30)
                out["dropped"].append(topic)
            except Exception as exc:  # said in the result; the check below decides
                out.setdefault("errors", []).append(f"{topic}: {str(exc).splitlines()[0]}")
        out["left"] = tagged()
