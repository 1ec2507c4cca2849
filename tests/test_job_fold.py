"""Read models via fold, end to end: real broker, real Spark, real Iceberg SQL catalog.

A topic of known order events (:mod:`tests.fold_fixtures`) is repaired into an existing
``order_totals`` target with ``replace-window`` on ``placed_at``: the source window reads ten
minutes on each side of the replaced window, so orders placed inside it are whole, orders
placed before it are seen without their ``placed`` event and orders placed after it are cut
off. The staging branch must hold exactly what this file computes on its own: the target's
rows outside the replaced window untouched, every order placed inside it recomputed (one row,
with the lineage of its last event), nothing else; the dropped orders counted.

The fold's commit is exactly once: a run SIGKILLed just before and just after it (each in its
own child process with ``REWIND_FAULT``) and resumed ends with the same staging as a clean
run, one finalize commit and one ``finalized`` audit entry.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.job.runner import RunOutcome
from rewind.spec import parse_spec
from tests import fold_fixtures as ff
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce

PARTITIONS = 2
ORDERS = 240  # one every 15 s: an hour of orders, ~1,400 events
MINUTE = ff.MINUTE
SOURCE = (10 * MINUTE, 50 * MINUTE)  # read window, relative to the history's start
REPLACED = (20 * MINUTE, 40 * MINUTE)  # the replaced window (placed_at), inside it
VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")
FOREIGN = (90_001, 90_002, 90_003)
"""Target-only orders: placed inside the replaced window, after it, and never (null)."""

DRIVER = """
import json, sys
from rewind.config import load_settings
from rewind.job.service import resume_job, run_job
from rewind.spec import load_spec

settings = load_settings()
if sys.argv[1] == "run":
    out = run_job(settings, load_spec(sys.argv[2]))
else:
    out = resume_job(settings, sys.argv[2])
print(json.dumps(out.to_dict()))
"""


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


@dataclass
class World:
    tmp: Path
    settings: Settings
    topic: str
    base: int
    events: list[ff.Event]
    coords: dict[int, tuple[int, int]]
    target: str
    target_rows: list[dict[str, Any]]

    def abs(self, window: tuple[int, int]) -> tuple[int, int]:
        return self.base + window[0], self.base + window[1]

    def spec(self, **iceberg: Any) -> dict[str, Any]:
        lo, hi = self.abs(SOURCE)
        wlo, whi = self.abs(REPLACED)
        sink = {
            "table": self.target,
            "mode": "replace-window",
            "window_column": "placed_at",
            "window_from": _iso(wlo),
            "window_to": _iso(whi),
            **iceberg,
        }
        return {
            "name": "order-totals-fold",
            "source": {"kafka": {"topics": [self.topic], "from": _iso(lo), "to": _iso(hi)}},
            "decode": {"format": "json", "schema": dict(ff.DECODE_SCHEMA)},
            "translate": {
                "function": "tests.fold_fixtures:order_partials",
                "fold": "tests.fold_fixtures:fold_orders",
                "version": "1",
                "output_schema": dict(ff.MODEL_SCHEMA),
            },
            "key": ["order_id"],
            "sink": {"iceberg": {k: v for k, v in sink.items() if v is not None}},
            "run": {"work_unit_records": 300, "lease_ttl_s": 60},
        }


def _target_row(order_id: int, placed_ms: int | None, schema_names: list[str]) -> dict[str, Any]:
    """What the live projection wrote for an order (wrong on purpose: the repair must replace it)."""
    row = {
        "order_id": order_id,
        "status": "v1",
        "total_cents": 999_999,
        "lines": 0,
        "placed_at": ff.ts(placed_ms),
        "last_at": ff.ts(placed_ms),
        "_rewind_event_id": f"live-{order_id}",
        "_rewind_source_topic": "live",
        "_rewind_source_partition": 0,
        "_rewind_source_offset": order_id,
        "_rewind_source_timestamp": ff.ts(placed_ms),
        "_rewind_extracted_at": datetime.fromtimestamp(0, UTC),
        "_rewind_transform": "v1",
        "_rewind_transform_version": "1",
        "_rewind_run_id": "live",
        "_rewind_synthetic": False,
    }
    assert list(row) == schema_names
    return row


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> World:
    """The topic, and the target ``order_totals`` as the live service left it (main)."""
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.job.service import plan_job

    tmp = tmp_path_factory.mktemp("job-fold")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-fold-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, PARTITIONS)
    base = (int(time.time()) // 60 - 120) * MINUTE  # two hours ago: inside any broker's retention
    events = ff.order_history(ORDERS, base)
    coords = ff.produce_events(conf, topic, events, PARTITIONS)
    w = World(tmp, settings, topic, base, events, coords, f"models.order_totals_{uuid.uuid4().hex[:6]}", [])

    # the target: every order of the history (placed_at true, the rest wrong) and three
    # orders the topic does not have
    schema = plan_job(
        settings, parse_spec(w.spec(mode="append", window_column=None, window_from=None, window_to=None))
    ).output_schema()
    placed = {e.order_id: e.at_ms for e in events if e.type == "placed"}
    placed.update({FOREIGN[0]: base + 30 * MINUTE, FOREIGN[1]: base + 55 * MINUTE, FOREIGN[2]: None})
    w.target_rows = [_target_row(o, ms, schema.names) for o, ms in sorted(placed.items())]
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("models")
    catalog.create_table(w.target, schema=schema).append(pa.Table.from_pylist(w.target_rows, schema=schema))
    return w


def _staging_rows(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    rows = jf.staging_table(settings, staging).to_pylist()
    return sorted(rows, key=lambda r: (r["order_id"], r["_rewind_event_id"]))


def _stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def _expected(world: World) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The staging branch's rows (sorted, without the volatile columns) and the fold counts."""
    lo, hi = world.abs(REPLACED)
    model = ff.expected_model(
        world.events, world.coords, world.topic, world.abs(SOURCE), "order_partials", "1"
    )

    def inside(t: datetime | None) -> bool:
        return t is not None and ff.ts(lo) <= t < ff.ts(hi)  # type: ignore[operator]

    kept = [r for r in world.target_rows if not inside(r["placed_at"])]
    folded = [r for r in model.values() if inside(r["placed_at"])]
    read = [e for e in world.events if world.abs(SOURCE)[0] <= e.at_ms < world.abs(SOURCE)[1]]
    counts = {"rows_in": len(read), "rows_out": len(folded), "outside_window": len(model) - len(folded)}
    rows = sorted(_stable(kept) + folded, key=lambda r: (r["order_id"], r["_rewind_event_id"]))
    return rows, counts


def _finalize_snapshots(settings: Settings, staging: dict[str, Any], run_id: str) -> list[Any]:
    """Snapshots on the staging ref that carry the finalize marker, oldest first.

    When there are any, checks that they came in ONE commit: they are the head of the ref,
    a delete of the run's partial rows then an append of the folded files, and no earlier
    metadata version ever had the ref at the delete (nobody saw the run's rows gone and the
    folded rows not yet there).
    """
    from pyiceberg.serializers import FromInputFile
    from pyiceberg.table.snapshots import Operation, ancestors_of

    from rewind.catalog import load_catalog
    from rewind.sinks.iceberg import FINALIZED_PROPERTY

    table = load_catalog(settings).load_table(staging["table"])
    ref = staging["branch"] or "main"
    head = table.snapshot_by_name(ref)
    chain = list(ancestors_of(head, table.metadata))[::-1]
    marked = [s for s in chain if s.summary.additional_properties.get(FINALIZED_PROPERTY) == run_id]
    if marked:
        assert chain[-len(marked) :] == marked
        assert [s.summary.operation for s in marked] == [Operation.OVERWRITE, Operation.APPEND]
        for entry in table.metadata.metadata_log:
            old = FromInputFile.table_metadata(table.io.new_input(entry.metadata_file))
            seen = old.refs.get(ref)
            assert seen is None or seen.snapshot_id != marked[0].snapshot_id, entry.metadata_file
    return marked


def _audit(settings: Settings, run_id: str, action: str) -> list[Any]:
    from rewind.job.service import open_ledger

    with open_ledger(settings) as ledger:
        return [a for a in ledger.audit_log(run_id) if a.action == action]


# -- a clean run --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(world: World) -> RunOutcome:
    """A clean run of the repair, in this process."""
    from rewind.job.service import run_job

    return run_job(world.settings, parse_spec(world.spec()))


def test_the_fold_recomputes_the_replaced_window_and_keeps_the_rest(
    world: World, reference: RunOutcome
) -> None:
    from rewind.catalog import load_catalog

    outcome = reference
    want, counts = _expected(world)
    assert outcome.state == "succeeded"
    assert outcome.folded == counts
    # the units wrote one partial row per event read; the fold made one row per order
    assert outcome.counts.records_read == outcome.counts.rows_out == counts["rows_in"]
    assert outcome.counts.quarantined == outcome.counts.filtered == 0
    # the window has every case: orders dropped before and after it, orders kept on both sides
    assert counts["outside_window"] > 0 and 70 < counts["rows_out"] < 90

    got = _staging_rows(world.settings, outcome.staging)
    assert _stable(got) == want
    assert {r["_rewind_run_id"] for r in got} == {"live", outcome.run_id}
    ids = [r["_rewind_event_id"] for r in got]
    assert len(ids) == len(set(ids))
    # the boundaries: placed exactly at window_from is recomputed, exactly at window_to is not
    lo, hi = world.abs(REPLACED)
    by_order = {r["order_id"]: r for r in got}
    first = next(e.order_id for e in world.events if e.type == "placed" and e.at_ms == lo)
    last = next(e.order_id for e in world.events if e.type == "placed" and e.at_ms == hi)
    assert by_order[first]["_rewind_run_id"] == outcome.run_id
    assert by_order[last]["_rewind_run_id"] == "live"
    assert FOREIGN[0] not in by_order and {FOREIGN[1], FOREIGN[2]} <= set(by_order)

    # main is untouched until promote; the finalize commit and its audit entry are there once
    main = load_catalog(world.settings).load_table(world.target).scan().to_arrow().to_pylist()
    assert sorted(main, key=lambda r: r["order_id"]) == world.target_rows
    assert len(_finalize_snapshots(world.settings, outcome.staging, outcome.run_id)) == 2
    audit = _audit(world.settings, outcome.run_id, "finalized")
    assert [a.details for a in audit] == [counts]


def test_a_fold_killed_before_and_after_its_commit_resumes_to_the_clean_result(
    world: World, reference: RunOutcome
) -> None:
    from rewind.job.service import open_ledger, resume_job

    spec_path = jf.write_spec(world.tmp / "fold.yaml", world.spec())

    # 1. killed after every unit is committed and the fold's files are written, before its commit
    _driver(world, "before-fold-commit", "run", str(spec_path))
    with open_ledger(world.settings) as ledger:
        run = ledger.list_runs(1)[0]
        units = ledger.units(run.id)
    assert run.name == "order-totals-fold" and run.state == "running" and run.staging
    assert all(u.state == "done" for u in units)
    assert not _finalize_snapshots(world.settings, run.staging, run.id)
    partial = [r for r in _staging_rows(world.settings, run.staging) if r["_rewind_run_id"] == run.id]
    assert len(partial) == reference.counts.rows_out  # still one partial row per event
    assert not _audit(world.settings, run.id, "finalized")

    # 2. resumed and killed right after the fold's commit, before the ledger hears of it
    _driver(world, "after-fold-commit", "resume", run.id)
    marked = _finalize_snapshots(world.settings, run.staging, run.id)
    assert marked
    with open_ledger(world.settings) as ledger:
        assert ledger.get_run(run.id).state == "running"

    # 3. resumed to the end: the fold is not done again
    outcome = resume_job(world.settings, run.id)
    assert outcome.state == "succeeded" and outcome.run_id == run.id
    assert outcome.folded == reference.folded
    assert _finalize_snapshots(world.settings, run.staging, run.id) == marked
    got = _staging_rows(world.settings, outcome.staging)
    ref = _staging_rows(world.settings, reference.staging)
    assert _stable(got) == _stable(ref)
    assert {r["_rewind_run_id"] for r in got} == {"live", run.id}
    assert [a.details for a in _audit(world.settings, run.id, "finalized")] == [reference.folded]
    # the killed attempt's fold files are orphans: only the committed ones are referenced
    referenced = _fold_files(world.settings, outcome.staging)
    added = {f for f in referenced if f in _added_by(world.settings, outcome.staging, marked[-1])}
    assert referenced and referenced == added
    on_disk = {p.name for p in (world.tmp / "state").rglob(f"{run.id}-fold-*.parquet")}
    names = {f.rsplit("/", 1)[1] for f in referenced}
    assert names < on_disk  # the first attempt's files stay on disk, unreferenced


def _fold_files(settings: Settings, staging: dict[str, Any]) -> set[str]:
    from rewind.catalog import load_catalog

    table = load_catalog(settings).load_table(staging["table"])
    head = table.snapshot_by_name(staging["branch"])
    return {
        t.file.file_path
        for t in table.scan(snapshot_id=head.snapshot_id).plan_files()
        if "-fold-" in t.file.file_path
    }


def _added_by(settings: Settings, staging: dict[str, Any], snapshot: Any) -> set[str]:
    from rewind.catalog import load_catalog

    table = load_catalog(settings).load_table(staging["table"])
    return {
        e.data_file.file_path
        for m in snapshot.manifests(table.io)
        if m.added_snapshot_id == snapshot.snapshot_id
        for e in m.fetch_manifest_entry(table.io)
    }


def _driver(world: World, fault: str, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, *args],
        cwd=world.tmp,
        env=jf.child_env(world.settings, REWIND_FAULT=fault),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, f"{fault}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"


# -- replace-window on the source time, with a narrower replaced window ---------------------------


def test_a_narrower_window_on_the_source_time_drops_the_rows_outside_it(world: World) -> None:
    """Without a fold and with the default window column: the rows read outside
    [window_from, window_to) would duplicate the target's rows kept there."""
    import pyarrow as pa

    from rewind.catalog import load_catalog
    from rewind.job.service import run_job

    # the target: one row per event of the whole history, as an earlier run wrote it
    table = f"models.order_events_{uuid.uuid4().hex[:6]}"
    spec = world.spec(table=table, window_column=None)
    del spec["translate"]["fold"]
    spec["key"] = ["order_id", "last_at"]
    catalog = load_catalog(world.settings)
    schema = catalog.load_table(world.target).schema().as_arrow()
    live = []
    for i, e in enumerate(world.events):
        row = _target_row(e.order_id, e.at_ms, schema.names)
        row.update(_rewind_event_id=f"live-{i}", _rewind_source_offset=i)
        live.append(row)
    catalog.create_table(table, schema=schema).append(pa.Table.from_pylist(live, schema=schema))

    outcome = run_job(world.settings, parse_spec(spec))
    lo, hi = world.abs(REPLACED)
    slo, shi = world.abs(SOURCE)
    read = [e for e in world.events if slo <= e.at_ms < shi]
    inside = [e for e in read if lo <= e.at_ms < hi]
    assert outcome.folded == {
        "rows_in": len(read),
        "rows_out": len(inside),
        "outside_window": len(read) - len(inside),
    }
    got = _staging_rows(world.settings, outcome.staging)
    # every event once: the target's outside the window, the run's inside it
    times = sorted((r["order_id"], r["_rewind_source_timestamp"]) for r in got)
    assert times == sorted((e.order_id, ff.ts(e.at_ms)) for e in world.events)
    mine = [r for r in got if r["_rewind_run_id"] == outcome.run_id]
    assert sorted(r["_rewind_source_timestamp"] for r in mine) == sorted(ff.ts(e.at_ms) for e in inside)


# -- history plans pin the archive snapshot -------------------------------------------------------


def test_a_recreated_archive_is_a_new_plan_and_a_stale_pin_fails_clearly(world: World, spark: Any) -> None:
    import json

    from rewind.catalog import load_catalog
    from rewind.history import archive_once
    from rewind.history.exceptions import ArchiveTableError
    from rewind.job.components import make_sink
    from rewind.job.runner import start_run
    from rewind.job.service import open_ledger, plan_job, resume_job, run_job, show_run

    settings = world.settings
    topic = f"archived-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, 1)
    values = [json.dumps({"order_id": i, "status": "paid", "amount": 1.5}).encode() for i in range(200)]
    produce(conf, topic, [(0, None, v, None) for v in values])
    archive = f"lake.archive_{uuid.uuid4().hex[:6]}"
    archive_once(settings, [topic], archive, spark=spark)
    spec = parse_spec(
        {
            "name": "from-the-archive",
            "source": {
                "history": {"topics": [topic], "archive": archive, "declared_log_start": {topic: {"0": 150}}}
            },
            "decode": "json",
            "translate": {"function": "tests.job_fixtures:order_amounts", "version": "1"},
            "key": ["order_id"],
            "sink": {"iceberg": {"table": f"an.from_archive_{uuid.uuid4().hex[:6]}"}},
        }
    )
    before = plan_job(settings, spec)
    assert before.ok and {u.source for u in before.units} == {"archive", "kafka"}
    with open_ledger(settings) as ledger:  # a run planned now, executed later
        run_id = start_run(ledger, before, make_sink(settings, spec).target)

    catalog = load_catalog(settings)
    catalog.drop_table(archive)
    archive_once(settings, [topic], archive, spark=spark)  # the same records, a new table
    after = plan_job(settings, spec)
    assert after.ok and [u.id for u in after.units] == [u.id for u in before.units]
    assert after.plan_id != before.plan_id
    pinned = before.read_plan["history"]["archive_snapshot_id"]
    assert after.read_plan["history"]["archive_snapshot_id"] != pinned

    # the old run still pins the snapshot that is gone: it fails, it does not read nothing
    with pytest.raises(ArchiveTableError) as caught:
        resume_job(settings, run_id)
    message = str(caught.value)
    # (the table is named by pyiceberg's identifier tuple: "('lake', 'archive_...')")
    assert (
        archive.split(".")[1] in message and f"has no snapshot {pinned}, the one the plan pinned" in message
    )
    assert message.endswith("plan the job again"), message
    shown = show_run(settings, run_id)
    assert shown["state"] == "failed" and f"has no snapshot {pinned}" in shown["error"]
    assert "\n" not in shown["error"]

    outcome = run_job(settings, spec)  # planned again: every record once
    assert outcome.plan_id == after.plan_id
    assert outcome.counts.records_read == outcome.counts.rows_out == 200
