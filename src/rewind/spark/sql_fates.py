"""What a ``translate.sql`` wave's decoding made of each record, kept beside the record in the
task's spool (:class:`rewind.spark.sql_wave_tasks.SpoolWriter`) and replayed when the same task
finishes the record's unit (:class:`Replayed`), so a unit run in place is decoded once.

Its own module because it needs the decoder's classes (and so pandas, numpy and pyarrow) at
import, which the wave's module, imported by every ``rewind`` command that may run a job, must
not: the tasks import it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from rewind.core.columns import ROW, ROW_INDEX
from rewind.spark.sql_translate import SqlTranslateError
from rewind.translate.decoder import Decoded, Decoder
from rewind.translate.failures import Failure

FATE, FAIL_STAGE, FAIL_REASON, FAIL_KIND = (
    "_rewind_fate",
    "_rewind_fail_stage",
    "_rewind_fail_reason",
    "_rewind_fail_kind",
)
EVENT, FAILED, SKIPPED, NEITHER = 0, 1, 2, 3
"""A spooled record's fate in the wave's decoding: decoded into an event, quarantined (with its
stage, reason and kind), skipped on purpose, or none of these."""
FATE_COLUMNS = (FATE, FAIL_STAGE, FAIL_REASON, FAIL_KIND)


def with_fates(batch: pa.RecordBatch, decoded: Decoded) -> pa.RecordBatch:
    """``batch`` with :data:`FATE` and the failure columns of each of its records."""
    n = batch.num_rows
    fate = np.full(n, NEITHER, dtype=np.int8)
    fate[decoded.events[ROW].to_numpy(dtype=np.int64)] = EVENT
    fate[np.asarray(decoded.skipped, dtype=np.int64)] = SKIPPED
    texts: dict[str, pa.Array] = {k: pa.nulls(n, pa.string()) for k in (FAIL_STAGE, FAIL_REASON, FAIL_KIND)}
    if decoded.failures:  # rare: built record by record
        stage: list[str | None] = [None] * n
        reason: list[str | None] = [None] * n
        kind: list[str | None] = [None] * n
        for f in decoded.failures:
            fate[f.row] = FAILED
            stage[f.row], reason[f.row], kind[f.row] = f.stage, f.reason, f.kind
        texts = {k: pa.array(v, pa.string()) for k, v in zip(texts, (stage, reason, kind), strict=True)}
    columns = {FATE: pa.array(fate, pa.int8()), **texts}
    for name, column in columns.items():
        batch = batch.append_column(name, column)
    return batch


class Replayed(Decoder):
    """A decoder that decodes nothing: it answers with the fates the wave's first decoding of the
    same records spooled (:func:`with_fates`), so a unit finished in place is decoded once. Its
    events are their positions only (``_rewind_row``): the query's rows are the translate's output."""

    def __init__(self, batch: pa.Table) -> None:
        """``batch``: the records about to be processed, in order, with the fate columns."""
        self.fate = batch[FATE].to_numpy()
        self.failed = np.flatnonzero(self.fate == FAILED)
        self.texts = [batch[k].take(self.failed).to_pylist() for k in (FAIL_STAGE, FAIL_REASON, FAIL_KIND)]

    def decode(self, batch: pa.RecordBatch) -> Decoded:
        if batch.num_rows != len(self.fate):
            raise SqlTranslateError("a unit's records changed between its decoding and its finishing")
        rows = np.flatnonzero(self.fate == EVENT)
        events = pd.DataFrame({ROW: rows}, index=pd.Index(rows, name=ROW_INDEX))
        failures = [
            Failure(int(i), stage, reason, kind or "")
            for i, stage, reason, kind in zip(self.failed, *self.texts, strict=True)
        ]
        return Decoded(events, failures, np.flatnonzero(self.fate == SKIPPED).tolist())

    def field_dtypes(self) -> dict[str, Any]:
        return {}
