"""The Spark part of a large quarantine re-drive: the records processed in tasks, as a wave's are.

``rewind quarantine redrive`` (:mod:`rewind.job.redrive`) picks the records to re-drive in the
driver from the quarantine's coordinate columns (no key or value bytes). Below a threshold the
driver reads their bytes and processes them itself; above it, the job layer hands this stage a
DataFrame of the chosen quarantine entries (their bytes read by Spark from the quarantine
table's files), and each task:

1. rebuilds the Kafka records of its entries (key, value, topic, partition, offset, timestamp),
2. runs them through :func:`rewind.translate.process.process_batch` with the spec's decoder and
   translate at the re-drive's version, as the driver path and a wave do,
3. names the run in the quarantine rows (a re-drive's records stay the run's), and
4. writes one Parquet file of rows (data folder) and one of quarantine rows (quarantine
   table's folder), returning their paths and its counts.

The driver then commits the files exactly as the driver path does. Nothing is visible until
then: a failed stage leaves only orphan files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.counts import RecordCounts
from rewind.core.parquet import open_writer
from rewind.core.store import WarehouseStore, activate, active_store
from rewind.spark.job_stage import StageError, task_error
from rewind.spec import JobSpec
from rewind.translate.factory import lineage_options, make_decoder, make_translator, transform_name

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

RESULT_SCHEMA = "data_file string, quarantine_file string, counts string"
ENTRY_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
"""The columns of a quarantine entry a re-drive needs (the Kafka record's)."""


@dataclass(frozen=True)
class RedriveContext:
    """What a task needs, as plain data (pickled to every task)."""

    run_id: str
    unit_id: str
    """The re-drive's id: its rows' run id is ``<run>/<unit_id>``."""
    spec_json: str
    """The spec with the translate at the re-drive's version."""
    output_schema_b64: str
    data_folder: str
    quarantine_folder: str
    extracted_at: datetime
    store: WarehouseStore = field(default_factory=active_store)


def kafka_batch(entries: pa.Table) -> pa.Table:
    """Quarantine entries as the Kafka records they were (the reader's schema)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    return pa.table(
        {
            "key": entries.column("key").cast(pa.binary()),
            "value": entries.column("value").cast(pa.binary()),
            "topic": entries.column("topic").cast(pa.string()),
            "partition": entries.column("partition").cast(pa.int32()),
            "offset": entries.column("offset").cast(pa.int64()),
            "timestamp": entries.column("timestamp").cast(pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * entries.num_rows, pa.int32()),
        }
    )


class RedriveRecords:
    """``mapInArrow``: quarantine entries in, one result row per task out."""

    def __init__(self, ctx: RedriveContext) -> None:
        self.ctx = ctx

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # lazy: avoids pyarrow at import
        import pyarrow as pa

        # lazy: avoids numpy, pandas, pyarrow at import
        from rewind.translate.process import ProcessContext, process_batch

        ctx = self.ctx
        activate(ctx.store)
        spec = JobSpec.model_validate_json(ctx.spec_json)
        decoder, translator = make_decoder(spec.decode), make_translator(spec.translate)
        schema = schema_from_b64(ctx.output_schema_b64)
        user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
        pctx = ProcessContext(
            f"{ctx.run_id}/{ctx.unit_id}", ctx.unit_id, transform_name(spec.translate),
            spec.translate.version, ctx.extracted_at,
        )  # fmt: skip
        lineage = lineage_options(spec)
        counts = RecordCounts()
        writers: dict[str, tuple[Any, str]] = {}
        try:
            for batch in batches:
                if not batch.num_rows:
                    continue
                records = kafka_batch(pa.Table.from_batches([batch]))
                result = process_batch(
                    records, decoder, translator, spec.key, pctx, output_schema=user_schema, **lineage
                )
                counts = counts.merge(result.counts)
                rows = result.rows.select(schema.names).cast(schema)
                named = pa.array([ctx.run_id] * result.quarantine.num_rows, pa.string())
                quarantine = result.quarantine.set_column(0, result.quarantine.schema.field(0), named)
                for kind, table, folder in (
                    ("data", rows, ctx.data_folder),
                    ("quarantine", quarantine, ctx.quarantine_folder),
                ):
                    if table.num_rows:
                        if kind not in writers:
                            writers[kind] = open_writer(folder, ctx.unit_id, table.schema, ctx.store)
                        writers[kind][0].write_table(table)
        finally:
            for writer, _ in writers.values():
                writer.close()
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "data_file": writers["data"][1] if "data" in writers else "",
                    "quarantine_file": writers["quarantine"][1] if "quarantine" in writers else "",
                    "counts": json.dumps(counts.to_dict()),
                }
            ],
            schema=pa.schema(
                [("data_file", pa.string()), ("quarantine_file", pa.string()), ("counts", pa.string())]
            ),
        )


def run_redrive(
    entries: DataFrame, ctx: RedriveContext, tasks: int
) -> tuple[list[str], list[str], RecordCounts]:
    """Steps 1-4 of the module docstring over ``entries`` (:data:`ENTRY_COLUMNS`) in ``tasks``
    tasks; the rows' files, the quarantine's files and the summed counts."""
    spread = entries.select(*ENTRY_COLUMNS).repartition(max(1, tasks))
    try:
        results = spread.mapInArrow(RedriveRecords(ctx), RESULT_SCHEMA).collect()
    except Exception as exc:
        raise StageError(f"re-drive {ctx.unit_id} of run {ctx.run_id} failed: {task_error(exc)}") from exc
    counts = RecordCounts()
    data, quarantine = [], []
    for row in results:
        counts = counts.merge(RecordCounts.from_dict(json.loads(row["counts"])))
        if row["data_file"]:
            data.append(row["data_file"])
        if row["quarantine_file"]:
            quarantine.append(row["quarantine_file"])
    return sorted(data), sorted(quarantine), counts
