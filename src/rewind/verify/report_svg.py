"""SVG charts of the verify report, drawn without a plotting library (the page has no scripts)."""

from __future__ import annotations

import html
import math
from typing import Any

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


def esc(value: Any) -> str:
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
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="16" class="ct">{esc(title)}</text>',
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
                f"<title>{esc(name)}</title></polyline>"
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
                            f"<title>{esc(label)} {esc(name)}: {v:,.0f}</title></rect>"
                        )
                    base += v
            else:
                w = max((slot - gap) / len(series), 0.8)
                for j, (name, colour, values) in enumerate(series):
                    v = values[i]
                    parts.append(
                        f'<rect x="{x0 + j * w:.1f}" y="{y(v):.1f}" width="{w:.1f}" '
                        f'height="{max(y(0) - y(v), 0):.1f}" fill="{colour}">'
                        f"<title>{esc(label)} {esc(name)}: {v:,.0f}</title></rect>"
                    )
    every = max(1, math.ceil(n / 10))
    for i, label in enumerate(labels):
        if i % every == 0:
            parts.append(
                f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 16}" class="ax" '
                f'text-anchor="middle">{esc(label)}</text>'
            )
    lx = left
    for name, colour, _ in series:
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 4}" class="ax">{esc(name)}</text>')
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
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
        f'<text x="8" y="16" class="ct">{esc(title)}</text>',
    ]
    for i, label in enumerate(labels):
        yy = top + i * row_h
        parts.append(
            f'<text x="{left - 8}" y="{yy + 15}" class="ax" text-anchor="end">{esc(label[:32])}</text>'
        )
        base, total = 0.0, 0.0
        for name, colour, values in series:
            v = values[i]
            if v:
                parts.append(
                    f'<rect x="{left + base / xmax * plot_w:.1f}" y="{yy + 3}" '
                    f'width="{max(v / xmax * plot_w, 1):.1f}" height="{row_h - 6}" fill="{colour}">'
                    f"<title>{esc(label)} {esc(name)}: {v:,.0f}</title></rect>"
                )
            base += v
            total += v
        parts.append(
            f'<text x="{left + base / xmax * plot_w + 6:.1f}" y="{yy + 15}" class="ax">{total:,.0f}</text>'
        )
    lx = left
    for name, colour, _ in series:
        parts.append(f'<rect x="{lx}" y="{height - 14}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 4}" class="ax">{esc(name)}</text>')
        lx += 28 + 7 * len(name)
    parts.append("</svg>")
    return "".join(parts)
