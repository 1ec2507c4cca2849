"""Direct SQL over history: the window of a history plan as a Spark view named ``history``."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from rewind.history.exceptions import HistoryError
from rewind.history.plan import plan_history
from rewind.history.read import read_history
from rewind.history.schema import TP
from rewind.spec import KafkaSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rewind.config import Settings
    from rewind.core.windows import WindowRequest
    from rewind.history.plan import HistoryPlan, Prefer

VIEW = "history"


def window_from_bounds(topics: Sequence[str], start: Any = "earliest", end: Any = "latest") -> WindowRequest:
    """A window from job-spec style bounds (``earliest``/``latest``, ISO time, epoch ms, offsets JSON).

    The same parser as ``source.kafka.from``/``to`` of a job spec, so the CLI and specs agree.
    """
    try:
        source = KafkaSource.model_validate({"topics": list(topics), "from": start, "to": end})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "window"
        raise HistoryError(f"history window {where}: {err['msg']}") from None
    return source.window_request()


def parse_declared(text: str | None) -> dict[TP, int] | None:
    """``{"topic": {"0": 500}}`` into ``{(topic, 0): 500}``."""
    if not text:
        return None
    try:
        data = json.loads(text)
        return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError):
        raise HistoryError(
            f"declared log start {text!r}: expected JSON offsets per partition, "
            'like {"orders": {"0": 500}}'
        ) from None


def query_history(
    spark: SparkSession,
    settings: Settings,
    sql: str,
    topics: Sequence[str],
    archive: str,
    window: WindowRequest | None = None,
    *,
    declared_log_start: Mapping[TP, int] | None = None,
    allow_gaps: bool = False,
    prefer: Prefer = "kafka",
    include_headers: bool = True,
) -> tuple[HistoryPlan, DataFrame]:
    """Plan the window, register it as the view ``history``, and return the plan and ``spark.sql(sql)``."""
    plan = plan_history(
        settings,
        topics,
        archive,
        window,
        declared_log_start=declared_log_start,
        allow_gaps=allow_gaps,
        prefer=prefer,
    )
    read_history(spark, settings, plan, include_headers=include_headers).createOrReplaceTempView(VIEW)
    # PySpark logs every failed query (with the JVM stack) before raising: the error below says it
    quiet = logging.getLogger("SQLQueryContextLogger")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        return plan, spark.sql(sql)
    except Exception as exc:  # Spark's AnalysisException and parse errors: one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise HistoryError(f"query failed: {first}") from exc
    finally:
        quiet.setLevel(level)


def jsonable(value: Any) -> Any:
    """A result cell for JSON and tables: bytes as UTF-8 text when they are, else base64."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(bytes(value)).decode()
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if hasattr(value, "asDict"):
        return jsonable(value.asDict())
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def collect_rows(df: DataFrame, limit: int) -> tuple[list[str], list[list[Any]], bool]:
    """Up to ``limit`` rows of a result, JSON-ready, and whether more were left out."""
    rows = df.limit(limit + 1).collect()
    more = len(rows) > limit
    return list(df.columns), [[jsonable(v) for v in r] for r in rows[:limit]], more
