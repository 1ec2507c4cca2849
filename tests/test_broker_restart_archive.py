"""The broker dies in the middle of ``rewind archive``: the pass finishes by itself, exact.

A private noida-db (see tests/test_broker_restart.py): the source is produced and made
durable (SIGTERM and restart), then a real one-shot ``rewind archive`` child process plans
its pass; its Spark tasks are held at ``archive-task-read`` (``REWIND_FAULT_PAUSE``) for
:data:`HOLD_S` seconds, the broker is SIGKILLed as the first one is held, stays down
:data:`OUTAGE_S` seconds and is restarted on the same port and data folder. The tasks' reads
start against the dead broker and must wait for it: the pass must exit 0 by itself, and the
archive must hold every record of the source exactly once, with its key, value and timestamp,
as a clean pass does, and the high-water at the log end. A pass writes nothing to Kafka, so
what noida-db may lose when killed is none of the archive's business.

A broker named by ``REWIND_TEST_BOOTSTRAP`` cannot be killed and restarted by the test: skipped
there (``restarts_the_broker``).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from rewind.catalog import load_catalog
from rewind.config import load_settings
from rewind.history.schema import archive_state, open_archive
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce
from tests.test_broker_restart import (
    OUTAGE_LINES,
    OUTAGE_S,
    RestartableBroker,
    outage_lines,
    restarts_the_broker,
    tasks_retried,
)
from tests.test_cli_errors import REWIND

PER_PARTITION = 200
HOLD_S = 2.0  # the tasks start reading this long after the broker died: it is still down

Row = tuple[int, int, bytes, bytes, int]


def _source_rows(conf: dict[str, Any], topic: str, partitions: int) -> list[Row]:
    """(partition, offset, key, value, timestamp ms) of every record: what a clean pass archives."""
    consumer = Consumer({**conf, "group.id": f"check-{uuid.uuid4().hex[:6]}", "enable.partition.eof": True})
    rows: list[Row] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ended) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    rows.append((m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1]))
                elif m.error().code() == m.error()._PARTITION_EOF:
                    ended.add(m.partition())
    finally:
        consumer.close()
    return sorted(rows)


@restarts_the_broker
def test_an_archive_pass_survives_a_broker_restart(noida: RestartableBroker, tmp_path: Path) -> None:
    env = {"REWIND_BOOTSTRAP_SERVERS": noida.address, "REWIND_STATE_DIR": str(tmp_path / "state")}
    settings = load_settings(env=env, cwd=tmp_path)
    conf = settings.kafka_config()
    topic, table = f"arch-{uuid.uuid4().hex[:8]}", f"lake.restart_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    produce(conf, topic, [(i % 2, b"k%d" % i, b"v%d" % i, None) for i in range(2 * PER_PARTITION)])
    noida.restart_clean()  # the source survives the kill
    expected = _source_rows(conf, topic, 2)
    assert len(expected) == 2 * PER_PARTITION

    paused = tmp_path / "paused"
    child_env = jf.child_env(
        settings, REWIND_FAULT_PAUSE=f"archive-task-read:{HOLD_S}", REWIND_FAULT_PAUSED=str(paused)
    )
    child = subprocess.Popen(
        [REWIND, "archive", topic, "--table", table, "--json"],
        cwd=tmp_path, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        held = Path(f"{paused}.archive-task-read")
        deadline = time.monotonic() + 240
        while not held.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.exists(), f"no task was held: {child.communicate(timeout=60)[1][-3000:]}"
        noida.kill()
        time.sleep(OUTAGE_S)
        noida.start()
        out, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err[-3000:]
    noisy = outage_lines(err)
    assert len(noisy) <= OUTAGE_LINES, f"{len(noisy)} lines about the outage: {noisy[:10]}"
    assert tasks_retried(settings, err), err[-3000:]  # the tasks saw it
    report = json.loads(out)
    assert report["records"] == 2 * PER_PARTITION and report["passes"][0]["committed"]

    iceberg = open_archive(load_catalog(settings), table)
    got = iceberg.scan(selected_fields=("partition", "offset", "key", "value", "timestamp")).to_arrow()
    archived = sorted(
        (r["partition"], r["offset"], r["key"], r["value"], int(r["timestamp"].timestamp() * 1000))
        for r in got.to_pylist()
    )
    assert archived == expected  # each record once, as it is in Kafka
    assert archive_state(iceberg).hw == {(topic, 0): PER_PARTITION, (topic, 1): PER_PARTITION}
