"""Masking of secrets before anything is logged, printed or stored.

A key is secret when its last dotted/underscored part says so (``sasl.password``,
``ssl.key.password``, ``s3.secret-access-key``, ``token``...). URLs keep their shape but
lose the password (``postgresql://rewind:***@db/rewind``) and the values of query parameters
named like secrets (``?password=***``, ``&sslpassword=***``, ``?access_token=***``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

_SECRET_KEY = re.compile(
    r"(password|passwd|secret|token|credential|private[._-]?key|api[._-]?key|"
    r"access[._-]?key|account[._-]?key|connection[._-]?string|sasl\.jaas\.config|ssl\.key\.pem|"
    r"session[._-]?key)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]+)@")
_URL_QUERY = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#]*\?)(?P<query>[^\s#]*)")
_PARAM = re.compile(r"(?P<pre>(?:^|&)(?P<name>[^=&]+)=)(?P<value>[^&]*)")
_MASKED = re.compile(
    r"[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^:/@\s]*:\*\*\*@|[^\s?#]*\?(?:[^\s#]*&)?[^=&\s#]+=\*\*\*(?:[&#\s]|$))"
)


def is_secret_key(key: str) -> bool:
    """True when a settings key names a secret value."""
    return bool(_SECRET_KEY.search(key))


def mask_url(text: str) -> str:
    """Replace the password of every ``scheme://user:password@`` in ``text``, and the value of
    every secret-named query parameter of a URL (libpq takes ``?password=`` as well)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _URL_QUERY.sub(lambda m: m["head"] + _PARAM.sub(_param, m["query"]), text)


def _param(m: re.Match[str]) -> str:
    return m["pre"] + MASK if m["value"] and is_secret_key(m["name"]) else m[0]


def is_masked(text: str) -> bool:
    """True when ``text`` is a masked value or holds one (a URL whose password was masked):
    a value read back from the ledger that must be resolved again before it is used."""
    return text == MASK or bool(_MASKED.search(text))


# Maps whose keys are names from the user's data (columns, views), not settings: a column
# called ``api_token`` is not a secret, and masking its type or tolerance would leave a stored
# spec that no longer validates (resume, verify and promote read it back).
DATA_KEYED_MAPS = frozenset({"schema", "output_schema", "compare", "views"})


def mask(value: Any, key: str = "") -> Any:
    """Return a copy of ``value`` with every secret masked, recursively.

    The keys of a map named in :data:`DATA_KEYED_MAPS` are data names and never make a value
    secret; URL passwords inside such a map are masked all the same."""
    if isinstance(value, Mapping):
        data_keyed = key in DATA_KEYED_MAPS
        return {k: mask(v, "" if data_keyed else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, str):
        return mask_url(value)
    return value


def mask_text(text: str, secrets: list[str]) -> str:
    """Remove known secret values and URL passwords from free text (log lines, errors)."""
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, MASK)
    return mask_url(text)
