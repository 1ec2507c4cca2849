"""A snapshot's rows shaped as a run's partial rows, for the fold (``source.kafka.snapshot``).

The fold stage folds the rows of one run (``_rewind_run_id`` = the run); a snapshot's rows are
the state the run's new events are folded into, so they join the run's rows with the run's id
and, column by column, the run's types. Lineage columns the snapshot lacks (a table not made by
Rewind) are null, which sorts its rows before every event of their key; a Rewind read model
keeps its own lineage, that of the last event folded into it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rewind.core.columns import LINEAGE_PREFIX, RUN_ID
from rewind.errors import RewindError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SnapshotRowsError(RewindError):
    """The snapshot's table lacks a column of the read model."""


def with_state_rows(rows: DataFrame, state: DataFrame, run_id: str, table: str) -> DataFrame:
    """``rows`` (the run's staged rows) with the snapshot's rows added as rows of ``run_id``."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    missing = [c for c in rows.columns if not c.startswith(LINEAGE_PREFIX) and c not in state.columns]
    if missing:
        raise SnapshotRowsError(
            f"snapshot table {table} lacks the read model's column(s) {', '.join(missing)}; "
            "snapshot a table of the same read model"
        )
    columns = []
    for field in rows.schema.fields:
        if field.name == RUN_ID:
            value = F.lit(run_id)
        elif field.name in state.columns:
            value = F.col(field.name)
        else:
            value = F.lit(None)
        columns.append(value.cast(field.dataType).alias(field.name))
    return rows.unionByName(state.select(*columns))
