"""An object-store warehouse: archive, staging and quarantine on S3 (moto's server on loopback).

The same history job (archive below a declared log start, Kafka above, bad records
quarantined) runs once on a local warehouse and once on an ``s3://`` one; the S3 run is then
verified against a truth table in the same bucket and promoted. Spark's JVM cannot reach S3
(no hadoop-aws): every warehouse file is written and read by pyarrow in the Python tasks or by
pyiceberg in the driver. The S3 run must give the same rows and quarantine as the local one,
leave no warehouse file on local disk, and never store its secret key.

Kafka is read here exactly as by every job test (one broker: ``bootstrap``); what differs is
only where the files go.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from rewind.config import Settings, load_settings
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.s3_fixtures import BUCKET, SECRET, moto_s3, s3_catalog_env

N = 600
DECLARED = 150  # of each partition's 300 offsets, [0, 150) come from the archive only
ARCHIVE = "lake.orders_archive"
TABLE = "shop.orders"
LINEAGE = ("_rewind_source_topic", "_rewind_source_partition", "_rewind_source_offset")


def order_rows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per order, 'test' orders filtered; an amount of 13 raises (quarantined)."""
    if (events["amount"] == jf.UNLUCKY).any():
        raise ValueError("amount 13 is unlucky")
    return events.loc[events["status"] != "test", ["_rewind_row", "order_id", "status", "amount"]]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    yield from moto_s3()


def _s3_settings(tmp: Path, bootstrap: str, endpoint: str) -> Settings:
    env = {
        "REWIND_BOOTSTRAP_SERVERS": bootstrap,
        "REWIND_STATE_DIR": str(tmp / "state"),
        **s3_catalog_env(tmp, endpoint),
    }
    return load_settings(env=env, cwd=tmp)


def _spec(topic: str) -> dict[str, Any]:
    spec = jf.order_spec("s3-history", topic, TABLE, function="tests.test_s3_warehouse:order_rows")
    spec["source"] = {
        "history": {
            "topics": [topic],
            "archive": ARCHIVE,
            "declared_log_start": {topic: {"0": DECLARED, "1": DECLARED}},
        }
    }
    spec["verify"] = {"reference": {"iceberg": "shop.orders_truth"}, "compare": {"amount": {"abs": 0.001}}}
    return spec


def _archive_and_run(settings: Settings, spark: Any, topic: str) -> Any:
    from rewind.history import archive_once
    from rewind.job.service import run_job
    from rewind.spec import parse_spec

    archive_once(settings, [topic], ARCHIVE, spark=spark)
    outcome = run_job(settings, parse_spec(_spec(topic)))
    assert outcome.state == "succeeded"
    return outcome


def _rows(table: Any) -> list[dict[str, Any]]:
    rows = table.select(["order_id", "status", "amount", "_rewind_event_id", *LINEAGE]).to_pylist()
    return sorted(rows, key=lambda r: r["_rewind_event_id"])


def _quarantine(settings: Settings, run_id: str) -> list[tuple[Any, ...]]:
    return [
        (q["topic"], q["partition"], q["offset"], q["stage"], q["reason"])
        for q in jf.quarantine_rows(settings, "shop.rewind_quarantine", run_id)
    ]


def test_a_history_job_on_an_s3_warehouse_matches_the_local_one(
    spark: Any, bootstrap: str, s3_endpoint: str, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.fs as pafs

    from rewind.catalog import load_catalog
    from rewind.job.publish import promote_run
    from rewind.verify.service import verify_run

    topic = f"s3-orders-{uuid.uuid4().hex[:8]}"
    local = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "local")}, cwd=tmp_path
    )
    create_topic(local.kafka_config(), topic, 2)
    orders = jf.order_events(N, 2, raise_every=97)
    jf.produce_orders(local.kafka_config(), topic, orders)

    on_disk = _archive_and_run(local, spark, topic)
    s3_tmp = tmp_path / "s3"
    s3_tmp.mkdir()
    s3 = _s3_settings(s3_tmp, bootstrap, s3_endpoint)
    catalog = load_catalog(s3)
    catalog.create_namespace_if_not_exists("shop")
    expected = [
        {"order_id": o.order_id, "status": o.status, "amount": o.amount}
        for o in orders
        if o.fate in ("row", "double", "translate-reject")
    ]
    truth_schema = pa.schema([("order_id", pa.int64()), ("status", pa.string()), ("amount", pa.float64())])
    catalog.create_table("shop.orders_truth", schema=truth_schema).append(
        pa.Table.from_pylist(expected, schema=truth_schema)
    )
    on_s3 = _archive_and_run(s3, spark, topic)

    # the same rows, lineage and quarantine as on the local warehouse
    s3_rows = _rows(jf.staging_table(s3, on_s3.staging))
    assert s3_rows == _rows(jf.staging_table(local, on_disk.staging))
    assert sorted(r["order_id"] for r in s3_rows) == sorted(e["order_id"] for e in expected)
    quarantined = _quarantine(s3, on_s3.run_id)
    assert quarantined == _quarantine(local, on_disk.run_id)
    assert {q[3] for q in quarantined} == {"decode", "key-null", "translate-error"}, quarantined
    assert len(quarantined) == sum(o.fate in ("decode", "key-null", "translate-error") for o in orders)

    # verified (both sides read from S3 by the Python tasks) and promoted
    report = verify_run(s3, on_s3.run_id, s3_tmp / "verify.json")
    assert report["passed"], report
    assert report["rows"]["staging"] == len(expected)
    promoted = promote_run(s3, on_s3.run_id)
    assert promoted["state"] == "promoted"
    main = catalog.load_table(TABLE).scan().to_arrow()
    assert _rows(main) == s3_rows

    # every warehouse file is in the bucket; none on local disk; the secret stored nowhere
    fs = pafs.S3FileSystem(
        endpoint_override=s3_endpoint, access_key="moto", secret_key=SECRET, region="us-east-1"
    )
    in_bucket = {i.path for i in fs.get_file_info(pafs.FileSelector(BUCKET, recursive=True))}
    for name in (ARCHIVE, TABLE, "shop.rewind_quarantine"):
        files = [t.file.file_path for t in catalog.load_table(name).scan().plan_files()]
        assert files and all(f.startswith(f"s3://{BUCKET}/") for f in files), (name, files[:2])
        assert {f.removeprefix("s3://") for f in files} <= in_bucket, name
    local_files = [p for p in s3_tmp.rglob("*") if p.suffix in (".parquet", ".avro") or "metadata" in p.name]
    assert local_files == []
    for stored in (s3_tmp / "state" / "ledger.db", s3_tmp / "verify.json"):
        assert SECRET.encode() not in stored.read_bytes(), stored


def test_the_store_handed_to_tasks_holds_only_fileio_properties_and_never_shows_a_secret() -> None:
    import pickle

    from rewind.core.store import WarehouseStore, is_local_uri

    props = {
        "type": "sql",
        "uri": "postgresql://cat:pw@db/iceberg",
        "warehouse": "s3://lake/wh",
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.access-key-id": "AKIAEXAMPLE",
        "s3.secret-access-key": SECRET,
    }
    store = WarehouseStore.from_catalog_properties(props)
    assert dict(store.properties) == {k: v for k, v in props.items() if k.startswith("s3.")}
    assert SECRET not in repr(store) and SECRET not in str(store) and "AKIAEXAMPLE" not in repr(store)
    assert pickle.loads(pickle.dumps(store)) == store  # it travels to the tasks in their contexts
    assert is_local_uri("file:///tmp/x") and is_local_uri("/tmp/x") and not is_local_uri("s3://lake/x")
