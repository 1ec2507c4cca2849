"""The run ledger: runs, work units, progress, leases and audit, in SQLAlchemy.

SQLite by default (one process), PostgreSQL for a team (``ledger_url``).
"""

from rewind.ledger.db import SCHEMA_VERSION, connect, ensure_schema

__all__ = ["SCHEMA_VERSION", "connect", "ensure_schema"]
