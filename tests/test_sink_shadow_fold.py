"""A folded shadow's commits (``commit_folded``) on the sinks themselves, no Spark: Iceberg on
SQLite and PostgreSQL catalogs, and the SQL sink on SQLite and PostgreSQL.

Each batch's partial rows are folded with v2's rows of the batch's keys and replace them in one
commit that names the units; a replayed batch changes nothing. On Iceberg, v2 is kept as sorted,
non-overlapping key ranges: a batch of keys from one range reads and rewrites only that range's
file, however many files v2 has."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from rewind.core.parquet import write_parquet
from rewind.sinks.iceberg import keyed
from rewind.sinks.iceberg.shadow import IcebergShadowSink
from tests.test_sink_iceberg import catalog  # noqa: F401  (the fixture: SQLite and PostgreSQL catalogs)

T0 = datetime(2026, 11, 1, tzinfo=UTC)
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("events", pa.int64()),
        pa.field("_rewind_event_id", pa.string(), nullable=False),
        pa.field("_rewind_run_id", pa.string(), nullable=False),
        pa.field("_rewind_source_topic", pa.string(), nullable=False),
        pa.field("_rewind_source_partition", pa.int32(), nullable=False),
        pa.field("_rewind_source_offset", pa.int64(), nullable=False),
        pa.field("_rewind_source_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def partials(orders: list[int], first_offset: int) -> pa.Table:
    """One partial row per order, at consecutive offsets: amount = offset, one event."""
    return pa.Table.from_pylist(
        [
            {
                "order_id": o,
                "amount": float(first_offset + i),
                "events": 1,
                "_rewind_event_id": f"orders/0/{first_offset + i}",
                "_rewind_run_id": "r1",
                "_rewind_source_topic": "orders",
                "_rewind_source_partition": 0,
                "_rewind_source_offset": first_offset + i,
                "_rewind_source_timestamp": T0 + timedelta(seconds=first_offset + i),
            }
            for i, o in enumerate(orders)
        ],
        schema=SCHEMA,
    )


def fold(rows: pa.Table) -> pa.Table:
    """Sum amounts and events per order; lineage of the latest row (a fold that takes its own rows)."""
    frame = rows.to_pandas().sort_values(["order_id", "_rewind_source_offset"])
    by = frame.groupby("order_id", as_index=False)
    out = by.last()
    out["amount"] = by["amount"].sum()["amount"].to_numpy()
    out["events"] = by["events"].sum()["events"].to_numpy()
    return pa.Table.from_pandas(out[SCHEMA.names], preserve_index=False).cast(SCHEMA)


class Model:
    """The expected folded rows, batch by batch."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[float, int, int]] = {}

    def apply(self, orders: list[int], first_offset: int) -> None:
        for i, o in enumerate(orders):
            amount, events, _ = self.rows.get(o, (0.0, 0, 0))
            self.rows[o] = (amount + first_offset + i, events + 1, first_offset + i)


def table_model(data: pa.Table) -> dict[int, tuple[float, int, int]]:
    ids = data.column("order_id").to_pylist()
    assert len(ids) == len(set(ids)), "an order twice"
    cols = [data.column(c).to_pylist() for c in ("amount", "events", "_rewind_source_offset")]
    return {o: (a, e, off) for o, a, e, off in zip(ids, *cols, strict=True)}


def test_iceberg_folded_commits_touch_only_the_files_of_their_keys(
    catalog: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keyed, "ROWS_PER_FILE", 100)
    touched: list[int] = []
    read_rows = keyed.KeyedFiles.read_rows

    def spy(self: keyed.KeyedFiles, files: Any) -> pa.Table:
        touched.append(len(files))
        return read_rows(self, files)

    monkeypatch.setattr(keyed.KeyedFiles, "read_rows", spy)
    v1 = f"an.o{uuid.uuid4().hex[:6]}"
    catalog.create_table(v1, schema=SCHEMA)
    sink = IcebergShadowSink(catalog, v1, ["order_id"])
    staging = sink.prepare("r1", SCHEMA)
    model, offset = Model(), 0

    def batch(orders: list[int], unit: str) -> None:
        nonlocal offset
        path = write_parquet(sink.data_folder(staging), partials(orders, offset), "u")
        sink.commit_folded(staging, "r1", [unit], [path], fold)
        model.apply(orders, offset)
        offset += len(orders)

    batch(list(range(0, 1000, 2)), "history")  # 500 orders into an empty v2: 5 sorted files of 100
    assert touched[-1] == 0
    files = list(catalog.load_table(staging.table).scan().plan_files())
    assert len(files) == 5
    batch([10, 12, 10, 14], "b1")  # existing orders of the first range (one of them twice)
    assert touched[-1] == 1
    batch([5, 7], "b2")  # new orders inside the first range
    assert touched[-1] == 1
    batch([2001, 2003, 2005], "b3")  # new orders above every range: the last file takes them
    assert touched[-1] == 1
    batch([-4], "b4")  # below every range: the first file
    assert touched[-1] == 1
    batch([998, 2001, 0], "b5")  # both ends
    assert touched[-1] == 2
    before = catalog.load_table(staging.table).current_snapshot().snapshot_id
    sink.commit_folded(staging, "r1", ["b5"], [], fold)  # a replay with its files gone: nothing moves
    assert sink.committed_units(staging, "r1") >= {"history", "b1", "b5"}
    table = catalog.load_table(staging.table)
    assert table_model(table.scan().to_arrow()) == model.rows
    assert before != table.current_snapshot().snapshot_id  # the marker commit names the units again
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import LongType

    bounds = [(f.file.lower_bounds[1], f.file.upper_bounds[1]) for f in table.scan().plan_files()]
    spans = sorted((from_bytes(LongType(), lo), from_bytes(LongType(), hi)) for lo, hi in bounds)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), f"key ranges overlap: {spans}"


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_sql_folded_commits_fold_with_the_rows_of_their_keys(
    database: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    from rewind.sinks.sql.sink import SqlSink

    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'v.db'}"
        table = "totals"
    else:
        url = request.getfixturevalue("pg_url")
        table = f"public.totals_{uuid.uuid4().hex[:6]}"
    sink = SqlSink(url, table, key=["order_id"], spool_dir=tmp_path / "spool", copy_target=False)
    try:
        sink.check(SCHEMA)
        staging = sink.prepare("r1", SCHEMA, new_run=True)
        model, offset = Model(), 0
        for unit, orders in [("h", list(range(50))), ("b1", [3, 4, 3]), ("b2", [60, 4]), ("b3", [0])]:
            path = write_parquet(sink.data_folder(staging), partials(orders, offset), "u")
            sink.commit_folded(staging, "r1", [unit], [path], fold)
            model.apply(orders, offset)
            offset += len(orders)
        again = write_parquet(sink.data_folder(staging), partials([0], 0), "u")
        assert sink.commit_folded(staging, "r1", ["b3"], [again], fold)["path"] == "already-committed"
        assert table_model(sink.read_arrow(staging)) == model.rows
        assert sink.committed_units(staging, "r1") == {"h", "b1", "b2", "b3"}
    finally:
        sink.close()
