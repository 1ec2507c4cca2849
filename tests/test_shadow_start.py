"""``rewind shadow start``: history into v2, then the live tail, killed with -9 and restarted.

A producer keeps writing keyed order events during the whole test. The shadow is killed in
its history run (after a unit commit, before the ledger heard of it) and in its live tail
(after a micro-batch's commit, before Spark marked the batch done, so Spark replays it), and
started again each time. Finally v2 must hold, for every order, exactly its last event (a
clean recomputation from Kafka), and the unit ranges its sink committed must tile each
partition from 0 to the log end with no gap and no overlap. Runs on noida-db (fast groups);
the data is small.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rewind.shadow.positions import coverage
from rewind.shadow.start import start_shadow
from rewind.spec import load_spec
from tests import shadow_fixtures as sf
from tests.brokers import TestBroker
from tests.shadow_fixtures import prepared, rewind, shadow_env


def test_a_shadow_killed_in_history_and_in_its_tail_continues_with_no_gap_and_no_duplicate(
    noida_broker: TestBroker, spark: Any, tmp_path: Path
) -> None:
    settings, conf, topic, db, spec = prepared(noida_broker, spark, tmp_path, "shadow-kill")
    env = shadow_env(tmp_path, noida_broker.bootstrap)
    done = tmp_path / "producer-done"
    producer = sf.LiveProducer(conf, topic, 600, rate=40)
    producer.start()
    try:
        first = sf.run_child(env, spec, done, tmp_path, fault="after-sink-commit")  # in the history run
        assert first.returncode == -9, first.stderr[-3000:]
        # started again here, on the warm shared Spark session (a child's cold JVM is slower
        # at it): the history run is resumed to its end, then one lag sample of the tail
        resumed = start_shadow(settings, load_spec(spec), stop=lambda _: True, sample_s=0.5)
        assert resumed["state"] == "tailing" and resumed["replayed"] == 0, resumed
        # in the tail (the limit counts from the tail's start, the child's JVM start included)
        second = sf.run_child(env, spec, done, tmp_path, fault="shadow-after-batch-commit:2", limit=300)
        assert second.returncode == -9, second.stderr[-3000:]
    finally:
        last = producer.stop()
    # the last start runs in this process on the shared Spark session (a third JVM would cost
    # its start-up, proving nothing more), until the shadow is caught up (lag 0 for 1 s: the
    # producer stopped), as `shadow start --until-caught-up` stops
    result = start_shadow(settings, load_spec(spec), stop=lambda p: p.caught_up, sample_s=0.5)
    assert result["state"] == "tailing"
    assert result["replayed"] == 1, "the batch committed before the kill is replayed by Spark and skipped"
    assert result["max_lag"] == 0 and result["caught_up"] is True

    # the status below must come later than caught_up_for_s (1 s) after the last sample; a CLI
    # process started right away can start within it on a quiet machine
    time.sleep(1.5)
    shown = rewind(env, tmp_path, "shadow", "status", "shadow-kill", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    status = json.loads(shown.stdout)
    assert [(p["partition"], p["lag"], p["group_offset"]) for p in status["partitions"]] == [
        (0, 0, None),
        (1, 0, None),
    ]
    assert status["lag_history"][-1]["max_lag"] == 0
    assert len(status["lag_history"]) >= 2, "caught-up was judged over more than one sample"
    assert status["caught_up"] is False, (
        "caught-up is the running tail's: a stopped shadow records no new samples"
    )

    from rewind.ledger import Ledger
    from rewind.ledger.shadows import ShadowStore

    ledger = Ledger.open(settings.ledger)
    try:
        record = ShadowStore(ledger.engine).get("shadow-kill")
        staging = ledger.get_run(record.run_id).staging
    finally:
        ledger.close()
    assert record.history_end is not None
    assert sum(record.history_end[topic].values()) >= 600  # history read at least what was there first

    expected = sf.expected_rows(conf, topic)
    assert len(expected) == sf.ORDERS and last > 600
    rows = sf.table_rows(db, staging["table"])
    assert len(rows) == len({r[0] for r in rows}), "no order twice"
    assert {r[0]: (r[1], r[2], r[3], r[4]) for r in rows} == expected

    units = sf.committed_units(db, record.run_id)
    _check_tiles(units, topic, last)

    # abort: v2, its unit records and the tail's checkpoint are dropped; the shadow is not started again
    from rewind.shadow.lifecycle import abort

    dropped = abort(settings, "shadow-kill")
    assert dropped["state"] == "aborted" and dropped["dropped"]["dropped"] == [staging["table"]], dropped
    assert not Path(record.checkpoint).exists()
    assert sf.committed_units(db, record.run_id) == []
    again = rewind(env, tmp_path, "shadow", "start", str(spec), "--until-caught-up")
    assert again.returncode == 1, again.stderr
    assert "shadow shadow-kill is aborted; only a tailing shadow is started again" in again.stderr


def _check_tiles(units: list[str], topic: str, last: int) -> None:
    tiles = coverage(units)
    ends = {p: (last // 2 + (1 if last % 2 > p else 0)) for p in (0, 1)}
    for p in (0, 1):
        cov = tiles[(topic, p)]
        assert cov.ranges == ((0, ends[p]),), f"partition {p} is covered once, with no gap: {cov}"
        assert cov.overlaps == ()
