"""Translate functions used by the job tests (imported by name, as a user's would be), and
helpers that produce known order events and read back what a run wrote.

The order events of :func:`order_events` carry their own expected fate, so a test can
compute the exact staging content and quarantine from the produced data alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rewind.translate.functions import TranslateResult


def order_amounts(events: pd.DataFrame) -> TranslateResult:
    """One row per order event; negative amounts are rejected, 'test' orders filtered."""
    events = events[events["status"] != "test"]
    bad = events["amount"] < 0
    rows = events.loc[~bad, ["_rewind_row", "order_id", "status", "amount"]]
    rows = rows.assign(order_id=rows["order_id"].astype("int64"), amount=rows["amount"].astype("float64"))
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "negative amount"})
    return TranslateResult(rows=rows, rejects=rejects)


def explode_on_seven(events: pd.DataFrame) -> pd.DataFrame:
    """Raises for any batch holding order 7 (so that record ends in quarantine)."""
    if (events["order_id"] == 7).any():
        raise ValueError("order 7 is cursed")
    return events[["_rewind_row", "order_id", "amount"]]


def always_raises(events: pd.DataFrame) -> pd.DataFrame:
    """A translate broken for every record (the plan must say so, not "schema unknown")."""
    raise KeyError("amount_cents")


UNLUCKY = 13.0


def order_lines(events: pd.DataFrame) -> TranslateResult:
    """Every fate at once: 'test' orders filtered, negative amounts rejected, an amount of 13
    raises (the record ends in quarantine as translate-error), 'double' orders give two rows.
    The order id is passed through nullable, so a null one reaches the key check."""
    if (events["amount"] == UNLUCKY).any():
        raise ValueError("amount 13 is unlucky")
    events = events[events["status"] != "test"]
    bad = events["amount"] < 0
    rows = events.loc[~bad, ["_rewind_row", "order_id", "status", "amount"]]
    rows = pd.concat([rows, rows[rows["status"] == "double"]])
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "negative amount"})
    return TranslateResult(rows=rows, rejects=rejects)


def keep_orders(events: pd.DataFrame) -> pd.DataFrame:
    """Order id and amount of every decoded event."""
    return events[["_rewind_row", "order_id", "amount"]]


# -- known order events ----------------------------------------------------------------------

ORDER_SCHEMA = {"order_id": "long", "status": "string", "amount": "double"}
"""decode.schema and translate.output_schema of the order_lines jobs."""

FATES = ("row", "double", "filtered", "decode", "translate-reject", "translate-error", "key-null")


@dataclass(frozen=True)
class Order:
    """One produced record and what the order_lines job must do with it."""

    index: int
    partition: int
    key: bytes
    value: bytes
    timestamp_ms: int
    fate: str
    order_id: int | None
    status: str | None
    amount: float | None


def order_events(
    n: int, partitions: int, *, base_ms: int = 1_760_000_000_000, raise_every: int = 401
) -> list[Order]:
    """``n`` order events spread round-robin over ``partitions``, every fate represented.

    Timestamps grow by 10 ms per record, so they grow along each partition too.
    """
    out = []
    for i in range(n):
        order_id: int | None = 1000 + i
        status = "paid"
        amount: float | None = round((i % 1000) * 1.25 + 1, 2)
        if i % 53 == 5:
            fate = "decode"
        elif i % 47 == 6:
            fate, order_id = "key-null", None
        elif i % 31 == 7:
            fate, status = "filtered", "test"
        elif i % 29 == 8:
            fate, amount = "translate-reject", -amount
        elif i % raise_every == 9:
            fate, amount = "translate-error", UNLUCKY
        elif i % 11 == 3:
            fate, status = "double", "double"
        else:
            fate = "row"
        if fate == "decode":
            value = b'{"order_id": ' + str(1000 + i).encode() + b', "status": "paid", "amount": '
        else:
            value = json.dumps({"order_id": order_id, "status": status, "amount": amount}).encode()
        out.append(
            Order(
                i, i % partitions, f"o-{i}".encode(), value, base_ms + 10 * i, fate, order_id, status, amount
            )
        )
    return out


def produce_orders(conf: dict[str, Any], topic: str, orders: list[Order]) -> dict[int, tuple[int, int]]:
    """Produce ``orders`` in order; returns each order's (partition, offset) by index."""
    from confluent_kafka import Producer

    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    coords: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def report(err: Any, msg: Any) -> None:
            if err:
                errors.append(str(err))
            else:
                coords[index] = (msg.partition(), msg.offset())

        return report

    for o in orders:
        producer.produce(
            topic,
            key=o.key,
            value=o.value,
            partition=o.partition,
            timestamp=o.timestamp_ms,
            on_delivery=delivered(o.index),
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:3]
    assert len(coords) == len(orders)
    return coords


def event_id(topic: str, partition: int, offset: int, transform: str, version: str, ordinal: int) -> str:
    """The documented event id, computed here independently of Rewind's code."""
    text = f"{topic}/{partition}/{offset}/{transform}/{version}/{ordinal}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def expected_rows(
    topic: str, orders: list[Order], coords: dict[int, tuple[int, int]], transform: str, version: str
) -> list[dict[str, Any]]:
    """The output rows an order_lines job must write, sorted by event id."""
    rows = []
    for o in orders:
        if o.fate not in ("row", "double"):
            continue
        partition, offset = coords[o.index]
        for ordinal in range(2 if o.fate == "double" else 1):
            rows.append(
                {
                    "order_id": o.order_id,
                    "status": o.status,
                    "amount": o.amount,
                    "_rewind_event_id": event_id(topic, partition, offset, transform, version, ordinal),
                    "_rewind_source_topic": topic,
                    "_rewind_source_partition": partition,
                    "_rewind_source_offset": offset,
                    "_rewind_source_timestamp_ms": o.timestamp_ms,
                }
            )
    return sorted(rows, key=lambda r: r["_rewind_event_id"])


def order_spec(
    name: str,
    topic: str,
    table: str,
    *,
    unit_records: int = 250,
    version: str = "1",
    function: str = "tests.job_fixtures:order_lines",
    **sections: Any,
) -> dict[str, Any]:
    """A spec (as YAML would give it) of an order_lines job over the whole topic."""
    spec: dict[str, Any] = {
        "name": name,
        "source": {"kafka": {"topics": [topic]}},
        "decode": {"format": "json", "schema": dict(ORDER_SCHEMA)},
        "translate": {"function": function, "version": version, "output_schema": dict(ORDER_SCHEMA)},
        "key": ["order_id"],
        "sink": {"iceberg": {"table": table}},
        "run": {"work_unit_records": unit_records},
    }
    for key, value in sections.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return spec


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- reading what a run wrote ----------------------------------------------------------------


def staging_table(settings: Any, staging: dict[str, Any]) -> Any:
    """A run's staging content as an Arrow table, read with pyiceberg at the staging ref's head."""
    from rewind.catalog import load_catalog

    table = load_catalog(settings).load_table(staging["table"])
    snapshot = table.snapshot_by_name(staging.get("branch") or "main")
    if snapshot is None:
        return table.schema().as_arrow().empty_table()
    return table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()


def quarantine_rows(settings: Any, table: str, run_id: str) -> list[dict[str, Any]]:
    """The quarantine rows of one run, sorted by (topic, partition, offset)."""
    from pyiceberg.expressions import EqualTo

    from rewind.catalog import load_catalog

    scan = load_catalog(settings).load_table(table).scan(row_filter=EqualTo("run_id", run_id))
    rows = scan.to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


# -- child processes -------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
REWIND_BIN = str(Path(sys.executable).with_name("rewind"))
"""The ``rewind`` command of the interpreter running the tests."""

QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Driver JVM options for child processes that run one short Spark job: without the C2
compiler's threads the JVM starts and runs a small job much faster on a loaded 2-core machine
(measured: `rewind run` of 2,400 records 42-45 s instead of 65-78 s). Behaviour is unchanged."""
QUICK_SPARK_CONF = json.dumps({"spark.driver.extraJavaOptions": QUICK_JVM})
"""``REWIND_SPARK_CONF`` of a child whose driver JVM starts with :data:`QUICK_JVM` and nothing else."""


def child_env(settings: Any, **extra: str) -> dict[str, str]:
    """The environment of a ``rewind`` child process using ``settings``' broker and state folder.

    The repository is on PYTHONPATH (the specs name ``tests.job_fixtures`` functions), no
    other ``REWIND_*`` variable leaks in, and the driver JVM starts quickly (:data:`QUICK_JVM`,
    with Rewind's own log4j configuration kept).
    """
    import os

    log4j = (REPO / "src/rewind/spark/log4j2.properties").as_uri()
    java = f"-Dlog4j2.configurationFile={log4j} {QUICK_JVM}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        REWIND_BOOTSTRAP_SERVERS=settings.kafka.bootstrap_servers or "",
        REWIND_STATE_DIR=str(settings.state_path),
        REWIND_SPARK_CONF=json.dumps({"spark.driver.extraJavaOptions": java}),
        **extra,
    )
    return env


DRIVER = """
import json, sys
from rewind.config import load_settings
from rewind.job.service import resume_job, run_job
from rewind.spec import load_spec

action, target, per_wave = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = load_settings()
if action == "run":
    out = run_job(settings, load_spec(target), units_per_wave=per_wave)
else:
    out = resume_job(settings, target, units_per_wave=per_wave)
print(json.dumps(out.to_dict()))
"""
"""A child driver for kill tests: ``run SPEC N`` or ``resume RUN_ID N`` (N units per wave);
prints the outcome as JSON."""


def run_driver(
    cwd: Path, env: dict[str, str], action: str, target: str, units_per_wave: int = 2
) -> subprocess.CompletedProcess[str]:
    """Run :data:`DRIVER` in a child process (a fault in ``env`` may SIGKILL it: rc -9)."""
    return subprocess.run(
        [sys.executable, "-c", DRIVER, action, target, str(units_per_wave)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@contextlib.contextmanager
def in_tasks(spark: Any, **env: str) -> Iterator[None]:
    """``env`` in the Python workers of the session's next jobs, for a fault a Spark task must
    hit: PySpark hands its context's environment to every task, and a worker whose environment
    differs is a new one. A fault in a task then needs no child driver (only a driver's own kill
    does)."""
    environment = spark.sparkContext.environment
    before = {k: environment[k] for k in env if k in environment}
    environment.update(env)
    try:
        yield
    finally:
        for k in env:
            environment.pop(k, None)
        environment.update(before)


def breaks_contract_late(events: pd.DataFrame) -> Any:
    """Fine on the first records (the plan's sample), then returns something that is not a frame."""
    if (events["order_id"] > 2000).any():
        return "not a frame"
    return events[["_rewind_row", "order_id", "amount"]]


def record_finished_run(settings: Any, spec: dict[str, Any], target: str, run_id: str, staging: Any) -> None:
    """Record ``run_id`` in the ledger as a finished ``rewind run`` leaves it (its plan, the run
    with its staging, state ``succeeded``), for tests of what comes after a run (promote,
    rollback) that write the staging through the sink themselves instead of running Spark."""
    from rewind.ledger import Ledger

    plan = {
        "plan_id": f"plan-{run_id}",
        "name": spec["name"],
        "spec": spec,
        "read_plan": {},
        "units": [],
        "offsets": 0,
        "output_schema_b64": "",
        "output_columns": [],
        "gates": [],
    }
    with Ledger.open(settings.ledger) as ledger:
        ledger.save_plan(plan["plan_id"], spec["name"], spec, plan)
        ledger.create_run(plan["plan_id"], spec["name"], target, run_id=run_id, staging=staging.to_dict())
        ledger.set_state(run_id, "running")
        ledger.set_state(run_id, "succeeded")
