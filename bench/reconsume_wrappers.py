"""Benchmark: the reconsume wrappers against a bare consume-and-handle loop.

One run, the embedded broker, one topic of N records (default 100,000) of 200 bytes over 4
partitions. Each variant reads the whole topic with the same consumer settings (``assign``
at offset 0 under a fresh group id), the same handler (decode the JSON value, add the
amount to a per-status total) and the same batches (``consume(500, 1.0)``), and commits
synchronously after every batch:

  (a) bare: the loop a service would write;
  (b) ExistingSide, parallel mode: records the last offset handled per partition once per
      batch (one ledger transaction per batch) — the existing side while a reconsume runs;
  (c) ExistingSide, handover mode, after the handover: the steady state of a service
      whose partitions were handed over (no ledger I/O, no per-message check);
  (d) TemporarySide, handover mode: the re-read itself (the handover is tried only when the
      existing side's record, read at most once a second, says it can hold; progress is
      written at most once a second);
  (b0), (d0): (b) and (d) with ``record_interval_s=0``: a ledger transaction with every batch,
      to show what the throttle saves.

The variants run in turn, ``--repeat`` times (default 9) in rotating order, so load on the
machine hits them alike; the median and the best rate of each are compared with the bare
loop's (on a shared machine the best of several short runs is the least disturbed one). The
ledger is SQLite in a temporary folder (``REWIND_BENCH_LEDGER`` for another URL). Usage:
``python bench/reconsume_wrappers.py [--records N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bare_produce, broker, create_topic, machine, stamp

BATCH = 500
PARTITIONS = 4


class Totals:
    """The handler: what a small projection does per event (decode, aggregate)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.count = 0

    def __call__(self, message: Any) -> None:
        event = json.loads(message.value())
        status = event["status"]
        self.sums[status] = self.sums.get(status, 0.0) + event["amount"]
        self.count += 1


class Clock:
    """Wall time and this process's CPU time (all threads: the client's fetch threads too).

    CPU time is what the wrappers add; wall time is what a service sees, and on a shared
    machine it also carries whatever else runs.
    """

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, n: int) -> tuple[float, float]:
        return n / (time.perf_counter() - self.wall), n / (time.process_time() - self.cpu)


def consumer(conf: dict[str, Any], topic: str, group: str) -> Any:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.max.bytes": 4 << 20, "max.partition.fetch.bytes": 1 << 20})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    return c


def bare(conf: dict[str, Any], topic: str, n: int, _url: str) -> tuple[float, float]:
    c = consumer(conf, topic, f"bench-bare-{uuid.uuid4().hex[:8]}")
    handler = Totals()
    clock = Clock()
    while handler.count < n:
        messages = c.consume(BATCH, 1.0)
        handled = 0
        for m in messages:
            if m.error() is not None:
                continue
            handler(m)
            handled += 1
        if handled:
            c.commit(asynchronous=False)
    rate = clock.rates(n)
    c.close()
    return rate


def _reconsume(url: str, topic: str, mode: str, handed_over: bool = False) -> str:
    from rewind.ledger import Ledger
    from rewind.ledger.handover import HandoverTable, TempStep
    from rewind.ledger.reconsumes import ReconsumeStore

    rid = f"bench-{uuid.uuid4().hex[:8]}"
    with Ledger.open(url) as ledger:
        store = ReconsumeStore(ledger.engine)
        store.save_plan(rid, live_group=f"bench-live-{rid}", mode=mode,  # type: ignore[arg-type]
                        topics=[topic], plan={"idle_handover_s": 3600})
        store.start(rid, {(topic, p): 0 for p in range(PARTITIONS)})
        if handed_over:
            HandoverTable(ledger.engine, rid).record_temp(
                {(topic, p): TempStep(last=None, position=0, handover="now") for p in range(PARTITIONS)}
            )
    return rid


Variant = Callable[[dict[str, Any], str, int, str], tuple[float, float]]


def existing(mode: str, handed_over: bool, interval: float = 1.0) -> Variant:
    def run(conf: dict[str, Any], topic: str, n: int, url: str) -> tuple[float, float]:
        from rewind.reconsume import ExistingSide

        rid = _reconsume(url, topic, mode, handed_over)
        c = consumer(conf, topic, f"bench-live-{rid}")
        handler = Totals()
        side = ExistingSide(c, handler, reconsume=rid, ledger=url, batch_size=BATCH,
                            record_interval_s=interval)
        side.open()
        clock = Clock()
        while side.handled < n:
            side.poll_once()
        rate = clock.rates(n)
        side.close()
        c.close()
        assert handler.count == n
        return rate

    return run


def temporary(interval: float = 1.0) -> Variant:
    def run(conf: dict[str, Any], topic: str, n: int, url: str) -> tuple[float, float]:
        return _temporary(conf, topic, n, url, interval)

    return run


def _temporary(conf: dict[str, Any], topic: str, n: int, url: str, interval: float) -> tuple[float, float]:
    from rewind.kafka import groups as kg
    from rewind.reconsume import TemporarySide

    rid = _reconsume(url, topic, "handover")
    kg.alter_offsets(conf, f"rewind-reconsume-{rid}", {(topic, p): 0 for p in range(PARTITIONS)})
    handler = Totals()
    fetch = {"fetch.max.bytes": 4 << 20, "max.partition.fetch.bytes": 1 << 20}
    side = TemporarySide({**conf, **fetch}, handler, reconsume=rid, ledger=url, batch_size=BATCH,
                         record_interval_s=interval)
    side.open()
    clock = Clock()
    while side.handled < n:
        side.poll_once()
    rate = clock.rates(n)
    side.close()
    assert handler.count == n
    return rate


VARIANTS: dict[str, Variant] = {
    "a_bare": bare,
    "b_existing_parallel": existing("parallel", False),
    "c_existing_handed_over": existing("handover", True),
    "d_temporary": temporary(),
    "b0_existing_parallel_every_batch": existing("parallel", False, 0.0),
    "d0_temporary_every_batch": temporary(0.0),
}


def main() -> None:
    import os

    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    n = args.records
    url = os.environ.get("REWIND_BENCH_LEDGER") or f"sqlite:///{tempfile.mkdtemp(prefix='bench-ledger-')}/l.db"
    rates: dict[str, list[float]] = {k: [] for k in VARIANTS}
    cpu: dict[str, list[float]] = {k: [] for k in VARIANTS}
    with broker() as bootstrap:
        conf = {"bootstrap.servers": bootstrap}
        topic = f"bench-reconsume-{uuid.uuid4().hex[:6]}"
        create_topic(conf, topic, PARTITIONS)
        bare_produce(conf, topic, n, PARTITIONS)
        bare(conf, topic, n, url)  # warm the broker's and the client's caches
        names = list(VARIANTS)
        for r in range(args.repeat):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                wall, used = VARIANTS[name](conf, topic, n, url)
                rates[name].append(wall)
                cpu[name].append(used)
            print(f"round {r + 1}: " + ", ".join(f"{k} {rates[k][-1]:,.0f}" for k in names), flush=True)
    base, best = statistics.median(rates["a_bare"]), max(rates["a_bare"])
    base_cpu = statistics.median(cpu["a_bare"])
    print(f"\n{stamp()}  {machine()}  {n:,} records x 200 B, {PARTITIONS} partitions, batches of {BATCH}, "
          f"{args.repeat} rounds, ledger {url.split(':')[0]}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<34}{'median rec/s':>13}{'best':>10}{'ratio median':>14}{'ratio best':>12}"
          f"{'ratio CPU':>11}")
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"{name:<34}{med:>13,.0f}{max(values):>10,.0f}{med / base:>14.3f}{max(values) / best:>12.3f}"
              f"{statistics.median(cpu[name]) / base_cpu:>11.3f}")


if __name__ == "__main__":
    main()
