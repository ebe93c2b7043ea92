"""The page's template environment and its small formatters.

Contract: `template(source)` compiles a Jinja2 template with autoescape on, the one place where the page turns
data into HTML: every value a template prints is escaped unless it is `Markup` (HTML made by another template
or by `Markup.format`, which escapes its arguments). The formatters (`num`, `size`, ...) return plain text and are
also the templates' filters; `ago` and `qualified` return `Markup`.
"""
from __future__ import annotations

import datetime
from typing import Optional

from jinja2 import Environment, Template
from markupsafe import Markup


def num(n: Optional[float]) -> str:
    return "–" if n is None else f"{int(round(n)):,}"


def size(n: Optional[float]) -> str:
    if n is None:
        return "–"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def ratio(x: Optional[float]) -> str:
    try:
        return "–" if x is None else f"{float(x):.2f}×"
    except (TypeError, ValueError):
        return "–"


def pct(part: float, whole: float) -> str:
    return "–" if not whole else f"{100.0 * part / whole:.0f}%"


def ms(s: Optional[float]) -> str:
    if s is None:
        return "–"
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def utc(t: Optional[float]) -> str:
    if not t:
        return "–"
    return datetime.datetime.fromtimestamp(float(t), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(t: Optional[float], now: float) -> Markup:
    """'3 min ago', with the exact UTC time as a tooltip."""
    if not t:
        return Markup("–")
    d = max(0.0, now - float(t))
    if d < 60:
        s = f"{d:.0f} s ago"
    elif d < 3600:
        s = f"{d / 60:.0f} min ago"
    elif d < 86400:
        s = f"{d / 3600:.1f} h ago"
    else:
        s = f"{d / 86400:.0f} d ago"
    return Markup('<span title="{}">{}</span>').format(utc(t), s)


def duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}" if s % 60 else f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}"


def qualified(namespace: str, name: str) -> Markup:
    """A name with its namespace (the empty namespace shown as nothing)."""
    ns = Markup('<span class="ns">{}</span>').format(namespace) if namespace else Markup()
    return ns + Markup('<span class="name">{}</span>').format(name)


_ENV = Environment(autoescape=True, keep_trailing_newline=True)
_ENV.filters.update(num=num, size=size, ratio=ratio, pct=pct, ms=ms, utc=utc, duration=duration)
_ENV.globals.update(ago=ago, qualified=qualified)


def template(source: str) -> Template:
    """A template of the page (autoescaped; the formatters above as filters, `ago` and `qualified` as globals)."""
    return _ENV.from_string(source)
