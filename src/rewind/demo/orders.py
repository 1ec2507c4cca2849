"""The demo's domain: order events of a fulfilment service and the ``order_totals`` read model.

Three pieces, as a team would have them:

* :func:`generate` — the ``orders`` topic's history: orders placed over 60 days by a few
  thousand customers, each with its events (placed, line added, paid with an optional
  discount, cancelled or shipped) keyed by order id, plus a few malformed records on purpose;
  deterministic for a seed;
* :func:`project_v1` — the live projection that built ``order_totals`` in production. It has
  the bug the demo repairs: for orders placed inside the bug window it subtracts the discount
  twice;
* :func:`order_deltas_v2` and :func:`fold_order_totals` — the corrected projection as a Rewind
  job: the translate turns each event into a partial row of the read model, the fold combines
  an order's partial rows into its row.

Money is summed in cents and rounded to cents, so v1 and v2 agree to the cent on every order
the bug did not touch, whatever order the rows are summed in.
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from rewind.translate.functions import TranslateResult

DAY_MS = 86_400_000
START = datetime(2026, 9, 1, tzinfo=UTC)
DAYS = 60
ORDER_LIFETIME = timedelta(days=3)
"""No order has an event more than this after it was placed (the repair reads this far past the window)."""

DECODE_SCHEMA = {
    "type": "string",
    "order_id": "string",
    "customer_id": "string",
    "sku": "string",
    "qty": "long",
    "price": "double",
    "discount": "double",
    "at": "long",
}
"""decode.schema of the repair job: the fields of every event type."""

READ_MODEL_SCHEMA = {
    "order_id": "string",
    "customer_id": "string",
    "status": "string",
    "total": "double",
    "item_count": "long",
    "placed_at": "timestamp",
    "last_event_time": "timestamp",
}
"""Columns of ``order_totals`` (besides Rewind's lineage columns) and their Spark types."""

MALFORMED_EVERY = 5_000
"""One malformed record is added after every this many events."""


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


@dataclass(frozen=True)
class Event:
    """One record of the ``orders`` topic. ``data`` is None for a malformed record."""

    at_ms: int
    partition: int
    key: bytes
    value: bytes
    data: dict[str, Any] | None


@dataclass
class History:
    """Everything :func:`generate` produced, in produce order (time order)."""

    events: list[Event] = field(default_factory=list)
    orders: int = 0
    customers: int = 0
    malformed: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> Iterable[dict[str, Any]]:
        return (e.data for e in self.events if e.data is not None)


def partition_of(key: bytes, partitions: int) -> int:
    """A stable partition for a key (the demo does not depend on the client's partitioner)."""
    return zlib.crc32(key) % partitions


def _order_events(rng: random.Random, n: int, placed: int, customers: int) -> list[dict[str, Any]]:
    order_id = f"o-{n:07d}"
    events: list[dict[str, Any]] = [
        {
            "type": "placed",
            "order_id": order_id,
            "customer_id": f"c-{rng.randrange(customers):05d}",
            "at": placed,
        }
    ]
    t = placed
    for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4))):
        t += rng.randrange(10_000, 600_000)
        events.append(
            {
                "type": "line_added",
                "order_id": order_id,
                "sku": f"sku-{rng.randrange(400):03d}",
                "qty": rng.choice((1, 1, 1, 2, 3)),
                "price": rng.randrange(199, 12_000) / 100,
                "at": t,
            }
        )
    if rng.random() < 0.08:  # abandoned: cancelled before payment
        events.append({"type": "cancelled", "order_id": order_id, "at": t + rng.randrange(60_000, 7_200_000)})
        return events
    t += rng.randrange(60_000, 4 * 3_600_000)
    discount = rng.choice((0.0, 0.0, 0.0, 5.0, 10.0, 2.5))
    events.append({"type": "paid", "order_id": order_id, "discount": discount, "at": t})
    t += rng.randrange(3_600_000, 2 * DAY_MS)
    events.append({"type": "shipped" if rng.random() < 0.95 else "cancelled", "order_id": order_id, "at": t})
    return events


_MALFORMED_KINDS = ("not JSON", "qty not a number", "no order id", "negative quantity")


def _malformed(kind: str, order_id: str, at: int) -> bytes:
    if kind == "not JSON":
        return b'{"type": "line_added", "order_id": "' + order_id.encode() + b'", "qty": 1, "pri'
    if kind == "qty not a number":
        return json.dumps(
            {"type": "line_added", "order_id": order_id, "qty": "two", "price": 3.5, "at": at}
        ).encode()
    if kind == "no order id":
        return json.dumps({"type": "line_added", "qty": 1, "price": 3.5, "at": at}).encode()
    return json.dumps(
        {"type": "line_added", "order_id": order_id, "qty": -2, "price": 3.5, "at": at}
    ).encode()


def generate(events: int = 1_000_000, *, partitions: int = 6, seed: int = 7) -> History:
    """About ``events`` order events over :data:`DAYS` days from :data:`START`, in time order."""
    rng = random.Random(seed)
    orders = max(1, round(events / 5.3))
    customers = max(10, min(5_000, orders // 40))
    start, span = ms(START), DAYS * DAY_MS
    end = start + span
    raw: list[tuple[int, int, dict[str, Any]]] = []
    for n in range(orders):
        placed = start + rng.randrange(span)
        for seq, event in enumerate(_order_events(rng, n, placed, customers)):
            if event["at"] < end:  # later events have not happened yet
                raw.append((event["at"], n * 8 + seq, event))
    raw.sort(key=lambda r: (r[0], r[1]))
    history = History(orders=orders, customers=customers)
    for i, (at, _, event) in enumerate(raw):
        key = event["order_id"].encode()
        history.events.append(
            Event(at, partition_of(key, partitions), key, json.dumps(event).encode(), event)
        )
        if (i + 1) % MALFORMED_EVERY == 0:
            kind = _MALFORMED_KINDS[(i // MALFORMED_EVERY) % len(_MALFORMED_KINDS)]
            history.malformed[kind] = history.malformed.get(kind, 0) + 1
            history.events.append(
                Event(at, partition_of(key, partitions), key, _malformed(kind, event["order_id"], at), None)
            )
    return history


# -- v1: the live projection, with its bug --------------------------------------------------


def project_v1(events: Iterable[dict[str, Any]], bug_from: datetime, bug_to: datetime) -> pd.DataFrame:
    """``order_totals`` as the live service built it, one event at a time (malformed ones skipped).

    The bug: an order placed in ``[bug_from, bug_to)`` gets its discount subtracted twice (a
    release applied the coupon in the payment handler and again in the totals handler).
    """
    lo, hi = ms(bug_from), ms(bug_to)
    state: dict[str, dict[str, Any]] = {}
    for e in events:
        row = state.setdefault(
            e["order_id"],
            {
                "order_id": e["order_id"],
                "customer_id": None,
                "status": None,
                "cents": 0,
                "item_count": 0,
                "placed_at": None,
                "last_event_time": None,
            },
        )
        kind = e["type"]
        if kind == "placed":
            row.update(customer_id=e["customer_id"], status="placed", placed_at=e["at"])
        elif kind == "line_added":
            row["cents"] += round(e["qty"] * e["price"] * 100)
            row["item_count"] += e["qty"]
        elif kind == "paid":
            times = 2 if row["placed_at"] is not None and lo <= row["placed_at"] < hi else 1
            row["cents"] -= times * round(e["discount"] * 100)
            row["status"] = "paid"
        else:
            row["status"] = kind
        row["last_event_time"] = e["at"]
    frame = pd.DataFrame(list(state.values()))
    return _model_frame(frame)


def _model_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Cents → total, epoch ms → timestamps, columns in :data:`READ_MODEL_SCHEMA` order."""
    out = frame.assign(
        total=(frame["cents"] / 100).round(2),
        item_count=frame["item_count"].astype("int64"),
        placed_at=pd.to_datetime(frame["placed_at"], unit="ms", utc=True),
        last_event_time=pd.to_datetime(frame["last_event_time"], unit="ms", utc=True),
    )
    return out[list(READ_MODEL_SCHEMA)].sort_values("order_id").reset_index(drop=True)


# -- v2: the corrected projection, as a Rewind translate + fold -----------------------------

_STATUS = {"placed": "placed", "paid": "paid", "cancelled": "cancelled", "shipped": "shipped"}


def order_deltas_v2(events: pd.DataFrame) -> TranslateResult:
    """Each event → a partial ``order_totals`` row: what the event adds to its order.

    An unknown event type or a negative quantity is rejected (quarantined with the reason).
    """
    kind = events["type"]
    qty = events["qty"].fillna(0).astype("int64")
    bad_type = ~kind.isin(["line_added", *_STATUS])
    negative = (kind == "line_added") & (qty < 0)
    rejects = pd.concat(
        [
            pd.DataFrame(
                {"_rewind_row": events.loc[bad_type, "_rewind_row"], "reason": "unknown event type"}
            ),
            pd.DataFrame({"_rewind_row": events.loc[negative, "_rewind_row"], "reason": "negative quantity"}),
        ]
    )
    ok = events[~bad_type & ~negative]
    lines = ok["type"] == "line_added"
    line_cents = (ok["qty"].fillna(0) * ok["price"].fillna(0) * 100).round()
    discount_cents = (ok["discount"].fillna(0) * 100).round()
    cents = line_cents.where(lines, 0) - discount_cents.where(ok["type"] == "paid", 0)
    at = pd.to_datetime(ok["at"].astype("int64"), unit="ms", utc=True)
    rows = pd.DataFrame(
        {
            "_rewind_row": ok["_rewind_row"],
            "order_id": ok["order_id"],
            "customer_id": ok["customer_id"].where(ok["type"] == "placed", None),
            "status": ok["type"].map(_STATUS),
            "total": cents / 100,
            "item_count": ok["qty"].fillna(0).astype("int64").where(lines, 0),
            "placed_at": at.where(ok["type"] == "placed"),
            "last_event_time": at,
        }
    )
    return TranslateResult(rows=rows, rejects=rejects)


def fold_order_totals(rows: pd.DataFrame) -> pd.DataFrame:
    """An order's partial rows (in event order) → its ``order_totals`` row."""
    by = rows.groupby("order_id", sort=False)
    out = pd.DataFrame(
        {
            "customer_id": by["customer_id"].first(),
            "status": by["status"].last(),  # first/last skip nulls: the latest status event
            "total": (by["total"].sum() * 100).round() / 100,
            "item_count": by["item_count"].sum().astype("int64"),
            "placed_at": by["placed_at"].min(),
            "last_event_time": by["last_event_time"].max(),
        }
    )
    return out.reset_index()


# -- the shadow story: ``order_totals`` migrated to a v2 with a new field ----------------------

ORDER_TOTALS_V2_SCHEMA = {**READ_MODEL_SCHEMA, "discount": "double"}
"""v2 of ``order_totals``: the same and ``discount``, the discount the order got at payment."""

EVENT_TYPES = ("placed", "line_added", "paid", "cancelled", "shipped")


def valid_event(data: dict[str, Any]) -> bool:
    """Whether the job keeps an event (its decoder and translate reject the rest), so the live
    service skips exactly those."""
    kind, order_id, qty = data.get("type"), data.get("order_id"), data.get("qty", 0)
    if kind not in EVENT_TYPES or not isinstance(order_id, str) or not isinstance(data.get("at"), int):
        return False
    return qty is None or (isinstance(qty, int) and not (kind == "line_added" and qty < 0))


def fold_event(row: dict[str, Any] | None, data: dict[str, Any], discount: bool) -> dict[str, Any]:
    """The live service's fold of one valid event into its order's row (None: a new order):
    what :func:`order_totals_partials_v2` and :func:`fold_order_totals_v2` compute, one event at
    a time, money in cents. ``discount``: the service's new release, which keeps v2's field."""
    row = dict(row) if row is not None else {
        "order_id": data["order_id"], "customer_id": None, "status": None, "cents": 0,
        "item_count": 0, "placed_at": None, "last_event_time": None, "discount_cents": 0,
    }
    kind, at = data["type"], data["at"]
    if kind == "placed":
        row["customer_id"] = row["customer_id"] or data.get("customer_id")
        row["placed_at"] = at if row["placed_at"] is None else min(row["placed_at"], at)
    if kind == "line_added":
        row["cents"] += round(data["qty"] * data["price"] * 100)
        row["item_count"] += data["qty"]
    else:
        row["status"] = _STATUS[kind]
    if kind == "paid":
        off = round((data.get("discount") or 0) * 100)
        row["cents"] -= off
        row["discount_cents"] += off if discount else 0
    row["last_event_time"] = at if row["last_event_time"] is None else max(row["last_event_time"], at)
    return row


def order_totals_partials_v2(events: pd.DataFrame) -> TranslateResult:
    """v2's translate: :func:`order_deltas_v2` and each event's ``discount`` (paid events)."""
    result = order_deltas_v2(events)
    rows = result.rows
    kept = events.set_index("_rewind_row").loc[rows["_rewind_row"]]
    paid = (kept["type"] == "paid").to_numpy()
    cents = (kept["discount"].fillna(0) * 100).round().to_numpy()
    rows = rows.assign(discount=(cents * paid) / 100)
    return TranslateResult(rows=rows, rejects=result.rejects)


def fold_order_totals_v2(rows: pd.DataFrame) -> pd.DataFrame:
    """v2's fold: :func:`fold_order_totals` and the discounts summed (it takes its own rows)."""
    out = fold_order_totals(rows.drop(columns=["discount"]))
    by = rows.groupby("order_id", sort=False)["discount"].sum()
    out["discount"] = ((out["order_id"].map(by) * 100).round() / 100).to_numpy()
    return out
