"""A reconstruction's part of ``rewind plan`` (``source.table.reconstruct``): its gates and sample.

Added to a table source's plan (:mod:`rewind.tables.plan`), nothing written anywhere:

1. before the selection is counted: no state without an entity (gate ``entity-key``: a null
   key is refused, naming how many rows hold one);
2. the selected keys repeat (one per state): the entities are the distinct keys, placed once
   each, and the key ranges cut between entities (every state of an entity in one unit);
3. ``mode: snapshots``: the distinct snapshot times, each a time (gate ``snapshots``: a null or
   unparseable one is refused); the tasks diff successive snapshots over this list;
4. a sample (the first entities of the first range) through the transition (gate
   ``transition``): the columns it needs are there (``time``, ``tie``, ``compare``, no
   ``prev_<column>`` clash), the business time is a time, every event has a type; the events
   expected per type, the output schema (declared, else the sample's events) with the lineage
   columns of a reconstruction.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from rewind.core.columns import EFFECTIVE_TIME, SOURCE_SYSTEM
from rewind.errors import RewindError
from rewind.tables.exceptions import TableSourceError
from rewind.tables.readers import Key, Selection, TableReader
from rewind.tables.reconstruct_stage import rows_table, source_system, split_last_entity, state_order
from rewind.translate.factory import declared_output_schema, transform_name
from rewind.translate.functions import load_callable
from rewind.translate.lineage import LINEAGE_SCHEMA, TIMESTAMP
from rewind.translate.process import ProcessContext
from rewind.translate.states import NotATime, business_micros
from rewind.translate.transition import PREV_PREFIX, ReconstructContext, reconstruct_batch

if TYPE_CHECKING:
    from rewind.spec import JobSpec
    from rewind.tables.table_plan import TablePlan

SAMPLE_STATES = 5_000


def entity_gate(out: TablePlan, reader: TableReader, selection: Selection, key: str) -> bool:
    """Step 1; False when the gate failed (the plan stops)."""
    nulls = reader.null_keys(selection)
    if nulls:
        out.gates.append(
            (
                "entity-key",
                False,
                f"source.table.key {key!r} is null in {nulls} rows: a state must belong to an entity; "
                f"leave them out (where: {key} IS NOT NULL) or fix them at the source",
            )
        )
        return False
    out.gates.append(("entity-key", True, f"every state has a {key}"))
    return True


def entities(out: TablePlan, keys: list[Key]) -> list[Key]:
    """Step 2: the distinct entities of the selected states (keys sorted, so repeats are adjacent)."""
    distinct = list(dict.fromkeys(keys))
    out.read_plan["table"].update(states=len(keys), entities=len(distinct))
    return distinct


def snapshots_gate(out: TablePlan, reader: TableReader, spec: JobSpec, selection: Selection) -> bool:
    """Step 3; False when the gate failed."""
    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    column = table.reconstruct.time
    try:
        values = reader.distinct(selection, column)
        micros, valid = business_micros(_typed(values), column)
    except (TableSourceError, NotATime) as exc:
        out.gates.append(("snapshots", False, str(exc)))
        return False
    except RewindError as exc:
        out.gates.append(("snapshots", False, f"the snapshot times of {column} cannot be read: {exc}"))
        return False
    if not valid.all():
        bad = [v for v, ok in zip(values, valid.tolist(), strict=True) if not ok]
        out.gates.append(
            (
                "snapshots",
                False,
                f"{len(bad)} snapshot(s) without a snapshot time in {column} (first: {bad[0]!r}); every row "
                "of a snapshot names its time (ISO-8601 text, a timestamp or a date)",
            )
        )
        return False
    snaps = np.unique(micros)
    out.read_plan["table"]["snapshots"] = [int(v) for v in snaps]
    first, last = (
        pa.scalar(int(v), pa.timestamp("us", "UTC")).as_py().isoformat() for v in (snaps[0], snaps[-1])
    )
    out.gates.append(("snapshots", True, f"{len(snaps)} snapshots of {column}, {first} .. {last}"))
    return True


def _typed(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def sample(
    out: TablePlan, reader: TableReader, spec: JobSpec, selection: Selection, lo: Key | None, hi: Key | None
) -> None:
    """Step 4: ``out.output`` holds the gates and schema the job plan takes instead of a translate's."""
    table = spec.source.table
    assert table is not None and table.reconstruct is not None and spec.translate.transition is not None
    t0 = time.monotonic()
    rows = reader.read(selection, lo, hi, batch_rows=SAMPLE_STATES)
    try:
        first = next(rows, None)
    except TableSourceError as exc:
        out.gates.append(("source", False, str(exc)))
        return
    finally:
        rows.close()
    try:
        transition = load_callable(spec.translate.transition, "translate.transition")
    except RewindError as exc:
        out.output = (None, [("transition", False, str(exc))])
        return
    if first is None or not len(first):
        out.facts = {"sample_records": 0}
        out.output = (
            _declared(spec),
            [("transition", True, f"{spec.translate.transition} imported; no state")],
        )
        return
    states = rows_table(first)
    whole, _rest = split_last_entity(states, table.key)
    if whole.num_rows and states.num_rows >= SAMPLE_STATES:
        states = whole  # an entity the sample's end may cut would be paired from part of its history
    problem = _columns_problem(states, spec)
    if problem is not None:
        out.output = (None, [("transition", False, problem)])
        return
    try:
        result = _events(states, transition, spec, out)
    except RewindError as exc:
        out.output = (None, [("transition", False, str(exc))])
        return
    seconds = time.monotonic() - t0
    untyped = result.counts.reasons.get("translate-reject: event without a type", 0)
    if untyped:
        out.output = (
            None,
            [
                (
                    "transition",
                    False,
                    f"translate.transition {spec.translate.transition} returned events without a "
                    f"{table.reconstruct.type_column!r} for {untyped} of {states.num_rows} sampled states; "
                    "give every event its type",
                )
            ],
        )
        return
    entities_n = len(set(states.column(table.key).to_pylist()))
    shown = ", ".join(f"{k} {v}" for k, v in sorted(result.types.items())) or "no event"
    detail = (
        f"{spec.translate.transition} (version {spec.translate.version}) on a sample of {states.num_rows} "
        f"states of {entities_n} entities: {shown}"
    )
    if result.counts.quarantined:
        reasons = ", ".join(f"{k}: {v}" for k, v in result.counts.reasons.items())
        detail += f"; {result.counts.quarantined} quarantined ({reasons})"
    if result.counts.filtered:
        detail += f"; {result.counts.filtered} unchanged"
    _note_full_ties(out, states, spec)
    out.read_plan["table"]["sample"] = {
        "states": states.num_rows,
        "entities": entities_n,
        "events": dict(sorted(result.types.items())),
        "quarantined": result.counts.quarantined,
        "filtered": result.counts.filtered,
    }
    out.facts = {
        "sample_records": states.num_rows,
        "sample_seconds": round(seconds, 3),
        "avg_record_bytes": round(result.rows.nbytes / max(1, result.rows.num_rows), 1),
    }
    schema, schema_gate = _schema(spec, result.rows)
    out.output = (schema, [("transition", True, detail), schema_gate])


def _declared(spec: JobSpec) -> pa.Schema | None:
    declared = declared_output_schema(spec.translate)
    return None if declared is None else _with_lineage(declared)


def _with_lineage(user: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            *user,
            *LINEAGE_SCHEMA,
            pa.field(SOURCE_SYSTEM, pa.string(), nullable=False),
            pa.field(EFFECTIVE_TIME, TIMESTAMP),
        ]
    )


def _schema(spec: JobSpec, rows: pa.Table) -> tuple[pa.Schema | None, tuple[str, bool, str]]:
    declared = _declared(spec)
    if declared is not None:
        return declared, (
            "output-schema",
            True,
            f"{len(declared.names)} columns, from translate.output_schema",
        )
    if rows.num_rows == 0:
        return None, (
            "output-schema",
            False,
            "the sample gave no event, so the events' columns are unknown; give translate.output_schema",
        )
    unknown = [f.name for f in rows.schema if pa.types.is_null(f.type)]
    if unknown:
        return None, (
            "output-schema",
            False,
            f"event column(s) {', '.join(unknown)} are null in every sampled event; give their types in "
            "translate.output_schema",
        )
    return rows.schema, ("output-schema", True, f"{len(rows.schema.names)} columns, from the sample's events")


def _columns_problem(states: pa.Table, spec: JobSpec) -> str | None:
    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    rec = table.reconstruct
    names = states.column_names
    wanted = (
        [("time", rec.time)] + [("tie", c) for c in rec.tie] + [("compare", c) for c in rec.compare or []]
    )
    for field, column in wanted:
        if column not in names:
            listed = ", ".join(names)
            return (
                f"source.table.reconstruct.{field}: no column {column!r} in {table.label} (columns: {listed})"
            )
    clash = [c for c in names if c.startswith(PREV_PREFIX) and c[len(PREV_PREFIX) :] in names]
    if clash:
        return (
            f"column {clash[0]!r} of {table.label} clashes with the previous state's {clash[0]!r} the "
            "transition gets; rename it in a query (SELECT ... AS ...)"
        )
    return None


def _events(states: pa.Table, transition: Any, spec: JobSpec, out: TablePlan) -> Any:
    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    _micros, valid = business_micros(
        states.column(table.reconstruct.time).combine_chunks(), table.reconstruct.time
    )
    if table.reconstruct.mode == "history" and len(valid) and not valid.any():
        values = states.column(table.reconstruct.time).drop_null()
        if len(values):
            raise TableSourceError(
                "source.table.reconstruct.time",
                f"{table.reconstruct.time!r} holds no time among the sampled states (first: "
                f"{values[0].as_py()!r}); give a timestamp or date column, or ISO-8601 text",
            )
    user = None
    declared = _declared(spec)
    if declared is not None:
        user = pa.schema([f for f in declared if not f.name.startswith("_rewind_")])
    ctx = ReconstructContext(
        ProcessContext(
            "plan", "sample", transform_name(spec.translate), spec.translate.version, datetime.now(UTC)
        ),
        table.label,
        0,
        source_system(spec),
        spec.key[0],
    )
    snaps = tuple(out.read_plan["table"].get("snapshots") or ())
    order = state_order(spec, snaps)
    return reconstruct_batch(
        states, transition, order, ctx, 0, output_schema=user, name=spec.translate.transition
    )


def _note_full_ties(out: TablePlan, states: pa.Table, spec: JobSpec) -> None:
    """A note when sampled states of one entity tie on the business time and every tie column:
    their order is the read order, which a database need not keep from one read to the next."""
    table = spec.source.table
    assert table is not None and table.reconstruct is not None
    rec = table.reconstruct
    if rec.mode != "history":
        return
    columns = [table.key, rec.time, *rec.tie]
    tied = int(states.select(columns).to_pandas().duplicated().sum())
    if tied:
        ties = f"{rec.time} and {', '.join(rec.tie)}" if rec.tie else rec.time
        out.notes.append(
            f"warning: {tied} sampled states tie with another state of their entity on {ties}: they are "
            "ordered as read; name a column that orders them in source.table.reconstruct.tie"
        )
