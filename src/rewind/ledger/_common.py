"""Helpers shared by the ledger's modules: clocks, identity, JSON hygiene, audit rows."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, date, datetime
from pathlib import PurePath
from typing import Any

from sqlalchemy import Connection, RowMapping, Table, select
from sqlalchemy.dialects import postgresql, sqlite

from rewind.ledger.models import AuditEntry
from rewind.ledger.schema import audit
from rewind.secrets import mask, mask_url

CHUNK = 500
"""Ids per ``IN (...)`` list: well under SQLite's and PostgreSQL's bound-parameter limits."""

MAX_COUNT = 2**63 - 1


def utcnow() -> datetime:
    return datetime.now(UTC)


def db_now(conn: Connection) -> datetime:
    """The database's clock on PostgreSQL (so hosts with skewed clocks agree), ours on SQLite."""
    if conn.dialect.name == "postgresql":
        value = conn.exec_driver_sql("SELECT clock_timestamp()").scalar_one()
        return value.astimezone(UTC)  # type: ignore[no-any-return,unused-ignore]
    return utcnow()


def current_user() -> str:
    try:
        return getpass.getuser()  # LOGNAME, USER, LNAME, USERNAME, then the password database
    except (OSError, KeyError):
        return os.environ.get("USER") or "unknown"


def current_owner() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` is a process on this host that no longer exists.

    A process elsewhere cannot be checked and counts as alive; so does a reused pid.
    """
    host, _, pid_text = owner.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists, as someone else
        return False
    return False


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if hasattr(value, "model_dump"):  # pydantic
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def to_json(value: Any, what: str) -> Any:
    """``value`` with its secrets masked, as plain JSON data (dicts, lists, str, numbers, None).

    Strings holding JSON text are parsed first, so callers may hand over either form.
    """
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{what} is not valid JSON: {exc}") from None
    try:
        text = json.dumps(mask(value), default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} cannot be stored as JSON: {exc}") from None
    return json.loads(text)


def to_json_object(value: Any, what: str) -> dict[str, Any]:
    data = to_json(value, what)
    if not isinstance(data, dict):
        raise TypeError(f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def clean_text(text: str | None) -> str | None:
    """Free text (errors) without URL passwords, cut to a size a ledger row should hold."""
    if text is None:
        return None
    text = mask_url(str(text))
    return text if len(text) <= 20_000 else text[:20_000] + " …[truncated]"


def clean_counts(reasons: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A mapping of counts (ints, or nested mappings of ints) with URL passwords out of its keys.

    ``mask`` is not used here: a reason such as "bad password field" must keep its count.
    """
    out: dict[str, Any] = {}
    for key, value in reasons.items():
        name = mask_url(str(key))
        if isinstance(value, Mapping):
            out[name] = clean_counts(value, what)
        elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
            out[name] = value
        else:
            raise ValueError(f"{what}: reason {name!r} must map to a count >= 0, got {value!r}")
    return out


def merge_counts(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Add the counts of ``more`` to ``into``, recursively."""
    for key, value in more.items():
        if isinstance(value, Mapping):
            sub = into.get(key)
            if not isinstance(sub, dict):
                sub = {"": sub} if isinstance(sub, int) else {}
                into[key] = sub
            merge_counts(sub, value)
        elif isinstance(into.get(key), dict):
            into[key][""] = into[key].get("", 0) + value
        else:
            into[key] = into.get(key, 0) + value


def upsert(conn: Connection, table: Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's INSERT that supports ``ON CONFLICT``."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def chunks(items: Sequence[str], size: int = CHUNK) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def insert_audit(
    conn: Connection, run_id: str | None, action: str, user: str, details: Any, at: datetime | None = None
) -> AuditEntry:
    if not action or not action.strip():
        raise ValueError("an audit action must be a non-empty word such as 'run' or 'promote'")
    row = {
        "at": at or utcnow(),
        "run_id": run_id,
        "action": action,
        "username": user,
        "details": to_json_object(details if details is not None else {}, f"details of audit {action!r}"),
    }
    new_id = conn.execute(audit.insert().values(**row).returning(audit.c.id)).scalar_one()
    stored = conn.execute(select(audit).where(audit.c.id == new_id)).one()
    return audit_entry(stored._mapping)


def audit_entry(row: RowMapping) -> AuditEntry:
    return AuditEntry(
        id=int(row["id"]),
        at=row["at"],
        run_id=row["run_id"],
        action=row["action"],
        user=row["username"],
        details=row["details"],
    )
