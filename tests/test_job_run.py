"""Backfill runs end to end: real broker, real Spark, real Iceberg (SQLite catalog), real ledger.

One module-scoped run of the order_lines job over 3 partitions produces every fate a record
can have (row, two rows, filtered, malformed JSON, rejected, raising translate, null key);
the tests check its staging row for row against what the produced data says it must be, its
lineage, its quarantine and its counts. A second run of the same spec into a fresh table
checks determinism, and a small Avro job checks an unknown schema id.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from rewind.config import Settings, load_settings
from rewind.core.console import QuietConsole
from rewind.job.runner import RunOutcome
from rewind.spec import JobSpec, parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce

PARTITIONS = 3
RECORDS = 3000
UNIT_RECORDS = 250
TRANSFORM = "order_lines"
VERSION = "3"


@dataclass
class Job:
    settings: Settings
    topic: str
    orders: list[jf.Order]
    coords: dict[int, tuple[int, int]]
    spec: JobSpec
    outcome: RunOutcome
    seconds: float


def job_settings(tmp: Path, bootstrap: str) -> Settings:
    return load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Job:
    import time
    import uuid

    from rewind.job.service import run_job

    tmp = tmp_path_factory.mktemp("job-run")
    settings = job_settings(tmp, bootstrap)
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, PARTITIONS)
    orders = jf.order_events(RECORDS, PARTITIONS)
    coords = jf.produce_orders(conf, topic, orders)
    spec = parse_spec(
        jf.order_spec("orders-run", topic, "shop.order_lines", unit_records=UNIT_RECORDS, version=VERSION)
    )
    began = time.monotonic()
    outcome = run_job(settings, spec, units_per_wave=4)
    return Job(settings, topic, orders, coords, spec, outcome, time.monotonic() - began)


def fates(job: Job) -> Counter[str]:
    return Counter(o.fate for o in job.orders)


def staging(job: Job) -> list[dict[str, Any]]:
    return jf.staging_table(job.settings, job.outcome.staging).to_pylist()


def test_the_data_has_every_fate(job: Job) -> None:
    seen = fates(job)
    assert set(seen) == set(jf.FATES), seen
    assert all(count >= 3 for count in seen.values()), seen


def test_run_succeeds_in_several_waves_into_a_staging_table(job: Job) -> None:
    out = job.outcome
    assert out.state == "succeeded"
    assert out.units == PARTITIONS * RECORDS // PARTITIONS // UNIT_RECORDS == 12
    assert out.waves == 3
    assert out.staging["created_table"] is True  # the target does not exist: a new read model
    assert out.staging["table"].startswith("shop.order_lines__rewind_")
    assert out.quarantine_table == "shop.rewind_quarantine"


def test_staging_equals_what_the_produced_data_says(job: Job) -> None:
    got = sorted(staging(job), key=lambda r: r["_rewind_event_id"])
    want = jf.expected_rows(job.topic, job.orders, job.coords, TRANSFORM, VERSION)
    assert len(got) == len(want) == fates(job)["row"] + 2 * fates(job)["double"]
    for g, w in zip(got, want, strict=True):
        ts = g.pop("_rewind_source_timestamp")
        assert int(ts.timestamp() * 1000) == w.pop("_rewind_source_timestamp_ms")
        assert {k: g[k] for k in w} == w


def test_every_row_carries_lineage(job: Job) -> None:
    rows = staging(job)
    run_id = job.outcome.run_id
    lineage = [c for c in rows[0] if c.startswith("_rewind_")]
    assert lineage == [
        "_rewind_event_id",
        "_rewind_source_topic",
        "_rewind_source_partition",
        "_rewind_source_offset",
        "_rewind_source_timestamp",
        "_rewind_extracted_at",
        "_rewind_transform",
        "_rewind_transform_version",
        "_rewind_run_id",
        "_rewind_synthetic",
    ]
    run_started = datetime.fromisoformat(_show(job)["started_at"])
    extracted: dict[tuple[int, int], set[datetime]] = {}
    for r in rows:
        assert all(r[c] is not None for c in lineage), r
        assert r["_rewind_synthetic"] is True
        assert r["_rewind_run_id"] == run_id
        assert r["_rewind_transform"] == TRANSFORM
        assert r["_rewind_transform_version"] == VERSION
        assert r["_rewind_source_topic"] == job.topic
        assert len(r["_rewind_event_id"]) == 32
        assert run_started <= r["_rewind_extracted_at"] <= datetime.now(UTC)
        unit = r["_rewind_source_offset"] // UNIT_RECORDS
        extracted.setdefault((r["_rewind_source_partition"], unit), set()).add(r["_rewind_extracted_at"])
    # one extraction time per unit (a unit is read by one task, once, in this run)
    assert all(len(times) == 1 for times in extracted.values()), extracted
    ids = [r["_rewind_event_id"] for r in rows]
    assert len(set(ids)) == len(ids)


def test_quarantine_holds_each_bad_record_whole(job: Job) -> None:
    run_id = job.outcome.run_id
    got = jf.quarantine_rows(job.settings, job.outcome.quarantine_table, run_id)
    bad = {job.coords[o.index]: o for o in job.orders if o.fate not in ("row", "double", "filtered")}
    assert len(got) == len(bad)
    shown = _show(job)
    units = {u["unit_id"] for u in shown["units"]}
    started, finished = (datetime.fromisoformat(shown[k]) for k in ("started_at", "finished_at"))
    for q in got:
        o = bad[(q["partition"], q["offset"])]
        assert q["topic"] == job.topic
        assert q["run_id"] == run_id
        assert q["key"] == o.key and q["value"] == o.value  # raw bytes, replayable
        assert int(q["timestamp"].timestamp() * 1000) == o.timestamp_ms
        assert q["stage"] == o.fate
        assert started <= q["at"] <= finished  # quarantined by this run, while it ran
        start = q["offset"] // UNIT_RECORDS * UNIT_RECORDS
        assert q["unit_id"] == f"{job.topic}/{q['partition']}/{start}-{start + UNIT_RECORDS}"
        assert q["unit_id"] in units
        reason = q["reason"]
        if o.fate == "decode":
            assert reason.startswith("invalid JSON"), reason
        elif o.fate == "translate-reject":
            assert reason == "negative amount"
        elif o.fate == "translate-error":
            assert reason == "ValueError: amount 13 is unlucky"
        else:
            assert reason == "key column 'order_id' is null"


def test_counts_add_up_per_unit_and_in_total(job: Job) -> None:
    from rewind.job.service import open_ledger

    seen = fates(job)
    quarantined = seen["decode"] + seen["translate-reject"] + seen["translate-error"] + seen["key-null"]
    want = {
        "records_read": RECORDS,
        "emitted": seen["row"] + seen["double"],
        "rows_out": seen["row"] + 2 * seen["double"],
        "quarantined": quarantined,
        "filtered": seen["filtered"],
    }
    shown = _show(job)
    assert {k: shown[k] for k in want} == want
    assert {k: job.outcome.to_dict()[k] for k in want} == want
    assert shown["state"] == "succeeded"
    assert shown["units_by_state"] == {"done": 12}
    reasons = _flatten(shown["quarantine_reasons"])
    assert sum(reasons.values()) == quarantined
    by_stage = Counter()
    for label, count in reasons.items():
        by_stage[label.split(":", 1)[0]] += count
    assert by_stage == {s: seen[s] for s in ("decode", "translate-reject", "translate-error", "key-null")}

    # per unit, from the ledger itself, against the produced data
    per_unit: dict[str, Counter[str]] = {}
    for o in job.orders:
        partition, offset = job.coords[o.index]
        start = offset // UNIT_RECORDS * UNIT_RECORDS
        per_unit.setdefault(f"{job.topic}/{partition}/{start}-{start + UNIT_RECORDS}", Counter())[o.fate] += 1
    with open_ledger(job.settings) as ledger:
        units = ledger.units(job.outcome.run_id)
    assert {u.unit_id for u in units} == set(per_unit)
    for u in units:
        f = per_unit[u.unit_id]
        assert u.state == "done" and u.attempts == 1
        assert u.records_read == sum(f.values()) == u.emitted + u.quarantined + u.filtered
        assert u.emitted == f["row"] + f["double"]
        assert u.rows_out == f["row"] + 2 * f["double"]
        assert u.filtered == f["filtered"]
        assert u.quarantined == f["decode"] + f["translate-reject"] + f["translate-error"] + f["key-null"]


def test_the_plan_is_deterministic(job: Job) -> None:
    from rewind.job.service import plan_job

    first = plan_job(job.settings, job.spec)
    again = plan_job(job.settings, parse_spec(job.spec.canonical()))
    assert first.ok and again.ok
    assert first.plan_id == again.plan_id == job.outcome.plan_id
    assert first.units == again.units
    assert [u.id for u in first.units] == sorted(u.id for u in first.units)
    assert first.offsets == RECORDS
    assert {(u.partition, u.start, u.end) for u in first.units} == {
        (p, s, s + UNIT_RECORDS) for p in range(PARTITIONS) for s in range(0, 1000, UNIT_RECORDS)
    }


class StageRecorder(QuietConsole):
    """A console that keeps the stages a run reports, in order."""

    def __init__(self) -> None:
        self.stages: list[str] = []

    def stage(self, name: str, description: str) -> None:
        self.stages.append(description)


def test_a_rerun_into_a_fresh_table_gives_the_same_event_ids(job: Job) -> None:
    from rewind.job.service import load_plan, open_ledger, run_job
    from rewind.job.stages import plan_stages

    spec = parse_spec({**job.spec.canonical(), "sink": {"iceberg": {"table": "shop.order_lines_again"}}})
    recorder = StageRecorder()
    again = run_job(job.settings, spec, units_per_wave=12, console=recorder)
    assert again.state == "succeeded" and again.run_id != job.outcome.run_id
    assert again.waves == 1
    # the run walked exactly the stages its plan gives (what `rewind plan` prints)
    with open_ledger(job.settings) as ledger:
        plan = load_plan(ledger, again.plan_id)
    planned = plan_stages(plan, target="iceberg:shop.order_lines_again", wave_size=12)
    assert recorder.stages == [s.describe() for s in planned]
    assert [s.name for s in planned] == ["take-lease", "prepare-staging", "reconcile", "run-wave", "conclude"]
    first = {r["_rewind_event_id"]: r for r in staging(job)}
    second = {r["_rewind_event_id"]: r for r in jf.staging_table(job.settings, again.staging).to_pylist()}
    assert second.keys() == first.keys()
    volatile = ("_rewind_extracted_at", "_rewind_run_id")
    for eid, row in first.items():
        assert {k: v for k, v in row.items() if k not in volatile} == {
            k: v for k, v in second[eid].items() if k not in volatile
        }
    q1 = jf.quarantine_rows(job.settings, job.outcome.quarantine_table, job.outcome.run_id)
    q2 = jf.quarantine_rows(job.settings, again.quarantine_table, again.run_id)
    keep = ("topic", "partition", "offset", "key", "value", "stage", "reason", "unit_id")
    assert [{k: q[k] for k in keep} for q in q1] == [{k: q[k] for k in keep} for q in q2]


def test_an_unknown_avro_schema_id_is_quarantined(
    tmp_path: Path, bootstrap: str, topic_name: str, spark: Any
) -> None:
    import fastavro

    from rewind.job.service import run_job

    schema = {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "order_id", "type": "long"}, {"name": "amount", "type": "double"}],
    }
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "7.avsc").write_text(json.dumps(schema))
    parsed = fastavro.parse_schema(schema)

    def wire(schema_id: int, order_id: int) -> bytes:
        body = io.BytesIO()
        fastavro.schemaless_writer(body, parsed, {"order_id": order_id, "amount": order_id / 4})
        return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()

    settings = job_settings(tmp_path, bootstrap)
    conf = settings.kafka_config()
    create_topic(conf, topic_name, 1)
    values = [wire(99 if i % 10 == 4 else 7, i) for i in range(200)]
    produce(conf, topic_name, [(0, None, v, None) for v in values])
    spec = parse_spec(
        {
            "name": "avro-orders",
            "source": {"kafka": {"topics": [topic_name]}},
            "decode": {
                "format": "avro",
                "schema_dir": str(schemas),
                "reader_schema": str(schemas / "7.avsc"),
            },
            "translate": {"function": "tests.job_fixtures:keep_orders", "version": "1"},
            "sink": {"iceberg": {"table": "avro.orders"}},
        }
    )
    out = run_job(settings, spec)
    assert out.state == "succeeded"
    assert (out.counts.records_read, out.counts.emitted, out.counts.quarantined) == (200, 180, 20)
    assert out.counts.reasons == {"decode: unknown schema id": 20}
    rows = jf.staging_table(settings, out.staging).to_pylist()
    assert sorted(r["order_id"] for r in rows) == [i for i in range(200) if i % 10 != 4]
    assert all(r["amount"] == r["order_id"] / 4 for r in rows)
    q = jf.quarantine_rows(settings, out.quarantine_table, out.run_id)
    assert [r["offset"] for r in q] == [i for i in range(200) if i % 10 == 4]
    assert {(r["stage"], r["reason"]) for r in q} == {("decode", "unknown schema id 99")}
    assert [r["value"] for r in q] == [values[r["offset"]] for r in q]


def _show(job: Job) -> dict[str, Any]:
    from rewind.job.service import show_run

    return show_run(job.settings, job.outcome.run_id)


def _flatten(reasons: dict[str, Any], prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in reasons.items():
        label = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{label}: "))
        else:
            out[label] = int(value)
    return out


def test_a_translate_breaking_its_contract_mid_run_fails_the_run_with_one_line(
    job: Job, topic_name: str
) -> None:
    """The plan's sample passes; a later unit makes the function return a string. The task's
    own error reaches the caller and the ledger as one line; earlier waves stay committed."""
    from rewind.job.service import list_runs, run_job, show_run
    from rewind.spark.job_stage import StageError

    conf = job.settings.kafka_config()
    create_topic(conf, topic_name, 1)
    jf.produce_orders(conf, topic_name, jf.order_events(2000, 1))  # order ids 1000..2999
    schema = {"order_id": "long", "amount": "double"}
    spec = parse_spec(
        jf.order_spec(
            "late-break",
            topic_name,
            "shop.late_break",
            unit_records=500,
            translate={
                "function": "tests.job_fixtures:breaks_contract_late",
                "version": "1",
                "output_schema": schema,
            },
        )
    )
    with pytest.raises(StageError) as caught:
        run_job(job.settings, spec, units_per_wave=2)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    assert message.endswith(
        "TranslateOutputError: translate.function tests.job_fixtures:breaks_contract_late returned a str; "
        "expected a pandas DataFrame or a TranslateResult"
    ), message
    run_id = next(r["run_id"] for r in list_runs(job.settings) if r["name"] == "late-break")
    shown = show_run(job.settings, run_id)
    assert shown["state"] == "failed" and shown["error"] == f"StageError: {message}"
    assert shown["units_by_state"] == {"done": 2, "failed": 2}
    staging = jf.staging_table(job.settings, shown["staging"]).to_pylist()
    assert sorted({r["_rewind_source_offset"] // 500 for r in staging}) == [0, 1]  # the first wave only


@hypothesis_settings(max_examples=60, deadline=None)
@given(wave_size=st.integers(1, 40), done_mask=st.lists(st.booleans(), min_size=12, max_size=12))
def test_the_waves_of_the_stages_cover_every_unit_not_done_once_in_plan_order(
    job: Job, wave_size: int, done_mask: list[bool]
) -> None:
    from rewind.job.service import load_plan, open_ledger
    from rewind.job.stages import Conclude, RunWave, TakeLease, plan_stages

    with open_ledger(job.settings) as ledger:
        plan = load_plan(ledger, job.outcome.plan_id)
    done = [u.id for u, d in zip(plan.units, done_mask, strict=True) if d]
    stages = plan_stages(plan, target="iceberg:x.y", wave_size=wave_size, done=done)
    assert stages == plan_stages(plan, target="iceberg:x.y", wave_size=wave_size, done=done)  # pure
    assert isinstance(stages[0], TakeLease) and isinstance(stages[-1], Conclude)
    waves = [s for s in stages if isinstance(s, RunWave)]
    assert [s.index for s in waves] == list(range(len(waves)))
    assert all(0 < len(w.unit_ids) <= wave_size for w in waves)
    in_waves = [uid for w in waves for uid in w.unit_ids]
    assert in_waves == [u.id for u in plan.units if u.id not in done]
    sizes = {u.id: u.end - u.start for u in plan.units}
    assert all(w.offsets == sum(sizes[uid] for uid in w.unit_ids) for w in waves)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
    rows=st.integers(min_value=1, max_value=60),
)
@hypothesis_settings(max_examples=100, deadline=None)
def test_tasks_gather_fetch_batches_in_order_without_losing_a_record(sizes: list[int], rows: int) -> None:
    # a task processes its fetch responses gathered into tables of at least `rows` records
    import pyarrow as pa

    from rewind.spark.job_stage import coalesced

    batches, start = [], 0
    for size in sizes:
        batches.append(pa.record_batch({"offset": pa.array(range(start, start + size), pa.int64())}))
        start += size
    tables = list(coalesced(iter(batches), rows=rows))
    assert [o for t in tables for o in t["offset"].to_pylist()] == list(range(start))
    assert all(t.num_rows > 0 for t in tables)
    assert all(t.num_rows >= rows for t in tables[:-1])
