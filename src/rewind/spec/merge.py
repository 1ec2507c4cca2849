"""The ``merge:`` section: how a backfill's rows meet the rows live already wrote.

Merging backfill and live output "is not plumbing, it is policy": without this section the
SQL sink's upsert keeps the row of the later source event and an Iceberg sink appends.
With it, every output row gets one declared decision (applied, rejected as stale,
deduplicated, superseded by the row already there, routed to the quarantine), counted in the
run's totals. The decisions themselves are :mod:`rewind.core.merge`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from rewind.spec.errors import _Bad
from rewind.spec.values import _exactly_one, _iso, _Model, _verify_time

OnCollision = Literal["prefer-live", "prefer-backfill", "latest-event-time", "latest-offset"]


class CutLine(_Model):
    """Where live output starts to count as newer than the backfill: exactly one of ``time``,
    ``offsets`` or ``group``. A bare time is short for ``{time: ...}``."""

    time: datetime | None = Field(
        default=None,
        description=(
            "Rows live wrote from a source event at or after this time (its "
            "`_rewind_source_timestamp`) are newer than any backfill row."
        ),
    )
    offsets: dict[str, dict[int, int]] | None = Field(
        default=None,
        description=(
            "Per partition, `{topic: {partition: offset}}`: rows live wrote from a record at or "
            "after that offset are newer. Every partition named must be one the source reads."
        ),
        json_schema_extra={"doc_type": "mapping topic → {partition: offset}"},
    )
    group: str | None = Field(
        default=None,
        description=(
            "A consumer group (the live service's): its committed offsets, read at plan time, are "
            "the per-partition cut line."
        ),
    )

    @field_validator("time", mode="plain")
    @classmethod
    def _time(cls, value: Any) -> datetime | None:
        return _verify_time(value, "time")

    @field_serializer("time")
    def _dump_time(self, value: datetime | None) -> str | None:
        return None if value is None else _iso(value)

    @field_validator("offsets")
    @classmethod
    def _offsets(cls, value: dict[str, dict[int, int]] | None) -> dict[str, dict[int, int]] | None:
        for topic, parts in (value or {}).items():
            if not parts:
                raise _Bad("no partitions", 'give {partition: offset}, like {"0": 1200}', at=(topic,))
            for partition, offset in parts.items():
                if partition < 0 or offset < 0:
                    raise _Bad(
                        "a negative partition or offset",
                        "give offsets the live consumer reached, 0 or more",
                        got=offset if partition >= 0 else partition,
                        at=(topic, partition),
                    )
        return value

    @field_validator("group")
    @classmethod
    def _group(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _Bad("empty", "name the live service's consumer group", got=value)
        return value

    @model_validator(mode="after")
    def _one(self) -> CutLine:
        _exactly_one(self, ("time", "offsets", "group"), "cut line")
        return self


class Merge(_Model):
    """How the run's rows are merged with the rows already in the target, per key."""

    on_collision: OnCollision = Field(
        default="latest-event-time",
        description=(
            "A run's row meets a row of the same key that the run did not write: `prefer-live` "
            "keeps the row there, `prefer-backfill` writes the run's, `latest-event-time` the one "
            "from the later source event (`_rewind_source_timestamp`), `latest-offset` the one from "
            "the later offset of the same partition (event time across partitions). Rows not "
            "written are counted as superseded."
        ),
    )
    reject_stale_after: CutLine | None = Field(
        default=None,
        description=(
            "A cut line (a time, `{offsets: ...}` or `{group: NAME}`): a run's row whose key live "
            "already wrote after the cut line is not applied, whatever `on_collision` says, and is "
            "counted as rejected_stale."
        ),
        json_schema_extra={"doc_type": "time or mapping, see `merge.reject_stale_after`"},
    )
    dedup: Literal["key"] | None = Field(
        default=None,
        description=(
            "`key`: the run writes at most one row per key, the one from its latest source event "
            "(an Iceberg sink then merges on the key instead of appending); the others are "
            "counted as deduplicated. Default: `key` (a merge is always per key)."
        ),
        json_schema_extra={"doc_default": "`key`"},
    )
    ambiguous: Literal["route", "latest-offset"] = Field(
        default="latest-offset",
        description=(
            "Rows the policy cannot decide (same key, same event time, different values): `route` "
            "sends them all to the quarantine with reason `ambiguous`, `latest-offset` keeps the "
            "one of the later offset."
        ),
    )

    @field_validator("reject_stale_after", mode="before")
    @classmethod
    def _bare_time(cls, value: Any) -> Any:
        return {"time": value} if isinstance(value, str | int | datetime) else value

    @model_validator(mode="after")
    def _defaults(self) -> Merge:
        if self.dedup is None:
            object.__setattr__(self, "dedup", "key")
        return self

