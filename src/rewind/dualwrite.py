"""``rewind.dualwrite``: the live service's side of a dual-write cutover (``rewind shadow``).

After ``rewind shadow cutover NAME --dual-write`` the live service, restarted from the cut
line, writes every row to v1 **and** v2 with the same idempotent key (an upsert on the
job's key), until ``rewind shadow repoint NAME`` moves the reads to v2; from then on it
writes the swapped table only. :class:`DualWriter` does that by asking the ledger, once per
:meth:`DualWriter.upsert`, where rows go now:

* ``dual-write``: v1 and v2, in one transaction of the service's database;
* ``repointing``: v2 only (v1 stops moving, so the swap can check it did not);
* ``repointed`` and later: the target's name (which is v2 after the swap).

A write that meets the swap halfway (its table renamed under it) is rolled back and
retried with the tables read again, for up to ``swap_wait_s``. Usage in a consumer loop::

    writer = DualWriter("sqlite:///state/ledger.db", "orders-v2", "sqlite:///app.db")
    for batch in batches:
        writer.upsert(rows)      # list of dicts: column -> value
        consumer.commit()
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from rewind.errors import RewindError


class DualWriteError(RewindError):
    """The shadow is not in a state where the live service writes through this helper."""


def _quote(name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


class DualWriter:
    """Upserts a live service's rows into the tables a shadow's state names (see the module)."""

    def __init__(self, ledger_url: str, shadow: str, database_url: str, *, swap_wait_s: float = 30.0) -> None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        # lazy: avoids sqlalchemy at import
        from rewind.ledger import Ledger
        from rewind.ledger.shadows import ShadowStore

        self.ledger = Ledger.open(ledger_url)
        self.store = ShadowStore(self.ledger.engine)
        self.shadow = shadow
        self.swap_wait_s = swap_wait_s
        url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
        sqlite = url.startswith("sqlite")
        self.engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 30} if sqlite else {})

    def tables(self) -> tuple[list[str], list[str]]:
        """The tables to write now, and the key to upsert on."""
        record = self.store.get(self.shadow)
        facts = record.details.get("dual_write")
        if facts is None:
            raise DualWriteError(
                f"shadow {self.shadow} is {record.state}, not cut over with --dual-write; "
                "run `rewind shadow cutover NAME --dual-write` first"
            )
        if record.state == "dual-write":
            return [facts["v1"], facts["v2"]], list(facts["key"])
        if record.state == "repointing":
            return [facts["v2"]], list(facts["key"])
        if record.state in ("repointed", "decommissioned"):
            return [facts["v1"]], list(facts["key"])  # v2 carries v1's name since the swap
        raise DualWriteError(f"shadow {self.shadow} is {record.state}; nothing to dual-write")

    def upsert(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """Upsert ``rows`` into every table the shadow names now, in one transaction; the tables."""
        # lazy: avoids sqlalchemy at import
        from sqlalchemy.exc import OperationalError, ProgrammingError

        if not rows:
            return []
        deadline = time.monotonic() + self.swap_wait_s
        while True:
            tables, key = self.tables()
            try:
                self._write(tables, key, rows)
                return tables
            except (OperationalError, ProgrammingError):
                # the swap renamed a table under this write: the ledger names the new one as
                # soon as `repoint` records it; until then, wait (nothing was written)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _write(self, tables: list[str], key: list[str], rows: Sequence[Mapping[str, Any]]) -> None:
        # lazy: avoids sqlalchemy at import
        from sqlalchemy import text

        columns = list(rows[0])
        names = ", ".join(_quote(c) for c in columns)
        marks = ", ".join(f":c{i}" for i in range(len(columns)))
        update = ", ".join(f"{_quote(c)} = excluded.{_quote(c)}" for c in columns if c not in key)
        params = [{f"c{i}": row[c] for i, c in enumerate(columns)} for row in rows]
        with self.engine.begin() as conn:
            for table in tables:
                conn.execute(
                    text(
                        f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks}) "
                        f"ON CONFLICT ({', '.join(_quote(k) for k in key)}) DO UPDATE SET {update}"
                    ),
                    params,
                )

    def close(self) -> None:
        self.engine.dispose()
        self.ledger.close()
