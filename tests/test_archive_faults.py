"""``rewind archive`` killed with SIGKILL mid-commit, then run again: no duplicate, no missing offset.

Each crash runs the real command in a child process with ``REWIND_FAULT`` (see
:mod:`rewind.faults`): ``archive-before-commit`` dies after the files and gaps are written
but before the Iceberg commit; ``archive-after-commit`` dies right after the commit, before
the command returns. The next pass must start exactly where the last commit ended.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from confluent_kafka import Producer

from rewind.catalog import load_catalog
from rewind.config import Settings, load_settings
from rewind.history.archive import archive_once
from rewind.history.schema import archive_state, open_archive
from tests import job_fixtures as jf
from tests.kafka_util import create_topic

CLI = "from rewind.cli import main; main()"


def produce(conf: dict[str, Any], topic: str, start: int, count: int) -> None:
    producer = Producer({**conf, "linger.ms": 5, "enable.idempotence": True})
    for i in range(start, start + count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0


def run_cli(
    settings: Settings, cwd: Path, args: list[str], fault: str | None
) -> subprocess.CompletedProcess[str]:
    # jf.child_env: the driver JVM without C2, which starts a one-job child's Spark much faster
    env = jf.child_env(settings, **({"REWIND_FAULT": fault} if fault else {}))
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def offsets(settings: Settings, table: str) -> Counter[tuple[int, int]]:
    iceberg = load_catalog(settings).load_table(table)
    rows = iceberg.scan(selected_fields=("partition", "offset")).to_arrow()
    return Counter(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True))


def test_kill_before_and_after_commit_then_rerun(tmp_path: Path, bootstrap: str, spark: Any) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    conf = settings.kafka_config()
    topic = f"faults-{uuid.uuid4().hex[:8]}"
    table = f"lake.faults_{uuid.uuid4().hex[:8]}"
    create_topic(conf, topic, 2)
    produce(conf, topic, 0, 300)
    args = ["archive", topic, "--table", table, "--json"]

    died = run_cli(settings, tmp_path, args, "archive-before-commit")
    assert died.returncode == -9, died.stderr[-3000:]
    catalog = load_catalog(settings)
    assert archive_state(open_archive(catalog, table)).hw == {}  # files written, nothing committed
    fs, root = pafs.FileSystem.from_uri(f"{open_archive(catalog, table).location()}/data")
    orphans = [
        f for f in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if f.path.endswith(".parquet")
    ]
    assert orphans

    produce(conf, topic, 300, 100)
    died = run_cli(settings, tmp_path, args, "archive-after-commit")
    assert died.returncode == -9, died.stderr[-3000:]
    assert archive_state(open_archive(catalog, table)).hw == {(topic, 0): 200, (topic, 1): 200}

    produce(conf, topic, 400, 50)
    last = archive_once(settings, [topic], table, spark=spark)
    assert last.records == 50
    got = offsets(settings, table)
    assert all(n == 1 for n in got.values())
    assert sorted(got) == sorted([(0, o) for o in range(225)] + [(1, o) for o in range(225)])

    from typer.testing import CliRunner

    from rewind.cli import app

    env = {
        "REWIND_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "REWIND_STATE_DIR": str(settings.state_path),
    }
    again = CliRunner().invoke(app, args, env=env)  # the command once more, in process: nothing new
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["records"] == 0 and report["passes"][0]["committed"] is False


@pytest.mark.parametrize("bad", [["archive", "t", "--table", "no_namespace"]])
def test_archive_command_errors_are_one_line(tmp_path: Path, bootstrap: str, bad: list[str]) -> None:
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path
    )
    from typer.testing import CliRunner

    from rewind.cli import app

    env = {
        "REWIND_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "REWIND_STATE_DIR": str(settings.state_path),
    }
    result = CliRunner().invoke(app, [*bad, "--json"], env=env)
    assert result.exit_code == 1
    assert "expected namespace.table" in result.output
