"""Tables of the ledger. Later features add their tables here, in one metadata."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, Table, func

metadata = MetaData()

schema_info = Table(
    "rewind_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)
