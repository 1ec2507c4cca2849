"""Executors that share nothing with the driver but the network: a job's output on such a
cluster equals the local run's, row for row, into Iceberg, PostgreSQL and a Kafka topic.

The worker of the standalone cluster (:mod:`tests.spark_cluster`) runs in a mount namespace of
its own, where the project checkout (with its virtualenv) and the driver's ``state_dir`` are
empty tmpfs folders: it has the Spark distribution, a bare Python and the network, nothing
else. It has two cores, so a job's two tasks run at once in its executor, as on two workers;
one worker instead of two spares every job an executor's start and its unpacking of the
archive (tests/test_cluster.py runs a job over two workers).

The three jobs run one after the other in one driver process (:data:`CLUSTER_DRIVER`), one
Spark application: its executor starts and unpacks the archive once, and serves each job's
tasks in turn, as in a session that runs several jobs (tests/test_cluster.py runs ``rewind
run`` itself on a cluster).

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


CLUSTER_DRIVER = """
import json, sys
from rewind.config import load_settings
from rewind.job.service import run_job
from rewind.spec import load_spec

settings = load_settings()
print(json.dumps([run_job(settings, load_spec(path)).to_dict() for path in sys.argv[1:]]))
"""
"""A driver that runs each spec it is given, one after the other, in one Spark application:
its executor starts and unpacks the archive once for all of them."""


def run_on_cluster(
    cluster: SparkCluster,
    world: Path,
    env_archive: Path,
    pyfiles: Path,
    specs: list[dict[str, Any]],
    extra: dict[str, str],
) -> list[dict[str, Any]]:
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
    paths = [str(jf.write_spec(world / f"{spec['name']}.yaml", spec)) for spec in specs]
    proc = subprocess.run(
        [sys.executable, "-c", CLUSTER_DRIVER, *paths],
        cwd=world,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + cluster.log_tail()
    outs: list[dict[str, Any]] = json.loads(proc.stdout)
    assert [out["state"] for out in outs] == ["succeeded"] * len(specs), outs
    return outs


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
# 2-core machine) before three jobs run on the cluster and locally: more than the suite's
# 600 s a test
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

    # each sink's cluster job and local job, the same spec but for the target
    sinks = {
        "iso-ice": ({"iceberg": {"table": f"iso.orders_{tag}"}}, {"iceberg": {"table": f"loc.orders_{tag}"}}),
        "iso-pg": (
            {"postgres": {"url": pg_url, "table": f"public.iso_{tag}"}},
            {"postgres": {"url": pg_url, "table": f"public.loc_{tag}"}},
        ),
        "iso-kafka": ({"kafka": {"topic": f"iso-{tag}"}}, {"kafka": {"topic": f"loc-{tag}"}}),
    }
    cluster_specs = []
    for name, (sink, _) in sinks.items():
        spec = jf.order_spec(f"{name}-cluster", topic, "unused")
        spec["sink"] = sink
        cluster_specs.append(spec)
    ran = run_on_cluster(cluster, world, executor_env, translate_zip, cluster_specs, s3)
    outs = dict(zip(sinks, ran, strict=True))
    locals_: dict[str, dict[str, Any]] = {}
    for name, (_, local_sink) in sinks.items():
        spec = jf.order_spec(f"{name}-local", topic, "unused")
        spec["sink"] = local_sink
        local = run_job(settings, parse_spec(spec))
        assert local.state == "succeeded"
        assert outs[name]["quarantined"] == local.counts.quarantined
        assert outs[name]["rows_out"] == local.counts.rows_out
        locals_[name] = local.to_dict()

    # Iceberg: the cluster's files in the S3 warehouse, the local run's on disk
    staging = outs["iso-ice"]["staging"]
    assert staging["table"] and iceberg_rows(remote, staging) == iceberg_rows(
        settings, locals_["iso-ice"]["staging"]
    )

    # PostgreSQL: the tasks load their units (COPY) themselves
    assert postgres_rows(pg_url, outs["iso-pg"]["staging"]["table"]) == postgres_rows(
        pg_url, locals_["iso-pg"]["staging"]["table"]
    )

    # Kafka: the driver produces the units the tasks spooled to the object store
    # (the worker cannot see the driver's state_dir: a spool there would fail this run)
    assert topic_records(conf, outs["iso-kafka"]["staging"]["topic"]) == topic_records(
        conf, locals_["iso-kafka"]["staging"]["topic"]
    )
