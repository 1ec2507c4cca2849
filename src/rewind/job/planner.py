"""``rewind plan``: a spec and the broker's answers become a frozen, stored
:class:`~rewind.job.plan.JobPlan`.

Nothing is written anywhere but the ledger's plan table. Steps, in order:

1. resolve the window into per-partition ranges (:func:`rewind.kafka.resolve.resolve`, which
   checks every broker answer) and cut them into work units of ``run.work_unit_records``;
2. read a small sample (the first records of up to 8 units) with a bare consumer: it
   measures the read rate and record size, and runs decode and translate on real data
   (under ``guards.max_records_per_second``: one second's worth of the guard, at its pace);
3. learn the output schema (``translate.output_schema``, else the function on an empty
   frame, else the sample's output) and add the lineage columns;
4. check the gates: sink reachable and compatible, translate importable, output schema
   known, key columns present, no data below the log start, ``guards.max_records`` and
   ``guards.max_bytes`` (on the size estimated from the sample);
5. measure the topics' live produce rate, from the log ends' growth between a look before
   step 2 and one after step 4 (:mod:`rewind.job.realtime`), and set the run's expected speed
   beside it ("x real-time") and when retention takes the window's oldest records.

The plan id is a digest of the spec's fingerprint and the units, so planning the same spec
against the same log gives the same id; the measured estimates are kept but not hashed.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.core.arrow import schema_to_b64
from rewind.core.ranges import OffsetRange
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.history import plan_history
from rewind.history.exceptions import HistoryError
from rewind.history.iterate import sample_ranges
from rewind.job.components import make_sink
from rewind.job.cost import cost_estimate, rehearsed_rates
from rewind.job.merge import CUT_LINE_KEY, resolve_cut_line
from rewind.job.plan import Gate, JobPlan, plan_id_of
from rewind.job.realtime import live_estimate, start_probe
from rewind.job.snapshot import SNAPSHOT_KEY, resolve_snapshot, snapshot_offsets
from rewind.kafka.resolve import resolve
from rewind.spark.kafka_fetch import BATCH_MESSAGES, fetch_ranges
from rewind.spark.ratelimit import LocalPacer, RateLimit
from rewind.spark.sql_translate import sql_translator
from rewind.translate.factory import (
    declared_output_schema,
    lineage_options,
    make_decoder,
    make_translator,
    transform_name,
)
from rewind.translate.functions import infer_output_schema, load_callable

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings
    from rewind.kafka.read_plan import ReadPlan
    from rewind.spec import JobSpec

SAMPLE_RECORDS = 20_000


def cut_units(read_plan: ReadPlan, unit_records: int) -> tuple[WorkUnit, ...]:
    """Work units: each partition's range in chunks of ``unit_records`` offsets, sorted."""
    units = []
    for rng in read_plan.ranges():
        if rng.size == 0:
            continue
        for chunk in rng.split(unit_records):
            units.append(WorkUnit(chunk.topic, chunk.partition, chunk.start, chunk.end))
    return tuple(sorted(units))


def _pinned(read_plan: dict[str, Any]) -> str:
    history = read_plan.get("history") or {}
    snapshot = history.get("archive_snapshot_id")
    state = read_plan.get("snapshot")  # a snapshot source: the state's table snapshot
    pin = "" if state is None else f"{state['table']}@{state['snapshot_id']}"
    return pin if snapshot is None else f"{history.get('archive_table')}@{snapshot}"


def build_plan(settings: Settings, spec: JobSpec) -> JobPlan:
    """Resolve, sample, learn the schema and check the gates. Changes nothing anywhere."""
    conf = settings.kafka_config()
    gates: list[Gate] = []
    read_plan_data: dict[str, Any]
    table_plan = None
    if spec.source.table is not None:  # a re-produce: selection, placement, key ranges
        # lazy: avoids pandas / pyarrow / numpy at import
        from rewind.tables.plan import plan_table

        table_plan = plan_table(settings, spec)
        units, notes, read_plan_data = table_plan.units, list(table_plan.notes), table_plan.read_plan
        gates.extend(Gate(*g) for g in table_plan.gates)
    elif spec.source.history is not None:
        units, notes, history_gate, history = _history_units(settings, spec)
        gates.append(history_gate)
        read_plan_data = history
    else:
        assert spec.source.kafka is not None
        request, snapshot = spec.source.kafka.window_request(), None
        if spec.source.kafka.snapshot is not None:  # only the events after the snapshot's offsets
            snapshot = resolve_snapshot(settings, spec)
            request = spec.source.kafka.snapshot_window_request(snapshot_offsets(snapshot))
        read_plan = resolve(conf, request, declared_log_start=spec.source.kafka.declared_start() or None)
        units = cut_units(read_plan, spec.run.work_unit_records)
        notes = list(read_plan.notes)
        gates.append(_log_start_gate(read_plan))
        read_plan_data = read_plan.to_dict()
        if snapshot is not None:
            read_plan_data[SNAPSHOT_KEY] = snapshot
    probe = start_probe(settings, spec, read_plan_data)  # the first look, before the plan's own work
    offsets = sum(u.end - u.start for u in units)
    if table_plan is not None:
        pass  # a table plan checks guards.max_records itself, before it fetches any key
    elif spec.guards.max_records is not None and offsets > spec.guards.max_records:
        gates.append(
            Gate(
                "max-records",
                False,
                f"the window holds {offsets} offsets, more than "
                f"guards.max_records={spec.guards.max_records}; narrow the window or raise the guard",
            )
        )
    else:
        gates.append(Gate("max-records", True, f"{offsets} offsets"))

    if table_plan is not None and spec.translate.transition is not None:
        # a reconstruction: the transition's gates and its events' schema, from its own sample
        schema, more = table_plan.output or (None, [])
        gates.extend(Gate(*g) for g in more)
        sample_gate_facts = table_plan.facts  # no output: the table plan stopped at a failed gate
    else:
        translator, translator_gate = _load_translator(spec, settings)
        gates.append(translator_gate)
        if table_plan is not None:
            sample, sample_gate_facts = table_plan.sample, table_plan.facts
        else:
            sample, sample_gate_facts = _sample(conf, units, spec, translator)
        if not sample_gate_facts.get("sample_records") and spec.source.history is not None:
            sample, sample_gate_facts = _sample_archive(settings, units, read_plan_data)
        schema, schema_gate = _output_schema(spec, translator, sample)
        gates.append(schema_gate)
    if schema is not None:
        columns = set(schema.names)
        absent = [k for k in spec.key if k not in columns]
        gates.append(
            Gate(
                "key",
                not absent,
                f"key column(s) {absent} not in the output"
                if absent
                else f"key {spec.key or '(event id)'} present",
            )
        )
        gates.append(_sink_gate(settings, spec, schema))
    if spec.merge is not None:  # the cut line is resolved (a group's offsets read) once, here
        merge_gate, cut_line = resolve_cut_line(settings, spec, units)
        gates.append(Gate(*merge_gate))  # type: ignore[misc]
        if cut_line is not None:
            read_plan_data = {**read_plan_data, CUT_LINE_KEY: cut_line}

    estimates = _estimates(spec, offsets, sample_gate_facts)
    estimates["cost"] = _cost(settings, spec, units, sample_gate_facts)
    live = live_estimate(settings, spec, probe, units, estimates["cost"], estimates.get("avg_record_bytes"))
    if live is not None:
        estimates["cost"]["live"] = live
    if spec.guards.max_bytes is not None:
        gates.append(_bytes_gate(spec.guards.max_bytes, estimates.get("estimated_bytes")))
    fingerprint = spec.fingerprint()
    return JobPlan(
        plan_id=plan_id_of(fingerprint, units, table_plan.pinned if table_plan else _pinned(read_plan_data)),
        name=spec.name,
        spec=json.loads(spec.model_dump_json(by_alias=True)),
        read_plan=read_plan_data,
        units=units,
        offsets=offsets,
        output_schema_b64=schema_to_b64(schema) if schema is not None else "",
        output_columns=tuple((f.name, str(f.type)) for f in schema) if schema is not None else (),
        gates=tuple(gates),
        estimates=estimates,
        notes=tuple(notes),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _log_start_gate(read_plan: ReadPlan) -> Gate:
    missing = read_plan.missing()
    if not missing:
        return Gate("log-start", True, "every requested offset is still in Kafka")
    lost = sum(r.size for r in missing)
    where = ", ".join(f"{r.topic}/{r.partition} [{r.start}, {r.end})" for r in missing[:3])
    return Gate(
        "log-start",
        False,
        f"{lost} offsets of the window are no longer in Kafka ({where}); read them from a lake "
        "archive (source: history) or move the window",
    )


def _history_units(
    settings: Settings, spec: JobSpec
) -> tuple[tuple[WorkUnit, ...], list[str], Gate, dict[str, Any]]:
    """Units of a history source: archive ranges read from the lake, the rest from Kafka.

    Gaps are classified by :func:`rewind.history.plan_history`: ``lost`` ranges fail the
    ``coverage`` gate unless ``allow_gaps``; every gap is kept in the plan for the ledger.
    """
    source = spec.source.history
    assert source is not None
    try:
        history = plan_history(
            settings,
            source.topics,
            source.archive,
            source.window_request(),
            declared_log_start=source.declared_start() or None,
            allow_gaps=source.allow_gaps,
        )
    except HistoryError as exc:
        return (), [], Gate("coverage", False, str(exc)), {}
    size = spec.run.work_unit_records
    units: list[WorkUnit] = []
    for kind, ranges in (("archive", history.archive_ranges()), ("kafka", history.kafka_ranges())):
        for rng in ranges:
            for chunk in rng.split(size):
                if chunk.size:
                    units.append(WorkUnit(chunk.topic, chunk.partition, chunk.start, chunk.end, kind))
    gaps = history.gaps()
    lost = [g for g in gaps if g.kind == "lost"]
    detail = (
        f"{len(history.archive_ranges())} archive range(s), {len(history.kafka_ranges())} Kafka range(s); "
        f"{len(gaps)} gap(s), {len(lost)} lost" + (" (allowed by allow_gaps, recorded)" if lost else "")
    )
    data = {"history": history.to_dict(), "gaps": [g.to_dict() for g in gaps]}
    return tuple(sorted(units)), list(history.notes), Gate("coverage", True, detail), data


def _load_translator(spec: JobSpec, settings: Settings) -> tuple[Any, Gate]:
    if spec.translate.sql:
        try:
            sql, gate = sql_translator(settings, spec)
            return sql, Gate(*gate)
        except RewindError as exc:
            return None, Gate("translate", False, str(exc))
    try:
        fn = make_translator(spec.translate)
        if spec.translate.fold:  # a typo here would otherwise surface only after every unit ran
            load_callable(spec.translate.fold, "translate.fold")
    except RewindError as exc:
        return None, Gate("translate", False, str(exc))
    fold = f", fold {spec.translate.fold}" if spec.translate.fold else ""
    return fn, Gate(
        "translate", True, f"{spec.translate.function}{fold} imported (version {spec.translate.version})"
    )


def _sample(
    conf: dict[str, Any], units: tuple[WorkUnit, ...], spec: JobSpec, translator: Any
) -> tuple[Any, dict[str, Any]]:
    """Read up to SAMPLE_RECORDS from the first units (one per partition) and process them.

    Under ``guards.max_records_per_second`` the sample is part of the job: at most one
    second's worth of the guard, read at the guard's pace.
    """
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    firsts: dict[tuple[str, int], WorkUnit] = {}
    for unit in units:
        if unit.source == "kafka":  # the sample is read with a bare consumer
            firsts.setdefault((unit.topic, unit.partition), unit)
    picked = list(firsts.values())[:8]
    if not picked:
        return None, {"sample_records": 0}
    budget, pacer, batch = SAMPLE_RECORDS, None, BATCH_MESSAGES
    rate = spec.guards.max_records_per_second
    if rate:
        budget = min(SAMPLE_RECORDS, max(len(picked), int(rate)))
        pacer, batch = LocalPacer(RateLimit(rate)), max(1, min(BATCH_MESSAGES, int(rate / 20)))
    per = max(1, budget // len(picked))
    ranges = [OffsetRange(u.topic, u.partition, u.start, min(u.end, u.start + per)) for u in picked]
    t0 = time.monotonic()
    batches = list(fetch_ranges(conf, ranges, poll_timeout_s=30, batch_messages=batch, pacer=pacer))
    seconds = time.monotonic() - t0
    table = pa.Table.from_batches(batches) if batches else None
    facts: dict[str, Any] = {
        "sample_records": table.num_rows if table is not None else 0,
        "sample_seconds": round(seconds, 3),
    }
    if table is not None and table.num_rows:
        facts["avg_record_bytes"] = round(table.nbytes / table.num_rows, 1)
        facts["sample_read_rps"] = round(table.num_rows / seconds) if seconds > 0 else None
    return table, facts


def _sample_archive(
    settings: Settings, units: tuple[WorkUnit, ...], read_plan: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
    """The sample of a window with no Kafka units: read from the archive at the pinned snapshot."""
    history = read_plan.get("history") or {}
    firsts: dict[tuple[str, int], WorkUnit] = {}
    for unit in units:
        firsts.setdefault((unit.topic, unit.partition), unit)
    picked = list(firsts.values())[:8]
    if not picked or not history.get("archive_table"):
        return None, {"sample_records": 0}
    per = max(1, SAMPLE_RECORDS // len(picked))
    ranges = [OffsetRange(u.topic, u.partition, u.start, min(u.end, u.start + per)) for u in picked]
    t0 = time.monotonic()
    table = load_catalog(settings).load_table(history["archive_table"])
    sample = sample_ranges(table, history.get("archive_snapshot_id"), ranges)
    facts: dict[str, Any] = {
        "sample_records": sample.num_rows if sample is not None else 0,
        "sample_seconds": round(time.monotonic() - t0, 3),
        "sample_source": "archive",
    }
    if sample is not None and sample.num_rows:
        facts["avg_record_bytes"] = round(sample.nbytes / sample.num_rows, 1)
    return sample, facts


def _output_schema(spec: JobSpec, translator: Any, sample: Any) -> tuple[pa.Schema | None, Gate]:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids pandas / pyarrow / numpy at import
    from rewind.translate.process import ProcessContext, process_batch

    if translator is None and spec.translate.sql is not None:
        return None, Gate("output-schema", False, "unknown: translate.sql does not run (the translate gate)")
    declared = declared_output_schema(spec.translate)
    decoder = make_decoder(spec.decode)
    user: pa.Schema | None = declared
    how = "translate.output_schema"
    if user is None and translator is not None:
        try:
            user = infer_output_schema(translator, decoder.empty_events()).arrow_schema()
            how = "the translate function on an empty frame"
        except RewindError:
            user = None
    ctx = ProcessContext(
        "plan", "sample", transform_name(spec.translate), spec.translate.version, datetime.now(UTC)
    )
    if sample is not None and sample.num_rows and (translator is not None or spec.translate.sql is None):
        try:
            result = process_batch(
                sample, decoder, translator, spec.key, ctx, output_schema=user, **lineage_options(spec)
            )
        except RewindError as exc:
            return None, Gate("output-schema", False, f"the sample could not be processed: {exc}")
        if result.rows.num_rows or user is not None:
            schema = result.rows.schema
            if user is None:
                how = "the sample's output"
            return schema, Gate("output-schema", True, f"{len(schema.names)} columns, from {how}")
        raised = _translate_raised_on_all(result.quarantine, sample.num_rows, result.counts.filtered)
        if raised is not None:
            return None, Gate("output-schema", False, raised)
    if user is None:
        return None, Gate(
            "output-schema",
            False,
            "the output schema is unknown (no sample output, the function "
            "cannot run on an empty frame); give translate.output_schema",
        )
    empty = pa.Table.from_batches(
        [],
        schema=pa.schema(
            [
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("timestampType", pa.int32()),
            ]
        ),
    )
    lineage = lineage_options(spec)
    result = process_batch(empty, decoder, translator, spec.key, ctx, output_schema=user, **lineage)
    return result.rows.schema, Gate(
        "output-schema", True, f"{len(result.rows.schema.names)} columns, from {how}"
    )


def _translate_raised_on_all(quarantine: pa.Table, sampled: int, filtered: int) -> str | None:
    """Say so when the sample gave no row because the translate raised on every record that
    reached it: the schema is unknown because the function fails, not for want of data."""
    stages = quarantine.column("stage").to_pylist()
    raised = [i for i, stage in enumerate(stages) if stage == "translate-error"]
    if not raised or filtered:  # records it returned nothing for reached it and did not raise
        return None
    first = quarantine.slice(raised[0], 1).to_pylist()[0]
    rest = sampled - len(raised)
    return (
        f"the translate raised on every sampled record it was given ({len(raised)} of {sampled}"
        + (f"; {rest} never reached it" if rest else "")
        + f"); first, at {first['topic']}/{first['partition']} offset {first['offset']}: "
        f"{first['reason']}; fix the function, or declare translate.output_schema so that the "
        "plan does not need its output"
    )


def _sink_gate(settings: Settings, spec: JobSpec, schema: pa.Schema) -> Gate:
    try:
        sink = make_sink(settings, spec)
        return Gate("sink", True, sink.check(schema))
    except RewindError as exc:
        return Gate("sink", False, str(exc))


def _bytes_gate(limit: int, estimated: int | None) -> Gate:
    if estimated is None:
        return Gate("max-bytes", True, "no sample to estimate the size from (the window holds no record)")
    if estimated > limit:
        return Gate(
            "max-bytes",
            False,
            f"the window is estimated at {estimated} bytes, more than guards.max_bytes={limit}; "
            "narrow the window or raise the guard",
        )
    return Gate("max-bytes", True, f"about {estimated} bytes")


def _cost(
    settings: Settings, spec: JobSpec, units: tuple[WorkUnit, ...], facts: dict[str, Any]
) -> dict[str, Any]:
    """The cost model (:mod:`rewind.job.cost`), on a passed rehearsal's rates when there is one."""
    return cost_estimate(settings, units, facts, rehearsed_rates(settings, spec.fingerprint()))


def _estimates(spec: JobSpec, offsets: int, facts: dict[str, Any]) -> dict[str, Any]:
    out = dict(facts)
    avg = facts.get("avg_record_bytes")
    if avg:
        out["estimated_bytes"] = int(avg * offsets)
    rate = spec.guards.max_records_per_second
    if rate:
        out["seconds_at_guard_rate"] = round(offsets / rate, 1)
    measured = facts.get("sample_read_rps")
    if measured:
        out["seconds_at_sampled_rate"] = round(offsets / measured, 1)
    return out
