"""Tables of the ledger. Later features add their tables here, in one metadata.

Times are ``UTCDateTime``: written as UTC, read back as timezone-aware UTC on every backend
(SQLite keeps them naive on disk). JSON is ``jsonb`` on PostgreSQL and text on SQLite.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that goes in as aware UTC and always comes out as aware UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the ledger; use an aware UTC datetime")
        value = value.astimezone(UTC)
        # SQLite has no time zones: store the UTC wall clock so text comparisons order correctly
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType: Any = JSON().with_variant(JSONB(), "postgresql")
BigInt: Any = BigInteger().with_variant(Integer(), "sqlite")  # SQLite autoincrements INTEGER only

metadata = MetaData()

schema_info = Table(
    "rewind_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)

plans = Table(
    "rewind_plans",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("name", String(200), nullable=False),
    Column("spec_json", JSONType, nullable=False),
    Column("plan_json", JSONType, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

runs = Table(
    "rewind_runs",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("plan_id", String(128), ForeignKey("rewind_plans.id"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("target", String(500), nullable=False),
    Column("state", String(20), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    # not "user": in PostgreSQL a bare `user` is CURRENT_USER, a trap in hand-written queries
    Column("username", String(200), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("staging", JSONType),
    Column("totals", JSONType),
    Column("error", Text),
    Index("ix_rewind_runs_name_created", "name", "created_at"),
    Index("ix_rewind_runs_created", "created_at"),
)

units = Table(
    "rewind_units",
    metadata,
    Column("run_id", String(128), ForeignKey("rewind_runs.id"), nullable=False),
    Column("unit_id", String(500), nullable=False),
    Column("topic", String(255), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("state", String(20), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("records_read", BigInteger, nullable=False, default=0),
    Column("emitted", BigInteger, nullable=False, default=0),
    Column("rows_out", BigInteger, nullable=False, default=0),
    Column("quarantined", BigInteger, nullable=False, default=0),
    Column("filtered", BigInteger, nullable=False, default=0),
    Column("reasons", JSONType, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("error", Text),
    PrimaryKeyConstraint("run_id", "unit_id"),
    Index("ix_rewind_units_run_state", "run_id", "state"),
)

leases = Table(
    "rewind_leases",
    metadata,
    Column("target", String(500), primary_key=True),
    Column("holder", String(128), nullable=False),
    Column("owner", String(300), nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
)

audit = Table(
    "rewind_audit",
    metadata,
    Column("id", BigInt, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime, nullable=False),
    Column("run_id", String(128)),  # no foreign key: some actions (cleanup) span runs
    Column("action", String(64), nullable=False),
    Column("username", String(200), nullable=False),
    Column("details", JSONType, nullable=False),
    Index("ix_rewind_audit_run", "run_id", "id"),
)

reconsumes = Table(
    "rewind_reconsumes",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("live_group", String(255), nullable=False),
    # unique: two reconsumes sharing a temporary group would commit over each other's offsets
    Column("temp_group", String(255), nullable=False, unique=True),
    Column("mode", String(16), nullable=False),
    Column("topics", JSONType, nullable=False),
    Column("plan_json", JSONType, nullable=False),
    Column("state", String(20), nullable=False),
    Column("username", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
)

handover = Table(
    "rewind_handover",
    metadata,
    # one row per partition of a reconsume; see rewind.ledger.handover for who writes what
    Column("reconsume_id", String(128), ForeignKey("rewind_reconsumes.id"), nullable=False),
    Column("topic", String(255), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("existing_last_offset", BigInteger),
    Column("temp_last_offset", BigInteger),
    Column("handover_offset", BigInteger),
    Column("existing_updated_at", UTCDateTime),
    Column("temp_updated_at", UTCDateTime),
    Column("handed_over_at", UTCDateTime),
    PrimaryKeyConstraint("reconsume_id", "topic", "partition"),
)

group_resets = Table(
    "rewind_group_resets",
    metadata,
    # one row per executed reset of a consumer group's offsets; see rewind.ledger.group_resets
    Column("reset_id", String(128), primary_key=True),
    Column("group_id", String(255), nullable=False),
    Column("who", String(300), nullable=False),  # os user@host
    Column("at", UTCDateTime, nullable=False),
    Column("mode", String(32), nullable=False),
    Column("args", JSONType, nullable=False),
    Column("before_offsets", JSONType, nullable=False),  # [{topic, partition, offset|null}]
    Column("after_offsets", JSONType, nullable=False),
    Column("state", String(20), nullable=False),  # applying, applied, failed, undone
    Column("error", Text),
    Column("notes", JSONType, nullable=False),
    Column("undone_at", UTCDateTime),
    Column("undone_by", String(300)),
    Index("ix_rewind_group_resets_group_at", "group_id", "at"),
)

shadows = Table(
    "rewind_shadows",
    metadata,
    # one row per shadow migration (named by its job); see rewind.ledger.shadows
    Column("name", String(128), primary_key=True),
    Column("run_id", String(128), nullable=False),  # the history run whose staging is v2
    Column("fingerprint", String(64), nullable=False),  # the spec's: a restart must be the same job
    Column("state", String(20), nullable=False),
    Column("history_end", JSONType),  # {topic: {partition: offset}}: where the live tail starts
    Column("checkpoint", Text, nullable=False),  # the tail's Spark checkpoint folder
    Column("details", JSONType, nullable=False),  # cut line, cutover, repoint: what happened
    Column("username", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

shadow_events = Table(
    "rewind_shadow_events",
    metadata,
    # what a shadow measured and decided, oldest first: lag samples, verify results, proofs
    Column("id", BigInt, primary_key=True, autoincrement=True),
    Column("name", String(128), ForeignKey("rewind_shadows.name"), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("details", JSONType, nullable=False),
    Index("ix_rewind_shadow_events_name_kind", "name", "kind", "id"),
)

rehearsals = Table(
    "rewind_rehearsals",
    metadata,
    # one row per `rewind rehearse`: the evidence `rewind readiness` and the cost model read,
    # keyed by the fingerprint of the spec rehearsed; see rewind.ledger.evidence
    Column("id", String(64), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("name", String(128), nullable=False),
    Column("run_id", String(128)),  # the throw-away run (its staging and target are gone)
    Column("passed", Integer, nullable=False),  # 1: ran, verified, promoted, rolled back, cleaned
    Column("details", JSONType, nullable=False),  # slice, rates per stage, extrapolation, steps
    Column("username", String(200), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Index("ix_rewind_rehearsals_fingerprint_at", "fingerprint", "at"),
)

probes = Table(
    "rewind_probes",
    metadata,
    # what `rewind doctor` (and a rehearsal's lag sampling) found, per broker: readiness evidence
    Column("id", BigInt, primary_key=True, autoincrement=True),
    Column("kind", String(32), nullable=False),  # doctor | live-lag
    Column("subject", String(300), nullable=False),  # the bootstrap servers (masked) or a group
    Column("ok", Integer, nullable=False),
    Column("details", JSONType, nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Index("ix_rewind_probes_kind_subject", "kind", "subject", "id"),
)
