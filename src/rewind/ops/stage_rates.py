"""Per-stage rates of a rehearsal: what each stage of the pipeline does per second.

Inside a Spark task read, decode, translate and write interleave batch by batch, so the run
itself can only say how long its tasks took together (``spark_s``) and how long its commits
took (``commit_s``, from :func:`rewind.job.runner.execute`'s ``timings``). To say which stage
bounds the job, the driver re-runs the slice's first records (up to ``SAMPLE`` of its Kafka
pieces) through each stage alone, on one core, timed separately:

* ``read``: the bare consumer the tasks use (:func:`rewind.spark.kafka_fetch.fetch_ranges`),
  or a table source's reader with its rows turned into records (:func:`read_table_sample`);
* ``decode``: the spec's decoder on those records;
* ``translate``: :func:`rewind.translate.process.process_batch` less its decode (translate,
  lineage, quarantine routing);
* ``write``: the output rows into a Parquet file, as a task writes them;
* ``commit``: the run's own commits (records committed per second of committing).

Single-core rates are comparable with each other; the run's end-to-end rate (all cores, with
Spark's overhead) is reported beside them as ``spark``.
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.core.parquet import open_writer
from rewind.core.ranges import OffsetRange
from rewind.spark.kafka_fetch import fetch_ranges
from rewind.tables.placement import KeyRange
from rewind.tables.selection import choose
from rewind.translate.factory import make_decoder, make_translator, transform_name

if TYPE_CHECKING:
    import pyarrow as pa

    from rewind.config import Settings
    from rewind.core.units import WorkUnit
    from rewind.spec import JobSpec

SAMPLE = 20_000
STAGES = ("read", "decode", "translate", "write", "commit")


def _rate(records: int, seconds: float) -> float | None:
    return round(records / seconds, 1) if records and seconds > 0 else None


def measure_stages(
    conf: dict[str, Any],
    spec: JobSpec,
    units: tuple[WorkUnit, ...],
    timings: list[dict[str, Any]],
    sample: tuple[pa.Table | None, float] | None = None,
) -> dict[str, Any]:
    """Rates per stage (records/s), the bottleneck and what they were measured on; ``sample``:
    records already read and the seconds it took (a table source's, :func:`read_table_sample`),
    else the slice's first Kafka records are fetched here."""
    stages: dict[str, dict[str, Any]] = {}
    table, read_s = sample if sample is not None else _read_kafka_sample(conf, units)
    if table is not None:
        n = table.num_rows
        stages["read"] = {"records": n, "seconds": round(read_s, 4), "rate": _rate(n, read_s)}
        if n:
            stages.update(_downstream(spec, table))
    committed = sum(t["records"] for t in timings)
    commit_s = sum(t["commit_s"] for t in timings)
    stages["commit"] = {
        "records": committed,
        "seconds": round(commit_s, 4),
        "rate": _rate(committed, commit_s),
    }
    spark_s = sum(t["spark_s"] for t in timings)
    rated = {k: v["rate"] for k, v in stages.items() if v.get("rate")}
    bottleneck = min(rated, key=lambda k: rated[k]) if rated else None
    return {
        "stages": stages,
        "bottleneck": bottleneck,
        "spark": {"records": committed, "seconds": round(spark_s, 4), "rate": _rate(committed, spark_s)},
        "units": sum(t["units"] for t in timings),
    }


def _read_kafka_sample(conf: dict[str, Any], units: tuple[WorkUnit, ...]) -> tuple[pa.Table | None, float]:
    """Up to ``SAMPLE`` of the slice's Kafka records, one piece per partition (the consumer
    reads distinct partitions at once), and the seconds the fetch took."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa


    ranges, left, seen = [], SAMPLE, set()
    for u in (u for u in units if u.source == "kafka"):
        if left <= 0:
            break
        if (u.topic, u.partition) in seen:
            continue
        seen.add((u.topic, u.partition))
        ranges.append(OffsetRange(u.topic, u.partition, u.start, min(u.end, u.start + left)))
        left -= ranges[-1].size
    if not ranges:
        return None, 0.0
    t0 = time.monotonic()
    batches = list(fetch_ranges(conf, ranges, poll_timeout_s=30))
    read_s = time.monotonic() - t0
    return (pa.Table.from_batches(batches) if batches else pa.table({})), read_s


def read_table_sample(
    settings: Settings, spec: JobSpec, read_plan: dict[str, Any]
) -> tuple[pa.Table | None, float]:
    """Up to ``SAMPLE`` rows of a table source's first key ranges, read as a task reads them
    (the database's batches turned into Kafka-shaped records), and the seconds it took."""
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.tables.plan import reader_of
    from rewind.tables.records import as_records

    table = spec.source.table
    assert table is not None
    facts = read_plan["table"]
    reader = reader_of(settings, spec)
    batches: list[pa.RecordBatch] = []
    left = SAMPLE
    t0 = time.monotonic()
    try:
        chosen = choose(table, facts.get("key_type"), pinned=facts.get("ids_digest"))
        for number, r in enumerate(KeyRange.from_dict(r) for r in facts["ranges"]):
            offset = 0
            for rows in reader.read(chosen.selection, r.lo, r.hi):
                batch = as_records(rows, table.key, table.label, number, offset, datetime.now(UTC))
                offset += batch.num_rows
                batches.append(batch.slice(0, left))
                left -= batches[-1].num_rows
                if left <= 0:
                    break
            if left <= 0:
                break
    finally:
        reader.close()
    read_s = time.monotonic() - t0
    return (pa.Table.from_batches(batches) if batches else None), read_s


def _downstream(spec: JobSpec, table: pa.Table) -> dict[str, dict[str, Any]]:
    """decode, translate and write, each timed alone on ``table``."""
    # lazy: avoids numpy, pandas, pyarrow at import
    from rewind.translate.process import ProcessContext, process_batch

    n = table.num_rows
    decoder = make_decoder(spec.decode)
    t0 = time.monotonic()
    for b in table.to_batches():
        decoder.decode(b)
    decode_s = time.monotonic() - t0
    translator = make_translator(spec.translate)
    ctx = ProcessContext(
        "rehearsal",
        "stages",
        transform_name(spec.translate),
        spec.translate.version,
        datetime.now(UTC),
    )
    t0 = time.monotonic()
    result = process_batch(table, decoder, translator, spec.key, ctx)
    process_s = time.monotonic() - t0
    translate_s = max(process_s - decode_s, 1e-9)
    with tempfile.TemporaryDirectory(prefix="rewind-rehearse-") as folder:
        t0 = time.monotonic()
        writer, _ = open_writer(f"file://{folder}", "stages", result.rows.schema)
        writer.write_table(result.rows)
        writer.close()
        write_s = time.monotonic() - t0
    return {
        "decode": {"records": n, "seconds": round(decode_s, 4), "rate": _rate(n, decode_s)},
        "translate": {"records": n, "seconds": round(translate_s, 4), "rate": _rate(n, translate_s)},
        "write": {
            "records": n,
            "rows": result.rows.num_rows,
            "seconds": round(write_s, 4),
            "rate": _rate(n, write_s),
        },
    }


def wave_costs(timings: list[dict[str, Any]], cores: int) -> tuple[float | None, float]:
    """A run's waves split into a per-record cost and a fixed cost per wave:
    ``(records per core-second, fixed seconds per wave)``.

    A wave's Spark job pays a fixed cost (the job and its tasks started, Python workers, a
    consumer's first fetch) whatever its size; on a rehearsal's slice that cost can be most of
    the time, and dividing the records by the whole time extrapolated a 3,000-record topic's full
    run at 3-4x its real time. The tasks time their own stages (read, decode, translate, write:
    ``stages`` of each wave's timing, summed over tasks), which is the per-record work; what the
    wave took beyond its tasks' work spread over the cores it could use is its fixed cost. A wave
    whose tasks did not time their stages (nothing to split) counts whole as per-record work.
    """
    records = sum(int(t["records"]) for t in timings)
    worked = sum(sum((t.get("stages") or {}).values()) for t in timings)
    if not records:
        return None, 0.0
    if worked <= 0:
        spark_s = sum(float(t["spark_s"]) for t in timings)
        return (round(records / (spark_s * max(1, cores)), 1) if spark_s > 0 else None), 0.0
    fixed = [
        max(
            0.0,
            float(t["spark_s"]) - sum((t.get("stages") or {}).values()) / max(1, min(cores, int(t["units"]))),
        )
        for t in timings
    ]
    return round(records / worked, 1), round(sum(fixed) / len(fixed), 3)
