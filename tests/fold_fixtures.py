"""A read model built by translate + fold, for the fold tests (imported by name in Spark tasks).

The translate turns each order event into a partial ``order_totals`` row; the fold combines an
order's partial rows into its row. :func:`order_history` makes a known event history whose
expected read model the tests compute on their own, in plain Python (:func:`expected_model`),
without calling either function.

Events of an order share its partition (keyed), and every partition's timestamps never
decrease, so a time window is exactly the records whose timestamp lies in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from rewind.translate.functions import TranslateResult

DECODE_SCHEMA = {"order_id": "long", "type": "string", "cents": "long", "at": "long"}
MODEL_SCHEMA = {
    "order_id": "long",
    "status": "string",
    "total_cents": "long",
    "lines": "long",
    "placed_at": "timestamp",
    "last_at": "timestamp",
}
"""translate.output_schema: the read model's columns."""

MINUTE = 60_000


def order_partials(events: pd.DataFrame) -> TranslateResult:
    """One partial row per event: what the event adds to its order (lines and discounts are
    signed cents; a status event names the status)."""
    kind = events["type"]
    at = pd.to_datetime(events["at"].astype("int64"), unit="ms", utc=True)
    lines = kind == "line"
    rows = pd.DataFrame(
        {
            "_rewind_row": events["_rewind_row"],
            "order_id": events["order_id"].astype("int64"),
            "status": kind.where(~lines, None),
            "total_cents": events["cents"].fillna(0).astype("int64"),
            "lines": lines.astype("int64"),
            "placed_at": at.where(kind == "placed"),
            "last_at": at,
        }
    )
    return TranslateResult(rows=rows)


def fold_orders(rows: pd.DataFrame) -> pd.DataFrame:
    """An order's partial rows (in event order) → its row; ``last`` skips nulls: the status is
    that of the latest status event, so the result depends on the order of the rows."""
    by = rows.groupby("order_id", sort=False)
    out = pd.DataFrame(
        {
            "status": by["status"].last(),
            "total_cents": by["total_cents"].sum().astype("int64"),
            "lines": by["lines"].sum().astype("int64"),
            "placed_at": by["placed_at"].min(),
            "last_at": by["last_at"].max(),
        }
    )
    return out.reset_index()


def sum_fold(rows: pd.DataFrame) -> pd.DataFrame:
    """A fold for frames with columns ``k``, ``v``: the sum of ``v`` per ``k``."""
    return rows.groupby("k", as_index=False)["v"].sum()


def integer_sum(rows: pd.DataFrame) -> pd.DataFrame:
    """:func:`sum_fold` for a fold that relies on ``v`` being integers (as the translate gets them)."""
    if not pd.api.types.is_integer_dtype(rows["v"]):
        raise TypeError(f"v arrived as {rows['v'].dtype}")
    return sum_fold(rows)


# -- a known history --------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    order_id: int
    seq: int
    type: str
    cents: int
    at_ms: int

    @property
    def value(self) -> bytes:
        return json.dumps(
            {"order_id": self.order_id, "type": self.type, "cents": self.cents, "at": self.at_ms}
        ).encode()


def order_history(orders: int, base_ms: int, every_ms: int = 15_000) -> list[Event]:
    """Order ``i`` is placed at ``base_ms + i * every_ms``, gets 1-3 lines (two of them at the
    same millisecond for every fifth order: the offset breaks the tie), is paid two minutes
    later (every fourth with a discount), then shipped or cancelled three minutes after that.
    Returned in produce order: by time, then order, then sequence."""
    out = []
    for i in range(orders):
        oid = 5000 + i
        placed = base_ms + i * every_ms
        events = [Event(oid, 0, "placed", 0, placed)]
        for n in range(1 + i % 3):
            at = placed + 20_000 * (n + 1)
            if i % 5 == 0 and n == 1:
                at = placed + 20_000  # the same millisecond as the first line
            events.append(Event(oid, 1 + n, "line", 100 * (1 + (i + n) % 9), at))
        events.append(Event(oid, 4, "paid", -150 if i % 4 == 0 else 0, placed + 2 * MINUTE))
        final = "cancelled" if i % 7 == 0 else "shipped"
        events.append(Event(oid, 5, final, 0, placed + 5 * MINUTE))
        out.extend(events)
    return sorted(out, key=lambda e: (e.at_ms, e.order_id, e.seq))


def partition_of(order_id: int, partitions: int) -> int:
    return order_id % partitions


def ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def expected_model(
    events: list[Event],
    coords: dict[int, tuple[int, int]],
    topic: str,
    source: tuple[int, int],
    transform: str,
    version: str,
) -> dict[int, dict[str, Any]]:
    """The folded row of every order with an event in ``source`` ([from, to) in ms), computed
    one event at a time in time-then-offset order; lineage is the order's last event's.

    ``coords`` maps an event's index in ``events`` to its (partition, offset).
    """
    from tests.job_fixtures import event_id

    inside = [(i, e) for i, e in enumerate(events) if source[0] <= e.at_ms < source[1]]
    inside.sort(key=lambda p: (p[1].order_id, p[1].at_ms, coords[p[0]][1]))
    model: dict[int, dict[str, Any]] = {}
    for index, e in inside:
        row = model.setdefault(
            e.order_id,
            {
                "order_id": e.order_id,
                "status": None,
                "total_cents": 0,
                "lines": 0,
                "placed_at": None,
                "last_at": None,
            },
        )
        if e.type == "line":
            row["lines"] += 1
        else:
            row["status"] = e.type
        if e.type == "placed":
            row["placed_at"] = ts(e.at_ms)
        row["total_cents"] += e.cents
        row["last_at"] = ts(e.at_ms)
        partition, offset = coords[index]
        row.update(
            _rewind_event_id=event_id(topic, partition, offset, transform, version, 0),
            _rewind_source_topic=topic,
            _rewind_source_partition=partition,
            _rewind_source_offset=offset,
            _rewind_source_timestamp=ts(e.at_ms),
            _rewind_transform=transform,
            _rewind_transform_version=version,
            _rewind_synthetic=True,  # written by a backfill
        )
    return model


def produce_events(
    conf: dict[str, Any], topic: str, events: list[Event], partitions: int
) -> dict[int, tuple[int, int]]:
    """Produce ``events`` in order (keyed by order, partition by order id); returns each
    event's (partition, offset) by its index."""
    from confluent_kafka import Producer

    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    coords: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def report(index: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err:
                errors.append(str(err))
            else:
                coords[index] = (msg.partition(), msg.offset())

        return done

    for index, e in enumerate(events):
        producer.produce(
            topic,
            key=str(e.order_id).encode(),
            value=e.value,
            partition=partition_of(e.order_id, partitions),
            timestamp=e.at_ms,
            on_delivery=report(index),
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert len(coords) == len(events)
    return coords
