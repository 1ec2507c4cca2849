"""A quarantine re-drive processed in Spark tasks (:mod:`rewind.spark.redrive_stage`) against the
driver's (tansu, Spark, Iceberg).

Two identical runs of one topic quarantine the same records; after the fix, one is re-driven
with the driver processing the records (threshold above them) and one in Spark (threshold 0):
the counts, the re-drive's id, the rows it adds to staging (event ids, values, lineage) and the
quarantine entries it leaves must be the same.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import RedriveSettings, load_settings
from rewind.spec import parse_spec
from rewind.translate.functions import TranslateResult
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

ORDERS = 40
BROKEN = {0, 5, 10, 15, 20, 25, 30, 35}
FIXED = Path(tempfile.gettempdir()) / "rewind-test-redrive-spark.fixed"
"""The fix, seen by the driver and by Spark's Python workers alike (their environment is the
JVM's, taken before a test could set a variable)."""


def picky(events: pd.DataFrame) -> TranslateResult:
    if not FIXED.exists() and events["order_id"].isin(BROKEN).any():
        raise ValueError("fifth order")
    rows = events[["_rewind_row", "order_id", "amount"]]
    bad = events["order_id"] == 13
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "unlucky"})
    return TranslateResult(rows=rows[~bad], rejects=rejects)


def test_spark_redrives_as_the_driver_does(
    tmp_path: Any, bootstrap: str, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import Producer

    from rewind.job.redrive import redrive
    from rewind.job.service import run_job
    from rewind.spark import redrive_stage

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    producer = Producer(settings.kafka_config())
    for i in range(ORDERS):
        value = json.dumps({"order_id": i, "amount": i * 1.5}).encode()
        producer.produce(topic, value=value, partition=i % 2)
    producer.produce(topic, value=b'{"order_id": 99, "amount":', partition=0)
    assert producer.flush(30) == 0
    FIXED.unlink(missing_ok=True)
    outcomes = {}
    for side in ("driver", "spark"):
        spec = parse_spec(
            {
                "name": f"picky-{side}",
                "source": {"kafka": {"topics": [topic]}},
                "decode": {"format": "json", "schema": {"order_id": "long", "amount": "double"}},
                "translate": {
                    "function": "tests.test_redrive_spark:picky",
                    "version": "1",
                    "output_schema": {"order_id": "long", "amount": "double"},
                },
                "key": ["order_id"],
                "sink": {"iceberg": {"table": f"shop.picky_{side}_{uuid.uuid4().hex[:6]}"}},
                "run": {"work_unit_records": 10},
            }
        )
        outcomes[side] = run_job(settings, spec)
        assert outcomes[side].counts.quarantined == len(BROKEN) + 2

    calls = []
    real = redrive_stage.run_redrive

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(redrive_stage, "run_redrive", counted)
    FIXED.touch()
    try:
        done = {}
        for side, threshold in (("driver", 10**9), ("spark", 0)):
            here = settings.model_copy(update={"redrive": RedriveSettings(spark_records=threshold)})
            done[side] = redrive(here, outcomes[side].run_id, translate_version="2")
            assert calls == ([1] if side == "spark" else [])
    finally:
        FIXED.unlink(missing_ok=True)

    def same(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k != "run_id"}

    assert same(done["spark"]) == same(done["driver"])
    assert (done["driver"]["records_read"], done["driver"]["emitted"], done["driver"]["quarantined"]) == (
        len(BROKEN) + 2, len(BROKEN), 2
    )

    def added(side: str) -> list[tuple[Any, ...]]:
        rows = jf.staging_table(settings, outcomes[side].staging).to_pylist()
        mine = f"{outcomes[side].run_id}/{done[side]['redrive']}"
        skip = {"_rewind_run_id", "_rewind_extracted_at"}
        return sorted(
            tuple((k, v) for k, v in r.items() if k not in skip) for r in rows if r["_rewind_run_id"] == mine
        )

    assert added("spark") == added("driver") and len(added("driver")) == len(BROKEN)

    def left(side: str) -> list[tuple[Any, ...]]:
        rows = jf.quarantine_rows(settings, outcomes[side].quarantine_table, outcomes[side].run_id)
        keep = ("unit_id", "topic", "partition", "offset", "timestamp", "key", "value", "stage", "reason")
        return sorted(tuple(r[k] for k in keep) for r in rows if r["unit_id"] == done[side]["redrive"])

    assert left("spark") == left("driver") and len(left("driver")) == 2


def _latest_by_dicts(rows: Any, reason: Any, resolved: dict[Any, str]) -> list[dict[str, Any]]:
    """The choice of entries written plainly, one Python dict per entry (the reference)."""
    from rewind.job.redrive import NOT_RECORDS, REDRIVE_PREFIX

    out: dict[Any, dict[str, Any]] = {}
    for r in sorted(rows.to_pylist(), key=lambda r: (r["at"], r["unit_id"].startswith(REDRIVE_PREFIX))):
        if r["stage"] not in NOT_RECORDS:
            out[(r["topic"], r["partition"], r["offset"])] = r
    latest = [out[k] for k in sorted(out) if k not in resolved or out[k]["unit_id"] == resolved[k]]
    return [r for r in latest if reason is None or reason in f"{r['stage']}: {r['reason']}"]


@pytest.mark.parametrize("seed", range(20))
def test_the_latest_entries_are_picked_as_one_dict_per_entry_would(seed: int) -> None:
    """Ties in time, re-drive entries after the run's, merge rows left out, records a committed
    re-drive resolved, a reason filter: the Arrow choice equals the plain one."""
    import random
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa

    from rewind.job.redrive import _latest
    from rewind.translate.quarantine import QUARANTINE_SCHEMA

    rnd = random.Random(seed)
    t0 = datetime(2026, 11, 27, tzinfo=UTC)
    n = rnd.randint(0, 300)
    units = ["orders-0-0", "orders-1-0", "redrive-2-aaaa", "redrive-3-bbbb", "merge"]
    data: dict[str, list[Any]] = {f.name: [] for f in QUARANTINE_SCHEMA}
    for _ in range(n):
        unit = rnd.choice(units)
        data["run_id"].append("r")
        data["unit_id"].append(unit)
        data["topic"].append(rnd.choice(["a", "b", "é"]))
        data["partition"].append(rnd.randint(0, 2))
        data["offset"].append(rnd.randint(0, 20))
        data["timestamp"].append(t0)
        data["key"].append(None)
        data["value"].append(b"v")
        data["stage"].append("merge" if unit == "merge" else rnd.choice(["decode", "translate-error"]))
        data["reason"].append(rnd.choice(["bad", "unlucky"]))
        data["at"].append(t0 + timedelta(seconds=rnd.randint(0, 3)))
    rows = pa.Table.from_pydict(data, schema=QUARANTINE_SCHEMA)
    resolved = {("a", p, o): rnd.choice(units[2:4]) for p in range(3) for o in range(0, 20, 3)}
    for reason in (None, "unlucky", "decode"):
        assert _latest(rows, reason, resolved) == _latest_by_dicts(rows, reason, resolved)
