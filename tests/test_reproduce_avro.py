"""Re-produce with Avro values (``source.table`` + ``sink.kafka.encode: avro``), on each real broker.

A SQLite table of accounts is re-produced whole into a fresh topic with a folder of ``.avsc``
files holding two versions of the account schema. A consumer that knows only the latest
schema (fastavro's schemaless reader, after the Confluent header) reads every selected entity
exactly once, keyed by its id, on the murmur2 partition, with the latest schema's id in the
header; a field the output has no column for carries its default. Rows the translate rejects
are quarantined, not produced.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro

from rewind.config import Settings
from rewind.kafka.partitioner import partitions_for
from rewind.spec import parse_spec
from tests import reproduce_fixtures as rf
from tests.brokers import TestBroker
from tests.kafka_util import create_topic

PARTITIONS = 4
ACCOUNTS = rf.accounts(300)

V1: dict[str, Any] = {
    "type": "record",
    "name": "Account",
    "fields": [
        {"name": "account_id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "balance", "type": "double"},
    ],
}
V2: dict[str, Any] = {  # the latest: two more fields from the row, one with only a default
    "type": "record",
    "name": "Account",
    "fields": [
        {"name": "account_id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "balance", "type": "double"},
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["active", "blocked", "closed"]},
        },
        {"name": "region", "type": ["null", "string"], "default": None},
        {"name": "tier", "type": "string", "default": "standard"},
    ],
}


def _schemas(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1.avsc").write_text(json.dumps(V1))
    (folder / "7.avsc").write_text(json.dumps(V2))
    (folder / "latest.avsc").write_text(json.dumps(V2))
    return folder


def _raw_records(conf: dict[str, Any], topic: str) -> list[tuple[str, int, bytes, dict[str, str]]]:
    """Every record of ``topic`` read_committed: key, partition, raw value, headers."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **conf,
            "group.id": f"avro-reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    out = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        left = set(range(PARTITIONS))
        while left:
            for msg in consumer.consume(500, timeout=2.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition())
                    continue
                headers = {k: (v or b"").decode() for k, v in (msg.headers() or [])}
                out.append(((msg.key() or b"").decode(), msg.partition() or 0, msg.value() or b"", headers))
    finally:
        consumer.close()
    return out


def test_sqlite_re_produced_as_avro_read_with_the_latest_schema_only(
    tmp_path: Path, broker: TestBroker, broker_settings: Settings, spark: Any
) -> None:
    from rewind.job.service import plan_job, run_job

    conf = broker_settings.kafka_config()
    url = rf.sqlite_accounts(tmp_path / "accounts.db", ACCOUNTS)
    topic = f"accounts-avro-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, PARTITIONS)
    folder = _schemas(tmp_path / "schemas")
    source = {"sqlite": {"url": url, "table": "accounts"}, "key": "id", "where": "id <= 250", "key_ranges": 2}
    spec = rf.spec("reproduce-avro", source, topic)
    spec["sink"]["kafka"].update({"encode": "avro", "schema_dir": str(folder)})
    parsed = parse_spec(spec)
    plan = plan_job(broker_settings, parsed)
    assert plan.ok, plan.failed_gates()
    outcome = run_job(broker_settings, parsed)
    assert outcome.state == "succeeded"

    chosen = [a for a in ACCOUNTS if a.id <= 250]
    good = [a for a in chosen if not a.rejected]
    records = [r for r in _raw_records(conf, topic) if r[3].get("rewind.run-id") == outcome.run_id]
    assert sorted(int(k) for k, _, _, _ in records) == [a.id for a in good]  # once each
    placed = partitions_for([k.encode() for k, _, _, _ in records], PARTITIONS)
    assert [p for _, p, _, _ in records] == placed
    by_id = {a.id: a for a in good}
    latest = fastavro.parse_schema(V2)
    for key, _, value, headers in records:
        assert value[0] == 0 and int.from_bytes(value[1:5], "big") == 7  # Confluent header, latest id
        decoded = fastavro.schemaless_reader(io.BytesIO(value[5:]), latest, None)
        assert decoded == {**by_id[int(key)].message(), "tier": "standard"}
        assert headers["rewind.synthetic"] == "true" and headers["rewind.transform"] == "account_state"
    c = outcome.counts
    assert (c.records_read, c.emitted, c.quarantined) == (len(chosen), len(good), len(chosen) - len(good))
    assert len(chosen) - len(good) == 2  # ids 97 and 194: the data exercises the quarantine


def test_an_output_that_does_not_fit_the_schema_is_refused_by_the_plan(
    tmp_path: Path, broker: TestBroker, broker_settings: Settings, spark: Any
) -> None:
    from rewind.job.service import plan_job

    conf = broker_settings.kafka_config()
    url = rf.sqlite_accounts(tmp_path / "accounts.db", ACCOUNTS[:10])
    topic = f"accounts-avro-{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, PARTITIONS)
    folder = tmp_path / "schemas"
    folder.mkdir()
    narrow = {**V2, "fields": [{**f, "type": "long"} if f["name"] == "name" else f for f in V2["fields"]]}
    (folder / "1.avsc").write_text(json.dumps(narrow))
    (folder / "latest.avsc").write_text(json.dumps(narrow))
    source = {"sqlite": {"url": url, "table": "accounts"}, "key": "id", "where": "TRUE"}
    spec = rf.spec("reproduce-avro-bad", source, topic)
    spec["sink"]["kafka"].update({"encode": "avro", "schema_dir": str(folder)})
    plan = plan_job(broker_settings, parse_spec(spec))
    assert not plan.ok
    [gate] = [g for g in plan.gates if not g.ok]
    assert gate.name == "sink" and gate.detail.startswith("sink.kafka: output column name (string)"), (
        gate.detail
    )
    assert "long" in gate.detail
    assert not [r for r in _raw_records(conf, topic)]  # nothing produced
