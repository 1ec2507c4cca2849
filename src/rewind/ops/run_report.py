"""``rewind report RUN``: one self-contained HTML page per run, from the ledger alone.

What the page holds, each from where Rewind recorded it: the plan (ranges, gates, the cost
estimate), the readiness scorecard of the spec before the run (the ``readiness`` audit entry
``rewind run`` writes), progress over time (records per second from the units' commit times,
and the live groups' lag from the ``live-lag`` samples the run's metrics took), quarantine by
reason, the verification verdict, and the audit trail. Charts are inline SVG (no scripts, no
network): the page can be mailed or attached to a change ticket as it is.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rewind.core.cost import describe
from rewind.ops.readiness import LIVE_LAG
from rewind.verify.report_svg import COLOURS, esc, svg_columns

if TYPE_CHECKING:
    from rewind.config import Settings

BUCKETS = 30
LAG_COLOUR = "#c53030"


def gather(settings: Settings, run_id: str) -> dict[str, Any]:
    """Everything the page shows, as JSON-ready data (``rewind report RUN --json``)."""
    # lazy: avoids sqlalchemy at import
    from rewind.job.service import load_plan, open_ledger, show_run
    from rewind.ledger.evidence import EvidenceStore

    shown = show_run(settings, run_id)
    with open_ledger(settings) as ledger:
        plan = load_plan(ledger, shown["plan_id"])
        units = ledger.units(run_id)
        scored = [
            e
            for e in ledger.audit_log()
            if e.action == "readiness" and e.details.get("plan_id") == plan.plan_id
        ]
        # recorded with the run; a ledger written before that holds it beside the plan only
        risks = [e for e in ledger.audit_log(run_id) if e.action == "accept-risk"] or [
            e
            for e in ledger.audit_log()
            if e.action == "accept-risk" and e.run_id is None and e.details.get("plan_id") == plan.plan_id
        ]
        store = EvidenceStore(ledger.engine)
        groups = list(plan.spec.get("live_groups") or [])
        lag = {
            g: [
                {"at": p.at.isoformat(), "lag": p.details.get("lag")}
                for p in store.probes(LIVE_LAG, g)
                if p.details.get("run") == run_id
            ]
            for g in groups
        }
    done = sorted((u for u in units if u.finished_at is not None), key=lambda u: u.finished_at)  # type: ignore[arg-type, return-value]
    verifications = [h for h in shown["history"] if h["action"] == "verify"]
    return {
        "run": {k: v for k, v in shown.items() if k not in ("units", "history")},
        "plan": {
            "plan_id": plan.plan_id,
            "offsets": plan.offsets,
            "units": len(plan.units),
            "gates": [{"name": g.name, "ok": g.ok, "detail": g.detail} for g in plan.gates],
            "cost": plan.estimates.get("cost"),
            "partitions": _partitions(plan.units),
        },
        "readiness": scored[-1].details if scored else None,
        "accepted_risk": risks[-1].details if risks else None,
        "progress": [
            {"at": u.finished_at.isoformat(), "records": u.records_read, "unit": u.unit_id}  # type: ignore[union-attr]
            for u in done
        ],
        "live_lag": lag,
        "verification": verifications[-1]["details"] if verifications else None,
        "audit": shown["history"],
    }


def _partitions(units: Any) -> list[dict[str, Any]]:
    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    for u in units:
        row = out.setdefault((u.topic, u.partition, u.source), {"start": u.start, "end": u.end, "units": 0})
        row["start"], row["end"] = min(row["start"], u.start), max(row["end"], u.end)
        row["units"] += 1
    return [{"topic": t, "partition": p, "source": s, **row} for (t, p, s), row in sorted(out.items())]


def _rate_series(data: dict[str, Any]) -> tuple[list[str], list[float]]:
    """Records per second over the run, in up to BUCKETS buckets of the commit times."""
    points = [(datetime.fromisoformat(p["at"]), p["records"]) for p in data["progress"]]
    started = data["run"].get("started_at")
    if not points or not started:
        return [], []
    t0 = datetime.fromisoformat(started)
    span = max((points[-1][0] - t0).total_seconds(), 1.0)
    width = span / BUCKETS
    totals = [0.0] * BUCKETS
    for at, records in points:
        i = min(BUCKETS - 1, int((at - t0).total_seconds() / width))
        totals[i] += records
    labels = [f"{(i + 1) * width:.0f}s" for i in range(BUCKETS)]
    return labels, [round(t / width, 1) for t in totals]


def render(data: dict[str, Any]) -> str:
    """The page (self-contained HTML)."""
    run, plan = data["run"], data["plan"]
    ok = run["state"] in ("succeeded", "promoted")
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>rewind report {esc(run['run_id'])}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>Run {esc(run['run_id'])} of {esc(run['name'])} "
        f"<span class='badge {'pass' if ok else 'fail'}'>{esc(run['state'])}</span></h1>",
        f"<p class='meta'>target <code>{esc(run['target'])}</code>, "
        f"plan <code>{esc(plan['plan_id'])}</code>, "
        f"by {esc(run['user'])}, started {esc(run['started_at'])}, finished {esc(run['finished_at'])}</p>",
        "<h2>Counts</h2>",
        _table(
            ["read", "emitted", "rows out", "quarantined", "filtered", "units"],
            [
                [
                    run["records_read"],
                    run["emitted"],
                    run["rows_out"],
                    run["quarantined"],
                    run["filtered"],
                    ", ".join(f"{n} {state}" for state, n in sorted(run["units_by_state"].items())),
                ]
            ],
        ),
    ]
    out += _progress(data)  # first: the charts are what a reader looks for, above the fold
    out += [
        "<h2>Plan</h2>",
        _table(
            ["topic", "partition", "source", "range", "units"],
            [
                [p["topic"], p["partition"], p["source"], f"[{p['start']}, {p['end']})", p["units"]]
                for p in plan["partitions"]
            ],
        ),
        _table(
            ["gate", "ok", "detail"],
            [[g["name"], "yes" if g["ok"] else "NO", g["detail"]] for g in plan["gates"]],
        ),
    ]
    if plan.get("cost"):
        out.append("<ul>" + "".join(f"<li>{esc(line)}</li>" for line in describe(plan["cost"])) + "</ul>")
    out.append("<h2>Readiness</h2>")
    if data["readiness"]:
        out.append(
            _table(
                ["area", "status", "detail", "evidence"],
                [
                    [
                        a["area"],
                        f"<span class='s {a['status']}'>{a['status']}</span>",
                        a["detail"],
                        a["evidence"],
                    ]
                    for a in data["readiness"]["areas"]
                ],
                raw=True,
            )
        )
    else:
        out.append("<p class='meta'>not scored (the run was not started by <code>rewind run SPEC</code>)</p>")
    if data["accepted_risk"]:
        risk = data["accepted_risk"]
        out.append(
            f"<div class='note'>risk accepted for {esc(', '.join(risk['red']))}: {esc(risk['reason'])}</div>"
        )
    out.append("<h2>Quarantine by reason</h2>")
    reasons = run.get("quarantine_reasons") or {}
    out.append(
        _table(["reason", "records"], [[k, v] for k, v in _flat(reasons).items()])
        if reasons
        else "<p>none</p>"
    )
    out.append("<h2>Verification</h2>")
    v = data["verification"]
    if v:
        verdict = "pass" if v.get("passed") else "fail"
        out.append(
            f"<p><span class='badge {verdict}'>{'PASSED' if v.get('passed') else 'FAILED'}</span> "
            f"{esc(v.get('failed') or '')}</p>"
        )
    else:
        out.append("<p class='meta'>not verified</p>")
    out.append("<h2>Audit trail</h2>")
    out.append(
        _table(
            ["at", "action", "user", "details"],
            [[h["at"], h["action"], h["user"], _short(h["details"])] for h in data["audit"]],
        )
    )
    out.append("</main></body></html>")
    return "\n".join(out)


def _progress(data: dict[str, Any]) -> list[str]:
    out = ["<h2>Progress over time</h2>"]
    labels, rates = _rate_series(data)
    if labels:
        out.append(
            svg_columns(labels, [("records/s", COLOURS["staging"], rates)], title="records read per second")
        )
    for group, samples in data["live_lag"].items():
        values = [float(s["lag"]) for s in samples if s["lag"] is not None]
        if values:
            names = [s["at"][11:19] for s in samples if s["lag"] is not None]
            out.append(
                svg_columns(names, [(f"lag of {group}", LAG_COLOUR, values)], title=f"live lag of {group}")
            )
        else:
            out.append(
                f"<p class='meta'>live group {esc(group)}: no lag sampled (no such group, or the run "
                "was not started by rewind run)</p>"
            )
    return out


def write(settings: Settings, run_id: str, path: Path | None = None) -> tuple[dict[str, Any], Path]:
    data = gather(settings, run_id)
    target = path or settings.state_path / "reports" / f"{run_id}-report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(data))
    return data, target


def _flat(reasons: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in reasons.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}: "))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _short(details: Any) -> str:
    text = json.dumps(details, sort_keys=True, default=str)
    return text if len(text) <= 240 else text[:237] + "..."


def _table(headers: list[str], rows: list[list[Any]], raw: bool = False) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{c if raw and isinstance(c, str) and c.startswith('<span') else esc(c)}</td>" for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1a202c;
margin:0;background:#f7fafc}
main{max-width:1140px;margin:0 auto;padding:20px}
h1{font-size:22px}h2{font-size:17px;margin-top:26px;border-bottom:1px solid #e2e8f0}
.meta{color:#4a5568}
table{border-collapse:collapse;margin:8px 0;background:#fff}
th,td{border:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#edf2f7}
.badge{color:#fff;border-radius:4px;padding:2px 8px;font-size:14px}
.badge.pass{background:#2f855a}.badge.fail{background:#c53030}
.s{font-weight:600}.s.green{color:#2f855a}.s.yellow{color:#b7791f}.s.red{color:#c53030}
.note{background:#fffbea;border-left:4px solid #d69e2e;padding:6px 10px;margin:8px 0}
svg{background:#fff;margin:8px 0}
.ct{font-weight:600;font-size:13px}.ax{font-size:11px;fill:#4a5568}.grid{stroke:#e2e8f0}
"""
