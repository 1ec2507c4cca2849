"""Small Spark helpers of verification: step timing, query errors, column types, plain values."""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from rewind.verify.exceptions import VerifyError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class Timer:
    """Seconds per named step, for the report."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.steps[name] = round(self.steps.get(name, 0.0) + time.perf_counter() - began, 3)


@contextmanager
def quiet_query_errors() -> Iterator[None]:
    """Silence pyspark's loggers that print a user query's error with a stack trace.

    A failing assertion or filter is reported in one line by Rewind; pyspark would also
    log the whole JVM trace on stderr.
    """
    loggers = [logging.getLogger(n) for n in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def spark_types(df: DataFrame) -> dict[str, str]:
    """Column name → Spark's simple type name (``bigint``, ``decimal(10,2)``...)."""
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


def analysis_error(side: str, what: str, exc: Exception) -> VerifyError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return VerifyError(f"verify.{what} on {side}: {first}")


def plain(value: Any) -> Any:
    """A value as JSON can hold it: times in ISO-8601, decimals as text, bytes as base64."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return plain(value.asDict())
    return value
