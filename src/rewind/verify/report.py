"""The verification report: checks and verdict as JSON, and a self-contained HTML page.

Pure Python, no Spark. :func:`build_report` turns the comparison's results and the
assertions' into the JSON report (``checks`` and ``passed`` included); :func:`render_html`
draws it as one HTML file with inline CSS and inline SVG charts (counts per bucket, drift
per bucket and per category), the failed checks and the differing rows side by side. The
page loads nothing from anywhere: no scripts, fonts, images or styles from a network.
"""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rewind.verify.rules import Rules

COLOURS = {
    "staging": "#2b6cb0",
    "reference": "#dd6b20",
    "missing": "#c53030",
    "extra": "#805ad5",
    "changed": "#d69e2e",
    "changes": "#718096",
    "pass": "#2f855a",
    "fail": "#c53030",
}


# -- the JSON report --------------------------------------------------------------------------


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


# -- SVG charts -------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _nice(top: float) -> tuple[float, list[float]]:
    """A round axis maximum and its ticks."""
    if top <= 0:
        return 1.0, [0.0, 1.0]
    step = 10 ** math.floor(math.log10(top))
    for m in (1, 2, 5, 10):
        if top / (step * m) <= 5:
            step *= m
            break
    ticks = [step * i for i in range(math.ceil(top / step) + 1)]
    return ticks[-1], ticks


def _num(v: float) -> str:
    if abs(v) >= 1_000_000:
        return f"{v / 1_000_000:g}M"
    if abs(v) >= 1_000:
        return f"{v / 1_000:g}k"
    return f"{v:g}"


def svg_columns(
    labels: list[str],
    series: list[tuple[str, str, list[float]]],
    *,
    stacked: bool = False,
    title: str = "",
    width: int = 1100,
    height: int = 260,
) -> str:
    """Vertical bars per label (grouped or stacked), or lines when there are many labels."""
    left, right, top, bottom = 56, 12, 28, 46
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(labels), 1)
    if stacked:
        peak = max((sum(s[2][i] for s in series) for i in range(len(labels))), default=0)
    else:
        peak = max((max(s[2], default=0) for s in series), default=0)
    ymax, ticks = _nice(float(peak))
    y = lambda v: top + plot_h - (v / ymax) * plot_h  # noqa: E731
    parts = [
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
        f'<text x="{left}" y="16" class="ct">{_e(title)}</text>',
    ]
    for t in ticks:
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" class="ax" text-anchor="end">{_num(t)}</text>')
    slot = plot_w / n
    if n > 200 and not stacked:
        for name, colour, values in series:
            points = " ".join(f"{left + slot * (i + 0.5):.1f},{y(v):.1f}" for i, v in enumerate(values))
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5">'
                f"<title>{_e(name)}</title></polyline>"
            )
    else:
        gap = slot * 0.15 if slot > 4 else 0
        for i, label in enumerate(labels):
            x0 = left + slot * i + gap / 2
            if stacked:
                base = 0.0
                for name, colour, values in series:
                    v = values[i]
                    if v:
                        parts.append(
                            f'<rect x="{x0:.1f}" y="{y(base + v):.1f}" width="{max(slot - gap, 0.8):.1f}" '
                            f'height="{max(y(base) - y(base + v), 0.8):.1f}" fill="{colour}">'
                            f"<title>{_e(label)} {_e(name)}: {v:,.0f}</title></rect>"
                        )
                    base += v
            else:
                w = max((slot - gap) / len(series), 0.8)
                for j, (name, colour, values) in enumerate(series):
                    v = values[i]
                    parts.append(
                        f'<rect x="{x0 + j * w:.1f}" y="{y(v):.1f}" width="{w:.1f}" '
                        f'height="{max(y(0) - y(v), 0):.1f}" fill="{colour}">'
                        f"<title>{_e(label)} {_e(name)}: {v:,.0f}</title></rect>"
                    )
    every = max(1, math.ceil(n / 10))
    for i, label in enumerate(labels):
        if i % every == 0:
            parts.append(
                f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 16}" class="ax" '
                f'text-anchor="middle">{_e(label)}</text>'
            )
    lx = left
    for name, colour, _ in series:
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 4}" class="ax">{_e(name)}</text>')
        lx += 28 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def svg_rows(
    labels: list[str], series: list[tuple[str, str, list[float]]], *, title: str = "", width: int = 1100
) -> str:
    """Horizontal stacked bars, one row per label (drift by category)."""
    left, right, top, row_h = 200, 80, 28, 22
    height = top + row_h * max(len(labels), 1) + 30
    peak = max((sum(s[2][i] for s in series) for i in range(len(labels))), default=0)
    xmax, _ = _nice(float(peak))
    plot_w = width - left - right
    parts = [
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
        f'<text x="8" y="16" class="ct">{_e(title)}</text>',
    ]
    for i, label in enumerate(labels):
        yy = top + i * row_h
        parts.append(
            f'<text x="{left - 8}" y="{yy + 15}" class="ax" text-anchor="end">{_e(label[:32])}</text>'
        )
        base, total = 0.0, 0.0
        for name, colour, values in series:
            v = values[i]
            if v:
                parts.append(
                    f'<rect x="{left + base / xmax * plot_w:.1f}" y="{yy + 3}" '
                    f'width="{max(v / xmax * plot_w, 1):.1f}" height="{row_h - 6}" fill="{colour}">'
                    f"<title>{_e(label)} {_e(name)}: {v:,.0f}</title></rect>"
                )
            base += v
            total += v
        parts.append(
            f'<text x="{left + base / xmax * plot_w + 6:.1f}" y="{yy + 15}" class="ax">{total:,.0f}</text>'
        )
    lx = left
    for name, colour, _ in series:
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 4}" class="ax">{_e(name)}</text>')
        lx += 28 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)


# -- HTML -------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#1a202c;
margin:0;background:#f7fafc}
main{max-width:1140px;margin:0 auto;padding:20px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e2e8f0;padding-bottom:4px}
.badge{display:inline-block;padding:4px 14px;border-radius:4px;color:#fff;font-weight:700;font-size:16px}
.pass{background:#2f855a}.fail{background:#c53030}
.meta{color:#4a5568}.meta code{background:#edf2f7;padding:1px 4px;border-radius:3px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:10px 14px;min-width:130px}
.card b{display:block;font-size:20px}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#edf2f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{background:#fff5f5}td.ok{color:#2f855a;font-weight:700}td.no{color:#c53030;font-weight:700}
td.diff{background:#fefcbf;font-weight:700}
.chart{background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:6px;margin:8px 0;overflow-x:auto}
svg .grid{stroke:#e2e8f0;stroke-width:1}svg .ax{font-size:11px;fill:#4a5568}
svg .ct{font-size:13px;font-weight:700;fill:#1a202c}
.note{color:#744210;background:#fffff0;border:1px solid #faf089;padding:6px 10px;border-radius:4px;
margin:4px 0}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12px}
"""


def _table(headers: list[str], rows: list[list[Any]], *, classes: list[str] | None = None) -> str:
    out = ["<table><tr>", *(f"<th>{_e(h)}</th>" for h in headers), "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>")
        for cell in row:
            if isinstance(cell, tuple):  # (text, css class)
                out.append(f'<td class="{cell[1]}">{_e(cell[0])}</td>')
            elif isinstance(cell, int | float) and not isinstance(cell, bool):
                out.append(f'<td class="n">{cell:,}</td>')
            else:
                out.append(f"<td>{_e(cell)}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _value(v: Any) -> str:
    return "null" if v is None else json.dumps(v, default=str) if isinstance(v, dict | list) else str(v)


def _side_by_side(samples: list[dict[str, Any]], key: list[str], columns: list[str]) -> str:
    """Differing rows: one row per key and side, the differing cells highlighted."""
    if not samples:
        return "<p>none</p>"
    headers = [*key, "side", *columns]
    rows: list[list[Any]] = []
    classes: list[str] = []
    for sample in samples:
        differing = set(sample.get("columns") or [])
        for side in ("staging", "reference"):
            values = sample.get(side)
            if values is None:
                continue
            rows.append(
                [
                    *[_value(sample["key"].get(k)) for k in key],
                    side,
                    *[(_value(values.get(c)), "diff" if c in differing else "") for c in columns],
                ]
            )
            classes.append("")
    return _table(headers, rows, classes=classes)


def _keys(samples: list[dict[str, Any]], key: list[str], side: str, columns: list[str]) -> str:
    if not samples:
        return "<p>none</p>"
    rows = [
        [
            *[_value(s["key"].get(k)) for k in key],
            s.get("bucket") or "",
            *[_value((s.get(side) or {}).get(c)) for c in columns],
        ]
        for s in samples
    ]
    return _table([*key, "bucket", *columns], rows)


def render_html(report: dict[str, Any]) -> str:
    """The report as one self-contained HTML page."""
    passed = report["passed"]
    key = report["key"]
    columns = [c["column"] for c in report["columns"]]
    rows, record, state, changes = report["rows"], report["record"], report["state"], report["changes"]
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>rewind verify {_e(report.get('run_id') or '')}: {'passed' if passed else 'FAILED'}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>Verification of {_e(report.get('run_id') or report['staging'])} "
        f"<span class='badge {'pass' if passed else 'fail'}'>{'PASSED' if passed else 'FAILED'}</span></h1>",
        f"<p class='meta'>staging <code>{_e(report['staging'])}</code> vs reference "
        f"<code>{_e(report['reference'])}</code>, mode <b>{_e(report['mode'])}</b>, key "
        f"<code>{_e(', '.join(key))}</code>, generated {_e(report['generated_at'])}</p>",
    ]
    scope = report["scope"]
    scope_bits = [f"{k} <code>{_e(v)}</code>" for k, v in scope.items() if v is not None and k != "mode"]
    if scope_bits:
        out.append(f"<p class='meta'>scope: {', '.join(scope_bits)}</p>")
    for note in report.get("notes") or []:
        out.append(f"<div class='note'>{_e(note)}</div>")

    cards = [
        ("staging rows", rows.get("staging", 0)),
        ("reference rows", rows.get("reference", 0)),
        ("missing keys", record["missing"]),
        ("extra keys", record["extra"]),
        ("changed rows", state["changed"]),
        ("within tolerance", state["within_tolerance"]),
    ]
    if report["mode"] == "repair":
        cards += [
            ("changes: added", changes["extra"]),
            ("changes: removed", changes["missing"]),
            ("changes: updated", changes["changed"]),
        ]
    out.append("<div class='cards'>")
    out += [f"<div class='card'><b>{v:,}</b>{_e(k)}</div>" for k, v in cards]
    out.append("</div>")

    failed = [c for c in report["checks"] if not c["passed"]]
    out.append("<h2>Checks</h2>")
    if failed:
        out.append(f"<p><b>{len(failed)} failed</b>:</p>")
    out.append(
        _table(
            ["level", "check", "result", "detail"],
            [
                [c["level"], c["name"], ("pass", "ok") if c["passed"] else ("FAIL", "no"), c["detail"]]
                for c in report["checks"]
            ],
            classes=["" if c["passed"] else "bad" for c in report["checks"]],
        )
    )

    buckets = report["buckets"]
    brows = buckets["rows"]
    if brows:
        labels = [b["bucket"] for b in brows]
        unit = buckets.get("granularity") or "bucket"
        out.append(f"<h2>Rows per {_e(unit)} ({_e(buckets.get('time_column') or 'no time column')})</h2>")
        out.append(
            "<div class='chart'>"
            + svg_columns(
                labels,
                [
                    ("staging", COLOURS["staging"], [b["staging_rows"] for b in brows]),
                    ("reference", COLOURS["reference"], [b["reference_rows"] for b in brows]),
                ],
                title=f"rows per {unit}: staging vs reference",
            )
            + "</div>"
        )
        drift = [
            ("missing", COLOURS["missing"], [b["missing"] for b in brows]),
            ("extra", COLOURS["extra"], [b["extra"] for b in brows]),
            ("changed", COLOURS["changed"], [b["changed"] for b in brows]),
        ]
        if report["mode"] == "repair":
            drift.append(("changes in window", COLOURS["changes"], [b["changes"] for b in brows]))
        out.append(
            "<div class='chart'>"
            + svg_columns(labels, drift, stacked=True, title=f"differing rows per {unit}")
            + "</div>"
        )
    categories = report.get("categories")
    if categories and categories["rows"]:
        crow = categories["rows"]
        out.append(f"<h2>Drift by {_e(categories['column'])}</h2>")
        cseries = [
            ("missing", COLOURS["missing"], [c["missing"] for c in crow]),
            ("extra", COLOURS["extra"], [c["extra"] for c in crow]),
            ("changed", COLOURS["changed"], [c["changed"] for c in crow]),
        ]
        if report["mode"] == "repair":
            cseries.append(("changes in window", COLOURS["changes"], [c["changes"] for c in crow]))
        out.append(
            "<div class='chart'>"
            + svg_rows(
                [str(c["value"]) for c in crow], cseries, title=f"differing rows by {categories['column']}"
            )
            + "</div>"
        )
        out.append(
            _table(
                [
                    categories["column"],
                    "staging rows",
                    "reference rows",
                    "Δ rows",
                    "missing",
                    "extra",
                    "changed",
                ],
                [
                    [
                        _value(c["value"]),
                        c["staging_rows"],
                        c["reference_rows"],
                        c["staging_rows"] - c["reference_rows"],
                        c["missing"],
                        c["extra"],
                        c["changed"],
                    ]
                    for c in crow
                ],
            )
        )

    out.append("<h2>Differing rows</h2>")
    if state["by_column"]:
        out.append(
            "<p>by column: "
            + ", ".join(f"<code>{_e(c)}</code> {n:,}" for c, n in state["by_column"].items())
            + "</p>"
        )
    out.append(_side_by_side(state["changed_sample"], key, columns))
    out.append("<h2>Missing keys (in the reference, not in staging)</h2>")
    out.append(_keys(record["missing_sample"], key, "reference", columns))
    out.append("<h2>Extra keys (in staging, not in the reference)</h2>")
    out.append(_keys(record["extra_sample"], key, "staging", columns))
    if record["duplicate_sample"]:
        out.append("<h2>Duplicate keys</h2>")
        out.append(
            _table(
                [*key, "side", "rows"],
                [
                    [*[_value(d["key"].get(k)) for k in key], d["side"], d["rows"]]
                    for d in record["duplicate_sample"]
                ],
            )
        )
    if report["mode"] == "repair":
        out.append("<h2>Changes inside the repaired window</h2>")
        if changes.get("sampled"):
            s = changes["sampled"]
            out.append(
                f"<div class='note'>dense changes: {s['rows']:,} rows in {s['cells']:,} differing cells; "
                f"a share of {s['share']:.1%} of those cells was compared row by row</div>"
            )
        out.append(_side_by_side(changes["changed_sample"], key, columns))
        out.append("<p>added (first rows):</p>" + _keys(changes["extra_sample"], key, "staging", columns))
        out.append(
            "<p>removed (first rows):</p>" + _keys(changes["missing_sample"], key, "reference", columns)
        )

    if report["assertions"]:
        out.append("<h2>Assertions</h2>")
        out.append(
            _table(
                ["assertion", "result", "value", "expected", "tolerance", "detail", "sql"],
                [
                    [
                        a["name"],
                        ("pass", "ok") if a["passed"] else ("FAIL", "no"),
                        _value(a.get("value")),
                        _value(a.get("expected")),
                        a.get("tolerance", ""),
                        a.get("detail", ""),
                        a["sql"],
                    ]
                    for a in report["assertions"]
                ],
                classes=["" if a["passed"] else "bad" for a in report["assertions"]],
            )
        )
    if brows:
        out.append(f"<h2>Buckets ({len(brows):,})</h2>")
        out.append(
            _table(
                [
                    "bucket",
                    "staging rows",
                    "reference rows",
                    "staging checksum",
                    "reference checksum",
                    "equal",
                    "missing",
                    "extra",
                    "changed",
                ],
                [
                    [
                        b["bucket"],
                        b["staging_rows"],
                        b["reference_rows"],
                        b["staging_checksum"],
                        b["reference_checksum"],
                        ("yes", "ok") if b["equal"] else ("no", "no"),
                        b["missing"],
                        b["extra"],
                        b["changed"],
                    ]
                    for b in brows[:500]
                ],
                classes=["" if b["equal"] else "bad" for b in brows[:500]],
            )
        )
    out.append("<h2>How the rows were compared</h2>")
    out.append(
        _table(["column", "rule"], [[c["column"], c["rule"]] for c in report["columns"]])
        + _table(
            ["level", "key-hash bits", "differing cells", "rows in them", "decoded cells", "rows left"],
            [
                [
                    lv["level"],
                    lv["bits"],
                    lv["differing_cells"],
                    lv["rows"],
                    lv.get("decoded_cells", ""),
                    lv.get("undecoded_rows", ""),
                ]
                for lv in report["bisection"]
            ],
        )
        + _table(["step", "seconds"], [[k, v] for k, v in report["seconds"].items()])
    )
    out.append("</main></body></html>\n")
    return "".join(out)
