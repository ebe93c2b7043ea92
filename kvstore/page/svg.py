"""Inline SVG charts drawn in Python: no JavaScript, no library, readable without a network.

Contract: every function returns one `<svg>` element as a string; all text passes through `esc`. Colours come
from CSS classes (see style.py), so the charts follow the page's light or dark scheme.
  stacked_columns(columns, layers, x_labels, y_fmt, ...)  a time series of stacked columns
  hbars(rows, fmt)                                         labelled horizontal bars on one scale
"""
from __future__ import annotations

import math
from html import escape
from typing import Callable, Sequence


def esc(s: object) -> str:
    return escape(str(s), quote=True)


def nice_step(top: float, ticks: int = 4) -> float:
    """A 1/2/5 x 10^k step so that about `ticks` gridlines cover [0, top]."""
    if top <= 0:
        return 1.0
    raw = top / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def stacked_columns(columns: Sequence[Sequence[float]], layers: Sequence[tuple[str, str]],
                    x_labels: Sequence[str], y_fmt: Callable[[float], str], *, tips: Sequence[str] = (),
                    title: str, width: int = 760, height: int = 230) -> str:
    """columns[i][j]: the value of layer j in column i, stacked bottom-up; layers: (css class, legend label);
    x_labels: one per column ('' to leave a column unlabelled); tips: one tooltip per column."""
    left, right, top, bottom = 58, 10, 12, 26
    pw, ph = width - left - right, height - top - bottom
    peak = max((sum(c) for c in columns), default=0)
    step = max(1.0, nice_step(peak))  # counts: no gridline between two whole numbers
    ymax = step * max(1, math.ceil(peak / step)) if peak > 0 else step * 4
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}" '
           f'preserveAspectRatio="xMidYMid meet"><title>{esc(title)}</title>']
    v = 0.0
    while v <= ymax + 1e-9:
        y = top + ph - v / ymax * ph
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(y_fmt(v))}</text>')
        v += step
    n = max(1, len(columns))
    slot = pw / n
    bw = max(1.0, slot * 0.78)
    for i, col in enumerate(columns):
        x = left + i * slot + (slot - bw) / 2
        y = top + ph
        parts = []
        for (cls, _label), val in zip(layers, col):
            if val <= 0:
                continue
            h = val / ymax * ph
            y -= h
            parts.append(f'<rect class="{esc(cls)}" x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}"/>')
        if parts:
            tip = f"<title>{esc(tips[i])}</title>" if i < len(tips) else ""
            out.append(f'<g class="col">{tip}{"".join(parts)}</g>')
    for i, lab in enumerate(x_labels):
        if lab:
            x = left + (i + 0.5) * slot
            out.append(f'<text class="tick" x="{x:.1f}" y="{height - 8}" text-anchor="middle">{esc(lab)}</text>')
    out.append(f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}"/></svg>')
    legend = "".join(f'<span class="key"><i class="sw {esc(c)}"></i>{esc(lab)}</span>' for c, lab in layers)
    return f'<figure class="fig">{"".join(out)}<figcaption class="legend">{legend}</figcaption></figure>'


def hbars(rows: Sequence[tuple[str, float, str, str]], *, title: str, width: int = 760) -> str:
    """rows: (label, value, css class, value text), drawn on one scale from 0 to the largest value."""
    row_h, gap, label_w, value_w = 22, 8, 150, 120
    height = len(rows) * (row_h + gap) + gap
    peak = max((r[1] for r in rows), default=0) or 1
    pw = width - label_w - value_w
    out = [f'<svg class="chart bars" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">'
           f'<title>{esc(title)}</title>']
    for i, (label, value, cls, text) in enumerate(rows):
        y = gap + i * (row_h + gap)
        w = max(1.0, value / peak * pw) if value > 0 else 0
        out.append(f'<text class="lab" x="{label_w - 10}" y="{y + row_h * 0.7:.1f}" text-anchor="end">{esc(label)}</text>'
                   f'<rect class="track" x="{label_w}" y="{y}" width="{pw}" height="{row_h}" rx="3"/>'
                   f'<rect class="{esc(cls)}" x="{label_w}" y="{y}" width="{w:.1f}" height="{row_h}" rx="3"/>'
                   f'<text class="val" x="{label_w + pw + 10}" y="{y + row_h * 0.7:.1f}">{esc(text)}</text>')
    out.append("</svg>")
    return "".join(out)
