"""The driver's commits of a wave whose tasks are done (a Kafka-source wave, a reconstruction
into a table): each step durable before the next, so a kill between two loses nothing and
duplicates nothing on resume (the runner's reconcile, :mod:`rewind.job.runner`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rewind import faults
from rewind.core.counts import UNIT_COUNTS_KEY

if TYPE_CHECKING:
    from rewind.job.wave import Wave
    from rewind.spark.job_stage import UnitOutput


def commit_wave(wave: Wave, outputs: dict[str, UnitOutput]) -> list[str]:
    """The driver's commits of a wave whose tasks are done, in this order: the conservation law
    per unit, the quarantine files (of units not committed to the quarantine yet), the output
    files with the unit ids and counts in the same commit (units no task loaded), the ledger.
    Returns the wave's unit ids."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger.models import UnitResult

    done_q, run_id = wave.done_q, wave.run_id
    ids = sorted(outputs)
    for uid in ids:  # before anything of the wave is committed
        outputs[uid].counts.check(uid)
    q_files = [f for uid in ids if uid not in done_q for f in outputs[uid].quarantine_files]
    q_units = [uid for uid in ids if uid not in done_q and outputs[uid].quarantine_files]
    if q_files:
        wave.qsink.commit(wave.qstaging, run_id, q_units, q_files)
        done_q.update(q_units)
        faults.point("after-quarantine-commit")
    files = [f for uid in ids for f in outputs[uid].data_files]
    counts = json.dumps({uid: outputs[uid].counts.to_dict() for uid in ids}, sort_keys=True)
    rest = [uid for uid in ids if not outputs[uid].loaded]  # the tasks loaded the others
    if rest:
        wave.sink.commit(wave.staging, run_id, rest, files, extra={UNIT_COUNTS_KEY: counts})
    faults.point("after-sink-commit")
    wave.ledger.complete_units(run_id, [UnitResult.of(uid, outputs[uid].counts) for uid in ids])
    faults.point("after-ledger-update")
    return ids
