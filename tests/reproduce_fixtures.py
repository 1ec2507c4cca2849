"""Sources of truth for the re-produce tests: an accounts table in SQLite, PostgreSQL and Iceberg,
the translate that turns a row into a current-state message, and readers of what was produced.

Every account's fate is known from its id: ids divisible by 97 are ``corrupt`` (the translate
rejects them), the rest become one message each.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from rewind.translate.functions import TranslateResult

CORRUPT_EVERY = 97
STATUSES = ("active", "blocked", "closed")


@dataclass(frozen=True)
class Account:
    id: int
    name: str
    balance_cents: int
    status: str
    region: str

    @property
    def rejected(self) -> bool:
        return self.status == "corrupt"

    def message(self) -> dict[str, Any]:
        """The value the translate makes of the row (what a consumer reads)."""
        return {
            "account_id": self.id,
            "name": self.name,
            "balance": round(self.balance_cents / 100, 2),
            "status": self.status,
            "region": self.region,
        }


def accounts(n: int, first: int = 1) -> list[Account]:
    out = []
    for i in range(first, first + n):
        status = "corrupt" if i % CORRUPT_EVERY == 0 else STATUSES[i % 3]
        out.append(Account(i, f"account {i}", (i * 7919) % 1_000_000, status, "eu" if i % 2 else "us"))
    return out


def account_state(events: pd.DataFrame) -> TranslateResult:
    """A row of ``accounts`` → the current-state message of the account; corrupt rows rejected."""
    bad = events["status"] == "corrupt"
    good = events[~bad]
    rows = pd.DataFrame(
        {
            "_rewind_row": good["_rewind_row"],
            "account_id": good["id"].astype("int64"),
            "name": good["name"],
            "balance": (good["balance_cents"].astype("float64") / 100).round(2),
            "status": good["status"],
            "region": good["region"],
        }
    )
    rejects = pd.DataFrame({"_rewind_row": events.loc[bad, "_rewind_row"], "reason": "corrupt account"})
    return TranslateResult(rows=rows, rejects=rejects)


CREATE = (
    "CREATE TABLE accounts (id BIGINT PRIMARY KEY, name TEXT NOT NULL, balance_cents BIGINT NOT NULL, "
    "status TEXT NOT NULL, region TEXT NOT NULL)"
)


def sqlite_accounts(path: Path, rows: list[Account]) -> str:
    with sqlite3.connect(path) as db:
        db.execute(CREATE)
        db.executemany(
            "INSERT INTO accounts VALUES (?, ?, ?, ?, ?)",
            [(a.id, a.name, a.balance_cents, a.status, a.region) for a in rows],
        )
    return f"sqlite:///{path}"


def postgres_accounts(url: str, rows: list[Account], table: str = "accounts") -> None:
    import psycopg

    with psycopg.connect(url) as db:
        db.execute(CREATE.replace("accounts", table, 1))
        with db.cursor().copy(f"COPY {table} (id, name, balance_cents, status, region) FROM STDIN") as copy:
            for a in rows:
                copy.write_row((a.id, a.name, a.balance_cents, a.status, a.region))


def iceberg_accounts(settings: Any, table: str, rows: list[Account]) -> None:
    import pyarrow as pa

    from rewind.catalog import load_catalog

    data = pa.table(
        {
            "id": pa.array([a.id for a in rows], pa.int64()),
            "name": [a.name for a in rows],
            "balance_cents": pa.array([a.balance_cents for a in rows], pa.int64()),
            "status": [a.status for a in rows],
            "region": [a.region for a in rows],
        }
    )
    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
    catalog.create_table(table, schema=data.schema).append(data)


def spec(name: str, source: dict[str, Any], topic: str, **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "source": {"table": source},
        "decode": "rows",
        "translate": {"function": "tests.reproduce_fixtures:account_state", "version": "3"},
        "key": ["account_id"],
        "sink": {"kafka": {"topic": topic}},
    }
    data.update(sections)
    return data


def stable_offsets(conf: dict[str, Any], topic: str) -> dict[int, tuple[int, int, int]]:
    """Per partition (low watermark, last stable offset, high watermark): where a
    ``read_committed`` reader stops short of the end, an open transaction holds it back."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from rewind.kafka.clients import cluster_metadata

    admin = AdminClient(conf)
    parts = [TopicPartition(topic, p) for p in sorted(cluster_metadata(conf).topics[topic].partitions)]

    def ask(spec: Any, isolation: Any) -> dict[int, int]:
        asked = admin.list_offsets({tp: spec for tp in parts}, isolation_level=isolation, request_timeout=30)
        return {tp.partition: f.result().offset for tp, f in asked.items()}

    low = ask(OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)
    stable = ask(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
    high = ask(OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    return {p: (low[p], stable[p], high[p]) for p in low}


@dataclass(frozen=True)
class Produced:
    key: str
    partition: int
    offset: int
    value: dict[str, Any]
    headers: dict[str, str]
    timestamp: int


def read_topic(conf: dict[str, Any], topic: str, isolation: str = "read_committed") -> list[Produced]:
    """Every record of ``topic`` (all partitions, to the end), in partition and offset order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from rewind.kafka.clients import cluster_metadata

    meta = cluster_metadata(conf).topics[topic]
    consumer = Consumer(
        {
            **conf,
            "group.id": "reproduce-test-reader",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[Produced] = []
    try:
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        left = set(parts)
        while left:
            for msg in consumer.consume(500, timeout=2.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition())
                    continue
                headers = {k: (v or b"").decode() for k, v in (msg.headers() or [])}
                out.append(
                    Produced(
                        (msg.key() or b"").decode(),
                        msg.partition() or 0,
                        msg.offset() or 0,
                        json.loads(msg.value() or b"null"),
                        headers,
                        msg.timestamp()[1],
                    )
                )
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))
