"""A backfill job on a Spark standalone cluster equals the same job run locally, row for row.

The cluster is real: a master and two one-core workers started from the PySpark distribution
(:mod:`tests.spark_cluster`), the ledger on PostgreSQL, the job run by ``rewind run`` in a
child process whose ``spark.master`` names the cluster, so every task runs in an executor of
a worker, not in the driver. The expected rows are computed from the produced events alone
(:func:`tests.job_fixtures.expected_rows`); the local run is the tests' own ``local[*]``
session. The cluster run's warehouse is an S3 bucket (moto's server, :mod:`tests.s3_fixtures`),
which the driver reaches through pyiceberg and the executors' Python tasks through pyarrow.

It runs on the tests' one broker (tansu, or the broker ``REWIND_TEST_BOOTSTRAP`` names), not
on each: what it adds is where the tasks run, and starting a cluster and its executors costs
about a minute on the 2-core machine; the reader is the same on every broker.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind.catalog import load_catalog
from rewind.config import Settings, load_settings
from rewind.job.service import run_job
from rewind.spark.class_archive import java_options
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.s3_fixtures import BUCKET, moto_s3, s3_catalog_env
from tests.spark_cluster import QUICK_JVM, SparkCluster, spark_cluster

PARTITIONS = 3
RECORDS = 1_500
RATE = 1_000  # records/s: the run takes at least 1.5 s of reading
COMPARED = [
    "order_id",
    "status",
    "amount",
    "_rewind_event_id",
    "_rewind_source_topic",
    "_rewind_source_partition",
    "_rewind_source_offset",
    "_rewind_source_timestamp",
]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    yield from moto_s3()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


def _rows(table: Any) -> list[dict[str, Any]]:
    rows = table.select(COMPARED).to_pylist()
    for row in rows:  # as expected_rows gives it: epoch milliseconds
        row["_rewind_source_timestamp_ms"] = int(row.pop("_rewind_source_timestamp").timestamp() * 1000)
    return sorted(rows, key=lambda r: r["_rewind_event_id"])


def test_a_job_on_a_standalone_cluster_equals_the_local_run_row_for_row(
    cluster: SparkCluster,
    settings: Settings,
    spark: object,
    pg_url: str,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, PARTITIONS)
    orders = jf.order_events(RECORDS, PARTITIONS, raise_every=700)
    coords = jf.produce_orders(conf, topic, orders)
    expected = jf.expected_rows(topic, orders, coords, "order_lines", "1")

    # the cluster: its own state folder and catalog, the warehouse on S3, the ledger on PostgreSQL
    s3_env = s3_catalog_env(tmp_path, s3_endpoint)
    state = load_settings(
        env={
            "REWIND_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers or "",
            "REWIND_STATE_DIR": str(tmp_path / "cluster-state"),
            "REWIND_LEDGER_URL": pg_url,
            **s3_env,
        },
        cwd=tmp_path,
    )
    # a rate guard: on a cluster the driver keeps one budget for all executors (pace_server)
    spec_data = jf.order_spec("orders-cluster", topic, "cl.orders", guards={"max_records_per_second": RATE})
    spec_file = jf.write_spec(tmp_path / "orders.yaml", spec_data)
    log4j = (jf.REPO / "src/rewind/spark/log4j2.properties").as_uri()
    spark_conf = {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j} {jf.QUICK_JVM}",
        # the executors run on the driver's jars here: Spark's class archive maps into them too
        "spark.executor.extraJavaOptions": f"{QUICK_JVM} {java_options()}".strip(),
        "spark.executor.memory": "512m",
        # the executors' Python imports the spec's translate (tests.job_fixtures) from the repo
        "spark.executorEnv.PYTHONPATH": str(jf.REPO),
    }
    env = jf.child_env(state, REWIND_SPARK_MASTER=cluster.master_url, REWIND_LEDGER_URL=pg_url, **s3_env)
    env["REWIND_SPARK_CONF"] = json.dumps(spark_conf)
    import subprocess

    before = {a["id"] for a in cluster.completed_apps()}
    proc = subprocess.run(
        [jf.REWIND_BIN, "--debug", "run", str(spec_file), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + cluster.log_tail()
    out = json.loads(proc.stdout)
    assert out["state"] == "succeeded"
    # every task asked the driver's budget: one connection per task, and the run kept the rate
    served = re.findall(r"job-wide rate limit: (\d+) grants to (\d+) tasks", proc.stderr)
    assert served and all(int(g) > 0 and int(t) > 0 for g, t in served), proc.stderr[-2000:]
    assert out["seconds"] >= RECORDS / RATE * 0.9
    on_cluster = _rows(jf.staging_table(state, out["staging"]))
    files = [
        t.file.file_path for t in load_catalog(state).load_table(out["staging"]["table"]).scan().plan_files()
    ]
    assert files and all(f.startswith(f"s3://{BUCKET}/") for f in files), files[:2]

    # the job really ran on the cluster: one more application, on both workers' cores
    apps = [a for a in cluster.completed_apps() if a["id"] not in before]
    assert len(apps) == 1 and apps[0]["cores"] == 2, apps

    local = run_job(settings, parse_spec(jf.order_spec("orders-local", topic, f"loc.orders_{topic[-8:]}")))
    on_local = _rows(jf.staging_table(settings, local.to_dict()["staging"]))

    def ids(rows: list[dict[str, Any]]) -> set[str]:
        return {r["_rewind_event_id"] for r in rows}

    assert len(on_cluster) == len(expected), (len(on_cluster), len(on_local), len(expected))
    assert ids(on_cluster) == ids(expected), sorted(ids(on_cluster) ^ ids(expected))[:5]
    assert on_cluster == expected
    assert on_local == on_cluster
    fates = [o.fate for o in orders]
    assert (
        out["quarantined"]
        == local.counts.quarantined
        == sum(fates.count(f) for f in ("decode", "key-null", "translate-reject", "translate-error"))
    )
    assert out["records_read"] == RECORDS
