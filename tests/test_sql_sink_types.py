"""Column types of the SQL sink read back exactly, per database.

The same declared name means different types in PostgreSQL and SQLite (``REAL`` is a 32-bit
float in one and a 64-bit double in the other). Every type each database accepts is written
with the database's own client, or through the sink, and read back by the sink's read path
(``read_arrow``: what ``rewind verify``, ``rewind compensate`` and the merge read) exactly
equal. The sink's check agrees with that read path: a time column it accepts reads back as one.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.core.parquet import write_parquet
from rewind.sinks.sql import types as sql_types
from rewind.sinks.sql.exceptions import SqlSinkError
from rewind.sinks.sql.publish import read_sides, read_table
from rewind.sinks.sql.sink import SqlSink, SqlStaging
from rewind.translate.lineage import LINEAGE_SCHEMA

INT64 = st.integers(-(2**63), 2**63 - 1)
DOUBLES = st.floats(allow_nan=False, width=64)
FLOATS = st.floats(allow_nan=False, width=32)
TEXTS = st.text(max_size=12).filter(lambda t: "\x00" not in t)
BYTES = st.binary(max_size=12)
DATES = st.dates(date(1, 1, 1), date(9999, 12, 31))
TIMESTAMPS = st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1))  # naive: UTC
TIMES = st.times()


def decimals(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    """Exact decimals of ``precision`` digits, ``scale`` after the point (no context rounding)."""
    top = 10**precision - 1
    return st.integers(-top, top).map(lambda n: Decimal(f"{n}E-{scale}"))


def _sqlite_stamp(v: datetime) -> str:
    return v.strftime("%Y-%m-%d %H:%M:%S.%f")  # as the sink writes it (encoding.prepare_columns)


# declared type -> (values, how sqlite3 is handed one, the value read back)
SQLITE: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Any], Callable[[Any], Any]]] = {
    "INTEGER": (INT64, lambda v: v, lambda v: v),
    "BIGINT": (INT64, lambda v: v, lambda v: v),
    "SMALLINT": (INT64, lambda v: v, lambda v: v),  # SQLite's integers are 64-bit whatever the name
    "INT": (INT64, lambda v: v, lambda v: v),
    "REAL": (DOUBLES, lambda v: v, lambda v: v),
    "DOUBLE": (DOUBLES, lambda v: v, lambda v: v),
    "DOUBLE PRECISION": (DOUBLES, lambda v: v, lambda v: v),
    "FLOAT": (DOUBLES, lambda v: v, lambda v: v),
    "NUMERIC(15,4)": (decimals(15, 4), str, lambda v: v),
    "DECIMAL(9,2)": (decimals(9, 2), str, lambda v: v),
    "TEXT": (TEXTS, lambda v: v, lambda v: v),
    "VARCHAR(20)": (TEXTS, lambda v: v, lambda v: v),
    "BLOB": (BYTES, lambda v: v, lambda v: v),
    "BOOLEAN": (st.booleans(), int, lambda v: v),
    "DATE": (DATES, lambda v: v.isoformat(), lambda v: v),
    "TIMESTAMP": (TIMESTAMPS, _sqlite_stamp, lambda v: v.replace(tzinfo=UTC)),
    "DATETIME": (TIMESTAMPS, _sqlite_stamp, lambda v: v.replace(tzinfo=UTC)),
    "TIME": (TIMES, lambda v: v.isoformat(), lambda v: v),
}

PG: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], Any]]] = {
    "smallint": (st.integers(-(2**15), 2**15 - 1), lambda v: v),
    "integer": (st.integers(-(2**31), 2**31 - 1), lambda v: v),
    "bigint": (INT64, lambda v: v),
    "real": (FLOATS, lambda v: v),
    "double precision": (DOUBLES, lambda v: v),
    "numeric(15,4)": (decimals(15, 4), lambda v: v),
    "numeric(38,10)": (decimals(38, 10), lambda v: v),
    "numeric": (decimals(30, 6), str),  # no precision: read back as its text, exact
    "text": (TEXTS, lambda v: v),
    "character varying(20)": (TEXTS, lambda v: v),
    "bytea": (BYTES, lambda v: v),
    "boolean": (st.booleans(), lambda v: v),
    "date": (st.dates(date(1, 1, 1), date(9999, 12, 31)), lambda v: v),
    "timestamp with time zone": (TIMESTAMPS.map(lambda v: v.replace(tzinfo=UTC)), lambda v: v),
    "timestamp without time zone": (TIMESTAMPS, lambda v: v),
    "time without time zone": (TIMES, lambda v: v),
}


def test_text_that_looks_like_a_null_or_a_number_stays_text_in_postgres(pg_sink: SqlSink) -> None:
    """COPY's CSV marks NULL by an unquoted empty field only: 'null', 'NULL', 'N/A' and 'NaN'
    are values (pyarrow's default would read them all as nulls)."""
    url = pg_sink.url.replace("postgresql+psycopg://", "postgresql://")
    words = ["null", "NULL", "N/A", "NaN", "", "nan", "#N/A"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM public.types")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO public.types (id, c_text, c_double_precision) VALUES (%s, %s, %s)",
                [(i, w, float("nan") if i == 0 else None) for i, w in enumerate(words)],
            )
    table = read_table(pg_sink, "public.types")
    assert table is not None
    got = sorted(table.select(["id", "c_text", "c_double_precision"]).to_pylist(), key=lambda r: r["id"])
    assert [r["c_text"] for r in got] == words
    nan = got[0]["c_double_precision"]
    assert nan is not None and nan != nan  # NaN, not a null
    assert [r["c_double_precision"] for r in got[1:]] == [None] * (len(words) - 1)


def _column(name: str) -> str:
    return "c_" + "".join(ch if ch.isalnum() else "_" for ch in name.lower())


# -- every declared type, written by the database's client ------------------------------------


@pytest.fixture(scope="module")
def sqlite_sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlSink]:
    folder = tmp_path_factory.mktemp("sqlite-types")
    columns = ", ".join(f"{_column(d)} {d}" for d in SQLITE)
    with sqlite3.connect(folder / "types.db") as db:
        db.execute(f"CREATE TABLE types (id INTEGER PRIMARY KEY, {columns})")
    db.close()
    sink = SqlSink(f"sqlite:///{folder / 'types.db'}", "types", key=["id"], spool_dir=folder)
    yield sink
    sink.close()


@pytest.fixture(scope="module")
def pg_sink(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlSink]:
    columns = ", ".join(f"{_column(d)} {d}" for d in PG)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.types (id bigint PRIMARY KEY, {columns})")
    sink = SqlSink(pg_url, "public.types", key=["id"], spool_dir=tmp_path_factory.mktemp("pg-types"))
    yield sink
    sink.close()


def _rows(strategies: list[st.SearchStrategy[Any]]) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    row = st.tuples(*(st.one_of(st.none(), s) for s in strategies))
    return st.lists(row, min_size=1, max_size=8)


@given(rows=_rows([s for s, _, _ in SQLITE.values()]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_sqlite_every_declared_type_reads_back_exactly(
    sqlite_sink: SqlSink, rows: list[tuple[Any, ...]]
) -> None:
    path = sqlite_sink.url.removeprefix("sqlite:///")
    convs = [(to_db, back) for _, to_db, back in SQLITE.values()]
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM types")
        db.executemany(
            f"INSERT INTO types VALUES (?, {', '.join('?' for _ in SQLITE)})",
            [
                (i, *(None if v is None else c(v) for v, (c, _) in zip(r, convs, strict=True)))
                for i, r in enumerate(rows)
            ],
        )
    db.close()
    table = read_table(sqlite_sink, "types")
    assert table is not None
    assert [table.schema.field(_column(d)).type for d in SQLITE] == [
        sql_types.sqlite_arrow_of(d) for d in SQLITE
    ]
    got = sorted(table.to_pylist(), key=lambda r: r["id"])
    for i, r in enumerate(rows):
        want = {
            _column(d): None if v is None else back(v)
            for d, v, (_, back) in zip(SQLITE, r, convs, strict=True)
        }
        assert {k: got[i][k] for k in want} == want


@given(rows=_rows([s for s, _ in PG.values()]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_postgres_every_declared_type_reads_back_exactly(
    pg_sink: SqlSink, rows: list[tuple[Any, ...]]
) -> None:
    url = pg_sink.url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM public.types")
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO public.types VALUES (%s, {', '.join('%s' for _ in PG)})",
                [(i, *r) for i, r in enumerate(rows)],
            )
    table = read_table(pg_sink, "public.types")
    assert table is not None
    assert [table.schema.field(_column(d)).type for d in PG] == [
        sql_types.arrow_of(d, "postgres") for d in PG
    ]
    got = sorted(table.to_pylist(), key=lambda r: r["id"])
    for i, r in enumerate(rows):
        want = {
            _column(d): None if v is None else back(v)
            for d, v, (_, back) in zip(PG, r, PG.values(), strict=True)
        }
        assert {k: got[i][k] for k in want} == want


def test_real_is_a_double_in_sqlite_and_a_float_in_postgres() -> None:
    assert sql_types.arrow_of("REAL", "sqlite") == pa.float64()
    assert sql_types.arrow_of("real", "postgres") == pa.float32()
    assert (
        sql_types.arrow_of("FLOAT", "sqlite")
        == sql_types.arrow_of("double precision", "postgres")
        == pa.float64()
    )
    assert (
        sql_types.arrow_of("SMALLINT", "sqlite") == pa.int64()
        and sql_types.arrow_of("smallint", "postgres") == pa.int16()
    )


# -- the sink's own tables: what it writes, it reads back -------------------------------------

OUTPUT = pa.schema(
    [
        pa.field("order_id", pa.int64()),
        pa.field("i16", pa.int16()),
        pa.field("i32", pa.int32()),
        pa.field("f32", pa.float32()),
        pa.field("f64", pa.float64()),
        pa.field("dec", pa.decimal128(12, 3)),
        pa.field("txt", pa.string()),
        pa.field("raw", pa.binary()),
        pa.field("flag", pa.bool_()),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("clock", pa.time64("us")),
        *LINEAGE_SCHEMA,
    ]
)
BASE = datetime(2026, 10, 1, tzinfo=UTC)


def output_rows(run_id: str, values: list[tuple[Any, ...]]) -> pa.Table:
    n = len(values)
    user = {f.name: [v[i] for v in values] for i, f in enumerate(OUTPUT) if not f.name.startswith("_rewind_")}
    return pa.table(
        {
            **user,
            "_rewind_event_id": [f"e-{i}" for i in range(n)],
            "_rewind_source_topic": ["orders"] * n,
            "_rewind_source_partition": [0] * n,
            "_rewind_source_offset": list(range(n)),
            "_rewind_source_timestamp": [BASE + timedelta(milliseconds=i) for i in range(n)],
            "_rewind_extracted_at": [BASE] * n,
            "_rewind_transform": ["t"] * n,
            "_rewind_transform_version": ["1"] * n,
            "_rewind_run_id": [run_id] * n,
            "_rewind_synthetic": [True] * n,
        },
        schema=OUTPUT,
    )


def commit(sink: SqlSink, staging: SqlStaging, unit: str, table: pa.Table) -> None:
    files = [write_parquet(sink.data_folder(staging), table, "data")]
    counts = {unit: {"records_read": table.num_rows, "emitted": table.num_rows, "rows_out": table.num_rows}}
    sink.commit(staging, staging.run_id, [unit], files, extra={UNIT_COUNTS_KEY: json.dumps(counts)})


OUTPUT_VALUES = st.tuples(
    *(
        st.one_of(st.none(), s)
        for s in (
            st.integers(-(2**15), 2**15 - 1),
            st.integers(-(2**31), 2**31 - 1),
            FLOATS.filter(lambda f: abs(f) != float("inf")),
            DOUBLES.filter(lambda f: abs(f) != float("inf")),
            decimals(12, 3),
            TEXTS,
            BYTES,
            st.booleans(),
            st.dates(date(1, 1, 1), date(9999, 12, 31)),
            TIMESTAMPS.map(lambda v: v.replace(tzinfo=UTC)),
            TIMES,
        )
    )
)


@pytest.fixture(params=["postgres", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@given(values=st.lists(OUTPUT_VALUES, min_size=1, max_size=6))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_what_the_sink_writes_it_reads_back(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    values: list[tuple[Any, ...]],
) -> None:
    """A new read model on either database: the output of every type the sink creates a column
    for, committed and read back (verify's staging, compensate's sides) value for value."""
    folder = tmp_path_factory.mktemp("written")
    name = f"model_{uuid.uuid4().hex[:8]}"
    if backend == "postgres":
        sink = SqlSink(
            request.getfixturevalue("pg_url"), f"public.{name}", key=["order_id"], spool_dir=folder
        )
    else:
        sink = SqlSink(f"sqlite:///{folder / 'model.db'}", name, key=["order_id"], spool_dir=folder)
    try:
        run_id = f"r-{uuid.uuid4().hex[:8]}"  # units are recorded per run, in the database
        staging = sink.prepare(run_id, OUTPUT)
        written = output_rows(run_id, [(i, *v) for i, v in enumerate(values)])
        commit(sink, staging, "u1", written)
        got = sink.read_arrow(staging).select(OUTPUT.names).sort_by("order_id")
        assert got.to_pylist() == written.to_pylist()
        before, after = read_sides(sink, staging)
        assert (
            before is None
            and after.sort_by("order_id").select(OUTPUT.names).to_pylist() == written.to_pylist()
        )
    finally:
        sink.close()


# -- the case: a SQLite REAL read for compensate and verify --------------------------------

SQLITE_TARGET = """
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  amount REAL,
  _rewind_event_id TEXT, _rewind_source_topic TEXT, _rewind_source_partition INTEGER,
  _rewind_source_offset INTEGER, _rewind_source_timestamp {ts}, _rewind_extracted_at TIMESTAMP,
  _rewind_transform TEXT, _rewind_transform_version TEXT, _rewind_run_id TEXT, _rewind_synthetic BOOLEAN
)
"""
ORDERS = pa.schema([pa.field("order_id", pa.int64()), pa.field("amount", pa.float64()), *LINEAGE_SCHEMA])


def sqlite_target(folder: Path, ts: str = "TIMESTAMP") -> SqlSink:
    with sqlite3.connect(folder / "orders.db") as db:
        db.execute(SQLITE_TARGET.format(ts=ts))
        db.execute("INSERT INTO orders (order_id, amount) VALUES (1, 71.04), (2, 0.1), (3, 19.99)")
    db.close()
    return SqlSink(f"sqlite:///{folder / 'orders.db'}", "orders", key=["order_id"], spool_dir=folder)


def test_a_sqlite_real_survives_the_reads_of_compensate_and_verify(tmp_path: Path) -> None:
    sink = sqlite_target(tmp_path)
    try:
        staging = sink.prepare("r-1", ORDERS)
        before, after = read_sides(sink, staging)  # rewind compensate's production and staging
        assert before is not None
        for side in (before, after, sink.read_arrow(staging)):  # verify reads staging with read_arrow
            assert side.schema.field("amount").type == pa.float64()
            assert dict(zip(side["order_id"].to_pylist(), side["amount"].to_pylist(), strict=True)) == {
                1: 71.04,
                2: 0.1,
                3: 19.99,
            }
    finally:
        sink.close()


# -- the sink's check and verify agree on time columns ------------------------------------------


def test_sqlite_check_refuses_a_text_source_timestamp_naming_the_column(tmp_path: Path) -> None:
    """The sink writes ISO text into any column, but a TEXT column reads back as text, and
    verify's time column must be a timestamp: refused at plan time, in one line."""
    sink = sqlite_target(tmp_path, ts="TEXT")
    try:
        with pytest.raises(SqlSinkError) as refused:
            sink.check(ORDERS)
        message = str(refused.value)
        assert "\n" not in message
        assert "orders._rewind_source_timestamp is declared TEXT" in message
        assert "declare it TIMESTAMP" in message
    finally:
        sink.close()


def test_a_timestamp_column_the_sqlite_check_accepts_reads_back_as_a_timestamp(tmp_path: Path) -> None:
    sink = sqlite_target(tmp_path, ts="DATETIME")
    try:
        assert "exists" in sink.check(ORDERS)
        staging = sink.prepare("r-1", ORDERS)
        rows = output_like(ORDERS, "r-1")
        commit(sink, staging, "u1", rows)
        got = sink.read_arrow(staging)
        assert pa.types.is_timestamp(got.schema.field("_rewind_source_timestamp").type)
        assert got.sort_by("order_id")["_rewind_source_timestamp"].to_pylist()[0] == BASE
    finally:
        sink.close()


def output_like(schema: pa.Schema, run_id: str) -> pa.Table:
    return pa.table(
        {
            "order_id": [1],
            "amount": [71.04],
            "_rewind_event_id": ["e-0"],
            "_rewind_source_topic": ["orders"],
            "_rewind_source_partition": [0],
            "_rewind_source_offset": [0],
            "_rewind_source_timestamp": [BASE],
            "_rewind_extracted_at": [BASE],
            "_rewind_transform": ["t"],
            "_rewind_transform_version": ["1"],
            "_rewind_run_id": [run_id],
            "_rewind_synthetic": [True],
        },
        schema=schema,
    )


@pytest.mark.parametrize(
    "declared",
    [
        "TEXT",
        "VARCHAR(40)",
        "CLOB",
        "",
        "NUMERIC",
        "BLOB",
        "INTEGER",
        "REAL",
        "DATE",
        "TIME",
        "TIMESTAMP",
        "DATETIME",
    ],
)
def test_sqlite_accepts_a_timestamp_only_where_it_reads_back_as_one(declared: str) -> None:
    back = sql_types.sqlite_arrow_of(declared)
    reads_a_timestamp = back is not None and pa.types.is_timestamp(back)
    assert sql_types.sqlite_compatible(pa.timestamp("us", tz="UTC"), declared) is reads_a_timestamp


def test_sqlite_text_of_a_nanosecond_timestamp_reads_back_as_the_declared_microseconds() -> None:
    """pandas' timestamps are nanoseconds: SQLite keeps their text with 9 digits, and a TIMESTAMP
    column reads back as microseconds (an event reconstruction's business times, say)."""
    import pyarrow as pa

    from rewind.sinks.sql.types import from_text

    text = pa.array(["2024-02-10 00:00:00.000000000", "2024-03-31 12:30:00.123456000", None])
    got = from_text(text, pa.timestamp("us", tz="UTC")).to_pylist()
    assert [v.isoformat() if v else v for v in got] == [
        "2024-02-10T00:00:00+00:00",
        "2024-03-31T12:30:00.123456+00:00",
        None,
    ]
