"""Quarantine re-drive: the records a run quarantined, processed again after a translate fix.

``rewind quarantine list RUN`` shows what a run quarantined, by reason and record;
``rewind quarantine redrive RUN [--reason R] [--translate-version V]`` re-processes them into
the run's own staging, exactly once:

1. the candidates are the run's quarantined source records (the latest entry per record;
   rows routed by a merge policy are output rows, not records, and stay), those whose latest
   reason contains ``R`` if given, and none a committed re-drive already emitted;
2. the re-drive's id is a digest of the version and the records, and it is the unit id of its
   commits: a re-drive the sink holds already is reported, not done again (a second call after
   a crash commits nothing twice);
3. each record is rebuilt from its quarantined bytes (they are the Kafka record's) and goes
   through the same :func:`rewind.translate.process.process_batch` as a run, with the spec's
   translate at version ``V`` (a new version gives new event ids); rows carry
   ``_rewind_run_id = <run>/<re-drive id>``, which names the re-drive in their lineage. Up to
   ``redrive.spark_records`` records the driver reads their bytes and processes them; above,
   Spark tasks do (:mod:`rewind.spark.redrive_stage`) and the driver gets back files and counts;
4. records that fail again are quarantined under the re-drive's unit with their new reason;
   then the rows are committed to staging with the re-drive's counts (one sink transaction);
5. the ledger's audit gets a ``redrive`` entry with the counts (read, emitted, quarantined
   again, filtered: the conservation law, checked before anything is committed).
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.catalog import load_catalog
from rewind.core.arrow import schema_from_b64
from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.core.parquet import write_parquet
from rewind.core.store import WarehouseStore, remove_files_under
from rewind.errors import RewindError
from rewind.job.components import make_sink
from rewind.job.runner import _quarantine
from rewind.spark import redrive_stage, session
from rewind.spark.parquet_files import read_parquet_files
from rewind.spark.redrive_stage import RedriveContext, kafka_batch
from rewind.spark.session import default_parallelism
from rewind.translate.factory import lineage_options, make_decoder, make_translator, transform_name

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings

log = logging.getLogger(__name__)

REDRIVE_PREFIX = "redrive-"
"""Unit ids of re-drives (in the sink's and the quarantine's bookkeeping)."""
NOT_RECORDS = ("merge",)
"""Quarantine stages whose rows are output rows, not source records: never re-driven."""


class RedriveError(RewindError):
    """A re-drive that cannot go ahead (one line, nothing written)."""


def _context(settings: Settings, run_id: str) -> tuple[Any, Any, Any, Any]:
    """The run, its spec (secrets restored), its sink and staging."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger, usable_plan

    with open_ledger(settings) as ledger:
        run = ledger.get_run(run_id)
        plan = usable_plan(settings, ledger, run.plan_id, needed=("sink",))
    spec = plan.job_spec()
    if not run.staging:
        raise RedriveError(f"run {run_id} has no staging; there is nothing to re-drive into")
    sink = make_sink(settings, spec)
    return run, spec, sink, sink.staging_from_dict(run.staging)


ENTRY = ("run_id", "unit_id", "topic", "partition", "offset", "timestamp", "stage", "reason", "at")
"""A quarantine entry's columns but its key and value bytes: what choosing the records needs."""
SPARK_RECORDS = 300_000
"""Records above which a re-drive processes them in Spark: the default of the
``redrive.spark_records`` setting. ``bench/redrive_spark.py`` (bench/RESULTS.md), 2 cores:
the driver 2.2x faster at 100,000 records, the two even at 300,000, Spark faster at 1,000,000
(0.84x); the driver's memory grows with the records' bytes and rows, Spark's does not."""


def _quarantine_rows(
    settings: Settings, table: str, run_id: str, columns: tuple[str, ...] = ("*",)
) -> pa.Table:
    # lazy: avoids pyiceberg at import
    import pyiceberg.expressions as e
    from pyiceberg.exceptions import NoSuchTableError

    try:
        q = load_catalog(settings).load_table(table)
    except NoSuchTableError:
        # lazy: avoids pandas / pyarrow / numpy at import
        from rewind.translate.quarantine import QUARANTINE_SCHEMA

        return (
            QUARANTINE_SCHEMA.empty_table()
            if columns == ("*",)
            else QUARANTINE_SCHEMA.empty_table().select(columns)
        )
    eq: Any = e.EqualTo  # pyiceberg's pydantic signatures hide the positional form from mypy
    return q.scan(row_filter=eq("run_id", run_id), selected_fields=columns).to_arrow()


def list_quarantine(settings: Settings, run_id: str, reason: str | None = None) -> dict[str, Any]:
    """The run's quarantined records: counts by stage and reason, and each record's latest entry."""
    _, spec, sink, staging = _context(settings, run_id)
    try:
        resolved = _resolved(sink.committed_counts(staging, run_id))
    finally:
        sink.close()
    latest = _latest(_quarantine_rows(settings, spec.quarantine.table, run_id, ENTRY), reason, resolved)
    by_reason: dict[str, int] = {}
    for r in latest:
        label = f"{r['stage']}: {r['reason']}"
        by_reason[label] = by_reason.get(label, 0) + 1
    return {
        "run_id": run_id,
        "quarantine_table": spec.quarantine.table,
        "records": len(latest),
        "by_reason": dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        "entries": [
            {
                "topic": r["topic"],
                "partition": r["partition"],
                "offset": r["offset"],
                "stage": r["stage"],
                "reason": r["reason"],
                "unit_id": r["unit_id"],
            }
            for r in latest
        ],
    }


def _resolved(committed: dict[str, dict[str, Any]]) -> dict[tuple[str, int, int], str]:
    """Records a committed re-drive processed (recorded with its counts, in the same sink
    transaction as its rows), by the re-drive that did."""
    out: dict[tuple[str, int, int], str] = {}
    for unit, counts in committed.items():
        if unit.startswith(REDRIVE_PREFIX):
            for topic, partition, offset in counts.get("redriven") or []:
                out[(str(topic), int(partition), int(offset))] = unit
    return out


def _latest(
    rows: pa.Table, reason: str | None, resolved: dict[tuple[str, int, int], str]
) -> list[dict[str, Any]]:
    """One entry per quarantined source record still in quarantine, its latest (a record a
    committed re-drive processed is out, unless that re-drive quarantined it again); a reason
    filter applies to the latest entry. The latest entry of each record (by ``at``, a re-drive's
    after the run's at the same time, then the later read) is picked with Arrow's sort; only
    the picked entries become Python dicts, in (topic, partition, offset) order."""
    # lazy: avoids pyarrow / numpy at import
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = rows.filter(pc.invert(pc.is_in(rows.column("stage"), pa.array(NOT_RECORDS, pa.string()))))
    order = pa.table(
        {
            "topic": rows.column("topic"),
            "partition": rows.column("partition"),
            "offset": rows.column("offset"),
            "at": rows.column("at"),
            "again": pc.starts_with(rows.column("unit_id"), REDRIVE_PREFIX),
            "read": pa.array(np.arange(rows.num_rows)),
        }
    ).sort_by([(c, "ascending") for c in ("topic", "partition", "offset", "at", "again", "read")])
    at = order.column("read").to_numpy()
    record = [order.column(c).to_numpy(zero_copy_only=False) for c in ("topic", "partition", "offset")]
    last = np.ones(len(at), dtype=bool)  # the last row of each record's run of rows
    if len(at) > 1:
        last[:-1] = np.logical_or.reduce([c[1:] != c[:-1] for c in record])
    picked = rows.take(pa.array(at[last], pa.int64())).to_pylist()
    latest = [
        r
        for r in picked
        if (k := (r["topic"], r["partition"], r["offset"])) not in resolved or r["unit_id"] == resolved[k]
    ]
    if reason is not None:
        latest = [r for r in latest if reason in f"{r['stage']}: {r['reason']}"]
    return latest


def redrive(
    settings: Settings, run_id: str, reason: str | None = None, translate_version: str | None = None
) -> dict[str, Any]:
    """Re-process the run's quarantined records into its staging, once (steps in the module
    docstring); returns what was done."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids sqlalchemy / pandas / pyarrow / numpy at import
    from rewind.job.service import open_ledger
    from rewind.translate.process import ProcessContext, process_batch

    run, spec, sink, staging = _context(settings, run_id)
    try:
        if run.state not in ("succeeded", "rolled_back"):
            raise RedriveError(
                f"run {run_id} is {run.state}; a re-drive writes into a staging that is complete and not "
                "live: a succeeded (or rolled back) run; resume or roll back first"
            )
        if spec.source.table is not None or spec.sink.kafka is not None:
            raise RedriveError(
                f"run {run_id} writes to Kafka; re-drive needs a table staging (Iceberg or SQL)"
            )
        if translate_version is not None:
            fixed = spec.translate.model_copy(update={"version": translate_version})
            spec = spec.model_copy(update={"translate": fixed})
        committed = sink.committed_counts(staging, run_id)
        done_units = set(committed)
        version = spec.translate.version
        tried = f"{REDRIVE_PREFIX}{version}-"  # records this version failed on already stay
        quarantined = _quarantine_rows(settings, spec.quarantine.table, run_id, ENTRY)
        entries = _latest(quarantined, reason, _resolved(committed))
        # failed again under this version in a re-drive the sink holds: not again (a crash
        # between its quarantine and sink commits leaves them candidates, and the same id)
        latest = [r for r in entries if not (r["unit_id"].startswith(tried) and r["unit_id"] in done_units)]
        digest = hashlib.sha256(
            json.dumps([version, [[r["topic"], r["partition"], r["offset"]] for r in latest]]).encode()
        ).hexdigest()[:12]
        unit_id = f"{tried}{digest}"
        out: dict[str, Any] = {"run_id": run_id, "redrive": unit_id, "version": version, "reason": reason}
        if unit_id in done_units:
            return {**out, "already_done": True, **_recorded(sink, staging, run_id, unit_id)}
        if not latest:
            none = dict.fromkeys(("records_read", "emitted", "quarantined", "filtered", "rows_out"), 0)
            return {**out, "already_done": False, **none, "note": "no quarantined record to re-drive"}
        # lazy: avoids sqlalchemy at import
        from rewind.job.service import load_plan

        with open_ledger(settings) as ledger:
            schema_b64 = load_plan(ledger, run.plan_id).output_schema_b64
        schema = schema_from_b64(schema_b64)
        qsink, qstaging = _quarantine(settings, spec.quarantine.table, run_id)
        tctx = RedriveContext(
            run_id, unit_id, spec.model_dump_json(), schema_b64, sink.data_folder(staging),
            qsink.data_folder(qstaging), datetime.now(UTC),
        )  # fmt: skip
        threshold = settings.redrive.spark_records
        if len(latest) > (SPARK_RECORDS if threshold is None else threshold):
            files, qfiles, found = _in_spark(settings, spec.quarantine.table, tctx, latest)
        else:
            batch = kafka_batch(_with_bytes(settings, spec.quarantine.table, run_id, latest))
            ctx = ProcessContext(
                f"{run_id}/{unit_id}", unit_id, transform_name(spec.translate), version, tctx.extracted_at
            )
            user_schema = pa.schema([f for f in schema if not f.name.startswith("_rewind_")])
            result = process_batch(
                batch,
                make_decoder(spec.decode),
                make_translator(spec.translate),
                spec.key,
                ctx,
                output_schema=user_schema,
                **lineage_options(spec),
            )
            found = result.counts
            # the quarantine rows of a re-drive name the run (so `list` and later re-drives see them)
            named = pa.array([run_id] * result.quarantine.num_rows, pa.string())
            quarantine = result.quarantine.set_column(0, result.quarantine.schema.field(0), named)
            qfiles = (
                [write_parquet(tctx.quarantine_folder, quarantine, unit_id)] if quarantine.num_rows else []
            )
            rows = result.rows.select(schema.names).cast(schema)
            files = [write_parquet(tctx.data_folder, rows, unit_id)] if rows.num_rows else []
        found.check(unit_id, "re-drive")
        if found.records_read != len(latest):
            raise RedriveError(
                f"re-drive {unit_id} read {found.records_read} records of {len(latest)} chosen"
            )
        if qfiles and unit_id not in qsink.committed_units(qstaging, run_id):
            qsink.commit(qstaging, run_id, [unit_id], qfiles)
        faults.point("after-redrive-quarantine-commit")
        counts = found.to_dict()
        redriven = [[r["topic"], r["partition"], r["offset"]] for r in latest]
        extra = {UNIT_COUNTS_KEY: json.dumps({unit_id: {**counts, "redriven": redriven}})}
        sink.commit(staging, run_id, [unit_id], files, extra=extra)
        with open_ledger(settings) as ledger:
            details = {"redrive": unit_id, "version": version, "reason": reason, **counts}
            ledger.audit(run_id, "redrive", details)
        log.info("run %s: re-drive %s %s", run_id, unit_id, counts)
        return {**out, "already_done": False, **counts}
    finally:
        sink.close()


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["topic"], r["partition"], r["offset"], r["unit_id"], r["at"])


def _with_bytes(settings: Settings, table: str, run_id: str, latest: list[dict[str, Any]]) -> pa.Table:
    """The chosen entries with their key and value bytes, in their order (driver path)."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    rows = _quarantine_rows(settings, table, run_id)
    where = {
        _key(r): i
        for i, r in enumerate(rows.select(["topic", "partition", "offset", "unit_id", "at"]).to_pylist())
    }
    return rows.take(pa.array([where[_key(r)] for r in latest], pa.int64()))


def _in_spark(
    settings: Settings, table: str, ctx: Any, latest: list[dict[str, Any]]
) -> tuple[list[str], list[str], Any]:
    """Step 3 in Spark tasks: the chosen entries' bytes read by Spark from the quarantine's
    files that may hold the run's rows (pyiceberg prunes them by their ``run_id`` bounds), the
    run's rows joined with the chosen entries, processed and written in the tasks."""
    # lazy: avoids pyspark / pyiceberg / pyarrow at import
    import pyarrow as pa
    import pyiceberg.expressions as e
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    spark = session(settings)
    names = ["topic", "partition", "offset", "unit_id", "at"]
    chosen = pa.table(
        {
            "topic": pa.array([r["topic"] for r in latest], pa.string()),
            "partition": pa.array([r["partition"] for r in latest], pa.int32()),
            "offset": pa.array([r["offset"] for r in latest], pa.int64()),
            "unit_id": pa.array([r["unit_id"] for r in latest], pa.string()),
            "at": pa.array([r["at"] for r in latest], pa.timestamp("us", tz="UTC")),
        }
    )
    q = load_catalog(settings).load_table(table)
    eq: Any = e.EqualTo
    tasks = list(q.scan(row_filter=eq("run_id", ctx.run_id)).plan_files())
    if any(t.delete_files for t in tasks):
        raise RedriveError(f"{table} has row-level delete files; compact it before a re-drive")
    store = WarehouseStore.from_catalog_properties(q.io.properties)
    schema = from_arrow_schema(q.schema().as_arrow())
    files = read_parquet_files(spark, [t.file.file_path for t in tasks], schema, store=store)
    rows = files.where(F.col("run_id") == ctx.run_id)
    # the chosen coordinates reach the tasks as a file beside the table's data, not inside the
    # plan: a local relation of a million rows is serialized into every task (the JVM driver's
    # heap ran out at 1,000,000 records, bench/redrive_spark.py)
    folder = f"{q.location().rstrip('/')}/_rewind_redrive/{ctx.unit_id}"
    path = write_parquet(folder, chosen, "chosen", store)
    try:
        picked = read_parquet_files(spark, [path], from_arrow_schema(chosen.schema), store=store)
        entries = rows.join(picked, on=names, how="inner")
        return redrive_stage.run_redrive(
            entries, ctx, max(default_parallelism(spark), -(-len(latest) // 100_000))
        )
    finally:
        remove_files_under(folder, [path], store)


def _recorded(sink: Any, staging: Any, run_id: str, unit_id: str) -> dict[str, Any]:
    counts: dict[str, Any] = dict(sink.committed_counts(staging, run_id).get(unit_id) or {})
    counts.pop("redriven", None)
    return counts
