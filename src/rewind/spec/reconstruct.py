"""``source.table.reconstruct``: domain events reconstructed from a legacy table's states.

A legacy system kept only state: a history table with one row per change, or periodic
snapshots of a table. The reconstruction reads those states per entity (``key``), orders them
by business time (``time``, ties broken by ``tie``), hands each entity's consecutive states
(previous, current) to ``translate.transition`` and produces the events it returns, each
entity's in business order on the entity's partition, or appends them to a table
(docs/runbook-reconstruct.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from rewind.core.columns import is_reserved
from rewind.spec.errors import _Bad
from rewind.spec.values import _FUNCTION, _Model


class Reconstruct(_Model):
    """How the states of a history table (or of snapshots) become consecutive pairs per entity.

    The events go to ``sink.kafka`` (each entity's on its partition, in business order) or are
    appended to ``sink.iceberg`` or ``sink.postgres`` (a table of events, each row with its
    lineage columns)."""

    mode: Literal["history", "snapshots"] = Field(
        default="history",
        description=(
            "`history`: one row per change of an entity (an audit or history table); `snapshots`: "
            "the table holds several snapshots of the entities, each row naming its snapshot's time "
            "in `time`; consecutive states come from diffing successive snapshots per key "
            "(appeared, changed, disappeared; an unchanged state is filtered)."
        ),
    )
    key: str | None = Field(
        default=None,
        description=(
            "The entity key column (default: `source.table.key`, which the key ranges split on: "
            "every state of an entity is in one work unit)."
        ),
        json_schema_extra={"doc_default": "`source.table.key`"},
    )
    time: str = Field(
        description=(
            "The business time column (effective time; with `mode: snapshots`, the snapshot's "
            "time): a timestamp or a date, or ISO-8601 text (SQLite). Naive times are UTC."
        ),
    )
    tie: list[str] = Field(
        default_factory=list,
        description=(
            "Columns that order the states of one entity with the same business time (a change "
            "sequence). States still tied keep the order they were read in."
        ),
    )
    compare: list[str] | None = Field(
        default=None,
        description=(
            "`mode: snapshots`: the columns whose change makes a new state (default: every column "
            "but the key and the snapshot time)."
        ),
    )
    type_column: str = Field(
        default="type",
        description="The column of the transition's output that names each event's type.",
    )
    fold: str | None = Field(
        default=None,
        description=(
            "`package.module:callable` for the outcome verification: folds an entity's events (a "
            "frame sorted by key and business order) into its state, one row per key with the "
            "state's columns, compared with the source's latest state of each entity."
        ),
    )

    @field_validator("key", "time", "type_column")
    @classmethod
    def _column(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or is_reserved(value)):
            raise _Bad("not a column name", "name a column of the table", got=value)
        return value

    @field_validator("tie", "compare")
    @classmethod
    def _columns(cls, value: list[str] | None) -> list[str] | None:
        for i, column in enumerate(value or []):
            if not column.strip() or is_reserved(column):
                raise _Bad("not a column name", "list columns of the table", got=column, at=(i,))
            if column in (value or [])[:i]:
                raise _Bad(f"column '{column}' is listed twice", "list each column once", got=value)
        return value

    @field_validator("fold")
    @classmethod
    def _function(cls, value: str | None) -> str | None:
        if value is not None and not _FUNCTION.fullmatch(value.strip()):
            raise _Bad(
                "not a function reference", "expected package.module:callable, like policies:fold", got=value
            )
        return None if value is None else value.strip()

    @model_validator(mode="after")
    def _fits(self) -> Reconstruct:
        if self.time in self.tie:
            raise _Bad(
                "lists the business time column", "tie columns order states of the same time", at=("tie",)
            )
        if self.compare is not None and self.mode != "snapshots":
            raise _Bad(
                "used only with mode: snapshots",
                "a history table's every row is a change: remove compare",
                at=("compare",),
            )
        return self
