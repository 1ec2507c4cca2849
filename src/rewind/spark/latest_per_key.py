"""``source.kafka.latest_per_key``: a window read as the snapshot a compacted topic would give.

Log compaction keeps, per topic-partition, the last record of each key and eventually drops a
key whose last record is a tombstone (a null value). Rewind does the same on the window itself,
so the result does not depend on whether (or how far) the broker ever compacted:

1. before the first wave, one Spark job reads every unit of the run (log and archive) and
   keeps, per ``(topic, partition, key)`` with a non-null key, the highest offset and whether
   that record is a tombstone;
2. the offsets of the last records that are not tombstones travel to every task
   (:class:`LatestPerKey`, sorted arrays per partition: 8 bytes per distinct key);
3. a task processes only those records and the records with a null key (they cannot be
   superseded: compaction refuses them); every other record is counted as filtered, as
   ``superseded`` or, a last tombstone, ``deleted``.

The kept record goes through decode and translate unchanged, so its row carries the kept
record's own lineage (topic, partition, offset, timestamp, event id). The decision is
deterministic for a fixed window, so a resumed run filters exactly as the first attempt did.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rewind.core.counts import RecordCounts
from rewind.spark.job_stage import wave_source

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from rewind.spark.job_stage import ArchiveReader, StageContext


@dataclass(frozen=True)
class LatestPerKey:
    """Per ``(topic, partition)``: the sorted offsets of the records kept, and the totals."""

    kept: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    superseded: int = 0
    deleted: int = 0

    def to_audit(self) -> dict[str, int]:
        return {
            "kept": sum(len(v) for v in self.kept.values()),
            "superseded": self.superseded,
            "deleted": self.deleted,
        }

    def split(self, records: pa.Table, topic: str, partition: int) -> tuple[pa.Table, RecordCounts]:
        """The records of one partition to process, and the counts of those it leaves out
        (all filtered)."""
        # lazy: avoids numpy, pyarrow at import
        import numpy as np
        import pyarrow as pa

        kept = self.kept.get((topic, partition), np.empty(0, dtype=np.int64))
        offsets = records["offset"].to_numpy()
        mask = np.isin(offsets, kept) | records["key"].is_null().to_numpy()
        dropped = int(len(mask) - mask.sum())
        if not dropped:
            return records, RecordCounts()
        return records.filter(pa.array(mask)), RecordCounts(records_read=dropped, filtered=dropped)


def latest_per_key(
    spark: SparkSession, ctx: StageContext, read_archive: ArchiveReader | None
) -> LatestPerKey:
    """Step 1 above, over every unit of ``ctx`` (progress is not reported: the waves do)."""
    # lazy: avoids numpy, pyspark at import
    import numpy as np
    from pyspark.sql import functions as F

    source = wave_source(spark, replace(ctx, progress=None), read_archive)
    if source is None:
        return LatestPerKey()
    keyed = source.where(F.col("key").isNotNull())
    last = keyed.groupBy("topic", "partition", "key").agg(
        F.max(F.struct(F.col("offset"), F.col("value").isNull().alias("tombstone"))).alias("last"),
        F.count(F.lit(1)).alias("n"),
    )
    rows = last.select("topic", "partition", "last.offset", "last.tombstone", "n").collect()
    kept: dict[tuple[str, int], list[int]] = {}
    superseded = deleted = 0
    for row in rows:
        superseded += int(row["n"]) - 1
        if row["tombstone"]:
            deleted += 1
        else:
            kept.setdefault((str(row["topic"]), int(row["partition"])), []).append(int(row["offset"]))
    arrays: dict[tuple[str, int], Any] = {
        tp: np.sort(np.asarray(offsets, dtype=np.int64)) for tp, offsets in kept.items()
    }
    return LatestPerKey(arrays, superseded, deleted)
