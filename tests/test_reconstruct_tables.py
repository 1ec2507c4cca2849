"""Event reconstruction into an Iceberg table and a SQL table (SQLite, PostgreSQL), through Spark.

The legacy history of ``tests/reconstruct_fixtures.py`` (one state the transition rejects)
reconstructed into a table: the rows equal, event for event, what the transition makes of each
policy's history (the events a Kafka output carries), each with the lineage columns and the
reconstruction's labels (synthetic, source system, extraction time, business effective time,
transition and version); the rejected state is quarantined, the counts add up, the outcome check
(the events replayed with the fold give the latest state) passes from the table, and the
staging is promoted. A driver killed mid-wave and a task killed after its unit's load resume to
every event once. A table that cannot take the events is refused at plan time in one line.
"""

from __future__ import annotations

import random
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import Settings, load_settings
from rewind.errors import RewindError
from rewind.job.plan import PlanRefused
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests import reconstruct_fixtures as rx
from tests.test_reconstruct import _expected_events, _history_source

EVENT_COLUMNS = ["policy_id", "type", "status", "premium", "effective_at"]


def _spec(name: str, url: str, sink: dict[str, Any], **more: Any) -> dict[str, Any]:
    spec = rx.spec(
        name, _history_source(url, key_ranges=2, **more), "unused", lineage={"source_system": "legacy"}
    )
    spec["sink"] = sink
    return spec


def _sink(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    if kind == "iceberg":
        return {"iceberg": {"table": f"events_{tag}.policy_events"}}
    if kind == "sqlite":
        return {"postgres": {"url": f"sqlite:///{tmp_path / 'events.db'}", "table": "policy_events"}}
    return {"postgres": {"url": request.getfixturevalue("pg_url"), "table": f"public.policy_events_{tag}"}}


def _target_rows(settings: Settings, sink: dict[str, Any]) -> pd.DataFrame:
    """The promoted target's rows, read straight from the table (not through Rewind's sink)."""
    if "iceberg" in sink:
        from rewind.catalog import load_catalog

        return load_catalog(settings).load_table(sink["iceberg"]["table"]).scan().to_arrow().to_pandas()
    url, table = sink["postgres"]["url"], sink["postgres"]["table"]
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return pd.read_sql(f"SELECT * FROM {table}", db)
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        names = [d.name for d in cur.description or []]
        return pd.DataFrame(cur.fetchall(), columns=names)


def _history(seed: int, entities: int) -> tuple[list[rx.State], rx.State]:
    history = rx.random_history(random.Random(seed), entities, 5)
    at = next(i for i, s in enumerate(history) if s.change_seq > 0)  # a state the transition rejects
    bad = history[at]
    history[at] = rx.State(
        bad.policy_id, bad.status, -1.0, bad.effective_from, bad.change_seq, bad.changed_at
    )
    return history, history[at]


def _as_events(rows: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """Per policy, its events (type, effective day) in business order: the rows sorted as
    :mod:`rewind.verify.table_events` orders them (entity, key range, state position, ordinal)."""
    from rewind.verify.table_events import event_ordinals

    rows = rows.assign(_ordinal=event_ordinals(rows.reset_index(drop=True)))
    rows = rows.sort_values(
        ["policy_id", "_rewind_source_partition", "_rewind_source_offset", "_ordinal"], kind="stable"
    )
    out: dict[str, list[tuple[str, str]]] = {}
    for p, t, e in rows[["policy_id", "type", "_rewind_effective_time"]].values.tolist():
        out.setdefault(str(p), []).append((t, pd.Timestamp(e).strftime("%Y-%m-%d")))
    return out


@pytest.mark.parametrize("kind", ["iceberg", "sqlite", "postgres"])
def test_a_reconstruction_into_a_table_writes_the_events_the_transition_makes(
    kind: str, settings: Settings, spark: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from rewind.job.publish import promote_run
    from rewind.job.service import plan_job, run_job
    from rewind.verify.service import verify_run

    history, bad = _history(31, 60)
    url = rx.sqlite_history(tmp_path / "legacy.db", history, list(reversed(range(len(history)))))
    sink = _sink(kind, tmp_path, request)
    spec = parse_spec(_spec(f"reconstruct-into-{kind}", url, sink))
    plan = plan_job(settings, spec)
    assert plan.ok, plan.failed_gates()
    started = datetime.now(UTC)
    outcome = run_job(settings, spec)
    assert outcome.state == "succeeded"
    c = outcome.counts  # states in = consumed + quarantined + filtered
    assert (c.records_read, c.emitted, c.quarantined, c.filtered) == (len(history), len(history) - 1, 1, 0)

    report = verify_run(settings, outcome.run_id)  # the outcome, replayed from the table
    assert report["mode"] == "outcome" and report["passed"], report
    assert (report["entities"], report["skipped_quarantined"], report["events"]) == (59, 1, c.rows_out)
    promote_run(settings, outcome.run_id)

    rows = _target_rows(settings, sink)
    assert len(rows) == c.rows_out
    # event for event, each policy's in business order: what the transition makes of its history
    # (the Kafka output's events: tests/test_reconstruct.py), the rejected state's left out
    expected = _expected_events(history)
    assert _as_events(rows) == expected
    direct = _direct_events(history)
    got = rows[EVENT_COLUMNS].assign(effective_at=pd.to_datetime(rows["effective_at"], utc=True))
    assert _sorted(got) == _sorted(direct[EVENT_COLUMNS])
    # the lineage columns and the reconstruction's labels, on every row
    assert rows["_rewind_synthetic"].astype(bool).all()
    assert set(rows["_rewind_source_system"]) == {"legacy"}
    assert set(zip(rows["_rewind_transform"], rows["_rewind_transform_version"], strict=True)) == {
        ("policy_events", "1")
    }
    assert set(rows["_rewind_run_id"]) == {outcome.run_id} and rows["_rewind_event_id"].is_unique
    assert set(rows["_rewind_source_topic"]) == {"sqlite:policy_history"}
    extracted = pd.to_datetime(rows["_rewind_extracted_at"], utc=True)
    assert (extracted >= pd.Timestamp(started)).all() and (extracted <= pd.Timestamp.now(tz=UTC)).all()
    effective = pd.to_datetime(rows["_rewind_effective_time"], utc=True)
    assert (effective == pd.to_datetime(rows["effective_at"], utc=True)).all()

    q = jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
    assert len(q) == 1 and q[0]["reason"] == "negative premium" and int(q[0]["key"]) == bad.policy_id


def _direct_events(history: list[rx.State]) -> pd.DataFrame:
    from rewind.translate.process import ProcessContext
    from rewind.translate.states import StateOrder
    from rewind.translate.transition import ReconstructContext, reconstruct_batch
    from tests.test_reconstruct_states import _table

    ctx = ReconstructContext(
        ProcessContext("x", "x", "policy_events", "1", datetime.now(UTC)), "x", 0, "x", "policy_id"
    )
    order = StateOrder("policy_id", "effective_from", ("change_seq",))
    return reconstruct_batch(_table(history), rx.policy_events, order, ctx, 0).rows.to_pandas()


def _sorted(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows as tuples (NaN as None), sorted: a multiset of events."""
    rows = frame.astype(object).where(frame.notna(), None).values.tolist()
    return sorted((tuple(r) for r in rows), key=repr)


def test_a_killed_reconstruction_into_postgres_resumes_to_every_event_once(
    tmp_path: Path, settings: Settings, spark: Any, pg_url: str
) -> None:
    """The driver SIGKILLed mid-wave, then a task SIGKILLed right after its unit's load committed
    (the wave fails; the resume finds that unit in PostgreSQL and loads it no more), then resumed
    to the end."""
    from rewind.job.service import resume_job
    from rewind.ledger import Ledger

    local = load_settings(
        env={
            "REWIND_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers or "",
            "REWIND_STATE_DIR": str(tmp_path / "state"),
        },
        cwd=tmp_path,
    )
    history = rx.random_history(random.Random(17), 600, 4)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    sink = {"postgres": {"url": pg_url, "table": f"public.killed_{uuid.uuid4().hex[:8]}"}}
    spec = _spec("reconstruct-killed", url, sink)
    spec["source"]["table"]["key_ranges"] = 4
    spec["guards"] = {"max_records_per_second": 600.0}  # a wave of 2 units of ~400 states: ~1.3 s
    path = jf.write_spec(tmp_path / "spec.yaml", spec)

    killed = jf.run_driver(
        tmp_path, jf.child_env(local, REWIND_FAULT="mid-wave", REWIND_FAULT_DELAY="1.0"), "run", str(path)
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    with Ledger.open(local.ledger) as ledger:
        (run,) = ledger.list_runs(5)
    with (
        jf.in_tasks(spark, REWIND_FAULT="postgres-unit-after-commit"),
        pytest.raises(Exception, match="a Spark task"),  # the task died: Spark's job failed
    ):
        resume_job(local, run.id, units_per_wave=2)
    done = resume_job(local, run.id, units_per_wave=2)
    assert done.state == "succeeded"
    with Ledger.open(local.ledger) as ledger:  # the loaded unit was found in PostgreSQL, not loaded again
        found = [e.details for e in ledger.audit_log(run.id) if e.action == "reconcile"]
    assert sum(d["units_recovered_from_sink"] for d in found) >= 1

    from rewind.job.components import make_sink

    staged = make_sink(local, parse_spec(spec))
    rows = staged.read_arrow(staged.staging_from_dict(done.staging)).to_pandas()  # type: ignore[attr-defined]
    assert rows["_rewind_event_id"].is_unique
    assert _as_events(rows) == _expected_events(history)  # each event once, in business order
    with Ledger.open(local.ledger) as ledger:
        totals = ledger.unit_counts(run.id).counts
    assert (totals.records_read, totals.emitted, totals.quarantined, totals.filtered) == (
        len(history),
        len(history),
        0,
        0,
    )
    assert totals.rows_out == len(rows)


def test_a_table_that_cannot_take_the_events_is_refused_at_plan_time(
    settings: Settings, tmp_path: Path
) -> None:
    from rewind.job.service import run_job

    history, _bad = _history(3, 10)
    url = rx.sqlite_history(tmp_path / "legacy.db", history)
    with sqlite3.connect(tmp_path / "events.db") as db:
        db.execute("CREATE TABLE policy_events (policy_id BIGINT, note TEXT)")
    sink = {"postgres": {"url": f"sqlite:///{tmp_path / 'events.db'}", "table": "policy_events"}}
    with pytest.raises(PlanRefused) as err:
        run_job(settings, parse_spec(_spec("no-event-columns", url, sink)))
    line = str(err.value)
    assert "\n" not in line and "gate sink" in line and "policy_events" in line, line

    import pyarrow as pa

    from rewind.catalog import load_catalog

    table = f"events_{uuid.uuid4().hex[:8]}.policy_events"
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
    catalog.create_table(table, schema=pa.schema([("policy_id", pa.int64()), ("note", pa.string())]))
    with pytest.raises(PlanRefused) as err:
        run_job(settings, parse_spec(_spec("no-event-columns", url, {"iceberg": {"table": table}})))
    line = str(err.value)
    assert "\n" not in line and "gate sink" in line and "are not in" in line, line

    # what has no meaning for a table of events is refused when the spec is read
    for change, words in (
        ({"skip_partitions": [1]}, "used only with sink.kafka"),
        ({"mode": "upsert"}, "a reconstruction appends its events"),
    ):
        spec = _spec(
            "bad-spec",
            url,
            {"postgres": {**sink["postgres"], **({"mode": "upsert"} if "mode" in change else {})}},
        )
        if "skip_partitions" in change:
            spec["source"]["table"].update(change)
        with pytest.raises(RewindError) as bad:
            parse_spec(spec)
        assert words in str(bad.value) and "\n" not in str(bad.value).strip(), str(bad.value)
