"""The Kafka-protocol brokers the tests run against, and what each of them can do.

Two real brokers are started by the suite: the embedded tansu (what users get from
``make demo``) and noida-db, which implements what tansu cannot (transactions' visibility,
the time index, a right ``latest``, DeleteRecords, retention). A third, named by
``REWIND_TEST_BOOTSTRAP`` (a real Apache Kafka, Redpanda...), joins them when set; its gaps,
if any, are named in ``REWIND_TEST_BROKER_GAPS`` (comma-separated capability names).

A test that needs a capability calls :meth:`TestBroker.require`: on a broker without it
the test is *skipped* with the capability named, and it runs for real on the others.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rewind.embedded.broker import BrokerProcess

# capability names: those `rewind doctor` probes, plus retention (not probed: it takes time)
# and the consumer-group ones of `rewind groups`
READ_COMMITTED = "read_committed"  # aborted transactional records hidden, LSO honoured
TIME_INDEX = "list_offsets_by_time"  # ListOffsets by timestamp answers the right offset
LATEST = "list_offsets_latest"  # ListOffsets latest equals the high watermark
DELETE_RECORDS = "delete_records"  # DeleteRecords moves the log start
RETENTION = "retention"  # retention.ms expires old records (the log start moves by itself)
GROUP_MEMBERS = "describe_group_members"  # DescribeGroups lists a live group's members (and a
# subscribe gets its assignment in well under a second; tansu lists none and takes ~20 s)
OFFSET_DELETE = "offset_delete"  # OffsetDelete removes one partition's committed offset

TANSU_GAPS = frozenset(
    {READ_COMMITTED, TIME_INDEX, LATEST, DELETE_RECORDS, RETENTION, GROUP_MEMBERS, OFFSET_DELETE}
)
NOIDA_GAPS: frozenset[str] = frozenset()

TANSU = "tansu"
NOIDA = "noida-db"
EXTERNAL = "external"


def broker_names() -> list[str]:
    """Brokers every Kafka test runs on; ``REWIND_TEST_BROKERS`` narrows them for a local run."""
    names = [TANSU, NOIDA]
    if os.environ.get("REWIND_TEST_BOOTSTRAP"):
        names.append(EXTERNAL)
    chosen = os.environ.get("REWIND_TEST_BROKERS")
    if chosen:
        wanted = {n.strip() for n in chosen.split(",") if n.strip()}
        unknown = wanted - set(names)
        if unknown:
            raise pytest.UsageError(
                f"REWIND_TEST_BROKERS names {sorted(unknown)}; known here: {names}")
        names = [n for n in names if n in wanted]
    return names


def external_gaps() -> frozenset[str]:
    text = os.environ.get("REWIND_TEST_BROKER_GAPS", "")
    return frozenset(g.strip() for g in text.split(",") if g.strip())


@dataclass(frozen=True)
class TestBroker:
    """One running broker: where it listens and which capabilities it lacks."""

    __test__ = False  # not a test class, whatever its name says

    name: str
    bootstrap: str
    gaps: frozenset[str] = field(default_factory=frozenset)

    def has(self, capability: str) -> bool:
        return capability not in self.gaps

    def require(self, capability: str) -> None:
        """Skip the calling test on a broker that lacks ``capability``."""
        if not self.has(capability):
            pytest.skip(f"{self.name} lacks {capability}; the test runs on the other brokers")

    def conf(self) -> dict[str, object]:
        return {"bootstrap.servers": self.bootstrap}


class NoidaProcess(BrokerProcess):
    """noida-db's Kafka service in the foreground, data in ``data_dir``, stopped by its pid.

    The binary is started directly (the wheel's Python launcher would put a process in
    between whose death leaves the broker running).
    """

    def __init__(self, host: str, port: int, run_dir: Path) -> None:
        super().__init__(host, port, run_dir / "noida.pid", run_dir / "noida.log")
        self.data_dir = run_dir / "noida-data"

    def command(self) -> list[str]:
        import noida_db

        binary = Path(noida_db.__file__).with_name("noida-db")
        return [str(binary), "start", "--only", "kafka", "--host", self.host,
                "--kafka-port", str(self.port), "--data-dir", str(self.data_dir)]
