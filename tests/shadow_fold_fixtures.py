"""A folded read model over the shadow tests' order stream (imported by name in Spark tasks).

The translate turns each event of :func:`tests.shadow_fixtures.event` into a partial row of
``order_totals`` (the amount, one event, the status); the fold sums the amounts and the events
and keeps the last status. It takes its own rows (a sum of sums, the last of the lasts), as a
shadow's tail needs. :func:`expected_totals` recomputes the model from every event in Kafka,
in plain Python, without calling either function.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pandas as pd

from rewind.translate.functions import TranslateResult

TOTALS_SCHEMA = {"order_id": "long", "status": "string", "amount": "double", "events": "long"}


def order_partials(events: pd.DataFrame) -> TranslateResult:
    """One partial row per event; a negative amount is rejected."""
    bad = events["amount"] < 0
    ok = events[~bad]
    rows = pd.DataFrame(
        {
            "_rewind_row": ok["_rewind_row"],
            "order_id": ok["order_id"].astype("int64"),
            "status": ok["status"],
            "amount": ok["amount"].astype("float64"),
            "events": 1,
        }
    )
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "negative amount"})
    return TranslateResult(rows=rows, rejects=rejects)


def fold_totals(rows: pd.DataFrame) -> pd.DataFrame:
    """An order's rows (in event order) → its row: amounts and events summed, the last status."""
    by = rows.groupby("order_id", sort=False)
    out = pd.DataFrame(
        {
            "status": by["status"].last(),
            "amount": by["amount"].sum(),
            "events": by["events"].sum().astype("int64"),
        }
    )
    return out.reset_index()


def fold_to_average(rows: pd.DataFrame) -> pd.DataFrame:
    """A fold whose output is not its input: the average amount, under a new name."""
    by = rows.groupby("order_id", sort=False)
    return pd.DataFrame({"status": by["status"].last(), "average": by["amount"].mean()}).reset_index()


def folded_spec(data: dict[str, Any], fold: str = "tests.shadow_fold_fixtures:fold_totals") -> dict[str, Any]:
    """The shadow tests' spec (:func:`tests.shadow_fixtures.spec_data`) as a folded read model."""
    data["translate"] = {
        "function": "tests.shadow_fold_fixtures:order_partials",
        "fold": fold,
        "version": "1",
        "output_schema": TOTALS_SCHEMA,
    }
    return data


def expected_totals(conf: dict[str, Any], topic: str) -> dict[int, tuple[str, float, int, int, int]]:
    """A clean recomputation of every event in Kafka: order → (last status, sum of amounts,
    events, partition and offset of its last event)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"check-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1)}
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    out: dict[int, tuple[str, float, int, int, int]] = {}
    seen = {0: 0, 1: 0}
    deadline = time.monotonic() + 60
    while any(seen[p] < high[p] for p in (0, 1)) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        v = json.loads(msg.value())
        order = int(v["order_id"])
        _, amount, events, _, _ = out.get(order, ("", 0.0, 0, 0, 0))
        out[order] = (v["status"], amount + float(v["amount"]), events + 1, msg.partition(), msg.offset())
        seen[msg.partition()] = msg.offset() + 1
    consumer.close()
    assert seen == high, "every event read"
    return out
