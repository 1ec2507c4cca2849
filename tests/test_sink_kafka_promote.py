"""``rewind promote`` and ``rewind rollback`` of a Kafka topic run, SIGKILLed at every step.

The Kafka sink publishes a run by writing one record, ``<run id>/publication`` in the compacted
``rewind.commits`` topic: ``published`` (with the topic's end offsets and record count) on
promote, ``withdrawn`` on rollback. Each promote or rollback runs as a real ``rewind`` child
process with ``REWIND_FAULT`` set to one of the points of :mod:`rewind.faults` on that path:
before that record is produced, after it is acknowledged (the ledger not told), after the audit
entry (the run state not moved). After each kill the publication the sink reports must be
exactly the old one or exactly the new one; a plain re-run (in the test's own process: nothing
is killed there) must complete the step without writing a second record for the same swap, and
the ledger must hold one audit entry per swap. The backfill topic's records are never touched
by publishing.

The run is recorded directly in the ledger (plan, run, staging, state) and its topic written
through the sink (``prepare`` + ``commit`` of Parquet files, as the runner does), as a finished
``rewind run`` leaves them; no Spark job is needed. The broker is the test session's (embedded
tansu, or ``REWIND_TEST_BOOTSTRAP``), so run ids are unique (``rewind.commits`` is shared).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rewind.config import Settings, load_settings
from rewind.core.parquet import write_parquet
from rewind.sinks.kafka.bookkeeping import KafkaStaging, bookkeeping_partition, read_log
from rewind.sinks.kafka.sink import KafkaTopicSink
from rewind.sinks.kafka.topics import high_watermarks, partition_watermarks
from tests import cli_in_process
from tests import job_fixtures as jf
from tests.kafka_util import create_topic
from tests.test_sink_kafka import SCHEMA, output_rows

PARTITIONS = 2
ROWS_PER_UNIT = 50


@dataclass
class Run:
    """One finished run into a backfill topic of its own, staged and recorded."""

    settings: Settings
    run_id: str
    sink: KafkaTopicSink
    staging: KafkaStaging

    def publication(self) -> dict[str, Any] | None:
        """The run's publication as the sink reports it (a fresh sink: nothing cached)."""
        record = self.fresh_sink().publication(self.run_id)
        if record is None:
            return None
        keys = ("state", "topic", "end_offsets", "records", "withdrawn")
        return {k: record[k] for k in keys if k in record}

    def fresh_sink(self) -> KafkaTopicSink:
        return KafkaTopicSink(
            self.settings.kafka_config(),
            source_topics=self.sink.source_topics,
            key=["order_id"],
            spool_dir=self.sink.spool_dir,
        )

    def publication_records(self) -> list[str]:
        """The states of every ``<run>/publication`` record in ``rewind.commits``, in log order."""
        conf = self.settings.kafka_config()
        topic = self.staging.bookkeeping
        marks = partition_watermarks(conf, topic, partitions=(bookkeeping_partition(self.run_id),))
        lows = {p: low for p, (low, _high) in marks.items()}
        highs = {p: high for p, (_low, high) in marks.items()}
        key = f"{self.run_id}/publication".encode()
        return [
            json.loads(msg.value() or b"")["state"]
            for msg in read_log(conf, topic, lows, highs)
            if msg.key() == key and msg.value() is not None
        ]

    def topic_ends(self) -> dict[int, int]:
        return high_watermarks(self.settings.kafka_config(), self.staging.topic)

    def publish_log(self) -> tuple[str, list[str]]:
        """The run state and its promote/rollback audit entries, oldest first."""
        from rewind.ledger import Ledger

        with Ledger.open(self.settings.ledger) as ledger:
            entries = [e.action for e in ledger.audit_log(self.run_id) if e.action in ("promote", "rollback")]
            return ledger.get_run(self.run_id).state, entries

    def cli(self, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = [*args, self.run_id, "--json"]
        env = jf.child_env(self.settings)
        return cli_in_process.rewind_unless_killed(argv, cwd=Path.cwd(), env=env, fault=fault)


def record_run(settings: Settings, src: str, label: str) -> Run:
    """Stage a run's output through the sink and record it in the ledger as a finished run."""
    from rewind.job.components import make_sink
    from rewind.spec import JobSpec

    run_id = f"{label}-{uuid.uuid4().hex[:8]}"
    spec = jf.order_spec(f"promote-{run_id}", src, "unused.t")
    spec["sink"] = {"kafka": {}}
    sink: Any = make_sink(settings, JobSpec.model_validate(spec))
    assert isinstance(sink, KafkaTopicSink)
    staging = sink.prepare(run_id, SCHEMA)
    units = [f"{src}/{p}/0-{ROWS_PER_UNIT}" for p in range(PARTITIONS)]
    files = [
        write_parquet(sink.data_folder(staging), output_rows(src, p, 0, ROWS_PER_UNIT, run_id), f"u{p}")
        for p in range(PARTITIONS)
    ]
    counts = {
        u: {"records_read": ROWS_PER_UNIT, "emitted": ROWS_PER_UNIT, "rows_out": ROWS_PER_UNIT} for u in units
    }
    sink.commit(staging, run_id, units, files, extra={"rewind.unit-counts": json.dumps(counts)})
    jf.record_finished_run(settings, spec, sink.target, run_id, staging)
    return Run(settings, run_id, sink, staging)


@dataclass
class World:
    settings: Settings
    src: str


@pytest.fixture(scope="module")
def world(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> World:
    """The session's broker (``bootstrap``: embedded, or REWIND_TEST_BOOTSTRAP), a ledger of this
    module's own, and one source topic the runs are named after."""
    tmp: Path = tmp_path_factory.mktemp("kafka-promote")
    settings = load_settings(
        env={"REWIND_BOOTSTRAP_SERVERS": bootstrap, "REWIND_STATE_DIR": str(tmp / "state")}, cwd=tmp
    )
    src = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(settings.kafka_config(), src, PARTITIONS)
    return World(settings, src)


PROMOTE = ("promote", "--force", "--reason", "test: promote under kill -9")
POINTS = ["before-commit", "after-commit", "after-audit"]


def fault(action: str, point: str) -> str:
    return f"{action}-after-audit" if point == "after-audit" else f"kafka-{action}-{point}"


def killed(run: Run, args: tuple[str, ...], fault: str) -> None:
    proc = run.cli(*args, fault=fault)
    assert proc.returncode == -9, f"{fault} did not fire ({proc.returncode}): {proc.stderr[-2000:]}"


def completed(run: Run, args: tuple[str, ...]) -> dict[str, Any]:
    proc = run.cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


@pytest.mark.parametrize("point", POINTS)
def test_promote_and_rollback_killed_then_rerun(world: World, point: str) -> None:
    run = record_run(world.settings, world.src, f"kill-{point}")
    ends = run.topic_ends()
    rows = PARTITIONS * ROWS_PER_UNIT
    assert sum(ends.values()) == rows and run.publication() is None
    published = {
        "state": "published",
        "topic": run.staging.topic,
        "end_offsets": {str(p): o for p, o in sorted(ends.items())},
        "records": rows,
    }
    withdrawn = {"state": "withdrawn", "topic": run.staging.topic, "withdrawn": published}

    def withdrawn_view() -> dict[str, Any] | None:
        """The publication, its ``withdrawn`` copy of the published record cut to the same keys."""
        view = run.publication()
        if view is not None and "withdrawn" in view:
            view["withdrawn"] = {k: view["withdrawn"][k] for k in published}
        return view

    killed(run, PROMOTE, fault("promote", point))
    assert run.publication() == (None if point == "before-commit" else published)  # not a half of either
    assert run.publish_log() == ("succeeded", ["promote"] if point == "after-audit" else [])
    done = completed(run, PROMOTE)
    assert done["state"] == "promoted" and done["swap"]["already_done"] is (point != "before-commit")
    assert run.publication() == published
    assert run.publication_records() == ["published"]  # the re-run did not publish twice
    assert run.publish_log() == ("promoted", ["promote"])  # audited once

    killed(run, ("rollback",), fault("rollback", point))
    assert withdrawn_view() == (published if point == "before-commit" else withdrawn)
    done = completed(run, ("rollback",))
    assert done["state"] == "rolled_back" and done["swap"]["already_done"] is (point != "before-commit")
    assert withdrawn_view() == withdrawn
    assert run.publication_records() == ["published", "withdrawn"]
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])
    assert run.topic_ends() == ends  # publishing never touches the backfill topic's records

    if point == "after-commit":  # the withdrawn topic is published again
        assert completed(run, PROMOTE)["swap"]["already_done"] is False
        assert run.publication() == published
        assert run.publication_records() == ["published", "withdrawn", "published"]
        assert run.publish_log() == ("promoted", ["promote", "rollback", "promote"])


def test_rollback_completes_a_promote_killed_after_its_audit(world: World) -> None:
    run = record_run(world.settings, world.src, "half")
    killed(run, PROMOTE, "promote-after-audit")
    assert run.publish_log() == ("succeeded", ["promote"])  # published and audited, state not moved
    assert (run.publication() or {}).get("state") == "published"
    completed(run, ("rollback",))
    assert (run.publication() or {}).get("state") == "withdrawn"
    assert run.publication_records() == ["published", "withdrawn"]
    assert run.publish_log() == ("rolled_back", ["promote", "rollback"])
