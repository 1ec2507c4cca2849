"""The driver side of the live tail: each micro-batch translated and committed like a unit.

Per micro-batch (:func:`rewind.spark.shadow_tail.start_tail` gives its exact ranges): the
units it reads are translated by the same task code as a wave, the conservation law is
checked per unit, the quarantine rows and then the output rows are committed with the unit
ids in one sink transaction each. A batch whose units the sink already holds is a replay
after a crash and is skipped, so every offset reaches v2 exactly once; upserts on the key
make the order of keys' events the only thing that matters, and that is the log's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.counts import UNIT_COUNTS_KEY, RecordCounts
from rewind.shadow.exceptions import ShadowError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.sinks.base import Staging, StagingSink
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
        # only the first batch after a (re)start can be a replay: read the sink's units once
        self.known = sink.committed_units(staging, run_id)
        self.known_q = self.qsink.committed_units(self.qstaging, run_id)
        self.stats = TailStats()

    def __call__(self, df: DataFrame, batch: TailBatch) -> None:
        from rewind.spark.job_stage import StageContext
        from rewind.spark.shadow_tail import process_batch_units

        ids = [u.id for u in batch.units]
        if not ids:
            return
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
        self.sink.commit(
            self.staging,
            self.run_id,
            ordered,
            files,
            extra={UNIT_COUNTS_KEY: json.dumps(counts, sort_keys=True)},
        )
        faults.point("shadow-after-batch-commit")
        self.known.update(ordered)
        self.stats.batches += 1
        for out in outputs.values():
            self.stats.counts = self.stats.counts.merge(out.counts)
        self.stats.ends.update(batch.ends)
