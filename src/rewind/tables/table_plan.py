"""What a table source's part of ``rewind plan`` hands the job plan: a :class:`TablePlan`,
filled step by step by :func:`rewind.tables.plan.plan_table` and, for a reconstruction, by the
steps of :mod:`rewind.tables.reconstruct_plan`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rewind.core.units import WorkUnit

if TYPE_CHECKING:
    import pyarrow as pa

GateTuple = tuple[str, bool, str]


@dataclass
class TablePlan:
    """What the job plan takes from a table source (gates as ``(name, ok, detail)``)."""

    units: tuple[WorkUnit, ...] = ()
    gates: list[GateTuple] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read_plan: dict[str, Any] = field(default_factory=dict)
    sample: pa.Table | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    output: tuple[pa.Schema | None, list[GateTuple]] | None = None
    """A reconstruction's output schema and gates (:mod:`rewind.tables.reconstruct_plan`), which
    the job plan takes instead of a translate's."""

    @property
    def pinned(self) -> str:
        """What a plan id must change with besides the units: the ids file's digest."""
        digest = (self.read_plan.get("table") or {}).get("ids_digest")
        return f"ids_file@{digest}" if digest else ""
