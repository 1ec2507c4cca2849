"""``rewind snapshot create RUN``: a promoted read model's state, tagged with its offsets.

Separate from :mod:`rewind.job.snapshot` (which the planner imports) because it reads stored
plans; see that module for what a snapshot is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rewind.catalog import load_catalog
from rewind.job.plan import JobPlan
from rewind.job.snapshot import OFFSETS_PROPERTY, TAG_PREFIX, SnapshotError
from rewind.kafka.read_plan import ReadPlan

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.ledger import Ledger


def create_snapshot(settings: Settings, ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Tag a promoted run's Iceberg target and record its end offsets with the tag.

    Steps: 1. the run is promoted (its rows are the target's state) and its sink Iceberg;
    2. its offsets are each partition's end of the window (the first offset not read);
    3. the tag on the current snapshot (kept if a first attempt made it), then the offsets
       property: a plan names the tag, so a tag without its offsets is refused, never misread.
    """
    run = ledger.get_run(run_id)
    if run.state != "promoted":
        raise SnapshotError(
            f"run {run_id} is {run.state}, not promoted: a snapshot is of a read model's state in its "
            "target; promote the run first"
        )
    plan = JobPlan.from_dict(ledger.get_plan(run.plan_id).plan)
    spec = plan.job_spec()
    if spec.sink.iceberg is None or spec.translate.fold is None or spec.source.kafka is None:
        raise SnapshotError(
            f"run {run_id}: a snapshot is of a read model folded from source.kafka (translate.fold) "
            "into Iceberg"
        )
    ends: dict[str, dict[str, int]] = {}
    for rng in ReadPlan.from_dict(plan.read_plan).ranges():  # every partition, empty ones too
        ends.setdefault(rng.topic, {})[str(rng.partition)] = rng.end
    table = load_catalog(settings).load_table(spec.sink.iceberg.table)
    head = table.current_snapshot()
    if head is None:
        raise SnapshotError(f"{spec.sink.iceberg.table} has no data; nothing to snapshot")
    tag = f"{TAG_PREFIX}{run_id}"
    existing = table.snapshot_by_name(tag)
    if existing is not None:
        head = existing
    else:
        table.manage_snapshots().create_tag(head.snapshot_id, tag).commit()
    with table.transaction() as tx:
        tx.set_properties({OFFSETS_PROPERTY + tag: json.dumps(ends, sort_keys=True)})
    out = {"run_id": run_id, "table": spec.sink.iceberg.table, "ref": tag, "snapshot_id": head.snapshot_id}
    out["offsets"] = ends
    ledger.audit(run_id, "snapshot-created", out)
    return out


def snapshot_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """``rewind snapshot create RUN``: :func:`create_snapshot` with the settings' ledger; the
    result names the spec part that starts from it."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger

    with Ledger.open(settings.ledger) as ledger:
        out = create_snapshot(settings, ledger, run_id)
    out["spec"] = {"source": {"kafka": {"snapshot": {"table": out["table"], "ref": out["ref"]}}}}
    return out
