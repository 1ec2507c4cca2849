"""The verification report: checks and verdict as JSON, and a self-contained HTML page.

Pure Python, no Spark. :func:`build_report` turns the comparison's results and the
assertions' into the JSON report (``checks`` and ``passed`` included); :func:`render_html`
draws it as one HTML file with inline CSS and inline SVG charts (counts per bucket, drift
per bucket and per category), the failed checks and the differing rows side by side. The
page loads nothing from anywhere: no scripts, fonts, images or styles from a network.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rewind.verify.report_html import render_html
from rewind.verify.rules import Rules


def _n(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def build_checks(
    result: dict[str, Any], assertions: list[dict[str, Any]], rules: Rules
) -> list[dict[str, Any]]:
    """Every check with its level, verdict and a one-line detail, in the order people read them."""
    where = " outside the repaired window" if rules.mode == "repair" and rules.windowed else ""
    record, state = result["record"], result["state"]
    dup = record["duplicates"]
    checks = [
        {
            "level": "record",
            "name": f"every reference key is in staging{where}",
            "passed": record["missing"] == 0,
            "count": record["missing"],
            "detail": f"{_n(record['missing'], 'key')} missing from staging",
        },
        {
            "level": "record",
            "name": f"staging has no extra keys{where}",
            "passed": record["extra"] == 0,
            "count": record["extra"],
            "detail": f"{_n(record['extra'], 'key')} only in staging",
        },
        {
            "level": "record",
            "name": "staging keys are unique",
            "passed": dup["staging"] == 0,
            "count": dup["staging"],
            "detail": f"{_n(dup['staging'], 'key')} more than once in staging"
            + (f" ({dup['reference']:,} in the reference)" if dup["reference"] else ""),
        },
    ]
    by_column = ", ".join(f"{c} {n:,}" for c, n in state["by_column"].items())
    tolerated = state["within_tolerance"]
    checks.append(
        {
            "level": "state",
            "name": f"values match{where}"
            + (" within tolerance" if any(c.kind == "numeric" for c in rules.columns) else ""),
            "passed": state["changed"] == 0,
            "count": state["changed"],
            "detail": f"{_n(state['changed'], 'row differs', 'rows differ')}"
            + (f" ({by_column})" if by_column else "")
            + (f"; {tolerated:,} differ within tolerance" if tolerated else ""),
        }
    )
    for a in assertions:
        checks.append(
            {
                "level": "outcome",
                "name": a["name"],
                "passed": bool(a["passed"]),
                "count": a.get("value") if isinstance(a.get("value"), int | float) else None,
                "detail": a.get("detail", ""),
            }
        )
    return checks


def build_report(
    result: dict[str, Any],
    assertions: list[dict[str, Any]],
    rules: Rules,
    *,
    run_id: str | None,
    staging: str,
    reference: str,
    notes: list[str] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """The JSON report: verdict, checks, and every figure behind them."""
    checks = build_checks(result, assertions, rules)
    return {
        "run_id": run_id,
        "passed": all(c["passed"] for c in checks),
        "failed": [c["name"] for c in checks if not c["passed"]],
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": rules.mode,
        "staging": staging,
        "reference": reference,
        "key": list(rules.key),
        "columns": [c.to_dict() for c in rules.columns],
        "scope": rules.scope_dict(),
        "checks": checks,
        "rows": result["rows"],
        "record": result["record"],
        "state": result["state"],
        "changes": result["changes"],
        "assertions": assertions,
        "buckets": result["buckets"],
        "categories": result["categories"],
        "bisection": result["bisection"],
        "notes": [*rules.notes, *(notes or [])],
        "seconds": {
            **result.get("seconds", {}),
            **({"total": round(seconds, 3)} if seconds is not None else {}),
        },
    }


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The part of the report recorded in the ledger's audit (small, no samples)."""
    return {
        "passed": report["passed"],
        "failed": report["failed"],
        "mode": report["mode"],
        "reference": report["reference"],
        "rows": report["rows"],
        "missing": report["record"]["missing"],
        "extra": report["record"]["extra"],
        "duplicates": report["record"]["duplicates"]["staging"],
        "changed": report["state"]["changed"],
        "changed_by_column": report["state"]["by_column"],
        "changes": {k: report["changes"][k] for k in ("missing", "extra", "changed")},
        "assertions": {a["name"]: bool(a["passed"]) for a in report["assertions"]},
        "report": report.get("report"),
    }


def write_report(report: dict[str, Any], path: Path) -> dict[str, str]:
    """Write the HTML to ``path`` (or only JSON when it ends in ``.json``) and JSON beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    json_path = path if path.suffix == ".json" else path.with_suffix(".json")
    written = {"json": str(json_path)}
    if path.suffix != ".json":
        written["html"] = str(path)
    report["report"] = written
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    if path.suffix != ".json":
        path.write_text(render_html(report), encoding="utf-8")
    return written
