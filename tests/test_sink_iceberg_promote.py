"""``rewind promote`` and ``rewind rollback`` of an Iceberg run, SIGKILLed at every step.

Each promote or rollback runs as a real ``rewind`` child process with ``REWIND_FAULT`` set to
one of the points of :mod:`rewind.faults` on that path: before the catalog commit, after it
(the ledger not told), after the audit entry (the run state not moved). After each kill the
target's ``main`` must be exactly the old snapshot or exactly the staged one, row for row; a
plain re-run (in the test's own process: nothing is killed there) must complete the step, and
the ledger must hold one audit entry per swap. Chains cover a branch swap, a rebase onto a
moved main (``--rebase``) and the rename of a new read model's staging table.

The run itself is recorded directly in the ledger (plan, run, staging, state) and its
staging written through the sink, as a finished ``rewind run`` leaves them: the promote path
under test is all real (catalog, ledger, CLI, SIGKILL), and no Spark job is needed for it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from rewind.config import Settings, load_settings
from rewind.core.parquet import write_parquet
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.test_sink_iceberg import SCHEMA, rows, ts

WINDOW_COLUMN = "_rewind_source_timestamp"


@dataclass
class Run:
    """One finished run of a replace-window job over [02:00, 04:00), staged and recorded."""

    settings: Settings
    run_id: str
    table: str
    staging: dict[str, Any]

    def catalog(self) -> Any:
        from rewind.catalog import load_catalog

        return load_catalog(self.settings)

    def main(self) -> tuple[int | None, list[dict[str, Any]]]:
        """The target's main: its snapshot id and its rows, sorted."""
        table = self.catalog().load_table(self.table)
        ref = table.metadata.refs.get("main")
        return (ref.snapshot_id if ref else None), sorted_rows(table.scan().to_arrow())

    def staged(self) -> list[dict[str, Any]]:
        return sorted_rows(jf.staging_table(self.settings, self.staging))

    def ledger(self) -> Any:
        from rewind.ledger import Ledger

        return Ledger.open(self.settings.ledger)

    def publish_log(self) -> tuple[str, list[str]]:
        """The run state and its promote/rollback audit entries, oldest first."""
        with self.ledger() as ledger:
            entries = [e.action for e in ledger.audit_log(self.run_id) if e.action in ("promote", "rollback")]
            return ledger.get_run(self.run_id).state, entries

    def cli(self, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REWIND_")}
        env.update(PYTHONPATH=str(jf.REPO), REWIND_STATE_DIR=str(self.settings.state_path))
        argv = [*args, self.run_id, "--json"]
        return cli_in_process.rewind_unless_killed(argv, cwd=Path.cwd(), env=env, fault=fault)


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["k"], r["v"]))


def record_run(settings: Settings, run_id: str, table: str, *, new_table: bool = False) -> Run:
    """Stage a run's output through the sink and record it in the ledger as a finished run."""
    from rewind.catalog import load_catalog
    from rewind.job.components import make_sink
    from rewind.spec import JobSpec

    catalog = load_catalog(settings)
    catalog.create_namespace_if_not_exists("an")
    iceberg = (
        {"table": table, "mode": "append"}
        if new_table
        else {
            "table": table,
            "mode": "replace-window",
            "window_column": WINDOW_COLUMN,
        }
    )
    if not new_table:
        target = catalog.create_table(table, schema=SCHEMA)
        target.append(rows((1, "a", 1), (2, "b", 2), (3, "c", 3), (4, "d", 4)))
    spec = jf.order_spec(
        f"promote-{run_id}",
        "orders",
        table,
        source={"kafka": {"topics": ["orders"], "from": ts(2).isoformat(), "to": ts(4).isoformat()}},
        sink={"iceberg": iceberg},
    )
    sink: Any = make_sink(settings, JobSpec.model_validate(spec))
    staging = sink.prepare(run_id, SCHEMA)
    files = [write_parquet(sink.data_folder(staging), rows((2, "B", 2), (3, "C", 3)), "x")]
    sink.commit(staging, run_id, ["orders/0/0-2"], files)
    jf.record_finished_run(settings, spec, sink.target, run_id, staging)
    return Run(settings, run_id, table, staging.to_dict())


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Ledger and SQLite-backed Iceberg catalog in a fresh state folder (no broker needed)."""
    return load_settings(env={"REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)


PROMOTE = ("promote", "--force", "--reason", "test: promote under kill -9")


def killed(run: Run, args: tuple[str, ...], fault: str) -> None:
    proc = run.cli(*args, fault=fault)
    assert proc.returncode == -9, f"{fault} did not fire ({proc.returncode}): {proc.stderr[-2000:]}"


def completed(run: Run, args: tuple[str, ...]) -> dict[str, Any]:
    proc = run.cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


POINTS = ["before-commit", "after-commit", "after-audit"]


def fault(action: str, point: str) -> str:
    return f"{action}-after-audit" if point == "after-audit" else f"iceberg-{action}-{point}"


@pytest.mark.parametrize("point", POINTS)
def test_branch_promote_and_rollback_killed_then_rerun(settings: Settings, point: str) -> None:
    run = record_run(settings, f"kill-{point}", "an.totals")
    old_snapshot, old_rows = run.main()
    staged_rows = run.staged()
    assert staged_rows == sorted_rows(rows((1, "a", 1), (2, "B", 2), (3, "C", 3), (4, "d", 4)))
    staged_snapshot = run.catalog().load_table(run.table).snapshot_by_name(run.staging["branch"]).snapshot_id

    killed(run, PROMOTE, fault("promote", point))
    expected = (old_snapshot, old_rows) if point == "before-commit" else (staged_snapshot, staged_rows)
    assert run.main() == expected  # exactly the old or exactly the staged main, never a mix
    done = completed(run, PROMOTE)
    assert done["state"] == "promoted" and done["swap"]["after"] == staged_snapshot
    assert run.main() == (staged_snapshot, staged_rows)
    assert run.publish_log() == ("promoted", ["promote"])  # audited once
    assert completed(run, PROMOTE)["already_promoted"] is True

    killed(run, ("rollback",), fault("rollback", point))
    expected = (staged_snapshot, staged_rows) if point == "before-commit" else (old_snapshot, old_rows)
    assert run.main() == expected
    assert completed(run, ("rollback",))["state"] == "rolled_back"
    assert run.main() == (old_snapshot, old_rows)
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])


@pytest.mark.parametrize("point", POINTS)
def test_rebase_promote_killed_then_rerun_and_rolled_back(settings: Settings, point: str) -> None:
    run = record_run(settings, f"rebase-{point}", "an.moved")
    live = run.catalog().load_table(run.table)
    live.append(rows((9, "late", 6)))  # main moves, outside the window
    moved_snapshot, moved_rows = run.main()
    refused = run.cli(*PROMOTE)
    assert refused.returncode == 1 and "--rebase" in refused.stderr and len(refused.stderr.splitlines()) == 1
    rebased_rows = sorted_rows(rows((1, "a", 1), (2, "B", 2), (3, "C", 3), (4, "d", 4), (9, "late", 6)))

    killed(run, (*PROMOTE, "--rebase"), fault("promote", point))
    snapshot, now = run.main()
    if point == "before-commit":
        assert (snapshot, now) == (moved_snapshot, moved_rows)
    else:
        assert snapshot != moved_snapshot and now == rebased_rows
    # nothing was committed before the kill: the re-run rebases; after it, the re-run finds
    # the rebase on main and only records it, even without --rebase
    rerun = (*PROMOTE, "--rebase") if point == "before-commit" else PROMOTE
    swap = completed(run, rerun)["swap"]
    assert swap["before"] == moved_snapshot and swap["rebase"]["onto"] == moved_snapshot
    assert run.main() == (swap["after"], rebased_rows)
    assert run.publish_log() == ("promoted", ["promote"])

    killed(run, ("rollback",), fault("rollback", point))
    assert run.main() in ((swap["after"], rebased_rows), (moved_snapshot, moved_rows))
    completed(run, ("rollback",))
    assert run.main() == (moved_snapshot, moved_rows)  # the main from just before the promote
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])


def test_new_read_model_rename_killed_then_rerun(settings: Settings) -> None:
    run = record_run(settings, "fresh", "an.fresh", new_table=True)
    staged_rows = run.staged()
    catalog = run.catalog()

    killed(run, PROMOTE, "iceberg-promote-after-commit")
    assert not catalog.table_exists(run.staging["table"]) and catalog.table_exists(run.table)
    assert run.main()[1] == staged_rows
    completed(run, PROMOTE)
    assert run.publish_log() == ("promoted", ["promote"])

    killed(run, ("rollback",), "iceberg-rollback-before-commit")
    assert run.main()[1] == staged_rows
    completed(run, ("rollback",))
    assert not catalog.table_exists(run.table) and catalog.table_exists(run.staging["table"])
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])


def test_rollback_completes_a_promote_killed_after_its_audit(settings: Settings) -> None:
    run = record_run(settings, "half", "an.half")
    old = run.main()
    killed(run, PROMOTE, "promote-after-audit")
    assert run.publish_log() == ("succeeded", ["promote"])  # swapped and audited, state not moved
    completed(run, ("rollback",))
    assert run.main() == old
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])
