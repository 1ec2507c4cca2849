"""The ``source:`` section: a Kafka window, history (the lake archive and the log), or a table.

The table source (entities of a source of truth, re-produced) is in :mod:`rewind.spec.table_source`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import (
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from rewind.core.windows import WindowRequest
from rewind.spec.errors import _Bad, _Plain
from rewind.spec.table_source import TableSource
from rewind.spec.values import (
    _ICEBERG_TABLE,
    _PG_IDENT,
    _TOPIC,
    KafkaBound,
    Offsets,
    _bound_spec,
    _dump_bound,
    _dump_offsets,
    _exactly_one,
    _iso,
    _Model,
    _parse_bound,
    _parse_offsets,
)


class SnapshotPart(_Model):
    """State as of recorded offsets: the read model's rows, then only the events after them.

    The run reads the window from the snapshot's offsets (not ``from``) and the fold folds the
    snapshot's rows together with the new events' partial rows, so the fold must accept its own
    output rows as input (sums, last non-null, min/max...). See docs/snapshots.md.
    """

    table: str = Field(
        description=(
            "The Iceberg table (`namespace.table`) holding the state; with `url`, the SQL table "
            "(`schema.table` or `table`)."
        )
    )
    url: str | None = Field(
        default=None,
        description=(
            "The state is a PostgreSQL (`postgresql://...`) or SQLite (`sqlite:///file.db`) table "
            "instead: `offsets` are then required (a SQL table records none). Keep passwords out "
            "of spec files (PGPASSWORD)."
        ),
    )
    ref: str = Field(
        default="main",
        description=(
            "The branch or tag of `table` to read; `rewind snapshot create RUN` makes a tag "
            "`rewind-snapshot-<run>` and records its offsets with it."
        ),
    )
    offsets: Offsets | None = Field(
        default=None,
        description=(
            'Offsets per partition (`{orders: {"0": 1200, "1": 1300}}`) the state is as of: the '
            "first offset of each partition NOT in it. Every partition of every topic is named. "
            "Without it, the offsets recorded on the table for `ref` by `rewind snapshot create`."
        ),
        json_schema_extra={"doc_type": "offsets per partition"},
    )

    @model_validator(mode="after")
    def _table(self) -> SnapshotPart:
        if self.url is None:
            if not _ICEBERG_TABLE.fullmatch(self.table):
                raise _Bad(
                    "not a namespace.table name", "like analytics.order_totals", got=self.table, at=("table",)
                )
            return self
        if not re.match(r"(postgres(ql)?(\+\w+)?|sqlite)://", self.url):
            raise _Bad("not a PostgreSQL or SQLite URL", "like sqlite:///state.db", at=("url",))
        if urlsplit(self.url).password is not None:  # the plan stores the URL: never a secret
            raise _Bad("holds a password", "leave it out and set PGPASSWORD (or ~/.pgpass)", at=("url",))
        parts = self.table.split(".")
        if len(parts) > 2 or not all(_PG_IDENT.fullmatch(x) and len(x) <= 63 for x in parts):
            raise _Bad("not a schema.table name", "like public.order_totals", got=self.table, at=("table",))
        if self.ref != "main":
            raise _Bad("is for an Iceberg snapshot", "a SQL table has no refs: leave ref out", at=("ref",))
        return self

    @field_validator("offsets", mode="plain")
    @classmethod
    def _offsets(cls, value: Any) -> Offsets | None:
        allowed = 'expected offsets per partition, like {orders: {"0": 1200}}'
        return None if value is None else _parse_offsets(value, "declared", allowed)

    @field_serializer("offsets")
    def _dump(self, value: Offsets | None) -> dict[str, dict[str, int]] | None:
        return None if value is None else _dump_offsets(value)


class KafkaSource(_Model):
    """Records of Kafka topics in the window ``[from, to)``.

    Times are resolved per partition to *the first record whose timestamp is >= the time*, so
    ``from: T1, to: T2`` reads exactly the records stamped in ``[T1, T2)`` when timestamps
    grow along each partition (see ``rewind.kafka.resolve`` for the policies).
    """

    topics: list[str] = Field(
        description="Topics to read, each listed once. Every partition of each topic is read.",
    )
    from_: KafkaBound = Field(
        default="earliest",
        validation_alias="from",
        serialization_alias="from",
        description=(
            'Start of the window, included: "earliest" (the first record still in Kafka), '
            '"latest", an ISO-8601 time with a zone (`2026-10-01T00:00:00Z`; a time without one '
            "is an error), epoch milliseconds (`1790812800000`), or offsets per partition "
            '(`{orders: {"0": 1200, "1": 1300}}`, Spark\'s JSON shape, as a mapping or a JSON '
            "string; -2 earliest, -1 latest). An offsets mapping names every partition of every "
            "topic, as in Spark."
        ),
        json_schema_extra={"doc_type": "window bound"},
    )
    to: KafkaBound = Field(
        default="latest",
        description=(
            'End of the window, excluded: "latest" (the high watermark at planning time), a '
            "time, epoch milliseconds or offsets per partition as for `from` (not earliest). "
            "Two times need `to` after `from`; two offsets mappings need each partition's "
            "`to` >= its `from`."
        ),
        json_schema_extra={"doc_type": "window bound"},
    )
    declared_log_start: dict[str, dict[int, int]] | None = Field(
        default=None,
        description=(
            'Offsets per partition (`{orders: {"0": 500}}`) below which records count as no '
            "longer in Kafka, as if retention had removed them; used when above the broker's "
            "log start. Simulates retention on brokers that cannot expire records."
        ),
        json_schema_extra={"doc_type": "offsets per partition"},
    )
    latest_per_key: bool | None = Field(
        default=None,
        description=(
            "Read the window as a compacted topic's snapshot: of the records of each partition "
            "with the same non-null key only the last one in the window is processed, and a key "
            "whose last record is a tombstone (null value) is deleted (no row). Superseded records "
            "and deleting tombstones count as filtered (the run's audit entry `latest-per-key` "
            "names how many of each); records with a null key are each kept. Works on brokers that "
            "never compacted; see docs/latest-per-key.md. Off by default (left out of the "
            "canonical spec then, so existing jobs keep their fingerprints)."
        ),
        json_schema_extra={"doc_type": "boolean"},
    )

    snapshot: SnapshotPart | None = Field(
        default=None,
        description=(
            "Start from a snapshot of the read model (an Iceberg table as of recorded offsets) "
            "and replay only the events after its offsets, folded into its state; needs "
            "`translate.fold`, an Iceberg sink and no `from`. See docs/snapshots.md."
        ),
    )

    @field_validator("topics")
    @classmethod
    def _topics(cls, topics: list[str]) -> list[str]:
        allowed = "a topic name is 1-249 of letters, digits, '.', '_' and '-'"
        if not topics:
            raise _Bad("no topic", "list at least one topic, like [orders]", got=topics)
        for i, topic in enumerate(topics):
            if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
                raise _Bad("not a topic name", allowed, got=topic, at=(i,))
            if topic in topics[:i]:
                raise _Bad(f"topic '{topic}' is listed twice", "list each topic once", got=topics)
        return topics

    @field_validator("latest_per_key")
    @classmethod
    def _latest(cls, value: bool | None) -> bool | None:
        return True if value else None

    @field_validator("from_", mode="plain")
    @classmethod
    def _from(cls, value: Any) -> KafkaBound:
        return _parse_bound(value, "from")

    @field_validator("to", mode="plain")
    @classmethod
    def _to(cls, value: Any) -> KafkaBound:
        return _parse_bound(value, "to")

    @field_validator("declared_log_start", mode="plain")
    @classmethod
    def _declared(cls, value: Any) -> Offsets | None:
        allowed = 'expected offsets per partition, like {orders: {"0": 500}}'
        return None if value is None else _parse_offsets(value, "declared", allowed)

    @field_serializer("from_", "to")
    def _dump_bounds(self, value: KafkaBound) -> str | dict[str, dict[str, int]]:
        return _dump_bound(value)

    @field_serializer("declared_log_start")
    def _dump_declared(self, value: Offsets | None) -> dict[str, dict[str, int]] | None:
        return None if value is None else _dump_offsets(value)

    @model_validator(mode="after")
    def _window(self) -> KafkaSource:
        topics = set(self.topics)
        for side, bound in (("from", self.from_), ("to", self.to)):
            if not isinstance(bound, dict):
                continue
            for topic in bound:
                if topic not in topics:
                    raise _Bad(
                        "topic is not in topics",
                        f"offsets name only topics of topics ({', '.join(self.topics)})",
                        got=topic,
                        at=(side, topic),
                    )
            for topic in self.topics:
                if topic not in bound:
                    raise _Bad(
                        f"names no partition of topic '{topic}'",
                        "as in Spark, offsets name every partition of every topic (-2 earliest, -1 latest)",
                        got=_dump_offsets(bound),
                        at=(side,),
                    )
        if isinstance(self.from_, datetime) and isinstance(self.to, datetime) and self.to <= self.from_:
            relation = "is before" if self.to < self.from_ else "is equal to"
            raise _Bad(
                f"{relation} from",
                "the window is [from, to): to must be after from",
                got=_Plain(f"{_iso(self.to)}, from is {_iso(self.from_)}"),
                at=("to",),
            )
        if isinstance(self.from_, dict) and isinstance(self.to, dict):
            starts = {(t, p): o for t, parts in self.from_.items() for p, o in parts.items()}
            ends = {(t, p): o for t, parts in self.to.items() for p, o in parts.items()}
            for topic, partition in sorted(starts.keys() ^ ends.keys()):
                side, other = ("to", "from") if (topic, partition) in starts else ("from", "to")
                raise _Bad(
                    f"names no partition {partition} of {topic}, which {other} names",
                    "both sides name the same partitions (-2 earliest, -1 latest)",
                    got=_dump_offsets(getattr(self, "from_" if side == "from" else "to")),
                    at=(side,),
                )
            for (topic, partition), start in sorted(starts.items()):
                end = ends[(topic, partition)]
                if 0 <= end < start:
                    raise _Bad(
                        f"is before from's offset {start}",
                        "the window is [from, to): each partition's to must be >= its from",
                        got=end,
                        at=("to", topic, str(partition)),
                    )
        if self.snapshot is not None and self.from_ != "earliest":
            raise _Bad(
                "is given with a snapshot",
                "a snapshot's run starts at the snapshot's offsets: leave from out",
                got=_dump_bound(self.from_),
                at=("from",),
            )
        for topic in (self.snapshot.offsets or {}) if self.snapshot is not None else {}:
            if topic not in topics:
                raise _Bad(
                    "topic is not in topics",
                    f"a snapshot's offsets name only topics of topics ({', '.join(self.topics)})",
                    got=topic,
                    at=("snapshot", "offsets", topic),
                )
        for topic in self.declared_log_start or {}:
            if topic not in topics:
                raise _Bad(
                    "topic is not in topics",
                    f"declare log starts only of topics ({', '.join(self.topics)})",
                    got=topic,
                    at=("declared_log_start", topic),
                )
        return self

    def window_request(self) -> WindowRequest:
        """The exact :class:`~rewind.core.windows.WindowRequest` of this window.

        Times become :class:`Timestamp` bounds, offsets per-partition overrides (no default,
        so every partition must be named, as in Spark), words ``EARLIEST``/``LATEST``. The
        bounds' ``option`` names the spec field (``source.kafka.from``), so the resolver's
        errors point at the spec.
        """
        return WindowRequest(
            subscribe=tuple(self.topics),
            start=_bound_spec(self.from_, "source.kafka.from"),
            end=_bound_spec(self.to, "source.kafka.to"),
        )

    def snapshot_window_request(self, offsets: Offsets) -> WindowRequest:
        """The window from a snapshot's offsets to ``to``; errors name the snapshot's offsets."""
        return WindowRequest(
            subscribe=tuple(self.topics),
            start=_bound_spec(offsets, "source.kafka.snapshot.offsets"),
            end=_bound_spec(self.to, "source.kafka.to"),
        )

    def declared_start(self) -> dict[tuple[str, int], int]:
        """``declared_log_start`` keyed by (topic, partition), for ``offsets.resolve``."""
        return {(t, p): o for t, parts in (self.declared_log_start or {}).items() for p, o in parts.items()}


class HistorySource(KafkaSource):
    """Records of Kafka topics in ``[from, to)``, read across the lake archive and the log.

    Offsets below the log's start (or ``declared_log_start``) come from the archive written
    by ``rewind archive``, the rest from Kafka; the overlap is read once. Offsets missing from
    both are classified: ``skipped`` (the broker itself skipped them while the archive read the
    partition contiguously: transaction markers, compaction) or ``lost`` (below the log start
    and never archived). Lost ranges refuse the plan unless ``allow_gaps``.
    """

    archive: str = Field(description="The archive table (`namespace.table`) written by `rewind archive`.")
    allow_gaps: bool = Field(
        default=False,
        description="Run even when offsets were lost (never archived, gone from Kafka); they are recorded.",
    )


class Source(_Model):
    """Where the records come from: exactly one kind of source."""

    KINDS: ClassVar[tuple[str, ...]] = ("kafka", "history", "table")

    kafka: KafkaSource | None = Field(default=None, description="Read a window of Kafka topics.")
    history: HistorySource | None = Field(
        default=None, description="Read a window across the lake archive and the Kafka log."
    )
    table: TableSource | None = Field(
        default=None,
        description=(
            "Re-produce current-state messages of selected entities from a table of a source of "
            "truth (PostgreSQL, SQLite, Iceberg) to a Kafka topic; see docs/reproduce.md."
        ),
    )

    @property
    def window(self) -> KafkaSource:
        """The window of either Kafka kind (a history source is a Kafka window plus an archive);
        a table source has none (check :attr:`kafka_window` first)."""
        found = self.kafka_window
        assert found is not None, "a table source has no Kafka window"
        return found

    @property
    def kafka_window(self) -> KafkaSource | None:
        """The Kafka window, or None for a table source."""
        return self.kafka or self.history

    @model_validator(mode="after")
    def _one(self) -> Source:
        _exactly_one(self, self.KINDS, "source")
        return self

    @property
    def kind(self) -> str:
        """The name of the source given (``"kafka"``)."""
        return next(k for k in self.KINDS if getattr(self, k) is not None)
