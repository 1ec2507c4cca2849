"""Loading OpenLineage events back through the client's own classes (``openlineage.client.event_v2``
and the facet classes generated from the OpenLineage schemas), for the lineage tests.

:func:`load_event` rebuilds a ``RunEvent`` from its JSON, every facet through its class, checks
each facet's ``_schemaURL`` is the one its class declares, and that the rebuilt event serializes
back to exactly the JSON it came from (so nothing was dropped or invented).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from openlineage.client import event_v2
from openlineage.client.facet_v2 import (
    data_quality_assertions_dataset,
    error_message_run,
    input_statistics_input_dataset,
    job_type_job,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    tags_run,
)
from openlineage.client.serde import Serde

from rewind.openlineage import facets as rf

RUN_FACETS: dict[str, type[Any]] = {
    "processing_engine": processing_engine_run.ProcessingEngineRunFacet,
    "errorMessage": error_message_run.ErrorMessageRunFacet,
    "parent": parent_run.ParentRunFacet,
    "tags": tags_run.TagsRunFacet,
    "rewind_run": rf.RewindRunFacet,
}
JOB_FACETS: dict[str, type[Any]] = {
    "jobType": job_type_job.JobTypeJobFacet,
    "rewind_transform": rf.RewindTransformJobFacet,
}
INPUT_FACETS: dict[str, type[Any]] = {
    "inputStatistics": input_statistics_input_dataset.InputStatisticsInputDatasetFacet,
    "dataQualityAssertions": data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet,
    "rewind_counts": rf.RewindCountsInputDatasetFacet,
}
OUTPUT_FACETS: dict[str, type[Any]] = {
    "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet,
    "rewind_counts": rf.RewindCountsOutputDatasetFacet,
}


def _nested(key: str, fields: dict[str, Any]) -> dict[str, Any]:
    if key == "tags":
        fields["tags"] = [tags_run.TagsRunFacetFields(**t) for t in fields["tags"]]
    elif key == "parent":
        fields["run"] = parent_run.Run(**fields["run"])
        fields["job"] = parent_run.Job(**fields["job"])
        assert "root" not in fields
    elif key == "dataQualityAssertions":
        fields["assertions"] = [data_quality_assertions_dataset.Assertion(**a) for a in fields["assertions"]]
    return fields


def load_facets(kinds: dict[str, type[Any]], data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        assert key in kinds, f"facet {key} has no known class"
        fields = {k: v for k, v in value.items() if k not in ("_producer", "_schemaURL")}
        facet = kinds[key](**_nested(key, fields), producer=value["_producer"])
        assert value["_schemaURL"] == facet._schemaURL, (key, value["_schemaURL"])
        assert value["_schemaURL"].startswith("https://")
        out[key] = facet
    return out


def load_event(data: dict[str, Any]) -> event_v2.RunEvent:
    """The event through the client's classes (their validators check eventTime and the run id)."""
    for field in ("eventTime", "eventType", "producer", "schemaURL", "run", "job"):
        assert field in data, field
    uuid.UUID(data["run"]["runId"])
    assert data["job"]["namespace"] and data["job"]["name"]
    event = event_v2.RunEvent(
        eventType=event_v2.RunState(data["eventType"]),
        eventTime=data["eventTime"],
        producer=data["producer"],
        run=event_v2.Run(runId=data["run"]["runId"], facets=load_facets(RUN_FACETS, data["run"]["facets"])),
        job=event_v2.Job(
            namespace=data["job"]["namespace"],
            name=data["job"]["name"],
            facets=load_facets(JOB_FACETS, data["job"]["facets"]),
        ),
        inputs=[
            event_v2.InputDataset(
                namespace=d["namespace"],
                name=d["name"],
                facets={},
                inputFacets=load_facets(INPUT_FACETS, d.get("inputFacets", {})),
            )
            for d in data.get("inputs", [])
        ],
        outputs=[
            event_v2.OutputDataset(
                namespace=d["namespace"],
                name=d["name"],
                facets={},
                outputFacets=load_facets(OUTPUT_FACETS, d.get("outputFacets", {})),
            )
            for d in data.get("outputs", [])
        ],
    )
    assert event.schemaURL == data["schemaURL"]
    assert Serde.to_dict(event) == data, "the event does not round-trip through the client's classes"
    return event


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events the file transport appended to ``path`` (one JSON object a line)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def file_transport_env(path: Path) -> dict[str, str]:
    return {
        "OPENLINEAGE__TRANSPORT__TYPE": "file",
        "OPENLINEAGE__TRANSPORT__LOG_FILE_PATH": str(path),
        "OPENLINEAGE__TRANSPORT__APPEND": "true",
    }
