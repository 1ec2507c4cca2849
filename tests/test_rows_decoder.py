"""``decode: rows``: a table's columns reach the translate as the database typed them, text as
pandas' Arrow-backed ``str`` dtype, and come back out of the translate unchanged."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.tables.readers import Rows
from rewind.tables.records import as_records
from rewind.translate.exceptions import DecoderConfigError
from rewind.translate.process import ProcessContext, process_batch
from rewind.translate.rows_decoder import TEXT_DTYPE, RowsDecoder

AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
CTX = ProcessContext("r-1", "u-0", "t", "1", AT, id_scheme="table")


def _records(columns: dict[str, pa.Array]) -> pa.RecordBatch:
    batch = pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))
    return as_records(Rows(tuple(columns), batch=batch), "id", "sqlite:things", 3, 100, AT)


def test_each_column_type_as_the_translate_sees_it() -> None:
    records = _records(
        {
            "id": pa.array([1, 2, 3]),
            "n": pa.array([7, None, 9]),
            "x": pa.array([0.5, 1.5, None]),
            "ok": pa.array([True, False, True]),
            "name": pa.array(["a", None, 'é "q"']),
            "seen": pa.array([AT, None, AT], pa.timestamp("us", tz="UTC")),
            "day": pa.array([date(2026, 1, 2), None, date(1999, 12, 31)]),
            "price": pa.array([Decimal("1.50"), None, Decimal("-2.00")]),
            "blob": pa.array([b"\x00", None, b""]),
            "nothing": pa.nulls(3),
        }
    )
    events = RowsDecoder().decode(records).events
    assert events["id"].dtype == np.int64
    assert events["n"].dtype == "Int64" and events["n"].isna().tolist() == [False, True, False]
    assert events["x"].dtype == np.float64
    assert events["ok"].dtype == bool
    assert events["name"].dtype == TEXT_DTYPE
    assert events["name"].tolist()[0] == "a" and events["name"].tolist()[2] == 'é "q"'
    assert pd.isna(events["name"].iloc[1])
    # text behaves as object text did: NumPy booleans from comparisons, the .str accessor
    assert (events["name"] == "a").tolist() == [True, False, False]
    assert (events["name"] == "a").dtype == bool
    assert events["name"].str.upper().iloc[2] == 'É "Q"'
    assert str(events["seen"].dtype) == "datetime64[us, UTC]"
    assert events["day"].iloc[0] == pd.Timestamp(date(2026, 1, 2)) and pd.isna(events["day"].iloc[1])
    assert events["price"].tolist()[2] == Decimal("-2.00")
    assert events["blob"].tolist()[0] == b"\x00"
    assert events["nothing"].isna().all()
    # the source columns: one label for the whole batch, the range, each row's position
    assert events["_src_topic"].tolist() == ["sqlite:things"] * 3
    assert events["_src_offset"].tolist() == [100, 101, 102]
    assert events["_src_key"].tolist() == [b"1", b"2", b"3"]


def test_text_out_of_the_translate_is_plain_arrow_text() -> None:
    """Without an output schema the output's types are inferred: text stays ``string`` (Arrow's
    ``large_string``, what pandas holds, would change the output schema a plan learns)."""
    records = _records({"id": pa.array([1, 2]), "name": pa.array(["a", None])})

    def shout(events: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {"_rewind_row": events["_rewind_row"], "id": events["id"], "loud": events["name"].str.upper()}
        )

    out = process_batch(records, RowsDecoder(), shout, ["id"], CTX)
    assert out.rows.schema.field("loud").type == pa.string()
    assert out.rows.column("loud").to_pylist() == ["A", None]
    assert out.counts.emitted == 2


def test_a_reserved_column_name_is_refused() -> None:
    records = _records({"id": pa.array([1]), "_src_topic": pa.array(["x"])})
    with pytest.raises(DecoderConfigError, match="reserved prefix"):
        RowsDecoder().decode(records)


texts = st.lists(st.one_of(st.none(), st.text(max_size=12)), min_size=1, max_size=60)


@given(names=texts, by_schema=st.booleans())
@settings(max_examples=60, deadline=None)
def test_text_passes_through_a_translate_unchanged(names: list[str | None], by_schema: bool) -> None:
    """Any text, nulls included, comes out of an identity translate exactly as it went in, with an
    output schema and without one."""
    ids = list(range(len(names)))
    records = _records({"id": pa.array(ids), "name": pa.array(names, pa.string())})
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())]) if by_schema else None
    out = process_batch(records, RowsDecoder(), None, ["id"], CTX, output_schema=schema)
    assert out.rows.column("name").to_pylist() == names
    assert out.rows.column("id").to_pylist() == ids
    all_null = not by_schema and all(n is None for n in names)  # a column of nulls is typed null
    assert out.rows.schema.field("name").type == (pa.null() if all_null else pa.string())
