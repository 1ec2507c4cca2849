"""The ``shadow:`` section: a migration of a read model to a v2 rebuilt from history.

A shadow rebuilds the job's target as a v2 (the run's staging) from the whole history, then
follows the live topic until it is caught up with the live consumer group, is verified
against v1 and cut over (:mod:`rewind.shadow`). The section only says how: which group is
the live one, when the shadow counts as caught up, how verification settles, where the cut
line goes and how long v1 is kept afterwards.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from rewind.spec.errors import _Bad
from rewind.spec.values import _Model

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration_s(text: str) -> float:
    """``"30s"`` → 30.0; ``ms``, ``s``, ``m``, ``h``, ``d``."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    return float(match.group(1)) * _UNIT_S[match.group(2)]


class Shadow(_Model):
    """Migrate the target to a v2 rebuilt from history while the live consumer keeps writing v1."""

    live_group: str = Field(
        description=(
            "The consumer group of the live service that writes v1 (the target): the shadow's lag "
            "is measured against its committed offsets, the cut line is taken from them."
        ),
    )
    lag_threshold: int = Field(
        default=100,
        ge=0,
        description="Offsets per partition the shadow may be behind and still count as caught up.",
    )
    caught_up_for_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds every partition's lag must stay under `lag_threshold` to be `caught-up`.",
    )
    trigger_s: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds between micro-batches of the live tail (Spark's processing-time trigger).",
    )
    max_offsets_per_trigger: int | None = Field(
        default=None,
        gt=0,
        description="Cap on offsets per micro-batch of the live tail (all partitions together).",
    )
    settle_s: float = Field(
        default=30.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "`shadow verify` compares only keys whose last event is older than this, so updates in "
            "flight to v1 or v2 are not counted as differences."
        ),
    )
    verify_passes: int = Field(
        default=3,
        gt=0,
        description="Go/no-go for cutover: the last this many `shadow verify` results all passed.",
    )
    rewind_by: int | str = Field(
        default=0,
        description=(
            "Overlap at the cut line: the cut line is the live group's committed offset minus this many "
            "offsets (an integer) or minus the offsets of this much time (`30s`, `5m`); the overlap "
            "is absorbed by the idempotent writes on the key."
        ),
        json_schema_extra={"doc_type": "integer or duration"},
    )
    monitoring_s: float = Field(
        default=86400.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds after cutover before `shadow decommission` may drop v1 (rollback until then).",
    )

    @field_validator("live_group")
    @classmethod
    def _group(cls, group: str) -> str:
        if not group.strip():
            raise _Bad("empty group id", "name the live service's consumer group", got=group)
        return group

    @field_validator("rewind_by", mode="before")
    @classmethod
    def _rewind_by(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise _Bad("not an offset count or a duration", "like 100 or 30s", got=value)
        if isinstance(value, int):
            if value < 0:
                raise _Bad("negative", "an overlap of 0 or more offsets, or a duration like 30s", got=value)
            return value
        if isinstance(value, str):
            try:
                duration_s(value)
            except ValueError:
                raise _Bad(
                    "not a duration", "like 30s, 5m, 500ms or an offset count like 100", got=value
                ) from None
            return value.strip()
        return value

    def overlap_offsets(self) -> int:
        """The overlap in offsets (0 when it is given as time)."""
        return self.rewind_by if isinstance(self.rewind_by, int) else 0

    def overlap_ms(self) -> int | None:
        """The overlap in milliseconds when it is given as time."""
        return None if isinstance(self.rewind_by, int) else int(duration_s(self.rewind_by) * 1000)
