"""A backfill job over a history source: archive below the declared log start, Kafka above.

The embedded broker cannot expire records, so the log start is declared (as in production the
broker's low watermark would be): records below it must come from the archive only, the
rest from Kafka only, every record exactly once, with lineage pointing at the true offsets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rewind.config import load_settings
from rewind.history import archive_once
from rewind.job.plan import PlanRefused
from rewind.job.service import plan_job, run_job
from rewind.sinks.iceberg import IcebergStaging
from rewind.spec import parse_spec
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.kafka_util import create_topic, produce

N = 1200


def _spec(topic: str, table: str, archive: str, declared: int, allow_gaps: bool = False) -> Any:
    return parse_spec(_spec_data(topic, table, archive, declared, allow_gaps))


def _spec_data(
    topic: str, table: str, archive: str, declared: int, allow_gaps: bool = False
) -> dict[str, Any]:
    return {
        "name": "history-job",
        "source": {
            "history": {
                "topics": [topic],
                "archive": archive,
                "declared_log_start": {topic: {"0": declared, "1": declared}},
                "allow_gaps": allow_gaps,
            }
        },
        "decode": "json",
        "translate": {"function": "tests.job_fixtures:order_amounts", "version": "1"},
        "key": ["order_id"],
        "sink": {"iceberg": {"table": table}},
        "run": {"work_unit_records": 250},
    }


def test_a_job_across_the_seam_reads_every_record_once(
    spark: Any, bootstrap: str, kafka_conf: dict[str, Any], topic_name: str, tmp_path: Path
) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path)}, cwd=tmp_path
    )
    create_topic(kafka_conf, topic_name, 2)
    records = [
        (
            i % 2,
            str(i).encode(),
            json.dumps({"order_id": i, "status": "paid", "amount": i / 4}).encode(),
            1_760_000_000_000 + i * 1000,
        )
        for i in range(N)
    ]
    produce(kafka_conf, topic_name, records)
    archive = "lake.orders_archive"
    archive_once(settings, [topic_name], archive, spark=spark)

    plan = plan_job(settings, _spec(topic_name, "an.history_out", archive, declared=400))
    assert plan.ok, plan.failed_gates()
    sources = {(u.partition, u.source) for u in plan.units}
    assert sources == {(0, "archive"), (1, "archive"), (0, "kafka"), (1, "kafka")}
    below = [u for u in plan.units if u.source == "archive"]
    assert all(u.end <= 400 for u in below), "archive units stay below the declared log start"

    # a window wholly below the log start is sampled from the archive (no Kafka unit to read)
    lake_only = plan_job(settings, _spec(topic_name, "an.history_lake", archive, declared=N // 2))
    assert {u.source for u in lake_only.units} == {"archive"}
    assert lake_only.estimates["sample_source"] == "archive"
    # the first unit of each partition, [0, 250): offsets 0..249 of partition p are records
    # 2*o + p, so the sample holds records 0..499, and each of them carries at least its value
    assert lake_only.estimates["sample_records"] == 2 * 250
    sampled_values = sum(len(value) for _p, _k, value, _t in records[:500]) / 500
    assert lake_only.estimates["avg_record_bytes"] > sampled_values

    outcome = run_job(settings, _spec(topic_name, "an.history_out", archive, declared=400))
    assert outcome.counts.records_read == N
    assert outcome.counts.rows_out == N
    from rewind.catalog import load_catalog

    staging = IcebergStaging.from_dict(outcome.staging)
    rows = load_catalog(settings).load_table(staging.table).scan().to_arrow().to_pylist()
    coordinates = sorted((r["_rewind_source_partition"], r["_rewind_source_offset"]) for r in rows)
    assert coordinates == sorted((i % 2, i // 2) for i in range(N))  # every record once, true offsets
    assert sorted(r["order_id"] for r in rows) == list(range(N))


def test_offsets_never_archived_and_gone_from_kafka_refuse_the_plan(
    spark: Any, bootstrap: str, kafka_conf: dict[str, Any], topic_name: str, tmp_path: Path
) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path)}, cwd=tmp_path
    )
    create_topic(kafka_conf, topic_name, 2)

    def batch(first: int) -> list[tuple[int, bytes | None, bytes | None, int | None]]:
        return [
            (i % 2, None, json.dumps({"order_id": i, "status": "paid", "amount": 1.0}).encode(), None)
            for i in range(first, first + 100)
        ]

    produce(kafka_conf, topic_name, batch(0))  # offsets 0..49 of each partition
    archive = "lake.part_archive"
    archive_once(settings, [topic_name], archive, spark=spark)
    produce(kafka_conf, topic_name, batch(100))  # offsets 50..99, never archived
    # the log "starts" at 80: offsets 50..79 are neither archived nor in Kafka any more
    plan = plan_job(settings, _spec(topic_name, "an.gappy", archive, declared=80))
    coverage = next(g for g in plan.gates if g.name == "coverage")
    assert not coverage.ok
    assert f"{topic_name}/0 [50, 80)" in coverage.detail and f"{topic_name}/1 [50, 80)" in coverage.detail, (
        coverage.detail
    )
    with pytest.raises(PlanRefused, match="coverage"):
        run_job(settings, _spec(topic_name, "an.gappy", archive, declared=80))
    # `rewind plan` says the same in one line (it crashed with KeyError: 'partitions')
    data = _spec_data(topic_name, "an.gappy", archive, declared=80)
    spec_path = jf.write_spec(tmp_path / "gappy.yaml", data)
    shown = cli_in_process.rewind(["plan", str(spec_path)], cwd=tmp_path, env=jf.child_env(settings))
    assert shown.returncode == 1, shown.stderr
    assert "Traceback" not in shown.stderr, shown.stderr
    refusal = [line for line in shown.stderr.splitlines() if "refused by gate coverage" in line]
    assert len(refusal) == 1 and "[50, 80)" in refusal[0], shown.stderr
    # allowed: the plan runs and records the lost ranges
    allowed = plan_job(settings, _spec(topic_name, "an.gappy", archive, declared=80, allow_gaps=True))
    assert allowed.ok
    lost = [g for g in allowed.read_plan["gaps"] if g["kind"] == "lost"]
    assert sorted((g["partition"], g["start"], g["end"]) for g in lost) == [(0, 50, 80), (1, 50, 80)]


def test_a_sql_translate_across_the_seam_equals_the_python_translate(
    spark: Any, bootstrap: str, kafka_conf: dict[str, Any], topic_name: str, tmp_path: Path
) -> None:
    """A wave holding archive units runs the query over records Spark read from the lake (the
    persisted path of :mod:`rewind.spark.sql_wave`), with the view typed from the wave's first
    records (schemaless JSON): the same rows as a Python translate doing the same."""
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path)}, cwd=tmp_path
    )
    create_topic(kafka_conf, topic_name, 2)
    n = 600
    records = [
        (i % 2, str(i).encode(), json.dumps({"order_id": i, "amount": i / 4}).encode(), 1_760_000_000_000 + i)
        for i in range(n)
    ]
    produce(kafka_conf, topic_name, records)
    archive = "lake.orders_sql_archive"
    archive_once(settings, [topic_name], archive, spark=spark)

    def run(table: str, translate: dict[str, Any]) -> list[tuple[Any, ...]]:
        data = _spec_data(topic_name, table, archive, declared=150)
        data["translate"] = {**translate, "version": "1", "name": "orders"}
        outcome = run_job(settings, parse_spec(data), units_per_wave=4)
        assert outcome.counts.records_read == n and outcome.counts.balanced
        from rewind.catalog import load_catalog

        staging = IcebergStaging.from_dict(outcome.staging)
        rows = load_catalog(settings).load_table(staging.table).scan().to_arrow().to_pylist()
        return sorted(
            (
                r["_rewind_event_id"],
                r["_rewind_source_partition"],
                r["_rewind_source_offset"],
                r["order_id"],
                r["amount"],
            )
            for r in rows
        )

    sql = run(
        "an.history_sql", {"sql": "SELECT _rewind_row, order_id, amount FROM events WHERE amount >= 10"}
    )
    python = run("an.history_py", {"function": "tests.test_job_history:ten_or_more"})
    assert sql == python and len(sql) == n - 40


def ten_or_more(events: Any) -> Any:
    return events[events["amount"] >= 10][["_rewind_row", "order_id", "amount"]]
