"""A record that did not make it: where (stage) and why (reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Stage = Literal["decode", "translate-reject", "translate-error", "key-null"]

STAGES: tuple[Stage, ...] = ("decode", "translate-reject", "translate-error", "key-null")


@dataclass(frozen=True, slots=True)
class Failure:
    """One quarantined source record.

    ``row`` is the record's position in its Kafka batch (its ``_rewind_row``); ``reason`` is
    the full text stored in the quarantine table; ``kind`` is a short, low-cardinality label
    for counters ("invalid JSON", "ValueError", "cast failed: amount"); empty means the
    reason itself is the label.
    """

    row: int
    stage: Stage
    reason: str
    kind: str = ""

    @property
    def label(self) -> str:
        """``"<stage>: <kind>"``, the key under which the failure is counted."""
        return f"{self.stage}: {self.kind or self.reason}"
