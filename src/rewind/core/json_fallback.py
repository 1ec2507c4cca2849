"""orjson's fallback for values it cannot serialise itself, the same wherever Rewind writes JSON
records (a table source's row values, the Kafka sink's values): bytes as base64 text,
everything else (Decimal, UUID, ...) as its ``str``."""

from __future__ import annotations

import base64
from typing import Any


def json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    return str(value)  # Decimal keeps every digit as text; other types by their own text
