"""The staging of a SQL run: a table beside the target, recorded in the ledger."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SqlStaging:
    """A run's staging table (JSON-able for the ledger). Names are ``schema.table``."""

    target: str
    table: str
    target_table: str
    prev_table: str
    run_id: str
    target_existed: bool
    spool: str
    base_rows: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "postgres", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SqlStaging:
        return cls(
            data["target"],
            data["table"],
            data["target_table"],
            data["prev_table"],
            data["run_id"],
            bool(data["target_existed"]),
            data["spool"],
            data.get("base_rows"),
        )

    def describe(self) -> str:
        if self.target_existed:
            return f"{self.table} (a copy of {self.target_table} plus this run's rows)"
        return f"{self.table} (a new table, becomes {self.target_table} on promotion)"
