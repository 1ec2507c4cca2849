"""The driver side of the live tail: each micro-batch translated and committed like a unit.

Per micro-batch (:func:`rewind.spark.shadow_tail.start_tail` gives its exact ranges): the
units it reads are translated by the same task code as a wave, the conservation law is
checked per unit, the quarantine rows and then the output rows are committed with the unit
ids in one sink transaction each. A batch whose units the sink already holds is a replay
after a crash and is skipped, so every offset reaches v2 exactly once; upserts on the key
make the order of keys' events the only thing that matters, and that is the log's.

A folded read model (``translate.fold``): the translate emits partial rows, and the sink's
:meth:`~rewind.sinks.base.StagingSink.commit_folded` folds them with v2's current rows of the
batch's keys and writes the result over those keys, in the same atomic commit that records the
batch's units. So a replayed batch is skipped as above and never folded twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.counts import UNIT_COUNTS_KEY, RecordCounts
from rewind.shadow.exceptions import ShadowError
from rewind.spark.fold_stage import fold_arrow
from rewind.spark.job_stage import StageContext
from rewind.spark.shadow_tail import process_batch_units
from rewind.translate.functions import load_callable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.sinks.base import RowFold, Staging, StagingSink
    from rewind.sinks.iceberg import IcebergSink, IcebergStaging
    from rewind.spark.shadow_tail import TailBatch

log = logging.getLogger(__name__)


@dataclass
class TailStats:
    """What the tail did in this process (the ledger and the sink hold the durable facts)."""

    batches: int = 0
    replayed: int = 0
    counts: RecordCounts = field(default_factory=RecordCounts)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)


class TailWriter:
    """The ``foreachBatch`` body of a shadow's tail, bound to its run's staging (v2)."""

    def __init__(
        self,
        settings: Settings,
        plan: JobPlan,
        run_id: str,
        sink: StagingSink[Any],
        staging: Staging,
        quarantine: tuple[IcebergSink, IcebergStaging],
    ) -> None:
        self.settings, self.plan, self.run_id = settings, plan, run_id
        self.sink, self.staging = sink, staging
        self.qsink, self.qstaging = quarantine
        self.spec_json = plan.job_spec().model_dump_json(by_alias=True)
        self.known: set[str] = set()
        self.known_q: set[str] = set()
        self.reload()
        self.stats = TailStats()
        self.fold = row_fold(plan)

    def reload(self) -> None:
        """Read the units the sink holds: only the first batch after a (re)start of the tail's
        query can be a replay of a committed one, so this is read once per start."""
        self.known = self.sink.committed_units(self.staging, self.run_id)
        self.known_q = self.qsink.committed_units(self.qstaging, self.run_id)

    def __call__(self, df: DataFrame, batch: TailBatch) -> None:
        ids = [u.id for u in batch.units]
        if not ids:
            return
        faults.fail("shadow-tail-batch")
        if set(ids) <= self.known:
            log.info("tail batch %d (%s) is in v2 already: a replay after a restart", batch.batch_id, ids)
            self.stats.replayed += 1
            self.stats.ends.update(batch.ends)
            return
        ctx = StageContext(
            run_id=self.run_id,
            spec_json=self.spec_json,
            output_schema_b64=self.plan.output_schema_b64,
            data_folder=self.sink.data_folder(self.staging),
            quarantine_folder=self.qsink.data_folder(self.qstaging),
            kafka_conf=self.settings.kafka_config(),
            units=batch.units,
        )
        outputs = process_batch_units(df, ctx)
        for out in outputs.values():
            c = out.counts
            if not c.balanced:
                raise ShadowError(
                    f"tail unit {out.unit_id}: read {c.records_read} != emitted {c.emitted} + "
                    f"quarantined {c.quarantined} + filtered {c.filtered}"
                )
        ordered = sorted(outputs)
        q_units = [u for u in ordered if outputs[u].quarantine_files and u not in self.known_q]
        if q_units:
            files = [f for u in q_units for f in outputs[u].quarantine_files]
            self.qsink.commit(self.qstaging, self.run_id, q_units, files)
            self.known_q.update(q_units)
        faults.point("shadow-before-batch-commit")
        counts = {u: outputs[u].counts.to_dict() for u in ordered}
        files = [f for u in ordered for f in outputs[u].data_files]
        extra = {UNIT_COUNTS_KEY: json.dumps(counts, sort_keys=True)}
        if self.fold is not None:  # partial rows: folded with v2's rows of their keys, in the commit
            self.sink.commit_folded(self.staging, self.run_id, ordered, files, self.fold, extra=extra)
        else:
            self.sink.commit(self.staging, self.run_id, ordered, files, extra=extra)
        faults.point("shadow-after-batch-commit")
        self.known.update(ordered)
        self.stats.batches += 1
        for out in outputs.values():
            self.stats.counts = self.stats.counts.merge(out.counts)
        self.stats.ends.update(batch.ends)


def row_fold(plan: JobPlan) -> RowFold | None:
    """The spec's ``translate.fold`` over Arrow rows in the plan's output schema, or None."""
    spec = plan.job_spec()
    if spec.translate.fold is None:
        return None

    fn = load_callable(spec.translate.fold, "translate.fold")
    key, schema = list(spec.key), plan.output_schema()

    def fold(rows: pa.Table) -> pa.Table:
        return fold_arrow(rows, key, fn, schema)

    return fold
