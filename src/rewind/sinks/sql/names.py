"""Table names of the SQL sink: quoting, the staging and previous-table names of a run.

PostgreSQL cuts identifiers at 63 bytes; long names keep a hash of the whole so two runs
never share a staging table.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:

    pass


MAX_IDENT = 63


def quote_ident(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


@dataclass(frozen=True)
class TableName:
    schema: str | None
    name: str

    @property
    def sql(self) -> str:
        if self.schema:
            return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"
        return quote_ident(self.name)

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name

    def sibling(self, name: str) -> TableName:
        return TableName(self.schema, name)

    @classmethod
    def parse(cls, text: str) -> TableName:
        schema, _, name = text.rpartition(".")
        return cls(schema or None, name)


def short_ident(base: str, suffix: str) -> str:
    """``base + suffix`` within PostgreSQL's 63 bytes; a shortened base keeps a hash of itself."""
    name = base + suffix
    if len(name.encode()) <= MAX_IDENT:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:8]
    keep = max(1, MAX_IDENT - len(suffix.encode()) - 9)
    return f"{base.encode()[:keep].decode(errors='ignore')}_{digest}{suffix}"


def run_tag(run_id: str) -> str:
    tag = re.sub(r"[^a-z0-9_]", "_", run_id.lower())
    return tag if len(tag) <= 32 else hashlib.sha256(run_id.encode()).hexdigest()[:16]


def staging_name(table: str, run_id: str) -> str:
    return short_ident(table, f"__rewind_{run_tag(run_id)}")


def prev_name(table: str, run_id: str) -> str:
    return short_ident(table, f"__rewind_prev_{run_tag(run_id)}")


def key_index_name(table: str) -> str:
    return short_ident(table, "_rewind_key")
