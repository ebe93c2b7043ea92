"""Inline SVG charts drawn in Python: no JavaScript, no library, readable without a network.

Contract: every function returns one `<svg>` element (in a `<figure>` with its legend for `stacked_columns`) as
`Markup`, rendered through an autoescaped template (`fmt.template`). Colours come from CSS classes (see style.py),
so the charts follow the page's light or dark scheme.
  stacked_columns(columns, layers, x_labels, y_fmt, ...)  a time series of stacked columns
  hbars(rows, fmt)                                         labelled horizontal bars on one scale
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from markupsafe import Markup

from kvstore.page.fmt import template

_COLUMNS = template(
    '<figure class="fig"><svg class="chart" viewBox="0 0 {{ width }} {{ height }}" role="img" aria-label="{{ title }}" '
    'preserveAspectRatio="xMidYMid meet"><title>{{ title }}</title>'
    '{% for g in grid %}<line class="grid" x1="{{ left }}" x2="{{ left + pw }}" y1="{{ g.y }}" y2="{{ g.y }}"/>'
    '<text class="tick" x="{{ left - 6 }}" y="{{ g.ty }}" text-anchor="end">{{ g.label }}</text>{% endfor %}'
    '{% for c in cols %}<g class="col">{% if c.tip is not none %}<title>{{ c.tip }}</title>{% endif %}'
    '{% for r in c.rects %}<rect class="{{ r.cls }}" x="{{ r.x }}" y="{{ r.y }}" width="{{ r.w }}" '
    'height="{{ r.h }}"/>{% endfor %}</g>{% endfor %}'
    '{% for lab in labels %}<text class="tick" x="{{ lab.x }}" y="{{ height - 8 }}" text-anchor="middle">'
    '{{ lab.text }}</text>{% endfor %}'
    '<line class="axis" x1="{{ left }}" x2="{{ left + pw }}" y1="{{ top + ph }}" y2="{{ top + ph }}"/></svg>'
    '<figcaption class="legend">{% for cls, label in layers %}<span class="key"><i class="sw {{ cls }}"></i>'
    '{{ label }}</span>{% endfor %}</figcaption></figure>')

_BARS = template(
    '<svg class="chart bars" viewBox="0 0 {{ width }} {{ height }}" role="img" aria-label="{{ title }}">'
    '<title>{{ title }}</title>{% for b in bars %}'
    '<text class="lab" x="{{ label_w - 10 }}" y="{{ b.ty }}" text-anchor="end">{{ b.label }}</text>'
    '<rect class="track" x="{{ label_w }}" y="{{ b.y }}" width="{{ pw }}" height="{{ row_h }}" rx="3"/>'
    '<rect class="{{ b.cls }}" x="{{ label_w }}" y="{{ b.y }}" width="{{ b.w }}" height="{{ row_h }}" rx="3"/>'
    '<text class="val" x="{{ label_w + pw + 10 }}" y="{{ b.ty }}">{{ b.text }}</text>{% endfor %}</svg>')


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
                    title: str, width: int = 760, height: int = 230) -> Markup:
    """columns[i][j]: the value of layer j in column i, stacked bottom-up; layers: (css class, legend label);
    x_labels: one per column ('' to leave a column unlabelled); tips: one tooltip per column."""
    left, right, top, bottom = 58, 10, 12, 26
    pw, ph = width - left - right, height - top - bottom
    peak = max((sum(c) for c in columns), default=0)
    step = max(1.0, nice_step(peak))  # counts: no gridline between two whole numbers
    ymax = step * max(1, math.ceil(peak / step)) if peak > 0 else step * 4
    grid = []
    v = 0.0
    while v <= ymax + 1e-9:
        y = top + ph - v / ymax * ph
        grid.append({"y": f"{y:.1f}", "ty": f"{y + 4:.1f}", "label": y_fmt(v)})
        v += step
    n = max(1, len(columns))
    slot = pw / n
    bw = max(1.0, slot * 0.78)
    cols = []
    for i, col in enumerate(columns):
        x = left + i * slot + (slot - bw) / 2
        y = top + ph
        rects = []
        for (cls, _label), val in zip(layers, col):
            if val <= 0:
                continue
            h = val / ymax * ph
            y -= h
            rects.append({"cls": cls, "x": f"{x:.1f}", "y": f"{y:.1f}", "w": f"{bw:.1f}", "h": f"{h:.1f}"})
        if rects:
            cols.append({"tip": tips[i] if i < len(tips) else None, "rects": rects})
    labels = [{"x": f"{left + (i + 0.5) * slot:.1f}", "text": lab} for i, lab in enumerate(x_labels) if lab]
    return Markup(_COLUMNS.render(width=width, height=height, title=title, left=left, top=top, pw=pw, ph=ph,
                                  grid=grid, cols=cols, labels=labels, layers=layers))


def hbars(rows: Sequence[tuple[str, float, str, str]], *, title: str, width: int = 760) -> Markup:
    """rows: (label, value, css class, value text), drawn on one scale from 0 to the largest value."""
    row_h, gap, label_w, value_w = 22, 8, 150, 120
    height = len(rows) * (row_h + gap) + gap
    peak = max((r[1] for r in rows), default=0) or 1
    pw = width - label_w - value_w
    bars = []
    for i, (label, value, cls, text) in enumerate(rows):
        y = gap + i * (row_h + gap)
        w = max(1.0, value / peak * pw) if value > 0 else 0
        bars.append({"label": label, "cls": cls, "text": text, "y": y, "ty": f"{y + row_h * 0.7:.1f}",
                     "w": f"{w:.1f}"})
    return Markup(_BARS.render(width=width, height=height, title=title, bars=bars, label_w=label_w, pw=pw,
                               row_h=row_h))
