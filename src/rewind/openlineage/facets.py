"""Rewind's custom facets and the events built from Rewind's facts.

Imported only when a transport is configured (it imports the OpenLineage client). Standard
facets carry what they can: ``jobType``, ``processing_engine``, ``parent``, ``errorMessage``,
``inputStatistics``/``outputStatistics`` and ``dataQualityAssertions``. The rest is in three
facets of Rewind's, each with a ``_schemaURL`` into ``docs/openlineage-facets.json`` (the JSON
schema of these facets, in the repository):

* ``rewind_run`` (run): the command, Rewind's run id, the plan id, the spec's fingerprint,
  the staging and the state it ended in;
* ``rewind_transform`` (job): the transform's name and version, and what it is (a function,
  SQL, a fold, a transition);
* ``rewind_counts`` (input or output dataset): records read, emitted, rows out, quarantined
  (by reason), filtered.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import attr
from openlineage.client import event_v2
from openlineage.client.constants import __version__ as client_version
from openlineage.client.facet_v2 import (
    InputDatasetFacet,
    JobFacet,
    OutputDatasetFacet,
    RunFacet,
    data_quality_assertions_dataset,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
)

from rewind.openlineage.datasets import Dataset
from rewind.secrets import mask

PROJECT_URL = "https://github.com/rewind/rewind"
"""The repository the producer and the custom facets' schema URLs name."""
FACETS_SCHEMA = f"{PROJECT_URL}/blob/main/docs/openlineage-facets.json"
PRODUCER = f"{PROJECT_URL}/tree/main/src/rewind/openlineage"


def _rewind_version() -> str:
    try:
        return version("rewind")
    except PackageNotFoundError:  # a checkout on PYTHONPATH
        return "0+unknown"


@attr.define
class RewindRunFacet(RunFacet):
    """What Rewind knows of the run: see ``docs/openlineage-facets.json#/$defs/RewindRunFacet``."""

    command: str
    rewindRunId: str | None = attr.field(default=None)
    planId: str | None = attr.field(default=None)
    specFingerprint: str | None = attr.field(default=None)
    state: str | None = attr.field(default=None)
    staging: dict[str, Any] | None = attr.field(default=None)
    details: dict[str, Any] | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}#/$defs/RewindRunFacet"


@attr.define
class RewindTransformJobFacet(JobFacet):
    """The transform: ``docs/openlineage-facets.json#/$defs/RewindTransformJobFacet``."""

    name: str
    version: str
    kind: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}#/$defs/RewindTransformJobFacet"


@attr.define
class RewindCountsOutputDatasetFacet(OutputDatasetFacet):
    """Rewind's counts of an output: ``docs/openlineage-facets.json#/$defs/RewindCountsDatasetFacet``."""

    recordsRead: int | None = attr.field(default=None)
    emitted: int | None = attr.field(default=None)
    rowsOut: int | None = attr.field(default=None)
    quarantined: int | None = attr.field(default=None)
    filtered: int | None = attr.field(default=None)
    quarantineReasons: dict[str, int] | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}#/$defs/RewindCountsDatasetFacet"


@attr.define
class RewindCountsInputDatasetFacet(InputDatasetFacet):
    """The same counts on an input (a quarantine re-read, a verified staging)."""

    recordsRead: int | None = attr.field(default=None)
    emitted: int | None = attr.field(default=None)
    rowsOut: int | None = attr.field(default=None)
    quarantined: int | None = attr.field(default=None)
    filtered: int | None = attr.field(default=None)
    quarantineReasons: dict[str, int] | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{FACETS_SCHEMA}#/$defs/RewindCountsDatasetFacet"


CUSTOM_FACETS: dict[str, type[Any]] = {
    "rewind_run": RewindRunFacet,
    "rewind_transform": RewindTransformJobFacet,
    "rewind_counts": RewindCountsOutputDatasetFacet,
}
"""Facet key → class, for a reader of the events (the tests load every facet back through these)."""

_COUNT_KEYS = {
    "records_read": "recordsRead",
    "emitted": "emitted",
    "rows_out": "rowsOut",
    "quarantined": "quarantined",
    "filtered": "filtered",
    "reasons": "quarantineReasons",
    "quarantine_reasons": "quarantineReasons",
}


def counts_fields(counts: Mapping[str, Any]) -> dict[str, Any]:
    """Rewind's counts (``RecordCounts.to_dict()`` keys) as the facet's fields."""
    out: dict[str, Any] = {}
    for key, name in _COUNT_KEYS.items():
        value = counts.get(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            out[name] = {str(k): int(v) for k, v in value.items() if isinstance(v, int | float)}
        else:
            out[name] = int(value)
    return out


def input_dataset(ds: Dataset) -> event_v2.InputDataset:
    facets: dict[str, Any] = {}
    if ds.rows is not None or ds.size is not None:
        facets["inputStatistics"] = input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
            rowCount=ds.rows, size=ds.size
        )
    if ds.assertions:
        facets["dataQualityAssertions"] = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
            assertions=[
                data_quality_assertions_dataset.Assertion(
                    assertion=a.assertion,
                    success=a.success,
                    column=a.column,
                    expected=mask(a.expected),
                    actual=mask(a.actual),
                )
                for a in ds.assertions
            ]
        )
    if ds.counts:
        facets["rewind_counts"] = RewindCountsInputDatasetFacet(**counts_fields(ds.counts))
    return event_v2.InputDataset(namespace=ds.namespace, name=ds.name, inputFacets=facets)


def output_dataset(ds: Dataset) -> event_v2.OutputDataset:
    facets: dict[str, Any] = {}
    if ds.rows is not None or ds.size is not None:
        facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=ds.rows, size=ds.size
        )
    if ds.counts:
        facets["rewind_counts"] = RewindCountsOutputDatasetFacet(**counts_fields(ds.counts))
    return event_v2.OutputDataset(namespace=ds.namespace, name=ds.name, outputFacets=facets)


def run_facets(
    command: str,
    facts: Mapping[str, Any],
    parent: tuple[str, str, str] | None,
    error: str | None,
) -> dict[str, Any]:
    """The run's facets; ``parent`` is (run id, job namespace, job name); every fact masked."""
    facts = mask(dict(facts))
    facets: dict[str, Any] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=_rewind_version(), name="Rewind", openlineageAdapterVersion=client_version
        ),
        "rewind_run": RewindRunFacet(
            command=command,
            rewindRunId=facts.get("rewind_run_id"),
            planId=facts.get("plan_id"),
            specFingerprint=facts.get("fingerprint"),
            state=facts.get("state"),
            staging=facts.get("staging"),
            details=facts.get("details"),
        ),
    }
    if parent is not None:
        facets["parent"] = parent_run.ParentRunFacet.create(parent[0], parent[1], parent[2])
    if error is not None:
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error, programmingLanguage="python"
        )
    return facets


def job_facets(command: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    facets: dict[str, Any] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType=str(facts.get("processing_type") or "BATCH"),
            integration="REWIND",
            jobType=command.upper().replace("-", "_"),
        )
    }
    transform = facts.get("transform")
    if transform:
        facets["rewind_transform"] = RewindTransformJobFacet(
            name=str(transform[0]),
            version=str(transform[1]),
            kind=transform[2] if len(transform) > 2 else None,
        )
    return facets


def now() -> str:
    return datetime.now(UTC).isoformat()
