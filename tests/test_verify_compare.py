"""The comparison on real data: real Spark, real Iceberg tables (SQL catalog), real PostgreSQL.

Tables are made with ``spark.range`` and written as Iceberg tables once per module; each
test compares two of them (or two small DataFrames for the edge cases of tolerances and
nulls) through :func:`rewind.verify.verify_frames`, the function ``rewind verify`` runs.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rewind.spec import PostgresReference, Reference, Verify
from rewind.verify.exceptions import ReferenceUnreachable, VerifyError
from rewind.verify.service import verify_frames

BIG = 1_000_000
SMALL = 50_000
DEEP_KEY = 876_543
BASE = datetime(2026, 10, 1, tzinfo=UTC)


def orders(spark: Any, n: int) -> Any:
    """``n`` orders: a key, a total, a status, a time (3 minutes apart, so ~480 a day)."""
    from pyspark.sql import functions as F

    return spark.range(n).select(
        F.col("id").alias("order_id"),
        (F.col("id") % 997 * 1.25).alias("total"),
        F.element_at(
            F.array(F.lit("open"), F.lit("paid"), F.lit("shipped")), (F.col("id") % 3 + 1).cast("int")
        ).alias("status"),
        (F.lit(int(BASE.timestamp())) + F.col("id") * 180).cast("timestamp").alias("updated_at"),
    )


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    tmp = tmp_path_factory.mktemp("verify-catalog")
    (tmp / "wh").mkdir()
    return SqlCatalog("verify", uri=f"sqlite:///{tmp / 'catalog.db'}", warehouse=(tmp / "wh").as_uri())


@pytest.fixture(scope="module")
def tables(spark: Any, catalog: Any) -> dict[str, str]:
    """Iceberg tables: 1M orders and a copy with one changed total; 50k orders, a copy, and
    one with 3 keys removed and 2 added."""
    from pyspark.sql import functions as F

    from rewind.verify.tables import dataframe_to_iceberg

    big = orders(spark, BIG)
    dataframe_to_iceberg(spark, big, catalog, "shop.big")
    changed = big.withColumn(
        "total", F.when(F.col("order_id") == DEEP_KEY, F.col("total") + 0.5).otherwise(F.col("total"))
    )
    dataframe_to_iceberg(spark, changed, catalog, "shop.big_truth")
    small = orders(spark, SMALL)
    dataframe_to_iceberg(spark, small, catalog, "shop.small")
    dataframe_to_iceberg(spark, orders(spark, SMALL), catalog, "shop.small_copy")
    keys = small.where(~F.col("order_id").isin(7, 20_000, 49_999)).unionByName(
        orders(spark, SMALL + 2).where(F.col("order_id") >= SMALL)
    )
    dataframe_to_iceberg(spark, keys, catalog, "shop.small_keys")
    return {"big": "shop.big", "big_truth": "shop.big_truth"}


def read(spark: Any, catalog: Any, table: str) -> Any:
    from rewind.sinks.iceberg import read_iceberg

    return read_iceberg(spark, catalog.load_table(table), "main")


def verify(**fields: Any) -> Verify:
    return Verify.model_validate({"reference": {"iceberg": "shop.truth"}, "key": ["order_id"], **fields})


def check(report: dict[str, Any], name_part: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if name_part in c["name"])


# -- identical, one change in a million, missing and extra keys -----------------------------------


def test_identical_sides_pass(spark: Any, catalog: Any, tables: dict[str, str]) -> None:
    v = verify(buckets={"time_column": "updated_at", "category": "status"})
    report = verify_frames(
        spark, read(spark, catalog, "shop.small"), read(spark, catalog, "shop.small_copy"), v
    )
    assert report["passed"], report["failed"]
    assert report["rows"]["staging"] == report["rows"]["reference"] == SMALL
    [level] = report["bisection"]  # one pass over the data: every cell agreed
    assert level["differing_cells"] == 0 and level["rows"] == 0
    days = report["buckets"]["rows"]
    assert sum(b["staging_rows"] for b in days) == SMALL and all(b["equal"] for b in days)
    assert all(b["staging_checksum"] == b["reference_checksum"] for b in days)
    assert days[0]["bucket"] == "2026-10-01" and days[0]["staging_rows"] == 480  # 24 h / 3 min
    statuses = {c["value"]: c for c in report["categories"]["rows"]}
    assert statuses["open"]["staging_rows"] == statuses["open"]["reference_rows"] == 16_667


def test_one_changed_value_in_a_million_rows_is_found_and_named(
    spark: Any, catalog: Any, tables: dict[str, str]
) -> None:
    v = verify(buckets={"time_column": "updated_at"}, samples=5)
    report = verify_frames(spark, read(spark, catalog, "shop.big"), read(spark, catalog, "shop.big_truth"), v)
    assert not report["passed"]
    assert report["failed"] == ["values match"]
    assert report["rows"] == {
        "staging": BIG,
        "reference": BIG,
        "staging_in_window": 0,
        "reference_in_window": 0,
    }
    state = report["state"]
    assert state["changed"] == 1 and state["by_column"] == {"total": 1}
    [row] = state["changed_sample"]
    assert row["key"] == {"order_id": DEEP_KEY} and row["columns"] == ["total"]
    assert row["reference"]["total"] - row["staging"]["total"] == pytest.approx(0.5)
    assert row["staging"]["status"] == row["reference"]["status"]
    day = (BASE + timedelta(seconds=DEEP_KEY * 180)).strftime("%Y-%m-%d")
    assert row["bucket"] == day
    differing = [b for b in report["buckets"]["rows"] if not b["equal"]]
    assert [(b["bucket"], b["changed"]) for b in differing] == [(day, 1)]
    assert report["record"]["missing"] == report["record"]["extra"] == 0
    # one differing cell out of half a million: only its few rows were compared one by one
    assert report["bisection"][-1]["differing_cells"] == 1 and report["bisection"][-1]["rows"] < 20


def test_missing_and_extra_keys_are_counted_and_sampled(
    spark: Any, catalog: Any, tables: dict[str, str]
) -> None:
    v = verify(buckets={"time_column": "updated_at", "category": "status"})
    report = verify_frames(
        spark, read(spark, catalog, "shop.small_keys"), read(spark, catalog, "shop.small"), v
    )
    assert not report["passed"]
    record = report["record"]
    assert record["missing"] == 3 and record["extra"] == 2
    assert [s["key"]["order_id"] for s in record["missing_sample"]] == [7, 20_000, 49_999]
    assert [s["key"]["order_id"] for s in record["extra_sample"]] == [SMALL, SMALL + 1]
    assert (
        record["missing_sample"][0]["reference"]["status"] == "paid"
        and "staging" not in record["missing_sample"][0]
    )
    assert set(report["failed"]) == {"every reference key is in staging", "staging has no extra keys"}
    assert report["state"]["changed"] == 0
    by_status = {c["value"]: (c["missing"], c["extra"]) for c in report["categories"]["rows"]}
    assert sum(m for m, _ in by_status.values()) == 3 and sum(e for _, e in by_status.values()) == 2
    assert report["rows"]["staging"] == SMALL - 1 and report["rows"]["reference"] == SMALL


def test_scope_filter_and_key_range_limit_what_is_compared(
    spark: Any, catalog: Any, tables: dict[str, str]
) -> None:
    staging, reference = read(spark, catalog, "shop.small_keys"), read(spark, catalog, "shop.small")
    v = verify(scope={"key_from": 8, "key_to": 20_000, "filter": "status != 'test'"})
    report = verify_frames(spark, staging, reference, v)
    assert report["passed"], report["failed"]
    assert report["rows"]["staging"] == report["rows"]["reference"] == 20_000 - 8
    window = {"time_column": "updated_at", "from": "2026-10-15T00:00:00Z", "to": "2026-11-01T00:00:00Z"}
    inside = verify_frames(spark, staging, reference, verify(scope=window))
    assert inside["record"]["missing"] == 0 and inside["record"]["extra"] == 0  # 7 and 20000 lie outside
    assert inside["rows"]["staging"] == 17 * 480


def test_bisection_splits_differing_cells_until_the_rows_fit(
    spark: Any, catalog: Any, tables: dict[str, str]
) -> None:
    from pyspark.sql import functions as F

    reference = read(spark, catalog, "shop.small")
    staging = reference.withColumn(
        "total", F.when(F.col("order_id") % 50 == 0, F.col("total") + 1).otherwise(F.col("total"))
    )
    report = verify_frames(spark, staging, reference, verify(drill_rows=500))
    assert report["state"]["changed"] == SMALL // 50
    levels = report["bisection"]
    assert len(levels) >= 2 and levels[1]["bits"] > levels[0]["bits"]
    assert levels[-1]["rows"] < levels[0]["rows"]


# -- tolerances, timestamps and nulls, on small DataFrames ----------------------------------------


def frame(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> Any:
    return spark.createDataFrame(rows, schema)


SCHEMA = "order_id long, total double, status string, updated_at timestamp"
T = datetime(2026, 10, 1, 12, 0, 0, tzinfo=UTC)


def changed_columns(report: dict[str, Any]) -> dict[Any, list[str]]:
    return {s["key"]["order_id"]: s["columns"] for s in report["state"]["changed_sample"]}


def test_abs_and_rel_tolerance_edges(spark: Any) -> None:
    schema = "order_id long, a double, b double, c double, d double"
    same = (10.0, 1000.0, 10.0, 10.0)
    reference = frame(spark, [(k, *same) for k in range(1, 8)], schema)
    staging = frame(
        spark,
        [
            (1, 10.0099, *same[1:]),  # a: abs 0.01, just inside
            (2, 10.0101, *same[1:]),  # a: just outside
            (3, 10.0, 1000.9, 10.0, 10.0),  # b: rel 0.001 of 1000 is 1.0, just inside
            (4, 10.0, 1001.1, 10.0, 10.0),  # b: just outside
            (5, 10.0, 1000.0, 10.02, 10.0),  # c: abs 0.011 + rel 0.001 * 10 = 0.021, inside
            (6, 10.0, 1000.0, 10.022, 10.0),  # c: outside
            (7, 10.0, 1000.0, 10.0, 10.0000001),  # d: exact
        ],
        schema,
    )
    compare = {"a": {"abs": 0.01}, "b": {"rel": 0.001}, "c": {"abs": 0.011, "rel": 0.001}, "d": "exact"}
    report = verify_frames(spark, staging, reference, verify(compare=compare))
    assert changed_columns(report) == {2: ["a"], 4: ["b"], 6: ["c"], 7: ["d"]}
    assert report["state"]["within_tolerance"] == 3
    assert report["state"]["by_column"] == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert report["failed"] == ["values match within tolerance"]


def test_timestamp_precision_truncates_both_sides(spark: Any) -> None:
    ms, us = timedelta(milliseconds=1), timedelta(microseconds=1)
    schema = "order_id long, by_second timestamp, by_minute timestamp, exact timestamp"
    reference = frame(
        spark,
        [(1, T + 100 * ms, T, T), (2, T + 999 * ms, T, T), (3, T, T + 10_000 * ms, T), (4, T, T, T)],
        schema,
    )
    staging = frame(
        spark,
        [(1, T + 900 * ms, T, T), (2, T + 1000 * ms, T, T), (3, T, T + 50_000 * ms, T), (4, T, T, T + us)],
        schema,
    )
    compare = {
        "by_second": {"timestamp_precision": "s"},
        "by_minute": {"timestamp_precision": "min"},
        "exact": "exact",
    }
    report = verify_frames(spark, staging, reference, verify(compare=compare))
    assert changed_columns(report) == {2: ["by_second"], 4: ["exact"]}


def test_nulls_equal_where_configured(spark: Any) -> None:
    schema = "order_id long, x double, y string"
    reference = frame(spark, [(None, None, "z"), (1, None, None), (2, None, "a"), (3, 2.0, None)], schema)
    staging = frame(spark, [(None, None, "z"), (1, None, None), (2, 5.0, "a"), (3, 2.0, "b")], schema)
    compare = {"x": {"abs": 0.1}, "y": {"nulls_equal": False}}
    report = verify_frames(spark, staging, reference, verify(compare=compare))
    # x: null = null, null != 5.0; y (nulls_equal false): null != null, null != 'b'; a null key joins
    assert changed_columns(report) == {1: ["y"], 2: ["x"], 3: ["y"]}
    assert report["record"]["missing"] == report["record"]["extra"] == 0
    strict = verify_frames(
        spark, staging, reference, verify(compare={"x": {"abs": 0.1}, "y": "exact"}, nulls_equal=False)
    )
    assert changed_columns(strict) == {None: ["x"], 1: ["x", "y"], 2: ["x"], 3: ["y"]}
    assert verify_frames(spark, reference, reference, verify(compare=["x", "y"]))["passed"]


def test_duplicate_keys_in_staging_fail(spark: Any) -> None:
    reference = frame(spark, [(1, 1.0, "a", T), (2, 2.0, "a", T)], SCHEMA)
    staging = frame(spark, [(1, 1.0, "a", T), (2, 2.0, "a", T), (2, 2.0, "a", T)], SCHEMA)
    report = verify_frames(spark, staging, reference, verify())
    assert report["failed"] == ["staging keys are unique"]
    assert report["record"]["duplicate_sample"] == [{"side": "staging", "key": {"order_id": 2}, "rows": 2}]


def test_types_are_aligned_to_staging(spark: Any) -> None:
    staging = frame(spark, [(1, 10.5, "a", T)], SCHEMA)
    reference = frame(
        spark,
        [("1", "10.50", "a", T.replace(tzinfo=None).isoformat())],
        "order_id string, total string, status string, updated_at string",
    )
    assert verify_frames(spark, staging, reference, verify())["passed"]


# -- repair mode: differences inside the window are the repair ------------------------------------


def test_repair_mode_allows_changes_inside_the_window_only(spark: Any) -> None:
    schema = SCHEMA + ", _rewind_source_timestamp timestamp"
    day = timedelta(days=1)
    old = [(i, float(i), "a", T, T + i * day) for i in range(10)]
    repaired = [(i, float(i) + (0.5 if 3 <= i < 6 else 0), "a", T, T + i * day) for i in range(10) if i != 4]
    repaired.append((100, 1.0, "a", T, T + 5 * day))
    window = (T + 3 * day, T + 6 * day)
    v = Verify.model_validate({"key": ["order_id"], "buckets": {"category": "status"}})
    report = verify_frames(
        spark, frame(spark, repaired, schema), frame(spark, old, schema), v, job_window=window
    )
    assert report["mode"] == "repair" and report["passed"], report["failed"]
    changes = report["changes"]
    assert (changes["changed"], changes["missing"], changes["extra"]) == (2, 1, 1)
    assert changes["by_column"] == {"total": 2}
    assert report["rows"]["staging_in_window"] == 3 and report["rows"]["reference_in_window"] == 3
    broken = [*repaired, (8, 99.0, "a", T, T + 8 * day)]
    broken.remove((8, 8.0, "a", T, T + 8 * day))
    report = verify_frames(
        spark, frame(spark, broken, schema), frame(spark, old, schema), v, job_window=window
    )
    assert report["failed"] == ["values match outside the repaired window"]
    assert [s["key"]["order_id"] for s in report["state"]["changed_sample"]] == [8]


def test_repair_mode_with_an_unbounded_window_reports_every_difference_as_a_change(spark: Any) -> None:
    # a read model rebuilt from `earliest`: the job's window is not in times, so all of it is repaired
    schema = SCHEMA + ", _rewind_source_timestamp timestamp"
    old = [(i, float(i), "a", T, T) for i in range(6)]
    rebuilt = [(i, float(i) + (1 if i == 2 else 0), "a", T, T) for i in range(1, 8)]
    v = Verify.model_validate({"key": ["order_id"], "mode": "repair"})
    report = verify_frames(spark, frame(spark, rebuilt, schema), frame(spark, old, schema), v)
    assert report["passed"], report["failed"]
    changes = report["changes"]
    assert (changes["changed"], changes["missing"], changes["extra"]) == (1, 1, 2)
    assert report["record"]["missing"] == 0 and report["record"]["extra"] == 0


def test_dense_changes_in_the_window_are_sampled(spark: Any) -> None:
    from pyspark.sql import functions as F

    base = orders(spark, 20_000).withColumn("_rewind_source_timestamp", F.col("updated_at"))
    repaired = base.withColumn("total", F.col("total") + 1)
    v = Verify.model_validate({"key": ["order_id"], "drill_rows": 2_000})
    window = (BASE, BASE + timedelta(days=365))
    report = verify_frames(spark, repaired, base, v, job_window=window)
    assert report["passed"]
    sampled = report["changes"]["sampled"]
    assert sampled is not None and 2_000 < sampled["rows"] <= 40_000 and 0 < sampled["share"] < 1
    assert 0 < report["changes"]["changed"] < 20_000


# -- assertions ------------------------------------------------------------------------------------


def test_assertions_in_sql(spark: Any, catalog: Any, tables: dict[str, str]) -> None:
    staging, reference = read(spark, catalog, "shop.small_keys"), read(spark, catalog, "shop.small")
    per_status = "SELECT status, sum(total) AS total, count(*) AS n FROM staging GROUP BY status"
    v = verify(
        assertions=[
            {
                "name": "no negative totals",
                "sql": "SELECT count(*) FROM staging WHERE total < 0",
                "expect": 0,
            },
            {"name": "no test orders", "sql": "SELECT * FROM staging WHERE status = 'test'"},
            {
                "name": "rows vs reference",
                "sql": "SELECT (SELECT count(*) FROM staging) - (SELECT count(*) FROM reference)",
                "expect": -1,
            },
            {
                "name": "sums per status within 1%",
                "sql": per_status,
                "compare_to_reference": True,
                "rel": 0.01,
            },
            {"name": "sums per status exact", "sql": per_status, "compare_to_reference": True},
            {"name": "open orders", "sql": "SELECT * FROM staging WHERE status = 'open' AND order_id < 3"},
            {"name": "broken", "sql": "SELECT nope FROM staging", "expect": 1},
        ]
    )
    report = verify_frames(spark, staging, reference, v)
    results = {a["name"]: a for a in report["assertions"]}
    assert results["no negative totals"]["passed"] and results["no negative totals"]["value"] == 0
    assert results["no test orders"]["passed"]
    assert results["rows vs reference"]["passed"]
    assert results["sums per status within 1%"]["passed"]
    exact = results["sums per status exact"]
    assert not exact["passed"] and "rows differ" in exact["detail"]
    # small_keys lacks orders 7, 20,000 and 49,999 and adds SMALL and SMALL + 1: the statuses
    # of those five (id % 3) are the rows that differ; each differing cell is one problem
    touched = {("open", "paid", "shipped")[i % 3] for i in (7, 20_000, 49_999, SMALL, SMALL + 1)}
    assert {r["row"]["status"] for r in exact["rows"]} == touched == {"open", "paid", "shipped"}
    # open gained one order, paid lost two (total and n differ); shipped lost 20,000 and gained
    # SMALL, of other totals (total differs, n not): 2 + 2 + 1 cells
    assert exact["value"] == 5
    assert exact["detail"].startswith("3 of 3 rows differ in 5 values")  # rows, then cells
    opened = results["open orders"]
    assert not opened["passed"] and opened["value"] == 1 and opened["rows"][0]["order_id"] == 0
    broken = results["broken"]
    assert not broken["passed"] and "nope" in broken["error"] and "\n" not in broken["error"]
    failed = {c["name"] for c in report["checks"] if c["level"] == "outcome" and not c["passed"]}
    assert failed == {"sums per status exact", "open orders", "broken"}


# -- references that cannot be reached -------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_references_give_one_line(spark: Any, catalog: Any, tmp_path: Path) -> None:
    from rewind.verify.sources import reference_side

    staging = frame(spark, [(1, 1.0, "a", T)], SCHEMA)
    url = f"postgresql://postgres:s3cret@127.0.0.1:{closed_port()}/test"
    pg = Reference(postgres=PostgresReference(url=url, table="public.orders"))
    with pytest.raises(ReferenceUnreachable) as caught:
        reference_side(spark, pg, staging_df=staging, catalog=None, folder=tmp_path)
    text = str(caught.value)
    assert text.startswith("verify.reference.postgres: PostgreSQL at postgresql://postgres:***@127.0.0.1:")
    assert "not reachable" in text and "\n" not in text and "s3cret" not in text
    with pytest.raises(ReferenceUnreachable) as caught:
        reference_side(
            spark, Reference(iceberg="shop.nope"), staging_df=staging, catalog=catalog, folder=tmp_path
        )
    missing = "Iceberg table shop.nope does not exist in catalog verify; check the name"
    assert str(caught.value) == f"verify.reference.iceberg: {missing}"
    with pytest.raises(VerifyError) as caught:
        reference_side(
            spark,
            Reference.model_validate({"sql": "SELECT * FROM nowhere"}),
            staging_df=staging,
            catalog=catalog,
            folder=tmp_path,
        )
    assert str(caught.value).startswith("verify.reference.sql: ") and "\n" not in str(caught.value)
    with pytest.raises(VerifyError, match=r"verify\.scope\.filter on staging: "):
        verify_frames(spark, staging, staging, verify(scope={"filter": "no_such_column > 1"}))


# -- a PostgreSQL source of truth and a SQL recomputation ------------------------------------------


def test_postgres_reference(spark: Any, pg_url: str, tmp_path: Path) -> None:
    import psycopg

    from rewind.verify.sources import reference_side

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE truth (order_id bigint PRIMARY KEY, total numeric(12,2), status text, "
            "updated_at timestamptz, flag boolean, day date, raw bytea)"
        )
        conn.execute(
            "INSERT INTO truth SELECT i, i * 1.25, CASE WHEN i % 2 = 0 THEN 'open' ELSE 'paid' END, "
            "timestamptz '2026-10-01 00:00:00+00' + i * interval '1 minute', i % 2 = 0, "
            "date '2026-10-01' + (i / 1000), decode('00ff', 'hex') FROM generate_series(0, 4999) i"
        )
        conn.execute("UPDATE truth SET status = NULL WHERE order_id = 10")
    side = reference_side(
        spark,
        Reference(postgres=PostgresReference(url=pg_url, table="public.truth")),
        staging_df=frame(spark, [], SCHEMA),
        catalog=None,
        folder=tmp_path,
    )
    types = dict(side.df.dtypes)
    assert types == {
        "order_id": "bigint",
        "total": "decimal(12,2)",
        "status": "string",
        "updated_at": "timestamp",
        "flag": "boolean",
        "day": "date",
        "raw": "binary",
    }
    from pyspark.sql import functions as F

    staging = (
        spark.range(5000)
        .select(
            F.col("id").alias("order_id"),
            (F.col("id") * 1.25).alias("total"),
            F.when(F.col("id") == 10, F.lit(None))
            .when(F.col("id") % 2 == 0, "open")
            .otherwise("paid")
            .alias("status"),
            (F.lit(int(datetime(2026, 10, 1, tzinfo=UTC).timestamp())) + F.col("id") * 60)
            .cast("timestamp")
            .alias("updated_at"),
        )
        .withColumn("status", F.when(F.col("order_id") == 4321, "open").otherwise(F.col("status")))
    )
    v = Verify.model_validate(
        {
            "reference": {"postgres": {"table": "truth"}},
            "key": ["order_id"],
            "compare": {"total": {"abs": 0.001}, "status": "exact", "updated_at": "exact"},
        }
    )
    report = verify_frames(spark, staging, side.df, v)
    assert report["rows"]["reference"] == 5000
    assert [(s["key"]["order_id"], s["columns"]) for s in report["state"]["changed_sample"]] == [
        (4321, ["status"])
    ]


def test_postgres_query_reference(spark: Any, pg_url: str, tmp_path: Path) -> None:
    """A ``query:`` reference reads what the query selects (it was a syntax error: two aliases)."""
    import psycopg

    from rewind.verify.sources import reference_side

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS q_truth (order_id bigint PRIMARY KEY, status text)")
        conn.execute("INSERT INTO q_truth SELECT i, CASE WHEN i % 3 = 0 THEN 'open' ELSE 'paid' END "
                     "FROM generate_series(0, 299) i ON CONFLICT DO NOTHING")
    query = "SELECT order_id, upper(status) AS status FROM q_truth WHERE order_id >= 100"
    side = reference_side(
        spark,
        Reference(postgres=PostgresReference(url=pg_url, query=query)),
        staging_df=frame(spark, [], SCHEMA),
        catalog=None,
        folder=tmp_path,
    )
    rows = {r.order_id: r.status for r in side.df.collect()}
    assert sorted(rows) == list(range(100, 300))
    assert rows[102] == "OPEN" and rows[101] == "PAID"


def test_sql_recomputation_reference(
    spark: Any, catalog: Any, tables: dict[str, str], tmp_path: Path
) -> None:
    from rewind.verify.sources import reference_side

    staging = read(spark, catalog, "shop.small")
    recompute = {
        "sql": {
            "query": "SELECT order_id, total, status, updated_at FROM lines",
            "views": {"lines": "shop.small_copy"},
        }
    }
    side = reference_side(
        spark, Reference.model_validate(recompute), staging_df=staging, catalog=catalog, folder=tmp_path
    )
    assert verify_frames(spark, staging, side.df, verify())["passed"]
