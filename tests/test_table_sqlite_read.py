"""A SQLite table source read as Arrow batches (ADBC): every selected row once, in key order, with
the values and per-batch types the row-tuple read gives, also when a column's type changes
after the first batch (SQLite's columns are dynamically typed)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.tables.readers import Selection
from rewind.tables.records import as_records, row_values
from rewind.tables.sql import SqlReader

Value = int | float | str | None

values = st.one_of(
    st.none(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=False, allow_infinity=False, width=64).filter(lambda f: f != int(f)),
    st.text(max_size=6).filter(lambda t: "\x00" not in t),
)


def _database(tmp: Path, rows: list[tuple[int, Value, Value]]) -> SqlReader:
    path = tmp / "mixed.db"
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, a, b TEXT)")
        db.executemany("INSERT INTO things VALUES (?, ?, ?)", rows)
    db.close()
    return SqlReader("sqlite", f"sqlite:///{path}", "things", None, "id", "sqlite:things")


def _tuples(
    reader: SqlReader, selection: Selection, lo: Any, hi: Any, batch_rows: int
) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for rows in reader.read(selection, lo, hi, batch_rows):
        if rows.batch is not None:  # Arrow batches, except where ADBC would print numbers lossily
            out += [tuple(r.values()) for r in rows.batch.to_pylist()]
        else:
            out += [tuple(r) for r in rows.rows]
    return out


@given(column=st.lists(values, min_size=1, max_size=40), batch_rows=st.integers(1, 7))
@settings(max_examples=40, deadline=None)
def test_every_row_once_in_key_order_whatever_the_types(
    tmp_path_factory: pytest.TempPathFactory, column: list[Value], batch_rows: int
) -> None:
    rows = [(i * 2, v, None if v is None else str(v)) for i, v in enumerate(column)]
    reader = _database(tmp_path_factory.mktemp("sqlite"), rows)
    try:
        got = _tuples(reader, Selection(where="TRUE"), None, None, batch_rows)
    finally:
        reader.close()
    assert [r[0] for r in got] == [r[0] for r in rows]
    assert [r[2] for r in got] == [r[2] for r in rows]
    for (_, want, _), (_, value, _) in zip(rows, got, strict=True):
        if isinstance(want, str) or want is None:
            assert value == want
        elif isinstance(value, str):  # a batch mixing text and numbers holds SQLite's text of them
            assert float(value) == pytest.approx(float(want), rel=1e-14)
        else:
            assert value == pytest.approx(want, rel=1e-15) and type(value) in (int, float)


def test_numbers_beside_text_keep_every_digit(tmp_path: Path) -> None:
    """ADBC prints a mixed column's numbers as ``%e`` (10000001 -> ``1.000000e+07``); such a batch
    is read again as tuples, so no digit is lost (found by the property test above)."""
    rows: list[tuple[int, Value, Value]] = [
        (0, 10000001, "x"),
        (1, 0.5, "y"),
        (2, "", "z"),
        (3, 2**40 + 1, "w"),
    ]
    reader = _database(tmp_path, rows)
    try:
        got = _tuples(reader, Selection(where="TRUE"), None, None, 10)
    finally:
        reader.close()
    assert [float(v) if v != "" else v for _, v, _ in got] == [10000001.0, 0.5, "", float(2**40 + 1)]
    plain = _database(tmp_path, [(i, i * 1000003, "t") for i in range(5)])  # no text: one Arrow batch
    try:
        (batch,) = list(plain.read(Selection(where="TRUE"), None, None, 10))
    finally:
        plain.close()
    assert batch.batch is not None and batch.values("a") == [i * 1000003 for i in range(5)]


def test_a_type_change_mid_range_restarts_where_it_stopped(tmp_path: Path) -> None:
    rows = [(i, i if i < 25 else f"late {i}", "x") for i in range(1, 41)]
    reader = _database(tmp_path, rows)
    try:
        batches = list(reader.read(Selection(ids=tuple(range(5, 45))), 5, 40, 10))
    finally:
        reader.close()
    kinds = [str(b.batch.schema.field("a").type) for b in batches]
    assert kinds == ["int64", "int64", "string", "string"]  # typed anew from the batch that changed
    assert [v for b in batches for v in b.values("id")] == list(range(5, 40))
    records = as_records(batches[2], "id", "sqlite:things", 0, 20, datetime(2026, 11, 25, tzinfo=UTC))
    assert records.column("key").to_pylist()[:2] == [b"25", b"26"]
    assert records.column("row:a").to_pylist()[:2] == ["late 25", "late 26"]
    assert row_values(batches[0], [0]) == [b'{"id":5,"a":5,"b":"x"}']


def test_an_all_null_column_is_typed_null_as_from_tuples(tmp_path: Path) -> None:
    reader = _database(tmp_path, [(1, None, None), (2, None, "b")])
    try:
        (rows,) = list(reader.read(Selection(where="TRUE"), None, None, 100))
    finally:
        reader.close()
    records = as_records(rows, "id", "sqlite:things", 0, 0, datetime(2026, 11, 25, tzinfo=UTC))
    assert str(records.schema.field("row:a").type) == "null"
    assert records.column("row:b").to_pylist() == [None, "b"]


number_texts = st.one_of(
    st.text(max_size=16),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:e}"),
    st.integers(-(10**120), 10**120).map(lambda i: f"{float(i):e}"),
    st.sampled_from(["1.000000e+07", "-1.000000e+100", "1,000000e+07", "x1.00000e+07", "1.000000e+7"]),
)


@given(
    texts=st.lists(st.one_of(st.none(), number_texts), max_size=30),
    cut=st.integers(0, 5),
    large=st.booleans(),
)
@settings(max_examples=100, deadline=None)
def test_the_lossy_text_prefilter_finds_what_the_regex_finds(
    texts: list[str | None], cut: int, large: bool
) -> None:
    """The cheap shape check in front of the regex never hides a value the regex would match
    (sliced arrays, nulls and both offset widths included)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from rewind.tables.sql import _ADBC_NUMBER_TEXT, _numbers_as_lossy_text

    column = pa.array(texts, pa.large_string() if large else pa.string()).slice(min(cut, len(texts)))
    batch = pa.RecordBatch.from_arrays([column], names=["a"])
    want = bool(pc.any(pc.match_substring_regex(column, _ADBC_NUMBER_TEXT)).as_py()) if len(column) else False
    assert _numbers_as_lossy_text(batch) is want
