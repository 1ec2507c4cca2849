"""Event reconstruction's pure part: states ordered by business time and paired, the transition's
events checked, counted and labelled (no Spark, no broker).

Ordering is proven where extraction order differs from business order (rows inserted late, ties
on the business time broken by the change sequence, snapshot partitions extracted out of order
with skewed clocks and time zones); a hypothesis property replays the events of random
histories with the user's fold and gets every entity's last state.
"""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind.core.columns import EFFECTIVE_TIME, SOURCE_OFFSET, SOURCE_SYSTEM
from rewind.translate.exceptions import TranslateOutputError
from rewind.translate.process import ProcessContext
from rewind.translate.states import NotATime, StateOrder, business_micros
from rewind.translate.transition import ReconstructContext, reconstruct_batch
from tests import reconstruct_fixtures as rx

ORDER = StateOrder("policy_id", "effective_from", ("change_seq",))
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def _ctx() -> ReconstructContext:
    process = ProcessContext(
        "r-1", "sqlite:policy_history/0/0-9", "policy_events", "1", NOW, id_scheme="table"
    )
    return ReconstructContext(process, "sqlite:policy_history", 0, "legacy-policies", "policy_id")


def _table(states: list[rx.State]) -> pa.Table:
    return pa.table(
        {
            "policy_id": pa.array([s.policy_id for s in states], pa.int64()),
            "status": [s.status for s in states],
            "premium": [s.premium for s in states],
            "changed_at": [s.changed_at.isoformat() for s in states],
            "effective_from": [s.effective_from.isoformat() for s in states],
            "change_seq": pa.array([s.change_seq for s in states], pa.int64()),
        }
    )


def _events(out: object) -> pd.DataFrame:
    return out.rows.to_pandas()  # type: ignore[attr-defined, no-any-return]


def test_business_order_not_extraction_order() -> None:
    """Rows inserted late (a 2024-03 change extracted first), a tie on the business time broken
    by change_seq (the later sequence extracted first): events come in business order."""
    d = lambda day: datetime(2024, 1, 1, tzinfo=UTC) + timedelta(days=day)  # noqa: E731
    history = [
        rx.State(7, "active", 500.0, d(0), 0, d(0)),
        rx.State(7, "active", 550.0, d(30), 1, d(31)),
        rx.State(7, "lapsed", 550.0, d(30), 2, d(31)),  # the same business day, a later sequence
        rx.State(7, "cancelled", 550.0, d(90), 3, d(200)),  # recorded long after it happened
        rx.State(8, "active", 100.0, d(5), 0, d(5)),
    ]
    extracted = [history[3], history[2], history[4], history[1], history[0]]  # the legacy table's order
    out = reconstruct_batch(_table(extracted), rx.policy_events, ORDER, _ctx(), 100)
    ev = _events(out)
    assert ev[["policy_id", "type"]].values.tolist() == [
        [7, "PolicyBound"],
        [7, "PremiumChanged"],
        [7, "PolicyStatusChanged"],
        [7, "PolicyCancelled"],
        [8, "PolicyBound"],
    ]
    assert [t.date() for t in ev[EFFECTIVE_TIME]] == [
        d(0).date(),
        d(30).date(),
        d(30).date(),
        d(90).date(),
        d(5).date(),
    ]
    # the source offset is the state's position in business order, not in extraction order
    assert ev[SOURCE_OFFSET].tolist() == [100, 101, 102, 103, 104]
    assert set(ev[SOURCE_SYSTEM]) == {"legacy-policies"}
    assert ev["_rewind_synthetic"].all()
    c = out.counts
    assert (c.records_read, c.emitted, c.rows_out, c.quarantined, c.filtered) == (5, 5, 5, 0, 0)
    assert out.types == {
        "PolicyBound": 2,
        "PremiumChanged": 1,
        "PolicyStatusChanged": 1,
        "PolicyCancelled": 1,
    }


def test_rejected_and_timeless_states_are_quarantined_with_both_states() -> None:
    d = lambda day: datetime(2024, 1, 1, tzinfo=UTC) + timedelta(days=day)  # noqa: E731
    table = _table(
        [
            rx.State(1, "active", 100.0, d(0), 0, d(0)),
            rx.State(1, "active", -5.0, d(3), 1, d(3)),  # rejected by the transition
            rx.State(2, "active", 100.0, d(1), 0, d(1)),
        ]
    )
    times = table.column("effective_from").to_pylist()
    table = table.set_column(4, "effective_from", pa.array([times[0], times[1], "next tuesday"]))
    out = reconstruct_batch(table, rx.policy_events, ORDER, _ctx(), 0)
    c = out.counts
    assert (c.records_read, c.emitted, c.quarantined, c.filtered) == (3, 1, 2, 0)
    q = {
        json.loads(v)["entity"]: (s, r, json.loads(v))
        for s, r, v in zip(
            *(out.quarantine.column(n).to_pylist() for n in ("stage", "reason", "value")), strict=True
        )
    }
    stage, reason, value = q[1]
    assert (stage, reason) == ("translate-reject", "negative premium")
    assert value["previous"]["premium"] == 100.0 and value["current"]["premium"] == -5.0
    stage, reason, value = q[2]
    assert stage == "decode" and "not a time: 'next tuesday'" in reason and value["previous"] is None
    assert _events(out)[["policy_id", "type"]].values.tolist() == [[1, "PolicyBound"]]
    assert c.reasons == {"translate-reject: negative premium": 1, "decode: business time": 1}


def test_snapshots_are_diffed_per_key_in_snapshot_order() -> None:
    """Snapshot partitions extracted out of order, their times written with other zones and their
    extraction clocks skewed: the diff follows the snapshot time. A policy unchanged is filtered;
    one missing from a snapshot disappeared there, and appears again when it comes back."""
    jan, feb, mar, apr = (
        "2024-01-31T00:00:00Z",
        "2024-02-29T01:00:00+01:00",
        "2024-03-31T00:00:00Z",
        "2024-04-30",
    )
    rows = [  # (snapshot_at, policy_id, status, premium, extracted_at): April's partition came first
        (apr, 1, "active", 120.0, "2024-05-01T00:00:00Z"),
        (apr, 3, "active", 300.0, "2024-05-01T00:00:00Z"),
        (mar, 1, "active", 120.0, "2024-03-30T23:00:00Z"),  # extracted before its snapshot time
        (jan, 1, "active", 100.0, "2024-02-01T00:00:00Z"),
        (jan, 2, "active", 200.0, "2024-02-01T00:00:00Z"),
        (feb, 1, "active", 100.0, "2024-03-01T00:00:00Z"),  # unchanged: no pair
        (feb, 2, "active", 200.0, "2024-03-01T00:00:00Z"),
        (jan, 3, "active", 300.0, "2024-02-01T00:00:00Z"),  # 3 is gone in Feb and Mar, back in Apr
    ]
    table = pa.table(
        {
            "snapshot_at": [r[0] for r in rows],
            "policy_id": pa.array([r[1] for r in rows], pa.int64()),
            "status": [r[2] for r in rows],
            "premium": [r[3] for r in rows],
            "extracted_at": [r[4] for r in rows],
        }
    )
    micros, valid = business_micros(pa.array(sorted({r[0] for r in rows})), "snapshot_at")
    assert valid.all()
    order = StateOrder(
        "policy_id",
        "snapshot_at",
        mode="snapshots",
        compare=("status", "premium"),
        snapshots=tuple(np.unique(micros)),
    )
    out = reconstruct_batch(table, rx.policy_events, order, _ctx(), 0)
    ev = _events(out)
    got = [
        (p, t, e.strftime("%Y-%m")) for p, t, e in ev[["policy_id", "type", EFFECTIVE_TIME]].values.tolist()
    ]
    assert got == [
        (1, "PolicyBound", "2024-01"),
        (1, "PremiumChanged", "2024-03"),
        (2, "PolicyBound", "2024-01"),
        (2, "PolicyCancelled", "2024-03"),  # gone from March: disappeared there
        (3, "PolicyBound", "2024-01"),
        (3, "PolicyCancelled", "2024-02"),
        (3, "PolicyBound", "2024-04"),
    ]
    c = out.counts
    assert (c.records_read, c.emitted, c.quarantined, c.filtered) == (8, 6, 0, 2)  # Feb's 1 and 2 unchanged


def test_events_without_a_type() -> None:
    table = _table(rx.random_history(random.Random(1), 3, 2))

    def untyped(pairs: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {"_rewind_row": pairs["_rewind_row"], "type": None, "policy_id": pairs["policy_id"]}
        )

    def no_type_column(pairs: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"_rewind_row": pairs["_rewind_row"], "policy_id": pairs["policy_id"]})

    out = reconstruct_batch(table, untyped, ORDER, _ctx(), 0)
    assert out.rows.num_rows == 0 and out.counts.quarantined == table.num_rows
    assert set(out.quarantine.column("reason").to_pylist()) == {"an event without a type"}
    with pytest.raises(TranslateOutputError, match="no 'type' column"):
        reconstruct_batch(table, no_type_column, ORDER, _ctx(), 0)


def test_a_business_time_that_is_not_a_time() -> None:
    with pytest.raises(NotATime, match="'changed_seq' is int64, not a time"):
        business_micros(pa.array([1, 2, 3]), "changed_seq")
    micros, valid = business_micros(pa.array(["2024-01-01", None, "2024-01-01T10:00:00+02:00", "x"]), "t")
    assert valid.tolist() == [True, False, True, False]
    assert micros[2] == int(datetime(2024, 1, 1, 8, tzinfo=UTC).timestamp() * 1_000_000)


@given(seed=st.integers(0, 2**32 - 1), entities=st.integers(1, 30), changes=st.integers(1, 8))
def test_replaying_the_events_gives_every_entity_its_last_state(
    seed: int, entities: int, changes: int
) -> None:
    """Random histories (ties on time, late inserts), extracted in a random order and cut into
    batches between entities as a unit's reader does: the fold of the events is the last state."""
    rng = random.Random(seed)
    history = rx.random_history(rng, entities, changes)
    extracted = history[:]
    rng.shuffle(extracted)
    extracted.sort(key=lambda s: s.policy_id)  # the reader's ORDER BY key, any order within a key
    cuts = sorted({0, len(extracted), *(rng.randrange(0, len(extracted) + 1) for _ in range(3))})
    events, offset, counts = [], 0, []
    for lo, hi in itertools.pairwise(cuts):
        while 0 < lo < len(extracted) and extracted[lo].policy_id == extracted[lo - 1].policy_id:
            lo += 1  # batches are cut between entities
        while 0 < hi < len(extracted) and extracted[hi].policy_id == extracted[hi - 1].policy_id:
            hi += 1
        if lo >= hi:
            continue
        out = reconstruct_batch(_table(extracted[lo:hi]), rx.policy_events, ORDER, _ctx(), offset)
        offset += hi - lo
        events.append(_events(out))
        counts.append(out.counts)
    assert sum(c.records_read for c in counts) == len(history)
    assert all(c.balanced and c.quarantined == 0 for c in counts)
    folded = rx.policy_state(pd.concat(events, ignore_index=True))
    got = {int(p): (s, float(m)) for p, s, m in folded[["policy_id", "status", "premium"]].values.tolist()}
    assert got == rx.latest(history)


def test_a_fold_keeps_the_last_rows_source_system_and_effective_time() -> None:
    """``lineage:`` with ``translate.fold``: the folded row carries its last row's optional lineage,
    and the user's fold never sees those columns."""
    from rewind.core.columns import LINEAGE_COLUMNS
    from rewind.spark.fold_stage import fold_frame

    n = 4
    at = pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01", "2024-01-15"], utc=True)
    rows = pd.DataFrame({"order_id": [1, 1, 1, 2], "amount": [1.0, 2.0, 3.0, 4.0]})
    for column in LINEAGE_COLUMNS:
        rows[column] = list(range(n)) if column != "_rewind_run_id" else "r"
    rows["_rewind_source_timestamp"] = pd.to_datetime([1, 2, 3, 4], unit="s", utc=True)
    rows[SOURCE_SYSTEM] = "orders-service"
    rows[EFFECTIVE_TIME] = at
    seen: list[list[str]] = []

    def total(frame: pd.DataFrame) -> pd.DataFrame:
        seen.append(list(frame.columns))
        return frame.groupby("order_id", as_index=False)["amount"].sum()

    out = fold_frame(rows, ["order_id"], total)
    assert seen == [["order_id", "amount"]]
    assert out["amount"].tolist() == [6.0, 4.0]
    assert out[EFFECTIVE_TIME].tolist() == [at[2], at[3]]
    assert out[SOURCE_SYSTEM].tolist() == ["orders-service"] * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["source"]["table"].pop("reconstruct"),
            "translate.transition: used only with source.table.reconstruct",
        ),
        (
            lambda s: s["translate"].pop("transition") and s["translate"].update(function="m:f"),
            "a reconstruction needs translate.transition",
        ),
        (lambda s: s["translate"].update(function="m:f"), "both function and transition given"),
        (
            lambda s: s["source"]["table"]["reconstruct"].update(key="other"),
            "reconstruct.key: is not source.table.key",
        ),
        (
            lambda s: s["source"]["table"]["reconstruct"].update(compare=["status"]),
            "used only with mode: snapshots",
        ),
        (
            lambda s: s["source"]["table"]["reconstruct"].update(tie=["effective_from"]),
            "lists the business time column",
        ),
        (
            lambda s: s.update(lineage={"effective_time_column": "effective_at"}),
            "is source.table.reconstruct.time in a reconstruction",
        ),
    ],
)
def test_bad_specs_are_one_line(change: Any, message: str) -> None:
    from rewind.errors import SpecError
    from rewind.spec import parse_spec

    source = {
        "sqlite": {"url": "sqlite:///legacy.db", "table": "policy_history"},
        "key": "policy_id",
        "where": "TRUE",
        "reconstruct": {"time": "effective_from", "tie": ["change_seq"]},
    }
    spec = rx.spec("bad", source, "policy-events")
    parse_spec(spec)  # valid as it is
    change(spec)
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
