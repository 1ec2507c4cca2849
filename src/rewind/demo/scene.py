"""The demo's starting state: the ``orders`` topic, the archive, and v1's ``order_totals``.

:func:`set_scene` builds it from scratch on every run (dropping what an earlier demo left
under the same prefix) and returns a :class:`Scene` that also carries what the generated
data says every later step must find: records in the repair window, malformed records by
kind, orders placed in the bug window, orders v1 got wrong, and the correct read model.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich.markup import escape

from rewind.catalog import load_catalog
from rewind.core.datatypes import arrow_type
from rewind.demo import orders as domain
from rewind.demo.errors import DemoFailed
from rewind.history import archive_once
from rewind.kafka import clients
from rewind.kafka.producer import TransactionalProducer
from rewind.sinks.sql.types import sqlite_type

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

    from rewind.config import Settings

PARTITIONS = 6
SEAM_DAY = 50
BUG_FROM_DAY, BUG_DAYS = 47, 5

# How a step tells the user what it did. Here, below both stories, because the scene says
# things too and the stories import the scene (never the other way round).
Say = Callable[[str], None]


@dataclass(frozen=True)
class Window:
    """The bug window, the seam and the window the repair reads."""

    bug_from: datetime
    bug_to: datetime
    seam: datetime

    @property
    def read_to(self) -> datetime:
        return self.bug_to + domain.ORDER_LIFETIME

    @classmethod
    def default(cls) -> Window:
        bug_from = domain.START + timedelta(days=BUG_FROM_DAY)
        return cls(bug_from, bug_from + timedelta(days=BUG_DAYS), domain.START + timedelta(days=SEAM_DAY))


@dataclass
class Scene:
    topic: str
    archive_table: str
    model_table: str
    sqlite_path: Path
    catalog: Catalog
    events: int
    log_start: dict[int, int]
    in_read_window: int
    malformed_in_window: dict[str, int]
    orders_in_bug_window: int
    orders_wrong_in_v1: int
    v1: pd.DataFrame
    correct: pd.DataFrame
    sample_ids: list[str] = field(default_factory=list)

    def facts(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "events": self.events,
            "orders": len(self.v1),
            "archive": self.archive_table,
            "read_model": self.model_table,
            "sqlite": str(self.sqlite_path),
        }

    def read_model(self) -> pd.DataFrame:
        """``order_totals`` as production reads it now (the table's main)."""
        return self.catalog.load_table(self.model_table).scan().to_pandas()


def set_scene(
    settings: Settings,
    spark: SparkSession,
    *,
    events: int,
    seed: int,
    prefix: str,
    window: Window,
    say: Say,
) -> Scene:
    t0 = time.monotonic()
    history = domain.generate(events, partitions=PARTITIONS, seed=seed)
    topic = f"{prefix}.orders"
    offsets = _produce(settings, topic, history)
    say(
        f"[bold]1. the scene[/]: {len(history.events):,} events of {history.orders:,} orders by "
        f"{history.customers:,} customers over {domain.DAYS} days in topic {escape(topic)} "
        f"({PARTITIONS} partitions), "
        f"{sum(history.malformed.values())} of them malformed on purpose ({time.monotonic() - t0:.1f} s)"
    )

    catalog = load_catalog(settings)
    model_table, archive_table = f"{prefix}.order_totals", f"{prefix}.orders_archive"
    catalog.create_namespace_if_not_exists(prefix)
    for name in (model_table, archive_table):
        if catalog.table_exists(name):
            catalog.drop_table(name)
    v1 = domain.project_v1(history.valid, window.bug_from, window.bug_to)
    correct = domain.project_v1(history.valid, window.bug_from, window.bug_from)  # an empty bug window
    _write_iceberg_model(catalog, model_table, v1)
    sqlite_path = settings.state_dir / f"{prefix}-read-models.sqlite"
    _write_sqlite_model(sqlite_path, v1)
    say(
        f"   v1 projection wrote {len(v1):,} orders to Iceberg {escape(model_table)} "
        f"and to SQLite {escape(str(sqlite_path))}"
    )

    t0 = time.monotonic()
    archived = archive_once(settings, [topic], archive_table, spark=spark)
    log_start = _first_offsets_at(history, offsets, domain.ms(window.seam))
    say(
        f"   archived {archived.records:,} records into {escape(archive_table)} "
        f"({time.monotonic() - t0:.1f} s); "
        f"records before {window.seam:%Y-%m-%d} declared beyond the log start "
        f"(offsets {', '.join(f'p{p}:{o}' for p, o in sorted(log_start.items()))})"
    )

    lo, hi = domain.ms(window.bug_from), domain.ms(window.read_to)
    in_window = [e for e in history.events if lo <= e.at_ms < hi]
    malformed: dict[str, int] = {}
    for e in in_window:
        if e.data is None:
            kind = _malformed_kind(e.value)
            malformed[kind] = malformed.get(kind, 0) + 1
    placed = (v1["placed_at"] >= window.bug_from) & (v1["placed_at"] < window.bug_to)
    wrong = v1["total"] != correct["total"]
    return Scene(
        topic=topic,
        archive_table=archive_table,
        model_table=model_table,
        sqlite_path=sqlite_path,
        catalog=catalog,
        events=len(history.events),
        log_start=log_start,
        in_read_window=len(in_window),
        malformed_in_window=malformed,
        orders_in_bug_window=int(placed.sum()),
        orders_wrong_in_v1=int(wrong.sum()),
        v1=v1,
        correct=correct,
        sample_ids=sorted(v1.loc[wrong, "order_id"])[:3],
    )


def _malformed_kind(value: bytes) -> str:
    try:
        data = json.loads(value)
    except ValueError:
        return "not JSON"
    if "order_id" not in data:
        return "no order id"
    return "qty not a number" if isinstance(data.get("qty"), str) else "negative quantity"


def _produce(settings: Settings, topic: str, history: domain.History) -> list[list[int]]:
    """Recreate ``topic`` and produce the history in time order; each record's offset, per partition."""
    # lazy: avoids confluent_kafka at import
    from confluent_kafka.admin import NewTopic  # confluent-kafka only once the demo produces


    conf = settings.kafka_config()
    admin = clients.admin(conf)
    if topic in admin.list_topics(timeout=15).topics:
        for fut in admin.delete_topics([topic]).values():
            fut.result(timeout=30)
        deadline = time.monotonic() + 30
        while topic in admin.list_topics(timeout=15).topics and time.monotonic() < deadline:
            time.sleep(0.2)
    # the history's records carry their own (past) times: a broker that expires by retention.ms
    # would drop them at once, so the topic keeps records forever (as the story needs)
    new = NewTopic(topic, PARTITIONS, 1, config={"retention.ms": "-1"})
    for fut in admin.create_topics([new]).values():
        fut.result(timeout=30)
    txn = TransactionalProducer(
        {**conf, "enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000}, error=DemoFailed
    )
    producer = txn.open()
    offsets: list[list[int]] = [[] for _ in range(PARTITIONS)]
    try:
        for event in history.events:
            offsets[event.partition].append(len(offsets[event.partition]))
            while True:
                try:
                    producer.produce(
                        topic,
                        value=event.value,
                        key=event.key,
                        partition=event.partition,
                        timestamp=event.at_ms,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        txn.flush(timeout_s=60)
    finally:
        txn.close()
    return offsets


def _first_offsets_at(history: domain.History, offsets: list[list[int]], at_ms: int) -> dict[int, int]:
    """Per partition, the offset of the first record at or after ``at_ms`` (the declared log start)."""
    first: dict[int, int] = {}
    position = [0] * PARTITIONS
    for event in history.events:
        p = event.partition
        if event.at_ms >= at_ms and p not in first:
            first[p] = offsets[p][position[p]]
        position[p] += 1
    return {p: first.get(p, position[p]) for p in range(PARTITIONS)}


def _arrow_schema() -> pa.Schema:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    # lazy: avoids numpy, pyarrow at import
    from rewind.translate.lineage import LINEAGE_SCHEMA

    fields = [pa.field(name, arrow_type(kind)) for name, kind in domain.READ_MODEL_SCHEMA.items()]
    # v1 is not Rewind: its rows carry no lineage, so the lineage columns are optional here
    return pa.schema(fields + [f.with_nullable(True) for f in LINEAGE_SCHEMA])


def _write_iceberg_model(catalog: Catalog, name: str, v1: pd.DataFrame) -> None:
    # lazy: avoids pyarrow at import
    import pyarrow as pa

    schema = _arrow_schema()
    table = catalog.create_table(name, schema=schema)
    data = pa.Table.from_pandas(v1, preserve_index=False)
    for f in schema:
        if f.name not in data.column_names:
            data = data.append_column(f, pa.nulls(len(data), f.type))
    table.append(data.select(schema.names).cast(schema))


_SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"  # naive UTC text, as Rewind's SQLite sink writes timestamps


def _write_sqlite_model(path: Path, v1: pd.DataFrame) -> None:
    """The service's SQL copy of the read model: its columns, a unique key, and (empty) lineage
    columns, which a backfill writes on every row it touches."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        leftover.unlink(missing_ok=True)  # the demo's own file: an earlier story's tables go with it
    columns = [f"{f.name} {sqlite_type(f.type)}" for f in _arrow_schema()]  # as the sink would type them
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE order_totals ({', '.join(columns)})")
        db.execute("CREATE UNIQUE INDEX order_totals_order_id ON order_totals (order_id)")
        rows = v1.assign(
            placed_at=v1["placed_at"].dt.strftime(_SQLITE_TIME),
            last_event_time=v1["last_event_time"].dt.strftime(_SQLITE_TIME),
        )
        names = ", ".join(domain.READ_MODEL_SCHEMA)
        db.executemany(
            f"INSERT INTO order_totals ({names}) VALUES ({', '.join('?' * len(domain.READ_MODEL_SCHEMA))})",
            rows[list(domain.READ_MODEL_SCHEMA)].itertuples(index=False, name=None),
        )


def read_sqlite_model(path: Path) -> pd.DataFrame:
    """``order_totals`` as the service reads it from SQLite now."""
    with sqlite3.connect(path) as db:
        frame = pd.read_sql_query(f"SELECT {', '.join(domain.READ_MODEL_SCHEMA)} FROM order_totals", db)
    for column in ("placed_at", "last_event_time"):
        frame[column] = pd.to_datetime(frame[column], utc=True, format="mixed")
    return frame.astype({"item_count": "int64"})
