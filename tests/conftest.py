"""Shared fixtures: real brokers, a real Spark session, real PostgreSQL, a real catalog.

Brokers (see tests/brokers.py): ``broker`` runs a test once per real broker (tansu,
noida-db, and the one named by ``REWIND_TEST_BOOTSTRAP`` when set); a test needing what a
broker lacks calls ``broker.require(capability)`` and is skipped there, with the capability
named. ``bootstrap`` is the one broker of the tests that are about something else (a job,
a sink, the CLI): the embedded tansu, or ``REWIND_TEST_BOOTSTRAP``.
"""

from __future__ import annotations

import os
import random
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from rewind.config import Settings, load_settings
from rewind.logs import remove_handlers
from tests.brokers import (
    EXTERNAL,
    NOIDA,
    NOIDA_GAPS,
    TANSU,
    TANSU_GAPS,
    NoidaProcess,
    TestBroker,
    broker_names,
    external_gaps,
)
from tests.file_order import longest_files_first, recorded_seconds
from tests.job_fixtures import QUICK_SPARK_CONF

EXTERNAL_BOOTSTRAP = os.environ.get("REWIND_TEST_BOOTSTRAP")
PG_DSN = os.environ.get("REWIND_TEST_PG", "postgresql://postgres@127.0.0.1:5432")

# Property tests check results, not speed: the suite runs 4 workers on 2 cores beside Spark
# and the brokers, where one example of a pure-Python test can take longer than hypothesis's
# 200 ms deadline (test_spans_match_set_algebra failed so under load, and passed alone).
hypothesis_settings.register_profile("rewind", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("rewind")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_files_first(items, recorded_seconds())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def restart_port() -> int:
    """A free port for a server a test stops and starts again on the same address: below the
    kernel's ephemeral range, so that while the server is down no other process's listener
    on port 0 (a JVM's, a Spark driver's, another worker's :func:`free_port`) can take it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port below the ephemeral range (from {low})")


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rewind-session")


@pytest.fixture(scope="session")
def tansu_broker(session_dir: Path) -> Iterator[TestBroker]:
    """The embedded tansu, started once per test process."""
    from rewind.embedded.broker import BrokerProcess

    broker = BrokerProcess("127.0.0.1", free_port(), session_dir / "broker.pid", session_dir / "broker.log")
    broker.start(timeout_s=30)
    try:
        yield TestBroker(TANSU, broker.address, TANSU_GAPS)
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def noida_broker(session_dir: Path) -> Iterator[TestBroker]:
    """noida-db on a free loopback port, started once per test process, stopped by pid."""
    proc = NoidaProcess("127.0.0.1", free_port(), session_dir)
    proc.start(timeout_s=30)
    try:
        yield TestBroker(NOIDA, proc.address, NOIDA_GAPS)
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def external_broker() -> TestBroker:
    assert EXTERNAL_BOOTSTRAP, "only parametrized when REWIND_TEST_BOOTSTRAP is set"
    return TestBroker(EXTERNAL, EXTERNAL_BOOTSTRAP, external_gaps())


_BROKER_FIXTURES = {TANSU: "tansu_broker", NOIDA: "noida_broker", EXTERNAL: "external_broker"}


@pytest.fixture(scope="module", params=broker_names())
def broker(request: pytest.FixtureRequest) -> TestBroker:
    """Each real broker in turn (module scope: a module's topics are made once per broker)."""
    return request.getfixturevalue(_BROKER_FIXTURES[request.param])  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of the one broker of non-Kafka tests (tansu unless REWIND_TEST_BOOTSTRAP)."""
    if EXTERNAL_BOOTSTRAP:
        return EXTERNAL_BOOTSTRAP
    return request.getfixturevalue("tansu_broker").bootstrap  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def settings(session_dir: Path, bootstrap: str) -> Settings:
    """Settings pointing at the test broker, with catalog and ledger in a temp folder."""
    env = {
        "REWIND_STATE_DIR": str(session_dir / "state"),
        "REWIND_BOOTSTRAP_SERVERS": bootstrap,
        # test jobs are small: a JVM that starts fast (client JIT, serial GC) beats one that
        # runs fast; measured 42 s instead of 65-78 s for a whole `rewind run` under load
        "REWIND_SPARK_CONF": QUICK_SPARK_CONF,
    }
    return load_settings(env=env, cwd=session_dir)


@pytest.fixture(scope="session")
def kafka_conf(settings: Settings) -> dict[str, object]:
    return settings.kafka_config()


@pytest.fixture(scope="module")
def broker_settings(settings: Settings, broker: TestBroker) -> Settings:
    """``settings`` pointing at ``broker`` instead of the default one."""
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": broker.bootstrap})
    return settings.model_copy(update={"kafka": kafka})


@pytest.fixture(scope="module")
def broker_bootstrap(broker: TestBroker) -> str:
    return broker.bootstrap


@pytest.fixture(scope="module")
def broker_conf(broker_settings: Settings) -> dict[str, object]:
    return broker_settings.kafka_config()


@pytest.fixture
def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark(settings: Settings):  # type: ignore[no-untyped-def]
    from rewind.spark import session

    spark = session(settings, app_name="rewind-tests")
    yield spark
    spark.stop()


@pytest.fixture(scope="module")
def pg_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database per test module on the machine's server."""
    import psycopg

    name = f"rewind_{request.module.__name__.rsplit('.', 1)[-1]}_{uuid.uuid4().hex[:6]}".lower()
    try:
        admin = psycopg.connect(f"{PG_DSN}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_DSN} is not reachable: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_DSN}/{name}"
    finally:
        with psycopg.connect(f"{PG_DSN}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def iceberg_catalog(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A temporary Iceberg SQL catalog on SQLite with a local warehouse."""
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    return SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=warehouse.as_uri())


@pytest.fixture(autouse=True)
def _no_log_file_left_behind() -> Iterator[None]:
    """A CLI command configures Rewind's logging for its process; in the suite that process
    runs many commands, so each test starts with none of an earlier test's log file (its
    warning count would otherwise reach this test's error lines)."""
    remove_handlers()
    yield
    remove_handlers()


@pytest.fixture
def noida(tmp_path: Path) -> Iterator[Any]:
    """A noida-db of the test's own that the test may kill and restart (the broker-restart
    tests: tests/test_broker_restart*.py)."""
    from tests.test_broker_restart import (
        RestartableBroker,  # a test module's helper, loaded by those tests only
    )

    broker = RestartableBroker(tmp_path / "noida")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
