"""The cut line: per partition, the offset that separates what v2 got from the shadow from what
it gets after cutover, and the proof that it holds.

The cut line is the live group's committed offset minus the overlap (``rewind_by``: offsets,
or the offsets of that much time, never below the history's start). After cutover the live
service resumes from the cut line, so the overlap ``[cut, committed)`` is written twice and
absorbed by the upsert on the key. The proof, per partition, from the unit ranges v2's sink
committed (each recorded in the same transaction as its rows):

* the ranges form one contiguous run from the history's first offset: no gap below the cut;
* that run reaches the cut line: every offset below it reached v2;
* no two ranges overlap: no offset was applied twice by the shadow.

A folded read model (``translate.fold``) cannot absorb an overlap: an event applied twice is
added twice. Its cut line is where v2's contiguous ranges end on each partition (the tail
stopped), and the group is moved there, back or forward: the service resumes on v2 exactly
after the last event folded into it (``shadow.rewind_by`` must be 0).

``rewind shadow cut`` computes it with the live group inactive and the tail stopped, records
it (and v1's row count and hash at that moment, against which the cutover's swap checks that
v1 did not move since), and resets the group to the cut line.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rewind.kafka import groups
from rewind.shadow.context import load_shadow
from rewind.shadow.exceptions import ShadowError
from rewind.shadow.positions import coverage

if TYPE_CHECKING:
    from rewind.config import Settings
    from rewind.ledger import Ledger
    from rewind.shadow.context import ShadowContext


def tail_running(ledger: Ledger, name: str) -> str | None:
    """The process (``host:pid``) tailing the shadow now, if one is."""
    # lazy: avoids sqlalchemy at import
    from rewind.ledger import owner_is_dead

    lease = ledger.lease(f"shadow:{name}")
    if lease is None or lease.expires_at <= datetime.now(UTC) or owner_is_dead(lease.owner):
        return None
    return lease.owner


def history_starts(ctx: ShadowContext) -> dict[tuple[str, int], int]:
    parts = (ctx.plan.read_plan.get("history") or {}).get("partitions") or []
    return {(str(p["topic"]), int(p["partition"])): int(p["start"]) for p in parts}


def cut_line(settings: Settings, ctx: ShadowContext) -> dict[tuple[str, int], dict[str, Any]]:
    """Per partition: the live group's committed offset and the cut line under the overlap."""
    config = ctx.config
    conf = settings.kafka_config()
    topics = list(ctx.spec.source.window.topics)
    committed = groups.committed_offsets(conf, config.live_group, topics)
    missing = sorted(f"{t}/{p}" for (t, p), o in committed.items() if o is None)
    if missing:
        raise ShadowError(
            f"the live group {config.live_group} has no committed offset on {', '.join(missing)}; "
            "a cut line is taken from the live service's offsets: let it commit on every partition"
        )
    starts = history_starts(ctx)
    by_time: dict[tuple[str, int], int] = {}
    overlap_ms = config.overlap_ms()
    if overlap_ms is not None:
        when = int(datetime.now(UTC).timestamp() * 1000) - overlap_ms
        by_time = {tp: pos.offset for tp, pos in groups.offsets_at_time(conf, list(committed), when).items()}
    out = {}
    if ctx.spec.translate.fold is not None:  # a fold adds an event twice: the cut is where v2 ends
        covered = coverage(ctx.committed_units())
        for tp, offset in sorted(committed.items()):
            cov = covered.get(tp)
            out[tp] = {"committed": offset, "cut": cov.end if cov else starts.get(tp, 0)}
        return out
    for tp, offset in sorted(committed.items()):
        assert offset is not None
        cut = offset - config.overlap_offsets() if overlap_ms is None else min(offset, by_time[tp])
        out[tp] = {"committed": offset, "cut": max(cut, starts.get(tp, 0))}
    return out


def prove(ctx: ShadowContext, line: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """The proof per partition (see the module docstring); ``holds`` is False with the reason."""
    covered = coverage(ctx.committed_units())
    starts = history_starts(ctx)
    partitions = []
    for (topic, partition), cut in sorted(line.items()):
        cov = covered.get((topic, partition))
        start = starts.get((topic, partition), 0)
        ranges = [list(r) for r in cov.ranges] if cov else []
        problems = []
        if cut["cut"] > start:
            if cov is None or cov.start > start:
                problems.append(
                    f"v2 starts at {cov.start if cov else 'nothing'}, not at the history's {start}"
                )
            elif cov.end < cut["cut"]:
                gap = f"a gap at {cov.end}" if len(ranges) > 1 else f"v2 ends at {cov.end}"
                problems.append(f"{gap}, below the cut line {cut['cut']}")
        if cov is not None and cov.overlaps:
            problems.append(f"offsets applied twice: {[list(o) for o in cov.overlaps]}")
        partitions.append(
            {
                "topic": topic,
                "partition": partition,
                "history_start": start,
                "committed": cut["committed"],
                "cut": cut["cut"],
                "overlap": cut["committed"] - cut["cut"],
                "v2_ranges": ranges,
                "v2_end": cov.end if cov else start,
                "below_cut_in_v2": max(0, cut["cut"] - start) if not problems else None,
                "holds": not problems,
                "problems": problems,
            }
        )
    bad = [p for p in partitions if not p["holds"]]
    return {
        "holds": not bad,
        "reason": (
            f"{bad[0]['topic']}/{bad[0]['partition']}: {bad[0]['problems'][0]}"
            if bad
            else "every offset below the cut line is in v2, once, on every partition"
        ),
        "partitions": partitions,
    }


def cut_shadow(settings: Settings, name: str) -> dict[str, Any]:
    """``rewind shadow cut NAME``: compute, prove, record the cut line; reset the group to it."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import open_ledger

    ledger = open_ledger(settings)
    try:
        ctx = load_shadow(settings, ledger, name)
        if ctx.record.state == "cut":
            return {"shadow": name, "state": "cut", "already_cut": True, **ctx.record.details["cut_line"]}
        if ctx.record.state != "tailing":
            raise ShadowError(f"shadow {name} is {ctx.record.state}; only a tailing shadow gets a cut line")
        running = tail_running(ledger, name)
        if running:
            raise ShadowError(
                f"the tail of shadow {name} is running ({running}); stop `rewind shadow start` first, "
                "so v2 stops moving while the cut line is proven"
            )
        conf = settings.kafka_config()
        groups.require_inactive(conf, ctx.config.live_group)
        line = cut_line(settings, ctx)
        proof = prove(ctx, line)
        proof["at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        if not proof["holds"]:
            ctx.store.add_event(name, "cut-refused", proof)
            raise ShadowError(
                f"the cut line of shadow {name} is not proven: {proof['reason']}; "
                "run `rewind shadow start` until it is caught up, then cut again"
            )
        sink: Any = ctx.sink
        proof["v1_base"] = sink.rebase_target(ctx.staging)
        folded = ctx.spec.translate.fold is not None  # the group moves to v2's end, either way
        rewound = {tp: v["cut"] for tp, v in line.items() if v["cut"] < v["committed"] or folded}
        groups.alter_offsets(conf, ctx.config.live_group, rewound)
        proof["group_reset"] = {f"{t}/{p}": o for (t, p), o in sorted(rewound.items())}
        ctx.store.move(name, ["tailing"], "cut", details={"cut_line": proof}, event=("cut-line", proof))
        return {"shadow": name, "state": "cut", "already_cut": False, **proof}
    finally:
        ledger.close()
