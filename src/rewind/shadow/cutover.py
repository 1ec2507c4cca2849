"""``rewind shadow cutover --hard NAME``: v2 swapped in for v1 in one step, after the gates.

Gates, all checked before anything changes (each refusal is one line, nothing changed):

1. caught up: the lag samples of the tail's last ``caught_up_for_s`` before it stopped had
   every partition's lag under ``lag_threshold``;
2. verification: the last ``verify_passes`` results of ``shadow verify`` passed;
3. the live group is inactive (its members are named otherwise): v1 must not move;
4. the tail is stopped: v2 must not move either while it is swapped.

Then the cut line is taken and proven (:mod:`rewind.shadow.cutline`) unless ``shadow cut``
did it already, and the run is promoted by the job's promotion (:func:`rewind.job.publish.promote_run`):
the SQL sink renames v1 → ``<table>__rewind_prev_<run>`` and v2 → ``<table>`` in one
transaction, refusing when v1 changed since the cut line; the Iceberg sink swaps the same two
names in one transaction of the SQL catalog, refusing when v1's metadata location is not the
one recorded at the cut line (:mod:`rewind.sinks.iceberg.shadow`). v1 stays as the previous table:
``rewind rollback RUN`` goes back until ``shadow decommission`` drops it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rewind.job.publish import promote_run
from rewind.kafka import groups
from rewind.kafka.exceptions import GroupActive
from rewind.shadow.context import load_shadow
from rewind.shadow.cutline import cut_shadow, tail_running
from rewind.shadow.exceptions import ShadowError
from rewind.shadow.lag import caught_up
from rewind.shadow.verify import go_no_go
from rewind.sinks.iceberg.shadow import IcebergTargetMoved
from rewind.sinks.sql.exceptions import TargetMoved

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.shadow.context import ShadowContext


def check_gates(settings: Settings, ctx: ShadowContext, running: str | None) -> dict[str, str]:
    """Gates 1-4 (see the module docstring); the reasons they hold, or a one-line refusal."""
    name, config = ctx.record.name, ctx.config
    samples = ctx.store.events(name, "lag", limit=int(config.caught_up_for_s) + 240)
    up, up_why = caught_up(samples, config, samples[-1].at) if samples else (False, "no lag sample yet")
    if not up:
        raise ShadowError(
            f"cutover of shadow {name} refused: not caught up ({up_why}); run `rewind shadow start "
            "--until-caught-up`; nothing was changed"
        )
    ok, why = go_no_go(ctx.store, name, config.verify_passes)
    if not ok:
        raise ShadowError(f"cutover of shadow {name} refused: {why}; nothing was changed")
    try:
        groups.require_inactive(settings.kafka_config(), config.live_group)
    except GroupActive as exc:
        raise ShadowError(f"cutover of shadow {name} refused: {exc}; nothing was changed") from None
    if running:
        raise ShadowError(
            f"cutover of shadow {name} refused: its tail is running ({running}); stop it first; "
            "nothing was changed"
        )
    return {"verification": why, "caught_up": up_why, "live_group": f"{config.live_group} is inactive"}


def cutover_hard(settings: Settings, name: str) -> dict[str, Any]:
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    ledger = open_ledger(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        if ctx.record.state == "cutover":
            return {"shadow": name, "state": "cutover", "already": True, **ctx.record.details["cutover"]}
        if ctx.record.state not in ("tailing", "cut"):
            raise ShadowError(
                f"shadow {name} is {ctx.record.state}; only a tailing or cut shadow is cut over"
            )
        gates = check_gates(settings, ctx, tail_running(ledger, name))
        run_id = ctx.record.run_id
    finally:
        ledger.close()
    cut = cut_shadow(settings, name)
    try:
        promoted = promote_run(settings, run_id)
    except (TargetMoved, IcebergTargetMoved) as exc:
        raise ShadowError(
            f"cutover of shadow {name} refused: v1 moved after the cut line ({str(exc).split(';')[0]}); "
            "something still writes it: stop it, then `rewind shadow abort` and start again; "
            "nothing was swapped"
        ) from None
    facts = {"mode": "hard", "gates": gates, "swap": promoted["swap"], "cut_line_at": cut.get("at")}
    ledger = open_ledger(settings)
    try:
        # lazy: avoids sqlalchemy at import
        from rewind.ledger.shadows import ShadowStore

        ShadowStore(ledger.engine).move(
            name, ["cut"], "cutover", details={"cutover": facts}, event=("cutover", facts)
        )
    finally:
        ledger.close()
    return {"shadow": name, "state": "cutover", "already": False, **facts}
