"""``lineage.source_system`` and ``lineage.effective_time_column``: on every output row.

``process_batch`` adds the columns after Rewind's other lineage (tested without Spark on real
Kafka-shaped batches), bad specs are one line, and a real run (tansu, Spark, Iceberg) writes
them on every row of its staging with exactly the values the events imply.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from typing import Any

import pyarrow as pa
import pytest

from rewind.core.columns import EFFECTIVE_TIME, LINEAGE_COLUMNS, SOURCE_SYSTEM
from rewind.errors import SpecError
from rewind.spec import parse_spec
from rewind.translate.exceptions import TranslateOutputError
from rewind.translate.factory import make_decoder
from rewind.translate.process import ProcessContext, process_batch
from tests import job_fixtures as jf

BASE_MS = 1_790_000_000_000


def kafka_batch(values: list[dict[str, Any]]) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array([json.dumps(v).encode() for v in values], pa.binary()),
            "topic": pa.array(["orders"] * n),
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([BASE_MS + i for i in range(n)], pa.timestamp("ms", tz="UTC")),
            "timestampType": pa.array([0] * n, pa.int32()),
        }
    )


def spec(**lineage: Any) -> Any:
    return parse_spec(
        {
            "name": "lineage",
            "source": {"kafka": {"topics": ["orders"]}},
            "decode": {"format": "json", "schema": {"order_id": "long", "placed_on": "date"}},
            "translate": {
                "function": "tests.test_lineage_fields:placed",
                "version": "1",
                "output_schema": {"order_id": "long", "placed_on": "date"},
            },
            "key": ["order_id"],
            "sink": {"iceberg": {"table": "shop.placed"}},
            **({"lineage": lineage} if lineage else {}),
        }
    )


def placed(events: Any) -> Any:
    return events[["_rewind_row", "order_id", "placed_on"]]


def run_batch(job: Any, values: list[dict[str, Any]]) -> Any:
    from rewind.translate.factory import lineage_options, make_translator

    ctx = ProcessContext("r1", "u1", "placed", "1", datetime(2026, 1, 1, tzinfo=UTC))
    return process_batch(
        kafka_batch(values),
        make_decoder(job.decode),
        make_translator(job.translate),
        job.key,
        ctx,
        **lineage_options(job),
    )


def test_both_columns_on_every_row_after_the_others() -> None:
    job = spec(source_system="orders-service", effective_time_column="placed_on")
    values = [{"order_id": 1, "placed_on": "2026-03-01"}, {"order_id": 2, "placed_on": "2026-03-02"}]
    out = run_batch(job, values)
    names = out.rows.column_names
    assert names[-2:] == [SOURCE_SYSTEM, EFFECTIVE_TIME]
    assert names[-2 - len(LINEAGE_COLUMNS) : -2] == list(LINEAGE_COLUMNS)
    assert out.rows.column(SOURCE_SYSTEM).to_pylist() == ["orders-service"] * 2
    assert out.rows.column(EFFECTIVE_TIME).to_pylist() == [
        datetime(2026, 3, 1, tzinfo=UTC),
        datetime(2026, 3, 2, tzinfo=UTC),
    ]
    assert out.rows.column("placed_on").to_pylist() == [date(2026, 3, 1), date(2026, 3, 2)]


def test_without_the_section_rows_are_as_before() -> None:
    out = run_batch(spec(), [{"order_id": 1, "placed_on": "2026-03-01"}])
    assert SOURCE_SYSTEM not in out.rows.column_names and EFFECTIVE_TIME not in out.rows.column_names


def test_an_effective_time_that_is_not_a_time_is_one_line() -> None:
    job = parse_spec({**spec().canonical(), "lineage": {"effective_time_column": "order_id"}})
    with pytest.raises(TranslateOutputError) as err:
        run_batch(job, [{"order_id": 1, "placed_on": "2026-03-01"}])
    assert str(err.value) == (
        "lineage.effective_time_column 'order_id' is int64, not a time; return it as a timestamp or date "
        "(or type it so in translate.output_schema)"
    )


@pytest.mark.parametrize(
    ("lineage", "message"),
    [
        ({}, "lineage: empty; give source_system and/or effective_time_column"),
        (
            {"effective_time_column": "shipped_on"},
            "lineage.effective_time_column: not a column of translate.output_schema",
        ),
        ({"source_system": " "}, "lineage.source_system: empty or longer than 200 characters"),
        (
            {"effective_time_column": "_rewind_run_id"},
            "lineage.effective_time_column: not an output column name",
        ),
    ],
)
def test_bad_lineage_sections_are_one_line(lineage: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**spec().canonical(), "lineage": lineage})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_run_writes_them_on_every_row(tmp_path: Any, bootstrap: str, spark: Any) -> None:
    from confluent_kafka import Producer

    from rewind.config import load_settings
    from rewind.job.service import run_job
    from tests.kafka_util import create_topic

    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")},
        cwd=tmp_path,
    )
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), topic, 2)
    producer = Producer(settings.kafka_config())
    for i in range(40):
        value = json.dumps({"order_id": i, "placed_on": f"2026-03-{1 + i % 28:02d}"}).encode()
        producer.produce(topic, value=value, partition=i % 2, timestamp=BASE_MS + i)
    assert producer.flush(30) == 0
    data = spec(source_system="orders-service", effective_time_column="placed_on").canonical()
    data["source"] = {"kafka": {"topics": [topic]}}
    data["run"] = {"work_unit_records": 10}
    outcome = run_job(settings, parse_spec(data))
    rows = jf.staging_table(settings, outcome.staging).to_pylist()
    assert len(rows) == 40
    assert {r[SOURCE_SYSTEM] for r in rows} == {"orders-service"}
    assert all(r[EFFECTIVE_TIME] == datetime.combine(r["placed_on"], datetime.min.time(), UTC) for r in rows)
    assert sorted(r["order_id"] for r in rows) == list(range(40))
