"""Seconds a task spends in each stage of the pipeline, for the stage-duration histogram.

Inside a task the stages interleave batch by batch, so each is timed where it runs and summed:

* ``read``: waiting for the next batch of records (the fetch from the broker or the archive
  upstream of the task, and Spark's hand-over of the batch);
* ``decode``: the decoder's calls (through :class:`TimedDecoder`);
* ``translate``: :func:`rewind.translate.process.process_batch` less its decode (the user's
  translate, key checks, lineage, quarantine routing);
* ``write``: the output and quarantine rows into their Parquet files.

The driver adds ``commit`` (the wave's commits) and reports one observation per stage per wave
(:mod:`rewind.ops.metrics`).

The clock also counts the **record bytes** the task read per source (``kafka`` or
``archive``): key + value + header keys and values, as they reach the task (uncompressed, without
the protocol's or Parquet's framing), which is the quantity the cost model's bytes estimate
(records x bytes per record) stands for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.translate.decoder import Decoded, Decoder

TASK_STAGES = ("read", "decode", "translate", "write")

T = TypeVar("T")


class StageClock:
    """Seconds per stage of one task (plain floats: it is summed and sent as JSON)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(TASK_STAGES, 0.0)
        self.bytes: dict[str, int] = {}

    def add_bytes(self, source: str, table: pa.Table) -> None:
        self.bytes[source] = self.bytes.get(source, 0) + record_bytes(table)

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] += seconds

    def timed_iter(self, items: Iterator[T], stage: str = "read") -> Iterator[T]:
        """``items``, with the time spent waiting for each one added to ``stage``."""
        it = iter(items)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                self.add(stage, time.perf_counter() - t0)
                return
            self.add(stage, time.perf_counter() - t0)
            yield item

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": {k: round(v, 6) for k, v in self.seconds.items()}, "bytes": dict(self.bytes)}


def add_stage_seconds(into: dict[str, float], other: dict[str, Any]) -> None:
    for stage, seconds in other.items():
        into[stage] = into.get(stage, 0.0) + float(seconds)


def record_bytes(table: pa.Table) -> int:
    """Key + value + header bytes of Kafka-shaped records (nulls count 0)."""
    # lazy: avoids pyarrow at import
    import pyarrow.compute as pc

    total = 0
    for name in ("key", "value"):
        if name in table.column_names:
            total += pc.sum(pc.binary_length(table[name])).as_py() or 0
    if "headers" in table.column_names:
        flat = pc.list_flatten(table["headers"])
        if len(flat):
            for name in ("key", "value"):
                total += pc.sum(pc.binary_length(pc.struct_field(flat, name))).as_py() or 0
    return int(total)


class TimedDecoder:
    """A decoder whose ``decode`` calls add to the clock's ``decode``; anything else delegated."""

    def __init__(self, decoder: Decoder, clock: StageClock) -> None:
        self._decoder, self._clock = decoder, clock

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        t0 = time.perf_counter()
        try:
            return self._decoder.decode(batch)
        finally:
            self._clock.add("decode", time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)
