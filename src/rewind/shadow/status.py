"""``rewind shadow status NAME``: lag per partition now, caught-up, the tail's speed as a multiple
of the live produce rate ("x real-time"), and the lag history."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.shadow.context import load_shadow
from rewind.shadow.lag import SPEED_WINDOW_S, caught_up, judge_tail, max_lag, sample, tail_speed

if TYPE_CHECKING:
    from rewind.config import Settings


def shadow_status(settings: Settings, name: str, *, history: int = 10) -> dict[str, Any]:
    """A fresh lag sample (v2's committed units against the log end and the live group), the
    caught-up verdict over the samples the running tail recorded, and the tail's speed judged
    against ``live.min_multiple`` (:func:`rewind.shadow.lag.judge_tail`)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    ledger = open_ledger(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        config = ctx.config
        lag = sample(settings, ctx.spec.source.window.topics, config.live_group, ctx.committed_units())
        now = ledger.clock()
        # enough samples to cover the caught-up window and the speed's at any pace
        window = int(max(config.caught_up_for_s, SPEED_WINDOW_S)) + 120
        events = ctx.store.events(name, "lag", limit=max(history, window))
        ok, reason = caught_up(events, config, now)
        restarts = ctx.store.events(name, "restart")  # the tail's query, started again after a failure
        if ctx.record.state != "tailing":
            ok, reason = False, f"the shadow is {ctx.record.state}, not tailing"
        speed = tail_speed(events)
        behind = max((p.lag for p in lag), default=0)
        verdict = judge_tail(speed, ok, behind, settings.live.min_multiple)
        if speed is not None and verdict is not None:
            speed.update(status=verdict.status, verdict=verdict.detail)
        return {
            "shadow": name,
            "state": ctx.record.state,
            "run_id": ctx.record.run_id,
            "live_group": config.live_group,
            "history_end": ctx.record.history_end,
            "v1": getattr(ctx.staging, "target_table", None),
            "v2": getattr(ctx.staging, "table", None),
            "partitions": [p.to_dict() for p in lag],
            "max_lag": behind,
            "caught_up": ok,
            "caught_up_reason": reason,
            "lag_threshold": config.lag_threshold,
            "caught_up_for_s": config.caught_up_for_s,
            "speed": speed,
            "restarts": len(restarts),
            "last_restart": (
                {"at": restarts[-1].at.isoformat(timespec="seconds"), **restarts[-1].details}
                if restarts
                else None
            ),
            "lag_history": [
                {
                    "at": e.at.isoformat(timespec="seconds"),
                    "max_lag": max_lag(e.details),
                    "max_group_lag": max(
                        (
                            p["group_lag"]
                            for p in e.details.get("partitions", [])
                            if p["group_lag"] is not None
                        ),
                        default=None,
                    ),
                }
                for e in events[-history:]
            ],
        }
    finally:
        ledger.close()
