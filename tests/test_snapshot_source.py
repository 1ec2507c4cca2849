"""``source.kafka.snapshot``: a read model's snapshot plus the events after it = a full replay.

A topic of known order events (:mod:`tests.fold_fixtures`, 2 partitions) is folded three ways
on real tansu, Spark and Iceberg: (1) a full replay; (2) the first part of the history, up to
an offset map cutting through many orders, promoted and snapshotted with
``rewind snapshot create`` (a tag and its recorded offsets); (3) a run from that snapshot that
reads only the events after those offsets. (3) must hold exactly (1)'s rows, lineage included
(only the run id and extraction time differ); so must (4), a run from the same state held in a
SQL table (SQLite, written by the SQL sink) with the offsets given. Bad input: a snapshot ref
without offsets, a SQL snapshot without offsets or table, and offsets naming a partition the
topic lacks are one line each, and nothing is written.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.spec import parse_spec
from tests import fold_fixtures as ff
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

ORDERS = 60
VOLATILE = ("_rewind_extracted_at", "_rewind_run_id")


def spec(topic: str, table: str, **kafka: Any) -> Any:
    return parse_spec(
        {
            "name": "order-totals",
            "source": {"kafka": {"topics": [topic], **kafka}},
            "decode": {"format": "json", "schema": dict(ff.DECODE_SCHEMA)},
            "translate": {
                "function": "tests.fold_fixtures:order_partials",
                "fold": "tests.fold_fixtures:fold_orders",
                "version": "1",
                "output_schema": dict(ff.MODEL_SCHEMA),
            },
            "key": ["order_id"],
            "sink": {"iceberg": {"table": table}},
            "run": {"work_unit_records": 100},
        }
    )


def rows_of(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    rows = jf.staging_table(settings, staging).to_pylist()
    return sorted(
        ({k: v for k, v in r.items() if k not in VOLATILE} for r in rows), key=lambda r: r["order_id"]
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str) -> tuple[Settings, str, dict[int, int]]:
    tmp = tmp_path_factory.mktemp("snapshot")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    events = ff.order_history(ORDERS, 1_790_000_000_000)
    coords = ff.produce_events(settings.kafka_config(), topic, events, 2)
    ends = {p: 1 + max(o for q, o in coords.values() if q == p) for p in (0, 1)}
    return settings, topic, ends


def test_snapshot_plus_tail_equals_a_full_replay(world: tuple[Settings, str, dict[int, int]]) -> None:
    from rewind.job.publish import promote_run
    from rewind.job.service import open_ledger, run_job
    from rewind.job.snapshot_create import create_snapshot

    settings, topic, ends = world
    tag = uuid.uuid4().hex[:6]
    full = run_job(settings, spec(topic, f"snap.full_{tag}"))
    expected = rows_of(settings, full.staging)
    assert len(expected) == ORDERS

    cut = {p: end * 2 // 5 for p, end in ends.items()}  # cuts through many orders' events
    first = run_job(
        settings, spec(topic, f"snap.state_{tag}", to={topic: {str(p): o for p, o in cut.items()}})
    )
    assert first.counts.records_read == sum(cut.values())
    partial = rows_of(settings, first.staging)
    promote_run(settings, first.run_id, force=True, reason="test: the state to snapshot")
    with open_ledger(settings) as ledger:
        made = create_snapshot(settings, ledger, first.run_id)
    assert made["ref"] == f"rewind-snapshot-{first.run_id}"
    assert made["offsets"] == {topic: {str(p): o for p, o in cut.items()}}

    tail = run_job(
        settings, spec(topic, f"snap.tail_{tag}", snapshot={"table": made["table"], "ref": made["ref"]})
    )
    assert tail.counts.records_read == sum(ends.values()) - sum(cut.values())  # only the events after
    got = rows_of(settings, tail.staging)
    assert got != partial and len(partial) < ORDERS  # the state alone is not the answer
    assert got == expected

    # the same state in a SQL table (SQLite, written by the SQL sink), as of the same offsets
    url = f"sqlite:///{settings.state_path / f'state_{tag}.db'}"
    from rewind.catalog import load_catalog

    state = load_catalog(settings).load_table(made["table"]).scan().to_arrow()  # the promoted state
    sql_state(url, "order_state", state, settings.state_path)
    offsets = {topic: {str(p): o for p, o in cut.items()}}
    from_sql = run_job(
        settings,
        spec(topic, f"snap.sqltail_{tag}", snapshot={"url": url, "table": "order_state", "offsets": offsets}),
    )
    assert from_sql.counts.records_read == tail.counts.records_read
    assert rows_of(settings, from_sql.staging) == expected


def sql_state(url: str, table: str, rows: Any, spool: Any) -> None:
    """``rows`` as the SQL table ``table``: staged, loaded and promoted by the SQL sink."""
    from rewind.core.parquet import write_parquet
    from rewind.sinks.sql.sink import SqlSink

    sink = SqlSink(url, table, key=["order_id"], spool_dir=spool / "spool")
    try:
        staging = sink.prepare("r-state", rows.schema)
        sink.commit(staging, "r-state", ["u0"], [write_parquet(sink.data_folder(staging), rows, "u0")])
        sink.promote(staging)
    finally:
        sink.close()


def test_a_sql_snapshot_without_offsets_is_one_line(world: tuple[Settings, str, dict[int, int]]) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.service import plan_job
    from rewind.job.snapshot import SnapshotError

    settings, topic, _ = world
    target = f"snap.never_{uuid.uuid4().hex[:6]}"
    url = f"sqlite:///{settings.state_path.parent / 'nothing.db'}"
    with pytest.raises(SnapshotError) as err:
        plan_job(settings, spec(topic, target, snapshot={"url": url, "table": "order_state"}))
    assert str(err.value) == (
        "source.kafka.snapshot.offsets: the SQL table order_state records no offsets; "
        "give the offsets its state is as of"
    )
    with pytest.raises(SnapshotError) as missing:
        plan_job(
            settings,
            spec(topic, target, snapshot={"url": url, "table": "nope", "offsets": {topic: {"0": 1, "1": 1}}}),
        )
    assert str(missing.value) == (
        "source.kafka.snapshot.table: no table nope in the SQL database of source.kafka.snapshot.url; "
        "name an existing table"
    )
    assert not load_catalog(settings).table_exists(target)


def test_a_snapshot_ref_without_offsets_is_one_line(world: tuple[Settings, str, dict[int, int]]) -> None:
    from rewind.catalog import load_catalog
    from rewind.job.service import open_ledger, plan_job, run_job
    from rewind.job.snapshot import SnapshotError
    from rewind.job.snapshot_create import create_snapshot

    settings, topic, _ = world
    tag = uuid.uuid4().hex[:6]
    state = run_job(settings, spec(topic, f"snap.bare_{tag}", to={topic: {"0": 5, "1": 5}}))
    table = state.staging["table"]
    ref = state.staging.get("branch") or "main"
    target = f"snap.never_{tag}"
    with pytest.raises(SnapshotError) as err:
        plan_job(settings, spec(topic, target, snapshot={"table": table, "ref": ref}))
    assert str(err.value) == (
        f"source.kafka.snapshot.offsets: {table}@{ref} records no offsets; give the offsets the state is "
        "as of, or make the snapshot with `rewind snapshot create RUN`"
    )
    assert not load_catalog(settings).table_exists(target)
    with open_ledger(settings) as ledger, pytest.raises(SnapshotError) as refused:
        create_snapshot(settings, ledger, state.run_id)  # not promoted: no state to snapshot
    assert str(refused.value) == (
        f"run {state.run_id} is succeeded, not promoted: a snapshot is of a read model's state in its "
        "target; promote the run first"
    )


def test_offsets_naming_an_unknown_partition_are_one_line(
    world: tuple[Settings, str, dict[int, int]],
) -> None:
    from rewind.catalog import load_catalog
    from rewind.errors import RewindError
    from rewind.job.service import plan_job, run_job

    settings, topic, _ = world
    tag = uuid.uuid4().hex[:6]
    state = run_job(settings, spec(topic, f"snap.odd_{tag}", to={topic: {"0": 5, "1": 5}}))
    offsets = {topic: {"0": 5, "1": 5, "7": 5}}
    target = f"snap.never_{tag}"
    snap = {"table": state.staging["table"], "ref": state.staging.get("branch") or "main", "offsets": offsets}
    with pytest.raises(RewindError) as err:
        plan_job(settings, spec(topic, target, snapshot=snap))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"source.kafka.snapshot.offsets names {topic}/7, which is not part of the subscription"
    )
    assert not load_catalog(settings).table_exists(target)


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        (
            {"url": "postgresql://u:pw@db/model", "table": "t", "offsets": {"o": {"0": 1}}},
            "source.kafka.snapshot.url: holds a password; leave it out and set PGPASSWORD (or ~/.pgpass)",
        ),
        (
            {"url": "sqlite:///s.db", "table": "t", "ref": "v1", "offsets": {"o": {"0": 1}}},
            "source.kafka.snapshot.ref: is for an Iceberg snapshot; a SQL table has no refs: leave ref out",
        ),
        (
            {"url": "mysql://db/model", "table": "t", "offsets": {"o": {"0": 1}}},
            "source.kafka.snapshot.url: not a PostgreSQL or SQLite URL; like sqlite:///state.db",
        ),
    ],
)
def test_bad_sql_snapshot_parts_are_one_line(snapshot: dict[str, Any], message: str) -> None:
    from rewind.errors import SpecError

    with pytest.raises(SpecError) as err:
        spec("o", "snap.t", snapshot=snapshot)
    assert str(err.value) == f"<spec>: {message}"
