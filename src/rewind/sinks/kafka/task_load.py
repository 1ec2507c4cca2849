"""A Kafka-source run's units produced to the Kafka sink by the Spark tasks that read them.

The driver path (:meth:`~rewind.sinks.kafka.sink.KafkaTopicSink.commit`) moves every row of a
wave through one process: the driver reads the tasks' Parquet files and produces them. Here each
task produces each unit it finished through the re-produce's machinery
(:class:`~rewind.sinks.kafka.unit_writer.UnitWriter`): **one transaction per unit**, of the
unit's own transactional id, holding the unit's records and its marker in ``rewind.commits``
(its counts, rows per partition and quarantine files). Steps of one unit, in the task:

1. open the unit's transaction: ``init_transactions`` fences an earlier attempt of the unit (a
   retried task, the task of a killed driver) and aborts what it left open; unless this is the
   unit's very first attempt, a marker of the unit in the run's bookkeeping means it is done:
   nothing is produced and the marker's counts and quarantine files are returned;
2. produce the unit's spool file (its rows in offset order, as the task wrote them) with the
   partition the driver path would give each record (its source partition when the topic has
   as many partitions as the source topic, else by key), the same values and lineage headers;
3. produce the marker, commit; delete the spool file.

The driver then checks the conservation law, commits the quarantine files and marks the units
done; a driver killed in between loses nothing (the reconcile finds the markers, and
:func:`rewind.job.reproduce.reconcile_quarantine` commits the quarantine files they name).

Only when every unit's transaction can be hidden until it commits: the staging is
transactional and the broker's ``read_committed`` hides aborted records (``rewind doctor``).
Elsewhere (tansu 0.6, ``transactional: false``) an aborted attempt's records would stay
visible beside its retry, so the driver path, which finds and skips an interrupted commit's
records, is kept. ``REWIND_KAFKA_LOAD=driver`` keeps the driver path anyway (the benchmark's
peer).

``guards.max_records_per_second`` holds the produced records too, job-wide: the tasks read at
that rate (the reader's budget), and produce at that rate from a budget of their own (a file
every task of the host shares; on a cluster, a budget server the driver keeps for the run,
:mod:`rewind.spark.pace_server`), since a task produces its units in a burst after reading them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.core.counts import QUARANTINE_FILES_KEY as QUARANTINE_FILES
from rewind.core.store import filesystem
from rewind.kafka.unit_redo import redo_interrupted
from rewind.sinks.kafka.bookkeeping import KafkaStaging
from rewind.sinks.kafka.commit_writer import remove_file
from rewind.sinks.kafka.unit_writer import UnitWriter
from rewind.spark.pace_server import RemotePacer
from rewind.spark.ratelimit import RateLimit, SharedFilePacer, default_state_dir, shared_state_path
from rewind.spark.unit_produce import first_attempt

if TYPE_CHECKING:
    from rewind.sinks.kafka.sink import KafkaTopicSink
    from rewind.spark.pace_server import PaceAddress

_BATCH_ROWS = 20_000


@dataclass(frozen=True)
class KafkaTaskLoader:
    """Plain data pickled to the tasks (the Kafka configuration travels in the task's closure,
    as the re-produce's writer does); :meth:`load` produces one unit there."""

    writer: UnitWriter
    attempted: frozenset[str] = frozenset()
    max_records_per_second: float | None = None
    """``guards.max_records_per_second``, for the records produced (the reads have their own)."""
    pace: PaceAddress | None = None
    """On a cluster: the driver's job-wide budget of produced records (:mod:`rewind.spark.pace_server`)."""

    def load(
        self, unit_id: str, files: list[str], quarantine_files: list[str], counts: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """Steps 1-3 of the module docstring; returns the unit's counts as recorded (with its
        quarantine files) and whether this call produced it. A unit whose transaction the broker
        interrupted is loaded again (:mod:`rewind.kafka.unit_redo`)."""
        return redo_interrupted(
            lambda first: self._load(unit_id, files, quarantine_files, counts, first),
            first_attempt(unit_id, self.attempted),
        )

    def _load(
        self,
        unit_id: str,
        files: list[str],
        quarantine_files: list[str],
        counts: dict[str, Any],
        first_attempt: bool,
    ) -> tuple[dict[str, Any], bool]:
        session = self.writer.open(unit_id, first_attempt)  # 1.
        if session.done is not None:
            done = session.done
            return {**done.counts, QUARANTINE_FILES: list(done.quarantine_files)}, False
        pacer = self._pacer()
        try:
            for path in files:  # 2.
                for table in _tables(path, self._chunk_rows()):
                    if pacer is not None:
                        pacer.acquire(table.num_rows, 0, time.sleep)
                    session.produce(table)
            session.commit(counts, list(quarantine_files))  # 3.
        except BaseException:
            session.abort()
            raise
        finally:
            if pacer is not None and hasattr(pacer, "close"):
                pacer.close()
        for path in files:
            remove_file(path)
        return {**counts, QUARANTINE_FILES: list(quarantine_files)}, True

    def _chunk_rows(self) -> int:
        # a chunk is paid for as a whole: keep it to a small slice of a second's quota
        rate = self.max_records_per_second
        return _BATCH_ROWS if rate is None else max(1, min(_BATCH_ROWS, int(rate / 20)))

    def _pacer(self) -> Any:
        """The job-wide budget of produced records: the driver's on a cluster, else a file every
        task of this host shares (as the reader's, under its own name)."""
        if not self.max_records_per_second:
            return None
        if self.pace is not None:
            return RemotePacer(self.pace)

        run_id = self.writer.staging["run_id"]
        path = shared_state_path(default_state_dir(), f"produce-{run_id}")
        return SharedFilePacer(RateLimit(self.max_records_per_second), path)


def task_loader(
    sink: KafkaTopicSink,
    staging: Any,
    attempted: frozenset[str],
    max_records_per_second: float | None = None,
    pace: PaceAddress | None = None,
) -> KafkaTaskLoader | None:
    """The tasks' loader for this staging, or None when the driver produces (see the module
    docstring for when)."""
    if not isinstance(staging, KafkaStaging):
        return None
    if not (staging.transactional and staging.read_committed == "supported"):
        return None
    if os.environ.get("REWIND_KAFKA_LOAD", "").strip().lower() == "driver":
        return None
    writer = UnitWriter(conf=dict(sink.conf), staging=staging.to_dict(), key=tuple(sink.key))
    return KafkaTaskLoader(writer, attempted, max_records_per_second, pace)


def _tables(path: str, rows: int) -> Any:
    # lazy: avoids pyarrow at import
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=rows):
            yield pa.Table.from_batches([batch])
