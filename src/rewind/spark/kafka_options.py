"""Options shared by the ``rewind-kafka`` reader, stream reader and writer.

Spark's Kafka source conventions: every option starting with ``kafka.`` is a client
property with the prefix removed; everything else is a source option. Option names are
matched case-insensitively, as Spark does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rewind.errors import RewindError


class KafkaOptionError(RewindError):
    """A ``rewind-kafka`` option is missing or has a bad value."""


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def client_conf(options: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka properties from the ``kafka.*`` options; bootstrap servers required."""
    conf = {k[len("kafka.") :]: v for k, v in options.items() if k.lower().startswith("kafka.")}
    if not conf.get("bootstrap.servers"):
        raise KafkaOptionError(
            "option kafka.bootstrap.servers is required, e.g. .option('kafka.bootstrap.servers', 'host:9092')"
        )
    return conf


def flag(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = lower_keys(options).get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise KafkaOptionError(f"option {name}={raw!r}: expected true or false")


def positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = lower_keys(options).get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise KafkaOptionError(f"option {name}={raw!r}: expected a positive integer")
    return value


def positive_float(options: Mapping[str, str], name: str) -> float | None:
    raw = lower_keys(options).get(name.lower())
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise KafkaOptionError(f"option {name}={raw!r}: expected a positive number")
    return value
