"""A reconstruction's events read back from its table sink (Iceberg, SQL), in business order.

The outcome check (:mod:`rewind.verify.outcome`) replays an entity's events in the order they
happened. A topic keeps that order per partition; a table keeps no row order, so it is rebuilt
from the lineage every event row carries:

1. the run's rows of the staging (``_rewind_run_id``), read through the sink's own reader;
2. sorted by entity, then by source row: the key range (``_rewind_source_partition``) and the
   state's position in the range's business order (``_rewind_source_offset``);
3. events of one state (one pair) by their ordinal, the order the transition returned them in:
   not a column, but the event id is the hash of the source row and that ordinal
   (:func:`rewind.translate.lineage.event_id`), so each row's ordinal is the one whose id it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.core.columns import (
    EVENT_ID,
    LINEAGE_PREFIX,
    RUN_ID,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    TRANSFORM,
)
from rewind.core.columns import TRANSFORM_VERSION as VERSION
from rewind.job.components import make_sink
from rewind.spark import session

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from rewind.config import Settings
    from rewind.spec import JobSpec


def table_events(settings: Settings, spec: JobSpec, staging: dict[str, Any], run_id: str) -> pd.DataFrame:
    """Steps 1-3: the run's events with their user columns and ``_key`` (the entity's text),
    ``_partition`` and ``_offset`` (their place in that order), as the topic's reader gives them."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F


    sink = make_sink(settings, spec)
    try:
        rows = sink.read(session(settings), sink.staging_from_dict(staging))  # 1.
        frame: pd.DataFrame = rows.filter(F.col(RUN_ID) == run_id).toPandas()
    finally:
        close = getattr(sink, "close", None)
        if close is not None:
            close()
    key = spec.key[0]
    if frame.empty:
        return frame
    frame["_key"] = frame[key].astype(str)
    frame["_ordinal"] = event_ordinals(frame)
    order = ["_key", SOURCE_PARTITION, SOURCE_OFFSET, "_ordinal"]  # 2., 3.
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    frame["_partition"] = 0
    frame["_offset"] = range(len(frame))
    return frame.drop(columns=[c for c in frame.columns if c.startswith(LINEAGE_PREFIX) or c == "_ordinal"])


def event_ordinals(frame: pd.DataFrame) -> np.ndarray:
    """Step 3: each event's ordinal among its source row's events (-1 when no ordinal gives its
    id: such a row sorts first within its source row, in the order read)."""
    # lazy: avoids numpy at import
    import numpy as np

    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.translate.lineage import table_event_ids

    sizes = frame.groupby([SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET], sort=False)[EVENT_ID].transform(
        "size"
    )
    ordinals = np.full(len(frame), -1, dtype=np.int64)
    transform, version = str(frame[TRANSFORM].iloc[0]), str(frame[VERSION].iloc[0])
    for (topic, partition), rows in frame.groupby([SOURCE_TOPIC, SOURCE_PARTITION], sort=False):
        at = frame.index.get_indexer(rows.index)
        offsets = rows[SOURCE_OFFSET].to_numpy(dtype=np.int64)
        ids = rows[EVENT_ID].to_numpy(dtype=object)
        found = np.full(len(at), -1, dtype=np.int64)
        for k in range(int(sizes.iloc[at].max())):  # a source row's events are few: one pass each
            expected = table_event_ids(
                str(topic), int(partition), offsets, np.full(len(at), k), transform, version
            ).to_numpy(zero_copy_only=False)
            found[(found < 0) & (expected == ids)] = k
        ordinals[at] = found
    return ordinals
