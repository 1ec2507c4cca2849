"""A shadow's Iceberg v2 (:mod:`rewind.sinks.iceberg.shadow`) on a real SQL catalog (SQLite and
PostgreSQL): units upserted on the key in any order and re-applied change nothing; the swap
of v1 and v2 is one catalog transaction, refused (nothing renamed) when v1 moved since the cut
line; rollback, promotion again, cleanup; a catalog without transactions refused in one line."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest

from rewind.core.parquet import write_parquet
from rewind.sinks.iceberg import IcebergSinkError
from rewind.sinks.iceberg.shadow import IcebergShadowSink, IcebergTargetMoved
from tests.test_sink_iceberg import catalog  # noqa: F401  (the fixture: SQLite and PostgreSQL catalogs)

T0 = datetime(2026, 11, 1, tzinfo=UTC)
SCHEMA = pa.schema(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("_rewind_source_topic", pa.string(), nullable=False),
        pa.field("_rewind_source_partition", pa.int32(), nullable=False),
        pa.field("_rewind_source_offset", pa.int64(), nullable=False),
        pa.field("_rewind_source_timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def events(start: int, end: int) -> pa.Table:
    """Offsets [start, end) of one partition: order ``offset % 7``, amount = offset."""
    offs = list(range(start, end))
    return pa.Table.from_pylist(
        [
            {
                "order_id": o % 7,
                "amount": float(o),
                "_rewind_source_topic": "orders",
                "_rewind_source_partition": 0,
                "_rewind_source_offset": o,
                "_rewind_source_timestamp": T0 + timedelta(seconds=o),
            }
            for o in offs
        ],
        schema=SCHEMA,
    )


def v2_rows(sink: IcebergShadowSink, name: str) -> dict[int, float]:
    data = sink.catalog.load_table(name).scan().to_arrow()
    ids = data.column("order_id").to_pylist()
    assert len(ids) == len(set(ids)), "a key twice"
    return dict(zip(ids, data.column("amount").to_pylist(), strict=True))


def commit(sink: IcebergShadowSink, staging: Any, start: int, end: int) -> None:
    folder = sink.data_folder(staging)
    sink.commit(staging, "r1", [f"orders/0/{start}-{end}"], [write_parquet(folder, events(start, end), "u")])


def test_units_in_any_order_and_replayed_leave_each_key_its_last_event(catalog: Any) -> None:  # noqa: F811
    v1_name = f"an.o{uuid.uuid4().hex[:6]}"  # the PostgreSQL catalog is shared by the module
    catalog.create_table(v1_name, schema=SCHEMA)
    sink = IcebergShadowSink(catalog, v1_name, ["order_id"])
    sink.check(SCHEMA)
    staging = sink.prepare("r1", SCHEMA)
    assert sink.prepare("r1", SCHEMA) == staging  # found again on resume
    spans = [(a, a + 10) for a in range(0, 60, 10)]
    random.Random(7).shuffle(spans)
    for start, end in spans:
        commit(sink, staging, start, end)
    commit(sink, staging, *spans[2])  # a replayed unit: nothing changes
    commit(sink, staging, 60, 60)  # a unit with no rows is still recorded
    assert v2_rows(sink, staging.table) == {
        k: float(max(o for o in range(60) if o % 7 == k)) for k in range(7)
    }
    assert sink.committed_units(staging, "r1") == {f"orders/0/{a}-{b}" for a, b in spans} | {"orders/0/60-60"}
    files = list(catalog.load_table(staging.table).scan().plan_files())
    assert len(files) <= 2, "each upsert merges the files it touches"


def test_swap_is_one_transaction_refused_when_v1_moved(catalog: Any) -> None:  # noqa: F811
    v1_name = f"an.o{uuid.uuid4().hex[:6]}"  # the PostgreSQL catalog is shared by the module
    v1 = catalog.create_table(v1_name, schema=SCHEMA)
    v1.append(events(0, 3))
    sink = IcebergShadowSink(catalog, v1_name, ["order_id"])
    staging = sink.prepare("r1", SCHEMA)
    commit(sink, staging, 0, 20)
    with pytest.raises(IcebergSinkError, match="no cut line recorded"):
        sink.promote(staging)
    sink.rebase_target(staging)
    v1.append(events(3, 4))  # a write after the cut line
    names = sorted(catalog.list_tables("an"))
    with pytest.raises(IcebergTargetMoved, match=f"{v1_name} moved since it was recorded"):
        sink.promote(staging)
    assert sorted(catalog.list_tables("an")) == names, "nothing renamed"

    sink.rebase_target(staging)  # the cut taken again, v1 still
    swap = sink.promote(staging)
    assert not swap.already_done and swap.after["table"] == v1_name
    assert len(v2_rows(sink, v1_name)) == 7
    assert catalog.load_table(staging.prev_table).scan().to_arrow().num_rows == 4  # v1, kept for rollback
    assert sink.promote(staging).already_done
    assert sink.committed_units(staging, "r1") == {"orders/0/0-20"}  # v2 found under its new name

    back = sink.rollback(staging, swap.to_dict())
    assert not back.already_done and catalog.load_table(v1_name).scan().to_arrow().num_rows == 4
    assert sink.rollback(staging, swap.to_dict()).already_done
    again = sink.promote(staging)
    assert not again.already_done and len(v2_rows(sink, v1_name)) == 7
    assert sink.cleanup(staging)["dropped"] == [staging.prev_table]  # decommission: v1 purged
    with pytest.raises(IcebergSinkError, match="no v1 to roll back to"):
        sink.rollback(staging, again.to_dict())


def test_abort_purges_v2_and_a_missing_v1_is_one_line(catalog: Any) -> None:  # noqa: F811
    v1_name = f"an.o{uuid.uuid4().hex[:6]}"  # the PostgreSQL catalog is shared by the module
    sink = IcebergShadowSink(catalog, v1_name, ["order_id"])
    with pytest.raises(IcebergSinkError, match="does not exist; a shadow migrates the live table"):
        sink.check(SCHEMA)
    catalog.create_table(v1_name, schema=SCHEMA)
    staging = sink.prepare("r1", SCHEMA)
    assert sink.cleanup(staging)["dropped"] == [staging.table]
    assert staging.table not in {".".join(t) for t in catalog.list_tables("an")}
    assert sink.cleanup(staging)["dropped"] == []
