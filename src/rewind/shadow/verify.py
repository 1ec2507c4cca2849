"""``rewind shadow verify NAME``: v2 against v1 with the verify engine, on settled keys only.

Both tables keep changing while the live service writes v1 and the tail writes v2, so an
event in flight would show as a difference. A key is compared only when its row on each side
comes from an event older than ``settle_s`` (``_rewind_source_timestamp``, the source
record's time, on both sides): a key updated more recently on either side is left out and
counted. The comparison is :func:`rewind.verify.service.verify_frames` in ``match`` mode on
the job's key (missing, extra, duplicate and changed rows all fail it).

Each result is recorded (a ``verify`` event of the shadow, and the run's ``verify`` audit
entry that ``rewind promote``'s gate reads); the go/no-go for cutover is that the last
``verify_passes`` results all passed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from rewind import faults
from rewind.core.columns import SOURCE_TIMESTAMP
from rewind.shadow.context import load_shadow
from rewind.shadow.exceptions import ShadowError
from rewind.spark import session
from rewind.spec import Verify
from rewind.verify.report import summary
from rewind.verify.service import verify_frames

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from rewind.config import Settings
    from rewind.ledger.shadows import ShadowStore
    from rewind.shadow.context import ShadowContext


def go_no_go(store: ShadowStore, name: str, passes: int) -> tuple[bool, str]:
    """Whether the last ``passes`` verify results all passed, and why (not)."""
    results = store.events(name, "verify", limit=passes)
    if len(results) < passes:
        return False, f"{len(results)} of the {passes} verifications needed have run (`rewind shadow verify`)"
    failed = [r for r in results if not r.details.get("passed")]
    if failed:
        at = failed[-1].at.isoformat(timespec="seconds")
        return False, f"{len(failed)} of the last {passes} verifications failed (the latest failure at {at})"
    return True, f"the last {passes} verifications passed"


def settled(
    v2: DataFrame, v1: DataFrame, key: list[str], cutoff: datetime
) -> tuple[DataFrame, DataFrame, int]:
    """Both sides without the keys whose row on either side is newer than ``cutoff``."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F

    fresh = (
        v2.where(F.col(SOURCE_TIMESTAMP) >= F.lit(cutoff))
        .select(*key)
        .unionByName(v1.where(F.col(SOURCE_TIMESTAMP) >= F.lit(cutoff)).select(*key))
        .distinct()
    )
    fresh = fresh.cache()
    count = fresh.count()
    return v2.join(fresh, key, "left_anti"), v1.join(fresh, key, "left_anti"), count


def verify_once(settings: Settings, ctx: ShadowContext) -> dict[str, Any]:
    """One comparison of v2 with v1 on settled keys; recorded; returns the summary."""
    # lazy: avoids pyspark at import
    from pyspark.sql import functions as F


    if ctx.staging is None or ctx.record.state not in ("tailing", "cut"):
        raise ShadowError(
            f"shadow {ctx.record.name} is {ctx.record.state}: only a tailing (or cut) shadow is verified"
        )
    # the cutoff before anything is read: an event older than it is in both tables by the time
    # either is read (each side's lag under settle_s). Taken after the reads, a read slower than
    # settle_s moved it past events one side had not applied yet, which then showed as changed
    # rows (a false no-go seen with v2's lag at 6 s and settle_s 20)
    cutoff = datetime.now(UTC) - timedelta(seconds=ctx.config.settle_s)
    spark = session(settings)
    sink: Any = ctx.sink
    staging: Any = ctx.staging
    v2 = sink.read(spark, staging)
    v1 = sink.read(spark, replace(staging, table=staging.target_table))
    for side in (v1, v2):
        if SOURCE_TIMESTAMP not in side.columns:
            raise ShadowError(
                f"{SOURCE_TIMESTAMP} is not a column of {staging.target_table}: the settle time needs the "
                "source record's time on both sides (the live service writes it with each row)"
            )
    # each side is read once: the settle filter and the comparison are several Spark actions,
    # and a table read again between them (both keep changing) would show an update newer than
    # the cutoff as a difference on a key the filter had kept (seen under load, where a
    # verification took a minute)
    v2 = v2.withColumn(SOURCE_TIMESTAMP, F.col(SOURCE_TIMESTAMP).cast("timestamp")).localCheckpoint()
    faults.pause("shadow-verify-read")
    v1 = v1.withColumn(SOURCE_TIMESTAMP, F.col(SOURCE_TIMESTAMP).cast("timestamp")).localCheckpoint()
    config = ctx.config
    key = list(ctx.spec.key)
    v2s, v1s, unsettled = settled(v2, v1, key, cutoff.replace(tzinfo=None))
    report = verify_frames(
        spark,
        v2s,
        v1s,
        Verify(mode="match"),
        job_key=key,
        run_id=ctx.record.run_id,
        staging_name="v2",
        reference_name="v1",
    )
    facts = {
        **summary(report),
        "unsettled_keys": unsettled,
        "settle_s": config.settle_s,
        "settled_before": cutoff.isoformat(timespec="milliseconds"),
        "v1": staging.target_table,
        "v2": staging.table,
    }
    ctx.store.add_event(ctx.record.name, "verify", facts)
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import Ledger  # the run's verify entry: `rewind promote`'s gate reads it

    ledger = Ledger(ctx.store.engine)
    ledger.audit(ctx.record.run_id, "verify", {**facts, "shadow": ctx.record.name})
    return facts


def verify_shadow(
    settings: Settings,
    name: str,
    *,
    repeat: int = 1,
    every_s: float = 10.0,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``repeat`` verifications ``every_s`` apart; the results and the go/no-go after them."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    ledger = open_ledger(settings)
    try:
        results = []
        for i in range(repeat):
            if i:
                time.sleep(every_s)
            ctx = load_shadow(settings, ledger, name)
            result = verify_once(settings, ctx)
            results.append(result)
            if on_result is not None:
                on_result(result)
        ok, reason = go_no_go(ctx.store, name, ctx.config.verify_passes)
        return {"shadow": name, "results": results, "go": ok, "go_reason": reason}
    finally:
        ledger.close()
