"""The staging of an Iceberg run (a branch, or a new table) and the snapshot properties that record units."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rewind.errors import RewindError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


RUN_PROPERTY = "rewind.run-id"
UNITS_PROPERTY = "rewind.units"
FINALIZED_PROPERTY = "rewind.finalized"
"""Marks the commit that replaced a run's partial rows by its folded rows (:mod:`rewind.job.finalize`)."""
FOLD_COUNTS_PROPERTY = "rewind.fold-counts"


class IcebergSinkError(RewindError):
    """The Iceberg target or its staging cannot be used as asked."""


@dataclass(frozen=True)
class IcebergStaging:
    """Where a run's output lives before promotion."""

    target: str
    table: str
    branch: str | None
    base_snapshot_id: int | None
    created_table: bool

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "iceberg", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IcebergStaging:
        return cls(
            data["target"],
            data["table"],
            data.get("branch"),
            data.get("base_snapshot_id"),
            bool(data.get("created_table")),
        )

    @property
    def ref(self) -> str:
        return self.branch or "main"

    def describe(self) -> str:
        return f"{self.table}@{self.branch}" if self.branch else self.table


def split_identifier(identifier: str) -> tuple[str, str]:
    if identifier.count(".") < 1:
        raise IcebergSinkError(f"sink.iceberg.table {identifier!r}: expected namespace.table")
    namespace, _, name = identifier.rpartition(".")
    return namespace, name


def load_table(catalog: Catalog, name: str) -> Table | None:
    """The table ``name`` of ``catalog``, or None when it does not exist (the sink and its
    promotion both ask)."""
    # lazy: avoids pyiceberg at import
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(name)
    except NoSuchTableError:
        return None
