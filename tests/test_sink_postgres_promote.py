"""``rewind promote`` and ``rewind rollback`` of a PostgreSQL (and SQLite) run, SIGKILLed at every step.

Each promote or rollback runs as a real ``rewind`` child process with ``REWIND_FAULT`` set to
one of the points of :mod:`rewind.faults` on that path: inside the rename transaction before it
commits (renames done, exclusive locks held), right after it commits (the ledger not told),
after the audit entry (the run state not moved). After each kill the target must be exactly the
old table or exactly the staged one, row for row (and the tables beside it and the sink's
``rewind_stagings`` row must agree); readers looping over the target while the child runs must
only ever see one of the two, never an error or a missing table. A plain re-run (in the test's
own process: nothing is killed there) must complete the step, and the ledger must hold one
audit entry per swap.

The run is recorded directly in the ledger (plan, run, staging, state) and its staging written
through the sink (``prepare`` + ``commit`` of Parquet files, as the runner does), as a finished
``rewind run`` leaves them: the promote path under test is all real (database, ledger, CLI,
SIGKILL), and no Spark job is needed for it.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rewind.config import Settings, load_settings
from rewind.core.counts import UNIT_COUNTS_KEY
from rewind.core.parquet import write_parquet
from rewind.sinks.sql.backend import STAGINGS_TABLE
from rewind.sinks.sql.sink import SqlSink, SqlStaging
from rewind.translate.lineage import LINEAGE_SCHEMA
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.test_sink_postgres import SCHEMA, rows

LINEAGE_SQL = {
    "postgres": {"string": "text", "int32": "integer", "int64": "bigint", "bool": "boolean"},
    "sqlite": {"string": "TEXT", "int32": "INTEGER", "int64": "INTEGER", "bool": "BOOLEAN"},
}
TIMESTAMP_SQL = {"postgres": "timestamptz", "sqlite": "TIMESTAMP"}


@dataclass
class Db:
    """The sink's database, read with its own client (not through the sink)."""

    kind: str  # "postgres" | "sqlite"
    url: str
    schema: str | None

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            with closing(sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30)) as lite, lite:
                return lite.execute(sql).fetchall()
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def q(self, table: str) -> str:
        return f'"{self.schema}"."{table}"' if self.schema else f'"{table}"'

    def rows(self, table: str) -> list[tuple[Any, ...]]:
        """Every column of every row, in key order: what a reader of ``table`` sees."""
        return self.query(f"SELECT * FROM {self.q(table)} ORDER BY order_id")

    def tables(self, prefix: str) -> set[str]:
        if self.kind == "sqlite":
            found = self.query("SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            found = self.query(f"SELECT tablename FROM pg_tables WHERE schemaname = '{self.schema}'")
        return {name for (name,) in found if name.startswith(prefix)}

    def create_target(self, table: str, n: int) -> None:
        lineage = ", ".join(
            f"{f.name} {LINEAGE_SQL[self.kind].get(str(f.type), TIMESTAMP_SQL[self.kind])}"
            for f in LINEAGE_SCHEMA
        )
        statements = [
            f"CREATE TABLE {self.q(table)} (order_id bigint PRIMARY KEY, status text, "
            f"amount double precision, {lineage})",
            f"CREATE INDEX {table}_status ON {self.q(table)} (status)",
            f"INSERT INTO {self.q(table)} (order_id, status, amount) VALUES "
            + ", ".join(f"({i}, 'live', {i * 1.5})" for i in range(1, n + 1)),
        ]
        for statement in statements:
            self.query(statement)


@dataclass
class Readers:
    """What readers looping over the target saw (each answer all of a table's rows), and their errors."""

    answers: list[list[tuple[Any, ...]]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)


@dataclass
class Run:
    """One finished run repairing (or creating) a read model, staged and recorded."""

    settings: Settings
    db: Db
    run_id: str
    table: str
    staging: SqlStaging

    @property
    def staged_name(self) -> str:
        return self.staging.table.split(".")[-1]

    @property
    def prev_name(self) -> str:
        return self.staging.prev_table.split(".")[-1]

    def target(self) -> list[tuple[Any, ...]] | None:
        """The target's rows, or None when there is no such table."""
        return self.db.rows(self.table) if self.db.tables(self.table) >= {self.table} else None

    def state(self) -> tuple[list[tuple[Any, ...]] | None, set[str], str]:
        """(target rows, the run's tables beside the target, the staging's recorded state)."""
        beside = self.db.tables(self.table) - {self.table}
        [(recorded,)] = self.db.query(
            f"SELECT state FROM {self.db.q(STAGINGS_TABLE)} WHERE staging = '{self.staged_name}'"
        )
        return self.target(), beside, recorded

    def publish_log(self) -> tuple[str, list[str]]:
        """The run state and its promote/rollback audit entries, oldest first."""
        from rewind.ledger import Ledger

        with Ledger.open(self.settings.ledger) as ledger:
            entries = [e.action for e in ledger.audit_log(self.run_id) if e.action in ("promote", "rollback")]
            return ledger.get_run(self.run_id).state, entries

    def cli(
        self, *args: str, fault: str | None = None, read: bool = True
    ) -> tuple[subprocess.CompletedProcess[str], Readers]:
        """``rewind ARGS RUN --json`` (in a child process when a fault is to kill it, else in
        this one); with ``read``, readers loop over the target meanwhile."""
        argv = [*args, self.run_id, "--json"]
        env = jf.child_env(self.settings)
        with self.readers(read) as seen:
            proc = cli_in_process.rewind_unless_killed(argv, cwd=Path.cwd(), env=env, fault=fault)
        return proc, seen

    @contextmanager
    def readers(self, enabled: bool) -> Iterator[Readers]:
        """Two readers, each on its own connection, reading the whole target again and again."""
        seen = Readers()
        if not enabled:
            yield seen
            return
        stop = threading.Event()
        sql = f"SELECT * FROM {self.db.q(self.table)} ORDER BY order_id"

        def reader() -> None:
            try:
                if self.db.kind == "sqlite":
                    conn: Any = sqlite3.connect(self.db.url.removeprefix("sqlite:///"), timeout=30)
                else:
                    conn = psycopg.connect(self.db.url, autocommit=True)
                try:
                    while not stop.is_set():
                        seen.answers.append(conn.execute(sql).fetchall())
                        time.sleep(0.005)
                finally:
                    conn.close()
            except BaseException as exc:
                seen.errors.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            yield seen
        finally:
            stop.set()
            for t in threads:
                t.join(60)


def record_run(settings: Settings, db: Db, run_id: str, table: str, *, new_table: bool = False) -> Run:
    """Stage a run's output through the sink and record it in the ledger as a finished run."""
    from rewind.job.components import make_sink
    from rewind.spec import JobSpec

    if not new_table:
        db.create_target(table, 30)
    qualified = f"{db.schema}.{table}" if db.schema else table
    spec = jf.order_spec(f"promote-{run_id}", "orders", "unused.t")
    spec["sink"] = {"postgres": {"table": qualified, "url": db.url}}
    sink: Any = make_sink(settings, JobSpec.model_validate(spec))
    assert isinstance(sink, SqlSink)
    try:
        staging = sink.prepare(run_id, SCHEMA)
        assert staging.target_existed is not new_table
        items = [(i, 100 + i, 0.25 * i) for i in range(1, 11)] + [(31, 200, 9.0)]
        repaired = rows(run_id, items, status="repaired")
        files = [write_parquet(sink.data_folder(staging), repaired, "data")]
        counts = {"orders/0/0-11": {"records_read": 11, "emitted": 11, "rows_out": 11}}
        sink.commit(staging, run_id, ["orders/0/0-11"], files, extra={UNIT_COUNTS_KEY: json.dumps(counts)})
    finally:
        sink.close()
    jf.record_finished_run(settings, spec, sink.target, run_id, staging)
    return Run(settings, db, run_id, table, staging)


@pytest.fixture(scope="module")
def pg(pg_url: str) -> str:
    return pg_url


@pytest.fixture(params=["postgres", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    if request.param == "postgres":
        return Db("postgres", request.getfixturevalue("pg"), "public")
    return Db("sqlite", f"sqlite:///{tmp_path / 'model.db'}", None)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Ledger in a fresh state folder (no broker, no catalog needed)."""
    return load_settings(env={"REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)


def name() -> str:
    return f"orders_{uuid.uuid4().hex[:6]}"


PROMOTE = ("promote", "--force", "--reason", "test: promote under kill -9")
POINTS = ["before-commit", "after-commit", "after-audit"]


def fault(action: str, point: str) -> str:
    return f"{action}-after-audit" if point == "after-audit" else f"postgres-{action}-{point}"


def killed(run: Run, args: tuple[str, ...], fault: str, *views: list[tuple[Any, ...]] | None) -> None:
    """Run the command with ``fault`` set: it must die by SIGKILL, and readers looping over the
    target meanwhile must only have seen whole tables that are one of ``views`` (no readers
    without ``views``: a new read model's target appears and disappears)."""
    proc, seen = run.cli(*args, fault=fault, read=bool(views))
    assert proc.returncode == -9, f"{fault} did not fire ({proc.returncode}): {proc.stderr[-2000:]}"
    readers_saw_only(seen, *views)


def completed(run: Run, args: tuple[str, ...], *views: list[tuple[Any, ...]] | None) -> dict[str, Any]:
    proc, seen = run.cli(*args, read=bool(views))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    readers_saw_only(seen, *views)
    return dict(json.loads(proc.stdout))


def readers_saw_only(seen: Readers, *views: list[tuple[Any, ...]] | None) -> None:
    assert not seen.errors, seen.errors[:1]  # never a missing table, never a lock error
    assert seen.answers or not views, "the readers read nothing"
    assert all(answer in views for answer in seen.answers), "a reader saw a table that is neither"


@pytest.mark.parametrize("point", POINTS)
def test_repair_promote_and_rollback_killed_then_rerun(settings: Settings, db: Db, point: str) -> None:
    run = record_run(settings, db, f"kill-{point}", name())
    old = run.target()
    new = db.rows(run.staged_name)
    assert old is not None and len(old) == 30 and len(new) == 31 and old != new
    old_state = (old, {run.staged_name}, "staged")  # the target, and the staged table beside it
    new_state = (new, {run.prev_name}, "promoted")  # the staged table is the target, the old one beside

    killed(run, PROMOTE, fault("promote", point), old, new)
    assert run.state() == (old_state if point == "before-commit" else new_state)
    assert run.publish_log() == ("succeeded", ["promote"] if point == "after-audit" else [])
    done = completed(run, PROMOTE, old, new)
    assert done["state"] == "promoted" and done["swap"]["already_done"] is (point != "before-commit")
    assert run.state() == new_state
    assert run.publish_log() == ("promoted", ["promote"])  # audited once

    killed(run, ("rollback",), fault("rollback", point), old, new)
    assert run.state() == (new_state if point == "before-commit" else old_state)
    completed(run, ("rollback",), old, new)
    assert run.state() == old_state
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])

    if point == "after-commit":  # the rolled-back staging promotes again
        assert completed(run, PROMOTE, old, new)["swap"]["already_done"] is False
        assert run.state() == new_state
        assert run.publish_log() == ("promoted", ["promote", "rollback", "promote"])


@pytest.mark.parametrize("action_point", ["promote-after-commit", "rollback-before-commit"])
def test_new_read_model_rename_killed_then_rerun(settings: Settings, db: Db, action_point: str) -> None:
    """A new read model: staging is renamed to the target (and back); the target appears whole."""
    run = record_run(settings, db, f"fresh-{action_point}", name(), new_table=True)
    assert run.target() is None
    new = db.rows(run.staged_name)
    assert len(new) == 11

    promote_fault = "postgres-promote-after-commit" if action_point.startswith("promote") else None
    if promote_fault:
        killed(run, PROMOTE, promote_fault)
        assert run.state() == (new, set(), "promoted")
    completed(run, PROMOTE)
    assert run.state() == (new, set(), "promoted")
    assert run.publish_log() == ("promoted", ["promote"])

    rollback_fault = "postgres-rollback-before-commit" if action_point.startswith("rollback") else None
    if rollback_fault:
        killed(run, ("rollback",), rollback_fault)
        assert run.state() == (new, set(), "promoted")
    completed(run, ("rollback",))
    assert run.state() == (None, {run.staged_name}, "staged")
    assert db.rows(run.staged_name) == new
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])


def test_rollback_completes_a_promote_killed_after_its_audit(settings: Settings, pg: str) -> None:
    db = Db("postgres", pg, "public")
    run = record_run(settings, db, "half", name())
    old = run.target()
    new = db.rows(run.staged_name)
    killed(run, PROMOTE, "promote-after-audit", old, new)
    assert run.publish_log() == ("succeeded", ["promote"])  # swapped and audited, state not moved
    completed(run, ("rollback",), old, new)
    assert run.state() == (old, {run.staged_name}, "staged")
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])
