"""``source.kafka.latest_per_key``: a window read as a compacted topic's snapshot.

A topic that never compacted (every update, tombstone and re-insert still in the log) is run on
each real broker with units of 3 records, so a key's records are spread over several units and
waves: the staging holds exactly the last record of each (partition, key), none for a key whose
last record is a tombstone, every null-key record, each with the kept record's lineage; the
superseded and deleting records are counted as filtered (the law holds per unit and per run) and
the audit names how many of each. The expected rows come from a model of log compaction, not
from the code under test.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import load_settings
from rewind.errors import SpecError
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.brokers import TestBroker
from tests.kafka_util import create_topic

BASE_MS = 1_790_000_000_000

# (partition, key, value): value None is a tombstone, key None a record without a key
RECORDS: list[tuple[int, str | None, dict[str, Any] | None]] = [
    (0, "a", {"sku": "a", "qty": 1}),
    (0, "b", {"sku": "b", "qty": 1}),
    (0, "a", {"sku": "a", "qty": 2}),
    (0, "c", {"sku": "c", "qty": 1}),
    (0, "b", None),  # b deleted ...
    (0, None, {"sku": "n", "qty": 7}),  # no key: kept as is
    (0, "a", {"sku": "a", "qty": 3}),
    (0, "c", None),  # c deleted, and stays deleted
    (0, "b", {"sku": "b", "qty": 9}),  # ... and written again
    (0, "d", {"sku": "d", "qty": 4}),
    (1, "a", {"sku": "a", "qty": 100}),  # the same key on another partition: its own entry
    (1, "e", {"sku": "e", "qty": 1}),
    (1, "e", {"sku": "e", "qty": 2}),
    (1, "f", None),  # a tombstone for a key never written in the window
    (1, "e", {"sku": "e", "qty": 5}),
    (1, None, {"sku": "m", "qty": 8}),
    (1, "a", {"sku": "a", "qty": 101}),
]


def skus(events: pd.DataFrame) -> pd.DataFrame:
    return events[["_rewind_row", "sku", "qty"]]


def compacted(coords: list[tuple[int, int]]) -> tuple[list[tuple[str, int, int, int]], int, int]:
    """What log compaction leaves of RECORDS (at ``coords``): rows (sku, qty, partition,
    offset), records superseded, keys deleted."""
    last: dict[tuple[int, str], int] = {}
    for i, (partition, key, _) in enumerate(RECORDS):
        if key is not None:
            last[(partition, key)] = i
    kept = [i for i, (_, key, _) in enumerate(RECORDS) if key is None]
    kept += [i for i in last.values() if RECORDS[i][2] is not None]
    rows = []
    for i in kept:
        value = RECORDS[i][2]
        assert value is not None
        rows.append((value["sku"], value["qty"], *coords[i]))
    keyed = sum(1 for _, key, _ in RECORDS if key is not None)
    deleted = sum(1 for i in last.values() if RECORDS[i][2] is None)
    return sorted(rows), keyed - len(last), deleted


def test_a_run_keeps_the_last_record_per_key(broker: TestBroker, tmp_path: Path) -> None:
    from confluent_kafka import Producer

    from rewind.job.service import open_ledger, run_job

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": broker.bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    topic = f"stock-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    producer = Producer(settings.kafka_config())
    coords: list[tuple[int, int]] = []
    for i, (partition, key, value) in enumerate(RECORDS):
        payload = None if value is None else json.dumps(value).encode()
        producer.produce(
            topic,
            value=payload,
            key=key,
            partition=partition,
            timestamp=BASE_MS + i,
            on_delivery=lambda err, msg: (
                coords.append((msg.partition(), msg.offset())) if err is None else None
            ),
        )
        assert producer.flush(10) == 0  # one at a time: coords follow RECORDS
    assert len(coords) == len(RECORDS)

    spec = parse_spec(
        {
            "name": "stock-snapshot",
            "source": {"kafka": {"topics": [topic], "latest_per_key": True}},
            "decode": {"format": "json", "schema": {"sku": "string", "qty": "long"}},
            "translate": {
                "function": "tests.test_latest_per_key:skus",
                "version": "1",
                "output_schema": {"sku": "string", "qty": "long"},
            },
            "key": ["sku"],
            "sink": {"iceberg": {"table": f"snap.stock_{topic[-8:]}"}},
            "run": {"work_unit_records": 3},
        }
    )
    outcome = run_job(settings, spec, units_per_wave=2)
    assert outcome.state == "succeeded"

    expected, superseded, deleted = compacted(coords)
    got = jf.staging_table(settings, outcome.staging).to_pylist()
    assert (
        sorted((r["sku"], r["qty"], r["_rewind_source_partition"], r["_rewind_source_offset"]) for r in got)
        == expected
    )
    ids = {(r["_rewind_source_partition"], r["_rewind_source_offset"]): r["_rewind_event_id"] for r in got}
    for partition, offset in ids:
        assert ids[(partition, offset)] == jf.event_id(topic, partition, offset, "skus", "1", 0)

    c = outcome.counts
    assert (c.records_read, c.emitted, c.quarantined) == (len(RECORDS), len(expected), 0)
    assert c.filtered == superseded + deleted == len(RECORDS) - len(expected)
    with open_ledger(settings) as ledger:
        audit = [a.details for a in ledger.audit_log(outcome.run_id) if a.action == "latest-per-key"]
        units = ledger.unit_counts(outcome.run_id)
    assert audit == [{"kept": len(expected) - 2, "superseded": superseded, "deleted": deleted}]
    assert units.conserved and units.filtered == superseded + deleted and units.units > 2


def test_the_field_is_off_by_default_and_only_then_absent_from_the_canonical_spec() -> None:
    base = {
        "name": "n",
        "source": {"kafka": {"topics": ["t"]}},
        "decode": "json",
        "translate": {"function": "tests.test_latest_per_key:skus", "version": "1"},
        "key": ["id"],
        "sink": {"iceberg": {"table": "a.b"}},
    }
    off = parse_spec(base)
    assert not off.source.window.latest_per_key and "latest_per_key" not in off.canonical()["source"]["kafka"]
    on = parse_spec({**base, "source": {"kafka": {"topics": ["t"], "latest_per_key": True}}})
    assert on.source.window.latest_per_key is True
    assert on.canonical()["source"]["kafka"]["latest_per_key"] is True
    with pytest.raises(SpecError, match=r"source\.kafka\.latest_per_key") as err:
        parse_spec({**base, "source": {"kafka": {"topics": ["t"], "latest_per_key": "sometimes"}}})
    assert "\n" not in str(err.value)
