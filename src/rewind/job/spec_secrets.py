"""Secrets of a stored spec, put back before a stored plan runs or is published again.

The ledger never holds a secret: a plan's spec is stored masked (:func:`rewind.secrets.mask`),
with ``***`` for the password of a URL (``sink.postgres.url``, ``verify.reference.postgres.url``,
``decode.registry_url``), for a secret query parameter (``?password=``) and for a secret-named
key (a ``sink.kafka.configs`` entry naming a password or token). Resume, a run of a plan id,
verify, promote, rollback and cleanup put the values back before they connect, from, in order:

1. the original spec (``--spec SPEC``): its masked form must equal the stored spec field for
   field (``description`` aside, and ``verify`` for ``rewind verify --spec``), so it puts back
   what was masked and changes nothing else;
2. the setting ``spec_secrets`` (``REWIND_SPEC__SINK__POSTGRES__URL``): the field's whole
   value, which must mask to the stored one;
3. for a PostgreSQL URL, the documented defaults of these fields: the ledger URL's password when
   the ledger names the same user, host and port; else the URL without a password when
   ``PGPASSWORD`` is set or the passfile (``PGPASSFILE``, ``~/.pgpass``) has an entry for it,
   which libpq then reads itself.

A masked value none of these resolves is a one-line :class:`SecretUnresolved` naming the field
and how to supply it, raised before a lease is taken or anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from rewind.errors import RewindError
from rewind.secrets import MASK, is_masked, mask

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.job.plan import JobPlan
    from rewind.spec import JobSpec

Path_ = tuple[str | int, ...]

_POSTGRES = re.compile(r"postgres(ql)?(\+\w+)?$")


class SecretUnresolved(RewindError):
    """A masked value of a stored spec that nothing given resolves."""


class SpecMismatch(RewindError):
    """The spec given to put secrets back (or to replace ``verify``) differs elsewhere."""


def field_name(path: Path_) -> str:
    """``("sink", "postgres", "url")`` → ``sink.postgres.url`` (list positions as numbers)."""
    return ".".join(str(p) for p in path)


def env_name(field: str) -> str:
    """The variable of a field in ``spec_secrets``: ``REWIND_SPEC__SINK__POSTGRES__URL``."""
    return "REWIND_SPEC__" + field.upper().replace(".", "__")


def masked_fields(data: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Where the stored ``data`` holds a masked value, in document order."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            yield from masked_fields(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from masked_fields(value, (*path, i))
    elif isinstance(data, str) and is_masked(data):
        yield path


def first_difference(given: Any, stored: Any, path: Path_ = (), ignore: Sequence[str] = ()) -> Path_ | None:
    """The first field where the masked ``given`` differs from ``stored``, or None; top-level
    keys in ``ignore`` are skipped."""
    if isinstance(given, Mapping) and isinstance(stored, Mapping):
        keys = list(stored) + [k for k in given if k not in stored]
        for key in keys:
            if not path and key in ignore:
                continue
            found = first_difference(given.get(key), stored.get(key), (*path, key))
            if found is not None:
                return found
        return None
    if isinstance(given, list) and isinstance(stored, list) and len(given) == len(stored):
        for i, (a, b) in enumerate(zip(given, stored, strict=True)):
            found = first_difference(a, b, (*path, i))
            if found is not None:
                return found
        return None
    return None if given == stored else path


def spec_data(spec: JobSpec) -> dict[str, Any]:
    """The spec as a plan stores it (before the ledger masks it)."""
    data: dict[str, Any] = json.loads(spec.model_dump_json(by_alias=True))
    return data


def check_same_job(
    given: JobSpec, stored: Mapping[str, Any], what: str, ignore: Sequence[str]
) -> dict[str, Any]:
    """``given`` as plan data, after checking that, masked, it is the ``stored`` spec but for the
    top-level fields in ``ignore``; otherwise :class:`SpecMismatch` naming the first field."""
    data = spec_data(given)
    where = first_difference(mask(data), stored, ignore=("description", *ignore))
    if where is not None:
        shown = _show(_at(mask(data), where)), _show(_at(stored, where))
        only = f"; only {', '.join(ignore)} may differ" if ignore else ""
        raise SpecMismatch(
            f"{what}: {field_name(where)} is {shown[0]} where the run's spec has {shown[1]}: it is "
            f"not the spec of this run{only}"
        )
    return data


def resolve_plan(
    plan: JobPlan,
    settings: Settings,
    *,
    original: JobSpec | None = None,
    needed: Sequence[str] = ("",),
    how: str = "",
) -> JobPlan:
    """``plan`` with the masked values of its spec put back (see the module docstring).

    ``original`` is the spec the user gave again (already checked by :func:`check_same_job` when
    fields may differ; checked here otherwise). Masked values under a field in ``needed`` (a
    prefix like ``sink``; ``""`` is every field) must be resolved; others stay masked (a promotion
    does not need the verify reference). ``how`` is the first way offered in the error, like
    ``the original spec (rewind resume RUN --spec SPEC)``.
    """
    stored = plan.spec
    if original is not None:
        data = check_same_job(original, stored, "--spec", ())
        return dataclasses.replace(plan, spec=data)
    data = _copy(stored)
    unresolved: list[tuple[str, str]] = []
    for path in list(masked_fields(stored)):
        name = field_name(path)
        if not any(name == n or name.startswith(f"{n}.") or not n for n in needed):
            continue
        masked = _at(stored, path)
        value = _from_settings(settings, name, path, masked)
        if value is None:
            value = postgres_url(masked, settings.ledger)
        if value is None:
            unresolved.append((name, masked))
        else:
            _put(data, path, value)
    if unresolved:
        name, masked = unresolved[0]
        more = f" (+{len(unresolved) - 1} more)" if len(unresolved) > 1 else ""
        ways = [how] if how else []
        ways.append(f"{env_name(name)} (setting spec_secrets) with the whole value")
        if _is_postgres(masked):
            parts = urlsplit(masked)
            where = f"{parts.username}@{parts.hostname}:{parts.port or 5432}"
            ways.append(f"PGPASSWORD or a ~/.pgpass entry for {where}")
        raise SecretUnresolved(
            f"plan {plan.plan_id}: {name} holds a secret the ledger does not keep ({_show(masked)}){more}; "
            f"give {', or '.join(ways)}"
        )
    return dataclasses.replace(plan, spec=data)


def postgres_url(masked: str, ledger_url: str) -> str | None:
    """A masked PostgreSQL URL made usable again, or None.

    With the ledger's password when the ledger is PostgreSQL as the same user on the same host
    and port (the documented default of ``sink.postgres.url`` and the verify reference); else
    without a password when libpq will find one (``PGPASSWORD``, or a passfile entry).
    """
    if not _is_postgres(masked):
        return None
    parts = urlsplit(masked)
    params = [p for p in parts.query.split("&") if p]  # as written: libpq decodes them itself
    names = [p.partition("=")[0] for p in params]
    if any(p.partition("=")[2] == MASK and n != "password" for n, p in zip(names, params, strict=True)):
        return None  # another secret parameter (sslpassword...): only the user has it
    query = "&".join(p for n, p in zip(names, params, strict=True) if n != "password")
    netloc = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    at = f"{user}@" if parts.username is not None else ""
    bare = urlunsplit((parts.scheme, f"{at}{netloc}", parts.path, query, parts.fragment))
    ledger = urlsplit(ledger_url)
    port = parts.port or 5432
    same = (ledger.username, ledger.hostname, ledger.port or 5432) == (user or None, parts.hostname, port)
    if _is_postgres(ledger_url) and ledger.password and same:
        netloc = f"{user}:{ledger.password}@{netloc}"
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    if os.environ.get("PGPASSWORD"):
        return bare
    database = parts.path.lstrip("/") or user
    if _passfile_has(parts.hostname or "localhost", str(port), database, user):
        return bare
    return None


def _passfile_has(host: str, port: str, database: str, user: str) -> bool:
    """Whether libpq's passfile has an entry for the connection (libpq ignores a passfile that
    others may read, so this does too)."""
    path = Path(os.environ.get("PGPASSFILE") or Path.home() / ".pgpass")
    try:
        if path.stat().st_mode & 0o077:
            return False
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        parts = re.split(r"(?<!\\):", line, maxsplit=4)
        fields = [f.replace("\\:", ":").replace("\\\\", "\\") for f in parts]
        if len(fields) == 5 and all(
            f == "*" or f == want for f, want in zip(fields[:4], (host, port, database, user), strict=True)
        ):
            return True
    return False


def _from_settings(settings: Settings, name: str, path: Path_, masked: str) -> str | None:
    value = settings.spec_secrets.get(name)
    if value is None:
        return None
    if mask(value, str(path[-1])) != masked:
        raise SpecMismatch(
            f"{env_name(name)} (setting spec_secrets.{name}) is not the stored value with its secret "
            f"put back (stored: {_show(masked)}); give the whole value as the spec had it"
        )
    return value


def _is_postgres(value: str) -> bool:
    return bool(_POSTGRES.match(urlsplit(value).scheme)) if "://" in value else False


def _show(value: Any) -> str:
    """A value of the spec for a one-line message: masked, strings quoted, JSON otherwise."""
    if value is None:
        return "absent"
    value = mask(value)
    text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= 100 else text[:97] + "..."


def _at(data: Any, path: Path_) -> Any:
    for part in path:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return None
    return data


def _put(data: Any, path: Path_, value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def _copy(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data

