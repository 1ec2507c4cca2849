"""The ``guards:``, ``run:`` and ``quarantine:`` sections."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    field_validator,
)

from rewind.spec.errors import _Bad
from rewind.spec.values import _ICEBERG_TABLE, _Model, _size


class Guards(_Model):
    """Limits that protect the systems a backfill touches. Unset means no limit."""

    max_records_per_second: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Cap on records per second for the whole job (all tasks together).",
    )
    max_records: int | None = Field(
        default=None, gt=0, description="The plan is refused when its window holds more records than this."
    )
    max_bytes: int | None = Field(
        default=None,
        gt=0,
        description=(
            "The plan is refused when its window is estimated above this many bytes "
            "(`500MB`, `10GiB` allowed)."
        ),
    )

    max_quarantine_ratio: float | None = Field(
        default=0.1,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description=(
            "The run stops after a wave, failed with its top quarantine reasons, when the records "
            "quarantined exceed this share of the records read (this attempt's units, once "
            "`min_records_before_ratio` were read); `null` switches it off. `--accept-risk` does not "
            "override it; `rewind resume RUN --spec SPEC` may change it."
        ),
    )
    min_records_before_ratio: int = Field(
        default=1000,
        ge=0,
        description="Records read before `max_quarantine_ratio` is checked (a share of a few says little).",
    )

    @field_validator("max_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return _size(value)


class RunSettings(_Model):
    """How a run is cut into work units and leased."""

    work_unit_records: int = Field(
        default=250_000,
        gt=0,
        description="Offsets per work unit: each partition's range is cut into chunks of at most this many.",
    )
    lease_ttl_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a runner's lease on the run lasts without renewal before another may take over.",
    )


class Quarantine(_Model):
    """Where rejected records go, with their reason: an Iceberg table."""

    table: str | None = Field(
        default=None,
        description=(
            "`namespace.table` of the quarantine. Default: `<sink namespace>.rewind_quarantine` "
            "for an Iceberg sink, `rewind.rewind_quarantine` otherwise."
        ),
        json_schema_extra={"doc_default": "derived"},
    )

    @field_validator("table")
    @classmethod
    def _table(cls, table: str | None) -> str | None:
        if table is not None and not _ICEBERG_TABLE.fullmatch(table):
            raise _Bad("not a namespace.table name", "like analytics.rewind_quarantine", got=table)
        return table
