"""Executors that share nothing with the driver but the network: a job's output on such a
cluster equals the local run's, row for row, into Iceberg, PostgreSQL and a Kafka topic.

The worker of the standalone cluster (:mod:`tests.spark_cluster`) runs in a mount namespace of
its own, where the project checkout (with its virtualenv) and the driver's ``state_dir`` are
empty tmpfs folders: it has the Spark distribution, a bare Python and the network, nothing
else. It has two cores, so a job's two tasks run at once in its executor, as on two workers;
one worker instead of two spares every job an executor's start and its unpacking of the
archive (tests/test_cluster.py runs a job over two workers).

Rewind and its dependencies reach the executors as the packed virtualenv
``scripts/executor_env.py`` builds (``spark.archives``), the translate module as a zip
(``spark.submit.pyFiles``). The warehouse is an S3 bucket (moto's server), and so, with
the executors possibly elsewhere, is the spool through which the tasks hand the SQL and Kafka
sinks their units (:meth:`rewind.config.Settings.spool_root`).

It runs on the tests' one broker (like tests/test_cluster.py): what it adds is where the tasks
run and what they can see; building the archive (~40 s; ~15 s when the virtualenv under
``build/`` is reused) and starting the cluster cost up to 3 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.job.service import run_job
from rewind.spec import parse_spec
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.s3_fixtures import moto_s3, s3_catalog_env
from tests.spark_cluster import QUICK_JVM, SparkCluster, can_isolate, spark_cluster
from tests.test_sink_kafka import read_topic

PARTITIONS = 2
RECORDS = 600
COMPARED = [
    "order_id",
    "status",
    "amount",
    "_rewind_event_id",
    "_rewind_source_topic",
    "_rewind_source_partition",
    "_rewind_source_offset",
]

pytestmark = pytest.mark.skipif(can_isolate() is not None, reason=f"isolated workers: {can_isolate()}")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    yield from moto_s3()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("isolated")


@pytest.fixture(scope="module")
def executor_env(world: Path) -> Path:
    """The packed virtualenv of the executors (``make executor-env`` builds the same);
    ``REWIND_TEST_EXECUTOR_ENV`` names one already built. The virtualenv is kept under
    ``build/``: the next run with the same pins reinstalls only Rewind into it (~15 s instead of
    ~40 s), and the executors still get nothing but the archive packed from it."""
    given = os.environ.get("REWIND_TEST_EXECUTOR_ENV")
    if given:
        return Path(given)
    out = world / "rewind-executor-env.tar.gz"
    proc = subprocess.run(
        [
            sys.executable,
            str(jf.REPO / "scripts" / "executor_env.py"),
            "--out",
            str(out),
            "--work",
            str(jf.REPO / "build" / "test-executor-env"),
            # stored, not compressed: packed in ~4 s instead of ~14 s, and the executor and the
            # driver of each job below unpack it in about half the time (all on this machine)
            "--compress-level",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with tarfile.open(out) as packed:  # what the executors never use stays out of it
        names = packed.getnames()
    site = next(n for n in names if n.endswith("/site-packages/rewind/__init__.py")).rsplit("/rewind/", 1)[0]
    assert not [n for n in names if n.startswith((f"{site}/pip/", f"{site}/pandas/tests/"))]
    assert f"{site}/pandas/core/frame.py" in names
    return out


@pytest.fixture(scope="module")
def translate_zip(world: Path) -> Path:
    """The spec's translate module (``tests.job_fixtures``), as a user ships theirs."""
    out = world / "translate.zip"
    with zipfile.ZipFile(out, "w") as z:
        for name in ("__init__.py", "job_fixtures.py"):
            z.write(jf.REPO / "tests" / name, f"tests/{name}")
    return out


@pytest.fixture(scope="module")
def cluster(world: Path) -> Iterator[SparkCluster]:
    hidden = [jf.REPO, world / "state"]
    (world / "state").mkdir(exist_ok=True)
    with spark_cluster(world / "spark-cluster", workers=1, cores=2, hidden=hidden) as c:
        yield c


def run_on_cluster(
    cluster: SparkCluster,
    world: Path,
    env_archive: Path,
    pyfiles: Path,
    spec: dict[str, Any],
    extra: dict[str, str],
) -> dict[str, Any]:
    log4j = (jf.REPO / "src/rewind/spark/log4j2.properties").as_uri()
    spark_conf = {
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j} {jf.QUICK_JVM}",
        "spark.executor.extraJavaOptions": QUICK_JVM,
        "spark.executor.memory": "512m",
        "spark.archives": f"{env_archive.as_uri()}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.submit.pyFiles": str(pyfiles),
    }
    state = load_settings(env={"REWIND_STATE_DIR": str(world / "state"), **extra}, cwd=world)
    given = {k: v for k, v in extra.items() if k != "REWIND_BOOTSTRAP_SERVERS"}  # child_env sets it
    env = jf.child_env(state, REWIND_SPARK_MASTER=cluster.master_url, **given)
    env["REWIND_SPARK_CONF"] = json.dumps(spark_conf)
    path = jf.write_spec(world / f"{spec['name']}.yaml", spec)
    proc = subprocess.run(
        [jf.REWIND_BIN, "run", str(path), "--json"],
        cwd=world,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + cluster.log_tail()
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["state"] == "succeeded", out
    return out


def iceberg_rows(settings: Settings, staging: dict[str, Any]) -> list[dict[str, Any]]:
    rows = jf.staging_table(settings, staging).select(COMPARED).to_pylist()
    return sorted(rows, key=lambda r: (r["_rewind_event_id"], r["order_id"] or 0))


def postgres_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    import psycopg

    columns = ", ".join(COMPARED)
    schema, name = table.split(".", 1) if "." in table else ("public", table)
    with psycopg.connect(url) as conn:
        rows = conn.execute(f'SELECT {columns} FROM "{schema}"."{name}"').fetchall()
    return sorted(rows, key=lambda r: (r[3], r[0] or 0))


def topic_records(conf: dict[str, Any], topic: str) -> list[tuple[Any, ...]]:
    records, _ = read_topic(conf, topic)
    volatile = ("rewind.run-id", "rewind.extracted-at")
    return sorted(
        (r.partition, r.key, r.value, sorted((k, v) for k, v in r.headers.items() if k not in volatile))
        for r in records
    )


# its module fixtures build a packed virtualenv and start a cluster (2-5 minutes on a loaded
# 2-core machine) before three jobs run twice each: more than the suite's 600 s a test
@pytest.mark.timeout(1500)
def test_isolated_executors_write_what_a_local_run_writes(
    cluster: SparkCluster,
    world: Path,
    executor_env: Path,
    translate_zip: Path,
    settings: Settings,
    spark: object,
    pg_url: str,
    s3_endpoint: str,
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    conf = settings.kafka_config()
    create_topic(conf, topic, PARTITIONS)
    orders = jf.order_events(RECORDS, PARTITIONS, raise_every=250)
    jf.produce_orders(conf, topic, orders)
    s3 = {
        "REWIND_BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers or "",
        **s3_catalog_env(world, s3_endpoint),
    }
    remote = load_settings(env={"REWIND_STATE_DIR": str(world / "state"), **s3}, cwd=world)
    tag = topic[-8:]

    def both(name: str, sink: dict[str, Any], local_sink: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        cluster_spec = jf.order_spec(f"{name}-cluster", topic, "unused", sink=sink)
        cluster_spec["sink"] = sink
        out = run_on_cluster(cluster, world, executor_env, translate_zip, cluster_spec, s3)
        local_spec = jf.order_spec(f"{name}-local", topic, "unused")
        local_spec["sink"] = local_sink
        local = run_job(settings, parse_spec(local_spec))
        assert local.state == "succeeded"
        assert out["quarantined"] == local.counts.quarantined and out["rows_out"] == local.counts.rows_out
        return out, local

    # Iceberg: the cluster's files in the S3 warehouse, the local run's on disk
    out, local = both(
        "iso-ice", {"iceberg": {"table": f"iso.orders_{tag}"}}, {"iceberg": {"table": f"loc.orders_{tag}"}}
    )
    assert out["staging"]["table"] and iceberg_rows(remote, out["staging"]) == iceberg_rows(
        settings, local.to_dict()["staging"]
    )

    # PostgreSQL: the tasks load their units (COPY) themselves
    out, local = both(
        "iso-pg",
        {"postgres": {"url": pg_url, "table": f"public.iso_{tag}"}},
        {"postgres": {"url": pg_url, "table": f"public.loc_{tag}"}},
    )
    assert postgres_rows(pg_url, out["staging"]["table"]) == postgres_rows(
        pg_url, local.to_dict()["staging"]["table"]
    )

    # Kafka: the driver produces the units the tasks spooled to the object store
    out, local = both("iso-kafka", {"kafka": {"topic": f"iso-{tag}"}}, {"kafka": {"topic": f"loc-{tag}"}})
    # (the worker cannot see the driver's state_dir: a spool there would fail this run)
    assert topic_records(conf, out["staging"]["topic"]) == topic_records(
        conf, local.to_dict()["staging"]["topic"]
    )
