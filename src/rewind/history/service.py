"""What the ``rewind archive`` and ``rewind query`` commands do, as plain functions returning dicts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rewind.core.console import QUIET, Console
from rewind.history.archive import archive_once, start_continuous
from rewind.history.compact import compact_archive
from rewind.history.exceptions import HistoryError
from rewind.history.query import collect_rows, parse_declared, query_history, window_from_bounds
from rewind.history.schema import split_name
from rewind.openlineage import commands as lineage
from rewind.openlineage.runs import emits
from rewind.spark import session

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.history.plan import Prefer


@emits(lineage.archive, lineage.archived)
def run_archive(
    settings: Settings,
    topics: Sequence[str],
    table: str,
    *,
    continuous: bool = False,
    compact: bool = False,
    allow_loss: bool = False,
    max_offsets: int | None = None,
    trigger_seconds: float = 5.0,
    duration_s: float | None = None,
    console: Console = QUIET,
) -> dict[str, Any]:
    """One pass (or a continuous archive until ``duration_s`` or Ctrl-C), then compaction if asked."""
    split_name(table)
    if not topics:
        raise HistoryError("name at least one topic to archive")
    out: dict[str, Any] = {
        "table": table,
        "topics": list(topics),
        "mode": "continuous" if continuous else "once",
    }
    if not continuous:
        result = archive_once(
            settings,
            topics,
            table,
            allow_loss=allow_loss,
            max_offsets=max_offsets,  # Spark only if needed
        )
        if result.committed:
            console.archive_committed(result.to_dict())
        out["passes"] = [result.to_dict()]
    else:
        runner = start_continuous(
            session(settings),
            settings,
            topics,
            table,
            trigger_seconds=trigger_seconds,
            max_offsets_per_trigger=max_offsets,
            allow_loss=allow_loss,
        )
        shown = 0
        deadline = None if duration_s is None else time.monotonic() + duration_s
        try:
            while deadline is None or time.monotonic() < deadline:
                if runner.error() is not None:  # failed more often than its restarts allow
                    break
                for result in runner.refresh()[shown:]:
                    console.archive_committed(result.to_dict())
                shown = len(runner.results)
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            error = runner.error()
            runner.stop()
        if error is not None:
            raise HistoryError(str(error))
        for result in runner.refresh()[shown:]:
            console.archive_committed(result.to_dict())
        out["passes"] = [r.to_dict() for r in runner.results]
        out["restarts"] = runner.restarts
    out["records"] = sum(p["records"] for p in out["passes"])
    if compact:
        out["compaction"] = compact_archive(settings, table).to_dict()
    return out


def run_query(
    settings: Settings,
    sql: str,
    topics: Sequence[str],
    archive: str,
    *,
    start: str = "earliest",
    end: str = "latest",
    declared_log_start: str | None = None,
    allow_gaps: bool = False,
    prefer: Prefer = "kafka",
    limit: int = 100,
) -> dict[str, Any]:
    """Run ``sql`` over the view ``history`` of the window; up to ``limit`` rows and the plan's summary."""
    split_name(archive)
    window = window_from_bounds(topics, start, end)
    spark = session(settings)
    started = time.monotonic()
    plan, df = query_history(
        spark,
        settings,
        sql,
        topics,
        archive,
        window,
        declared_log_start=parse_declared(declared_log_start),
        allow_gaps=allow_gaps,
        prefer=prefer,
    )
    columns, rows, more = collect_rows(df, limit)
    return {
        "columns": columns,
        "rows": rows,
        "truncated": more,
        "plan": plan.summary(),
        "seconds": round(time.monotonic() - started, 3),
    }
