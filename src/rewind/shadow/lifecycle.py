"""After the tail: cutover by dual-write, repoint, decommission, abort.

* ``cutover --dual-write``: the same gates as a hard cutover but the live group may be
  active again later: the cut line is taken and proven (:mod:`rewind.shadow.cutline`) and
  published — the shadow moves to ``dual-write`` with v1's and v2's names; the live service,
  restarted from the cut line, writes both with the same keys through
  :class:`rewind.dualwrite.DualWriter`, and v2 keeps getting every event from then on.
* ``repoint``: reads move to v2: the shadow moves to ``repointing`` (the dual writers then
  write v2 only, so v1 stops moving), v1's base is re-recorded and the run is promoted (the
  same renames as a hard cutover); then ``repointed`` (the writers write the swapped table).
* ``decommission``: after ``monitoring_s`` since the cutover or repoint, v1 (kept as the
  previous table, a rollback until then) is dropped.
* ``abort``: before any swap, v2 (the staging), its unit records and the tail's checkpoint
  are dropped; the shadow is ``aborted`` and its name can be started afresh only after
  ``rewind``'s ledger forgets it (a new name starts a new shadow).
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.job.publish import cleanup_run, promote_run
from rewind.shadow.context import load_shadow
from rewind.shadow.cutline import cut_shadow, tail_running
from rewind.shadow.cutover import check_gates
from rewind.shadow.exceptions import ShadowError
from rewind.sinks.iceberg.shadow import IcebergTargetMoved
from rewind.sinks.sql.exceptions import TargetMoved

if TYPE_CHECKING:
    from rewind.config import Settings


def _store(settings: Settings) -> Any:
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger
    from rewind.ledger.shadows import ShadowStore

    ledger = open_ledger(settings)
    return ledger, ShadowStore(ledger.engine)


def cutover_dual_write(settings: Settings, name: str) -> dict[str, Any]:
    """Gates as for ``--hard``, the proven cut line, then ``dual-write`` published."""
    ledger, _ = _store(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        if ctx.record.state == "dual-write":
            return {
                "shadow": name,
                "state": "dual-write",
                "already": True,
                **ctx.record.details["dual_write"],
            }
        if ctx.record.state not in ("tailing", "cut"):
            raise ShadowError(
                f"shadow {name} is {ctx.record.state}; only a tailing or cut shadow is cut over"
            )
        if ctx.sink.kind == "iceberg":
            raise ShadowError(
                f"shadow {name} writes Iceberg: dual-write is for SQL read models (rewind.dualwrite "
                "upserts rows in a database transaction); an Iceberg table's readers follow the catalog, "
                "so use `rewind shadow cutover --hard`; nothing was changed"
            )
        gates = check_gates(settings, ctx, tail_running(ledger, name))
        staging: Any = ctx.staging
        facts = {
            "mode": "dual-write",
            "gates": gates,
            "v1": staging.target_table,
            "v2": staging.table,
            "key": list(ctx.spec.key),
        }
    finally:
        ledger.close()
    cut = cut_shadow(settings, name)
    facts["cut_line"] = {f"{p['topic']}/{p['partition']}": p["cut"] for p in cut["partitions"]}
    ledger, store = _store(settings)
    try:
        store.move(name, ["cut"], "dual-write", details={"dual_write": facts}, event=("dual-write", facts))
    finally:
        ledger.close()
    return {"shadow": name, "state": "dual-write", "already": False, **facts}


def repoint(settings: Settings, name: str, *, attempts: int = 5) -> dict[str, Any]:
    """Swap v2 in for v1 while the dual writers run (see the module docstring)."""
    ledger, store = _store(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        if ctx.record.state == "repointed":
            return {"shadow": name, "state": "repointed", "already": True, **ctx.record.details["repoint"]}
        if ctx.record.state not in ("dual-write", "repointing"):
            raise ShadowError(
                f"shadow {name} is {ctx.record.state}; repoint follows `rewind shadow cutover --dual-write`"
            )
        store.move(name, ["dual-write"], "repointing")
        sink: Any = ctx.sink
        run_id = ctx.record.run_id
        for attempt in range(attempts):
            time.sleep(0.2 * (attempt + 1))  # writers that read dual-write before the move finish
            base = sink.rebase_target(ctx.staging)
            try:
                promoted = promote_run(settings, run_id)
                break
            except (TargetMoved, IcebergTargetMoved):
                if attempt == attempts - 1:
                    raise ShadowError(
                        f"repoint of shadow {name}: v1 kept moving ({attempts} tries); a writer does not use "
                        "rewind.dualwrite; stop it and repoint again"
                    ) from None
        facts = {"swap": promoted["swap"], "v1_base": base, "at": datetime.now(UTC).isoformat()}
        store.move(name, ["repointing"], "repointed", details={"repoint": facts}, event=("repoint", facts))
        return {"shadow": name, "state": "repointed", "already": False, **facts}
    finally:
        ledger.close()


def decommission(settings: Settings, name: str) -> dict[str, Any]:
    """Drop v1 once ``monitoring_s`` has passed since the swap."""
    ledger, store = _store(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        if ctx.record.state == "decommissioned":
            return {"shadow": name, "state": "decommissioned", "already": True}
        if ctx.record.state not in ("cutover", "repointed"):
            raise ShadowError(
                f"shadow {name} is {ctx.record.state}; decommission follows a cutover --hard or a repoint"
            )
        swapped = ctx.record.updated_at
        until = swapped + timedelta(seconds=ctx.config.monitoring_s)
        if datetime.now(UTC) < until:
            raise ShadowError(
                f"shadow {name} is monitored until {until.isoformat(timespec='seconds')} "
                f"(shadow.monitoring_s {ctx.config.monitoring_s:g} s after the swap); v1 is kept for a "
                "rollback until then; nothing was dropped"
            )
        run_id = ctx.record.run_id
    finally:
        ledger.close()
    cleaned = cleanup_run(settings, run_id)
    ledger, store = _store(settings)
    try:
        store.move(
            name,
            ["cutover", "repointed"],
            "decommissioned",
            details={"decommission": cleaned["cleanup"]},
            event=("decommission", cleaned["cleanup"]),
        )
    finally:
        ledger.close()
    return {"shadow": name, "state": "decommissioned", "already": False, "dropped": cleaned["cleanup"]}


def abort(settings: Settings, name: str) -> dict[str, Any]:
    """Drop v2 and the tail's checkpoint of a shadow not swapped in."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import NotFound

    ledger, store = _store(settings)
    try:
        record = store.get(name)
        if record.state == "aborted":
            return {"shadow": name, "state": "aborted", "already": True}
        if record.state in ("cutover", "repointing", "repointed", "decommissioned"):
            raise ShadowError(
                f"shadow {name} is {record.state}: v2 is the live table; `rewind rollback {record.run_id}` "
                "swaps v1 back (then abort); nothing was dropped"
            )
        running = tail_running(ledger, name)
        if running:
            raise ShadowError(
                f"the tail of shadow {name} is running ({running}); stop it first; nothing was dropped"
            )
        try:
            run = ledger.get_run(record.run_id)
        except NotFound:
            run = None
    finally:
        ledger.close()
    dropped = cleanup_run(settings, record.run_id)["cleanup"] if run is not None and run.staging else {}
    shutil.rmtree(Path(record.checkpoint).parent, ignore_errors=True)
    ledger, store = _store(settings)
    try:
        store.move(
            name,
            ["history", "tailing", "cut", "dual-write"],
            "aborted",
            details={"abort": dropped},
            event=("abort", {"dropped": dropped, "checkpoint": record.checkpoint}),
        )
    finally:
        ledger.close()
    return {
        "shadow": name,
        "state": "aborted",
        "already": False,
        "dropped": dropped,
        "checkpoint": record.checkpoint,
    }
