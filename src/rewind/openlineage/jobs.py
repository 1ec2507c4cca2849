"""The lineage of a backfill run (``rewind run``/``resume``, a re-produce, a shadow's history
run): its datasets with the counts and bytes of the run so far.

Inputs carry ``inputStatistics`` (records and bytes read: per topic when the job reads one
topic, else in the output's ``rewind_counts``), outputs ``outputStatistics`` (rows written) and
``rewind_counts``; the quarantine table is an output too, its row count the quarantined records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rewind.openlineage.datasets import Dataset, iceberg, spec_datasets
from rewind.openlineage.runs import LineageRun, track

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.spec import JobSpec


def job_name(spec_name: str, command: str) -> str:
    """``{spec name}.{command}``: one OpenLineage job per command of a spec."""
    return f"{spec_name}.{command}"


class JobRun:
    """The events of one execution of a run (a resume is a new OpenLineage run of the same job)."""

    def __init__(
        self,
        settings: Settings,
        spec: JobSpec,
        plan_id: str,
        run_id: str,
        quarantine_table: str | None = None,
    ) -> None:
        command = "reproduce" if spec.source.table is not None else "run"
        self.settings = settings
        self.spec = spec
        self.run_id = run_id
        self.quarantine_table = quarantine_table
        self.lineage: LineageRun = track(
            settings, job_name(spec.name, command), command, spec=spec, plan_id=plan_id, rewind_run_id=run_id
        )

    def start(self) -> JobRun:
        self.lineage.start()
        return self

    def wave(self, counts: Mapping[str, Any], bytes_read: Mapping[str, int]) -> None:
        """RUNNING after a committed wave, with the counts so far."""
        if self.lineage.enabled:
            self.lineage.running(*self._datasets(counts, bytes_read), state="running")

    def complete(
        self, counts: Mapping[str, Any], bytes_read: Mapping[str, int], staging: Mapping[str, Any] | None
    ) -> None:
        if self.lineage.enabled:
            inputs, outputs = self._datasets(counts, bytes_read)
            self.lineage.complete(inputs, outputs, state="succeeded", staging=dict(staging or {}))

    def fail(self, exc: BaseException) -> None:
        self.lineage.fail(exc)

    def abort(self) -> None:
        self.lineage.abort()

    def _datasets(
        self, counts: Mapping[str, Any], bytes_read: Mapping[str, int]
    ) -> tuple[list[Dataset], list[Dataset]]:
        inputs, outputs = spec_datasets(self.settings, self.spec, self.run_id)
        read = counts.get("records_read")
        topics = [d for d in inputs if d.namespace.startswith("kafka://")]
        stated: list[Dataset] = []
        for d in inputs:
            if d.role == "archive":
                d = d.with_stats(size=bytes_read.get("archive"))
            elif d in topics and len(topics) == 1:
                only_kafka = not any(x.role == "archive" for x in inputs)
                d = d.with_stats(rows=read if only_kafka else None, size=bytes_read.get("kafka"))
            elif not topics and d.role is None:  # a re-produce's table
                d = d.with_stats(rows=read)
            stated.append(d)
        outs = [d.with_stats(rows=counts.get("rows_out"), counts=counts, role="staging") for d in outputs]
        if self.quarantine_table:
            outs.append(
                iceberg(
                    self.settings, self.quarantine_table, rows=counts.get("quarantined"), role="quarantine"
                )
            )
        return stated, outs
