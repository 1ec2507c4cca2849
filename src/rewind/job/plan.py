"""A job's frozen plan: what ``rewind plan`` decided, stored in the ledger and run by ``rewind run``.

:class:`JobPlan` is data (JSON, deterministic; its id a digest of the spec's fingerprint and the
units). :mod:`rewind.job.planner` builds it, :mod:`rewind.job.stages` turns it into stages and
:mod:`rewind.job.runner` walks them; the modules of those steps import this one, and it imports
none of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.core.arrow import schema_from_b64
from rewind.core.units import WorkUnit
from rewind.errors import RewindError
from rewind.spec import JobSpec

if TYPE_CHECKING:
    import pyarrow as pa


class PlanRefused(RewindError):
    """A gate failed: nothing may run until the spec or the world changes."""


@dataclass(frozen=True)
class Gate:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class JobPlan:
    plan_id: str
    name: str
    spec: dict[str, Any]
    read_plan: dict[str, Any]
    units: tuple[WorkUnit, ...]
    offsets: int
    output_schema_b64: str
    output_columns: tuple[tuple[str, str], ...]
    gates: tuple[Gate, ...]
    estimates: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    created_at: str = ""

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    def failed_gates(self) -> list[Gate]:
        return [g for g in self.gates if not g.ok]

    def job_spec(self) -> JobSpec:
        return JobSpec.model_validate(self.spec)

    def output_schema(self) -> pa.Schema:
        return schema_from_b64(self.output_schema_b64)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "name": self.name,
            "spec": self.spec,
            "read_plan": self.read_plan,
            "units": [u.to_dict() for u in self.units],
            "offsets": self.offsets,
            "output_schema_b64": self.output_schema_b64,
            "output_columns": [list(c) for c in self.output_columns],
            "gates": [{"name": g.name, "ok": g.ok, "detail": g.detail} for g in self.gates],
            "estimates": self.estimates,
            "notes": list(self.notes),
            "created_at": self.created_at,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobPlan:
        return cls(
            plan_id=data["plan_id"],
            name=data["name"],
            spec=data["spec"],
            read_plan=data["read_plan"],
            units=tuple(WorkUnit.from_dict(u) for u in data["units"]),
            offsets=int(data["offsets"]),
            output_schema_b64=data["output_schema_b64"],
            output_columns=tuple((str(a), str(b)) for a, b in data["output_columns"]),
            gates=tuple(Gate(g["name"], bool(g["ok"]), g["detail"]) for g in data["gates"]),
            estimates=dict(data.get("estimates") or {}),
            notes=tuple(data.get("notes") or ()),
            created_at=data.get("created_at", ""),
        )

    @classmethod
    def from_json(cls, text: str) -> JobPlan:
        return cls.from_dict(json.loads(text))


def plan_id_of(fingerprint: str, units: tuple[WorkUnit, ...], pinned: str = "") -> str:
    """The deterministic plan id: the spec, the units and what the plan pins (the archive
    snapshot of a history source: a recreated or advanced archive is a new plan, never a
    stored plan pointing at a snapshot that no longer exists)."""
    digest = hashlib.sha256()
    digest.update(fingerprint.encode())
    for unit in units:
        digest.update(unit.id.encode())
    if pinned:
        digest.update(b"/pinned/" + pinned.encode())
    return "p-" + digest.hexdigest()[:16]
