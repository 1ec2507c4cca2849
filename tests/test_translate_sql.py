"""``translate.sql`` end to end: Spark SQL over the view ``events``, on a real broker (tansu),
real Spark and Iceberg, with the lineage, quarantine and counts of a Python translate.

The topic holds the order events of :mod:`tests.job_fixtures` (every fate); the query keeps
paid orders with a positive amount and writes amounts in cents. The staging must hold exactly
the rows this file computes from the produced data, with the documented event ids; records
that do not decode are quarantined whole; records the query drops are filtered; the law holds.
A query that does not run, or that drops ``_rewind_row``, fails the plan in one line.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rewind.config import load_settings
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

QUERY = (
    "SELECT _rewind_row, order_id, CAST(ROUND(amount * 100) AS BIGINT) AS cents "
    "FROM events WHERE status <> 'test' AND amount > 0"
)
RECORDS = 300


def sql_spec(topic: str, query: str = QUERY, name: str = "orders-sql") -> Any:
    return parse_spec(
        {
            "name": name,
            "source": {"kafka": {"topics": [topic]}},
            "decode": {"format": "json", "schema": dict(jf.ORDER_SCHEMA)},
            "translate": {
                "sql": query,
                "version": "1",
                "output_schema": {"order_id": "long", "cents": "long"},
            },
            "key": ["order_id"],
            "sink": {"iceberg": {"table": f"shop.{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"}},
            "run": {"work_unit_records": 100},
        }
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bootstrap: str, spark: Any) -> Any:
    tmp: Path = tmp_path_factory.mktemp("sql")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    orders = jf.order_events(RECORDS, 2, raise_every=10_000)
    coords = jf.produce_orders(settings.kafka_config(), topic, orders)
    return settings, topic, orders, coords


def test_a_sql_translate_runs_with_lineage_quarantine_and_counts(world: Any) -> None:
    from rewind.job.service import run_job

    settings, topic, orders, coords = world
    outcome = run_job(settings, sql_spec(topic), units_per_wave=4)

    kept = [o for o in orders if o.fate not in ("decode",) and o.status != "test" and (o.amount or 0) > 0]
    # a null order id passes the query (its amount is positive) and is quarantined as key-null
    rows_expected = {
        jf.event_id(topic, *coords[o.index], "sql", "1", 0): (o.order_id, round(o.amount * 100))
        for o in kept
        if o.order_id is not None
    }
    rows = jf.staging_table(settings, outcome.staging).to_pylist()
    got = {r["_rewind_event_id"]: (r["order_id"], r["cents"]) for r in rows}
    assert got == rows_expected
    for r in rows:
        where = (r["_rewind_source_partition"], r["_rewind_source_offset"])
        o = next(o for o in orders if coords[o.index] == where)
        assert r["_rewind_source_topic"] == topic and r["order_id"] == o.order_id
        assert r["_rewind_transform"] == "sql" and r["_rewind_run_id"] == outcome.run_id

    quarantined = jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
    bad = sorted(
        (coords[o.index], o.fate) for o in orders if o.fate == "decode" or (o.order_id is None and o in kept)
    )
    assert sorted(((q["partition"], q["offset"]), q["stage"]) for q in quarantined) == [
        (c, "decode" if fate == "decode" else "key-null") for c, fate in bad
    ]
    by_coords = {coords[o.index]: o.value for o in orders}
    assert all(q["value"] == by_coords[(q["partition"], q["offset"])] for q in quarantined)  # whole bytes

    c = outcome.counts
    assert c.records_read == RECORDS
    assert c.quarantined == len(bad)
    assert c.emitted == c.rows_out == len(rows_expected)
    assert c.filtered == RECORDS - len(bad) - len(rows_expected)
    assert c.balanced


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "SELECT order_id, amount AS cents FROM events",
            "translate.sql does not select _rewind_row: keep it in the SELECT list",
        ),
        ("SELECT _rewind_row, nope FROM events", "translate.sql does not run over the view events: "),
    ],
)
def test_a_query_that_cannot_run_fails_the_plan_in_one_line(world: Any, query: str, message: str) -> None:
    from rewind.job.service import plan_job

    settings, topic, _, _ = world
    plan = plan_job(settings, sql_spec(topic, query, name="orders-sql-bad"))
    gate = next(g for g in plan.gates if g.name == "translate")
    assert not gate.ok and gate.detail.startswith(message) and "\n" not in gate.detail


# --- the query's own run-time failures, and a kill: what a Python translate gets -------------

FAILING = (
    "SELECT _rewind_row, order_id, "
    f"CASE WHEN amount = {jf.UNLUCKY} THEN raise_error('unlucky amount') "
    "ELSE CAST(ROUND(amount * 100) AS BIGINT) END AS cents "
    "FROM events WHERE status <> 'test' AND amount > 0"
)


def cents(events: Any) -> Any:
    """The Python translate doing what :data:`FAILING` does (raising on the same records)."""
    if (events["amount"] == jf.UNLUCKY).any():
        raise ValueError("unlucky amount")
    kept = events[(events["status"] != "test") & (events["amount"] > 0)]
    return kept.assign(cents=(kept["amount"] * 100).round().astype("int64"))[
        ["_rewind_row", "order_id", "cents"]
    ]


def named(spec: Any, **translate: Any) -> Any:
    """``spec`` with ``translate`` replaced; one transform name, so both runs' event ids agree."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["translate"] = {
        "version": "1",
        "name": "orders",
        "output_schema": {"order_id": "long", "cents": "long"},
    }
    data["translate"].update(translate)
    return parse_spec(data)


def comparable(settings: Any, outcome: Any) -> tuple[list[Any], list[Any]]:
    rows = sorted(
        (
            r["_rewind_event_id"],
            r["_rewind_source_partition"],
            r["_rewind_source_offset"],
            r["order_id"],
            r["cents"],
        )
        for r in jf.staging_table(settings, outcome.staging).to_pylist()
    )
    quarantined = sorted(
        (q["partition"], q["offset"], q["stage"], q["value"])
        for q in jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
    )
    return rows, quarantined


@pytest.fixture(scope="module")
def unlucky(world: Any) -> Any:
    """A topic where two records make the query (and the Python translate) fail."""
    settings, _, _, _ = world
    topic = f"orders-unlucky-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    orders = jf.order_events(RECORDS, 2, raise_every=150)
    coords = jf.produce_orders(settings.kafka_config(), topic, orders)
    assert sum(o.fate == "translate-error" for o in orders) == 2
    return topic, orders, coords


def test_records_the_query_fails_on_are_quarantined_and_the_rest_equals_a_python_translate(
    world: Any, unlucky: Any
) -> None:
    from rewind.job.service import run_job

    settings = world[0]
    topic, orders, coords = unlucky
    sql = run_job(settings, named(sql_spec(topic, name="orders-sql-unlucky"), sql=FAILING), units_per_wave=4)
    python = run_job(
        settings,
        named(sql_spec(topic, name="orders-py-unlucky"), function="tests.test_translate_sql:cents"),
        units_per_wave=4,
    )
    assert sql.state == python.state == "succeeded"
    sql_rows, sql_quarantine = comparable(settings, sql)
    assert (sql_rows, sql_quarantine) == comparable(settings, python)
    failed = sorted((p, o) for p, o, stage, _ in sql_quarantine if stage == "translate-error")
    assert failed == sorted(coords[o.index] for o in orders if o.fate == "translate-error")
    sql_counts, python_counts = sql.counts.to_dict(), python.counts.to_dict()
    sql_reasons, python_reasons = sql_counts.pop("reasons"), python_counts.pop("reasons")
    assert sql_counts == python_counts and sql.counts.balanced
    # counted by reason as a Python translate's, the error named as Spark names it
    assert sql_reasons.pop("translate-error: SparkRuntimeException") == 2
    assert python_reasons.pop("translate-error: ValueError") == 2
    assert sql_reasons == python_reasons


def test_a_query_that_does_not_select_the_key_fails_the_plan_in_one_line(world: Any) -> None:
    from rewind.job.service import plan_job

    settings, topic, _, _ = world
    plan = plan_job(
        settings, sql_spec(topic, "SELECT _rewind_row, amount AS cents FROM events", name="orders-nokey")
    )
    gate = next(g for g in plan.gates if g.name == "translate")
    assert not gate.ok and "\n" not in gate.detail
    assert gate.detail.startswith("translate.sql does not select the key column(s) order_id")


@pytest.mark.slow
def test_a_sql_job_killed_after_a_commit_resumes_to_the_clean_runs_output(world: Any, tmp_path: Path) -> None:
    import yaml

    from rewind.job.service import open_ledger, resume_job, run_job

    settings, topic, _, _ = world
    clean = run_job(settings, sql_spec(topic, name="orders-sql-clean"), units_per_wave=2)
    spec = sql_spec(topic, name="orders-sql-killed")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", by_alias=True, exclude_none=True)))
    env = jf.child_env(settings, REWIND_FAULT="after-sink-commit")
    proc = jf.run_driver(tmp_path, env, "run", str(path), units_per_wave=2)
    assert proc.returncode == -9, proc.stderr[-3000:]
    with open_ledger(settings) as ledger:
        run_id = next(r.id for r in ledger.list_runs() if r.name == "orders-sql-killed")
        assert sum(u.state == "done" for u in ledger.units(run_id)) < len(ledger.units(run_id))
    resumed = resume_job(settings, run_id, units_per_wave=2)
    assert resumed.state == "succeeded"

    def stable(outcome: Any) -> list[Any]:
        rows = jf.staging_table(settings, outcome.staging).to_pylist()
        return sorted((r["_rewind_event_id"], r["order_id"], r["cents"]) for r in rows)

    assert stable(resumed) == stable(clean)  # nothing lost, nothing twice
    assert resumed.counts.to_dict() == clean.counts.to_dict()


SHUFFLING_QUERY = (
    "SELECT _rewind_row, order_id, cents FROM ("
    "  SELECT _rewind_row, order_id, CAST(ROUND(amount * 100) AS BIGINT) AS cents, status, amount,"
    "         count(*) OVER (PARTITION BY status) AS per_status FROM events"
    ") WHERE status <> 'test' AND amount > 0 AND per_status > 0"
)


def test_a_query_with_a_shuffle_writes_what_an_in_place_query_writes(
    world: Any,
) -> None:
    """A row-by-row query runs in the task that read its records; one with a window (a shuffle)
    cannot, and its rows are brought to their unit's task: both write the same rows and
    quarantine the same records."""
    from rewind.job.service import run_job

    settings, topic, _, _ = world
    outcomes = [
        run_job(settings, sql_spec(topic, q, name=f"orders-{label}"), units_per_wave=4)
        for label, q in (("in-place", QUERY), ("shuffled", SHUFFLING_QUERY))
    ]

    def written(outcome: Any) -> tuple[Any, ...]:
        rows = jf.staging_table(settings, outcome.staging).to_pylist()
        quarantined = jf.quarantine_rows(settings, outcome.quarantine_table, outcome.run_id)
        return (
            sorted((r["_rewind_event_id"], r["order_id"], r["cents"]) for r in rows),
            sorted((q["partition"], q["offset"], q["stage"]) for q in quarantined),
            outcome.counts.to_dict(),
        )

    in_place, shuffled = (written(o) for o in outcomes)
    assert in_place == shuffled
    assert len(in_place[0]) > 0 and len(in_place[1]) > 0


@pytest.mark.parametrize(
    ("query", "in_place"),
    [
        ("SELECT id, id * 2 AS twice FROM events WHERE id % 3 = 0", True),
        ("SELECT id, explode(array(id, id)) AS copy FROM events", False),
        ("SELECT id, count(*) OVER (PARTITION BY id % 2) AS n FROM events", False),
        ("SELECT id FROM events LIMIT 3", False),
        ("SELECT id FROM events UNION ALL SELECT id FROM events", False),
        ("SELECT a.id FROM events a JOIN events b ON a.id = b.id + 1", False),
        ("SELECT id % 2 AS k, count(*) AS n FROM events GROUP BY id % 2", False),
    ],
)
def test_only_a_row_by_row_query_runs_in_the_task_that_read_its_records(
    spark: Any, query: str, in_place: bool
) -> None:
    from rewind.spark.sql_wave import runs_in_place

    def same(batches: Any) -> Any:
        yield from batches

    spark.range(0, 8, 1, 4).mapInArrow(same, "id long").createOrReplaceTempView("events")
    assert runs_in_place(spark.sql(query)) is in_place


def test_the_columns_a_row_by_row_query_reads_are_the_only_ones_the_view_sends(spark: Any) -> None:
    from rewind.spark.sql_wave import columns_read

    def same(batches: Any) -> Any:
        yield from batches

    view = spark.range(0, 8, 1, 4).selectExpr("id", "id * 10 AS amount", "'x' AS _src_topic")
    view.mapInArrow(same, "id long, amount long, _src_topic string").createOrReplaceTempView("events")
    view_columns = {"id", "amount", "_src_topic"}
    query = "SELECT id, amount * 2 AS twice FROM events WHERE amount > 10"
    assert columns_read(spark.sql(query), view_columns) == {"id", "amount"}
    assert columns_read(spark.sql("SELECT * FROM events WHERE id > 1"), view_columns) == view_columns
