"""``rewind shadow verify``: the settle cutoff is taken before the tables are read.

v1 and v2 are equal after the history run; then the live service applies one event to v1 that
v2's tail has not applied yet (v2 lags). That key is in flight: a verification must leave it
out, however long reading the two tables takes. A read slower than ``settle_s`` (the
``shadow-verify-read`` pause of :mod:`rewind.faults`, between the reads of v2 and v1) once
turned it into a changed row, because the cutoff was taken after the reads.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rewind.shadow.start import start_shadow
from rewind.shadow.status import shadow_status
from rewind.shadow.verify import verify_shadow
from rewind.spec import load_spec
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.shadow_fixtures import prepared

NAME = "shadow-settle"
SETTLE_S = 4
SHADOW = {"settle_s": SETTLE_S, "verify_passes": 1}


def test_a_read_slower_than_settle_s_leaves_an_in_flight_update_out(
    broker: TestBroker, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, _conf, _topic, db, spec_path = prepared(broker, spark, tmp_path, NAME, SHADOW)
    spec = load_spec(spec_path)
    sf.create_v1(settings, spec, db, "orders")
    assert start_shadow(settings, spec, stop=lambda _: True, sample_s=0.5)["state"] == "tailing"
    v2 = shadow_status(settings, NAME)["v2"]
    with sqlite3.connect(db) as conn:  # v1 as the live service left it: equal to v2
        cols = ", ".join(f'"{r[1]}"' for r in conn.execute('PRAGMA table_info("orders")'))
        conn.execute(f'INSERT INTO "orders" ({cols}) SELECT {cols} FROM "{v2}"')

    calm = verify_shadow(settings, NAME)["results"][-1]
    assert calm["passed"] is True and calm["unsettled_keys"] == 0, calm
    assert calm["rows"]["staging"] == calm["rows"]["reference"] == sf.ORDERS

    # an event of now reaches v1; v2's tail has not applied it yet
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(db) as conn:
        conn.execute(
            'UPDATE "orders" SET amount = -1, _rewind_source_offset = 100000, '
            "_rewind_source_timestamp = ? WHERE order_id = 7",
            (now,),
        )
    monkeypatch.setenv("REWIND_FAULT_PAUSE", f"shadow-verify-read:{SETTLE_S + 2}")
    slow = verify_shadow(settings, NAME)
    result = slow["results"][-1]
    assert result["changed"] == 0 and result["unsettled_keys"] == 1, result
    assert result["passed"] is True and slow["go"] is True, result
