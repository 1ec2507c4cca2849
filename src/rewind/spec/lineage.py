"""The ``lineage:`` section: lineage a row carries beyond where it was read from.

Every output row always carries its source record, transform and run (``_rewind_*``). This
section adds, on every row, the system the data came from and the business effective time
(when the fact was true, which is not when it was recorded in Kafka).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from rewind.core.columns import EFFECTIVE_TIME, SOURCE_SYSTEM, is_reserved
from rewind.spec.errors import _Bad
from rewind.spec.values import _Model


class Lineage(_Model):
    """Optional lineage columns, written on every output row."""

    source_system: str | None = Field(
        default=None,
        description=f"A name for the system the records come from, like `orders-service`: `{SOURCE_SYSTEM}`.",
    )
    effective_time_column: str | None = Field(
        default=None,
        description=(
            "An output column holding the business effective time (a timestamp or date): copied to "
            f"`{EFFECTIVE_TIME}` as a UTC timestamp."
        ),
    )

    @field_validator("source_system")
    @classmethod
    def _system(cls, value: str | None) -> str | None:
        if value is not None and not (0 < len(value.strip()) <= 200):
            raise _Bad("empty or longer than 200 characters", "name the system in a few words", got=value)
        return value

    @field_validator("effective_time_column")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or is_reserved(value)):
            raise _Bad("not an output column name", "name a column the translate returns", got=value)
        return value

    @model_validator(mode="after")
    def _something(self) -> Lineage:
        if self.source_system is None and self.effective_time_column is None:
            raise _Bad("empty", "give source_system and/or effective_time_column, or remove lineage")
        return self
