"""The verify report as one self-contained HTML page."""

from __future__ import annotations

import json
import math
from typing import Any

from rewind.verify.report_svg import COLOURS, esc, svg_columns, svg_rows

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
    out = ["<table><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>")
        for cell in row:
            if isinstance(cell, tuple):  # (text, css class)
                out.append(f'<td class="{cell[1]}">{esc(cell[0])}</td>')
            elif isinstance(cell, float):
                out.append(f'<td class="n">{_number(cell)}</td>')
            elif isinstance(cell, int) and not isinstance(cell, bool):
                out.append(f'<td class="n">{cell:,}</td>')
            else:
                out.append(f"<td>{esc(cell)}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _number(v: float, tolerance: float | None = None) -> str:
    """A float as people read it: to the decimals of the column's absolute tolerance, else to
    6 significant digits (floats print as ``15.309999999999999`` otherwise)."""
    if not math.isfinite(v):
        return str(v)
    if tolerance:
        decimals = max(0, math.ceil(-math.log10(tolerance)))
        return f"{v:,.{decimals}f}"
    return f"{float(f'{v:.6g}'):,}" if abs(v) < 1e15 else f"{v:.6g}"


def _value(v: Any, tolerance: float | None = None) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        return _number(v, tolerance)
    return json.dumps(v, default=str) if isinstance(v, dict | list) else str(v)


def _side_by_side(
    samples: list[dict[str, Any]], key: list[str], columns: list[str], tolerances: dict[str, float]
) -> str:
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
                    *[(_value(values.get(c), tolerances.get(c)), "diff" if c in differing else "")
                      for c in columns],
                ]
            )
            classes.append("")
    return _table(headers, rows, classes=classes)


def _keys(
    samples: list[dict[str, Any]], key: list[str], side: str, columns: list[str], tolerances: dict[str, float]
) -> str:
    if not samples:
        return "<p>none</p>"
    rows = [
        [
            *[_value(s["key"].get(k)) for k in key],
            s.get("bucket") or "",
            *[_value((s.get(side) or {}).get(c), tolerances.get(c)) for c in columns],
        ]
        for s in samples
    ]
    return _table([*key, "bucket", *columns], rows)


def render_html(report: dict[str, Any]) -> str:
    """The report as one self-contained HTML page."""
    passed = report["passed"]
    key = report["key"]
    columns = [c["column"] for c in report["columns"]]
    tolerances = {c["column"]: float(c["abs"]) for c in report["columns"] if c.get("abs")}
    rows, record, state, changes = report["rows"], report["record"], report["state"], report["changes"]
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>rewind verify {esc(report.get('run_id') or '')}: {'passed' if passed else 'FAILED'}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>Verification of {esc(report.get('run_id') or report['staging'])} "
        f"<span class='badge {'pass' if passed else 'fail'}'>{'PASSED' if passed else 'FAILED'}</span></h1>",
        f"<p class='meta'>staging <code>{esc(report['staging'])}</code> vs reference "
        f"<code>{esc(report['reference'])}</code>, mode <b>{esc(report['mode'])}</b>, key "
        f"<code>{esc(', '.join(key))}</code>, generated {esc(report['generated_at'])}</p>",
    ]
    scope = report["scope"]
    scope_bits = [f"{k} <code>{esc(v)}</code>" for k, v in scope.items() if v is not None and k != "mode"]
    if scope_bits:
        out.append(f"<p class='meta'>scope: {', '.join(scope_bits)}</p>")
    for note in report.get("notes") or []:
        out.append(f"<div class='note'>{esc(note)}</div>")

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
    out += [f"<div class='card'><b>{v:,}</b>{esc(k)}</div>" for k, v in cards]
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
        out.append(f"<h2>Rows per {esc(unit)} ({esc(buckets.get('time_column') or 'no time column')})</h2>")
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
        out.append(f"<h2>Drift by {esc(categories['column'])}</h2>")
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
            + ", ".join(f"<code>{esc(c)}</code> {n:,}" for c, n in state["by_column"].items())
            + "</p>"
        )
    out.append(_side_by_side(state["changed_sample"], key, columns, tolerances))
    out.append("<h2>Missing keys (in the reference, not in staging)</h2>")
    out.append(_keys(record["missing_sample"], key, "reference", columns, tolerances))
    out.append("<h2>Extra keys (in staging, not in the reference)</h2>")
    out.append(_keys(record["extra_sample"], key, "staging", columns, tolerances))
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
                f"<div class='note'>dense changes: {s['rows']:,} rows of {s['cells']:,} differing keys; "
                f"a share of {s['share']:.1%} of those keys was compared row by row</div>"
            )
        out.append(_side_by_side(changes["changed_sample"], key, columns, tolerances))
        added = _keys(changes["extra_sample"], key, "staging", columns, tolerances)
        removed = _keys(changes["missing_sample"], key, "reference", columns, tolerances)
        out.append("<p>added (first rows):</p>" + added)
        out.append("<p>removed (first rows):</p>" + removed)

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
            ["level", "hash bits", "differing cells", "rows in them", "cells naming their key", "rows read"],
            [
                [
                    lv["level"],
                    lv["bits"],
                    lv["differing_cells"],
                    lv["rows"],
                    lv.get("pure_cells", ""),
                    lv.get("rows_read", ""),
                ]
                for lv in report["bisection"]
            ],
        )
        + _table(["step", "seconds"], [[k, v] for k, v in report["seconds"].items()])
    )
    out.append("</main></body></html>\n")
    return "".join(out)
