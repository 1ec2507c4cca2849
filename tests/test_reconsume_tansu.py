"""One whole handover on the embedded tansu, where a group's first assignment takes ~20 s.

The other reconsume tests run on noida-db (test_reconsume.py); this one shows the same
guarantee on the broker users get from ``make demo``: every offset handled exactly once, by
exactly one side, with the live group subscribed and records arriving meanwhile.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rewind.config import Settings
from rewind.kafka import groups as kg
from rewind.ledger import Ledger
from rewind.ledger.reconsumes import ReconsumeStore
from rewind.reconsume import ExistingSide, TemporarySide
from rewind.reconsume.service import finish_reconsume, plan_reconsume, start_reconsume
from tests.brokers import TANSU, TestBroker, broker_names
from tests.kafka_util import produce
from tests.reconsume_fixtures import Recorder, broker_settings_for, sqlite_url, topic_with_group

pytestmark = pytest.mark.skipif(TANSU not in broker_names(), reason="REWIND_TEST_BROKERS leaves tansu out")


def test_a_whole_handover_on_tansu(settings: Settings, tansu_broker: TestBroker, tmp_path: Path) -> None:
    s = broker_settings_for(settings, tansu_broker.bootstrap, sqlite_url(tmp_path))
    conf = s.kafka_config()
    topic, group, rid = topic_with_group(conf, partitions=2, per_partition=100, live_at=100)
    plan_reconsume(s, rid, group=group, topics=[topic], from_earliest=True, idle_handover_s=1.0)
    start_reconsume(s, rid)
    existing, temporary = Recorder(), Recorder()
    stop = threading.Event()
    live = ExistingSide(conf, existing, reconsume=rid, ledger=s.ledger, timeout_s=0.2)
    thread = threading.Thread(target=live.run, args=(stop,))
    thread.start()
    try:
        side = TemporarySide(conf, temporary, reconsume=rid, ledger=s.ledger, batch_size=30, timeout_s=0.2)
        with side:
            for _ in range(20):  # records arrive on partition 0 while the temporary side re-reads
                produce(conf, topic, [(0, b"k", b"live", None) for _ in range(5)])
                side.poll_once()
            side.run(max_batches=2000)
            assert side.done
        produce(conf, topic, [(p, b"k", b"after", None) for _ in range(10) for p in (0, 1)])
        high = {p: b.high for (_t, p), b in kg.log_bounds(conf, [(topic, 0), (topic, 1)]).items()}
        deadline = time.monotonic() + 90  # the live group's first assignment takes ~20 s here
        while time.monotonic() < deadline:
            at = kg.committed_offsets(conf, group, [(topic, 0), (topic, 1)])
            if all(at[(topic, p)] == high[p] for p in (0, 1)):
                break
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
        live.close()
    with Ledger.open(s.ledger) as ledger:
        rows = {r.partition: r for r in ReconsumeStore(ledger.engine).rows(rid)}
    for p in (0, 1):
        t_seen, e_seen = temporary.of(p), existing.of(p)
        h = rows[p].handover_offset
        assert h is not None and t_seen == list(range(h)), p
        assert sorted(e_seen) == list(range(h, high[p])) and len(e_seen) == len(set(e_seen)), p
    assert finish_reconsume(s, rid)["state"] == "finished"
