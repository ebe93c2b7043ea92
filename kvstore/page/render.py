"""One self-contained HTML page from a snapshot: `render_page(snapshot, live=...)` and `render_fragment(snapshot)`.

Contract: pure functions of the snapshot (shape in kvstore/page/__init__.py); no I/O, no aiohttp. The page
embeds its CSS, its SVG charts and (live only) its refresh script; it loads nothing, and its Content-Security-
Policy says so: no connections except the live page's own URL, and no script but the refresh script (by hash),
so a string that slipped through escaping still could not run or load anything.
The fragment is the inner HTML of `<main id="kv-main">`, which the live page fetches and swaps in. Both go
through autoescaped templates (`fmt.template`); the refresh script is inserted as it is, so its CSP hash holds.
"""
from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from markupsafe import Markup

from kvstore.page.fmt import template
from kvstore.page.live import savings_section, server_section, slots_section
from kvstore.page.store_view import store_section
from kvstore.page.style import CSS, refresh_script

REFRESH_S = 5.0

_FRAGMENT = template('{% if stamp %}<p class="note" id="generated">As of {{ generated|utc }}.</p>{% endif %}'
                     '{% for part in parts %}{{ part }}{% endfor %}')
_PAGE = template(
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
    '<meta http-equiv="Content-Security-Policy" content="{{ csp }}">'
    '<meta name="viewport" content="width=device-width,initial-scale=1">'
    '<meta name="color-scheme" content="light dark">'
    '<title>kvstore{% if up %} · {{ up }}{% endif %}</title><style>{{ css }}</style></head><body>'
    '<header><h1>kvstore</h1><span class="sub">'
    '{% if up %}in front of {{ up }}{% else %}store snapshot (no server){% endif %}</span>'
    '{% if live %}<span id="kv-status" class="live">live</span>'
    '{% else %}<span id="kv-status">written {{ generated|utc }}</span>{% endif %}</header>'
    '<main id="kv-main">{{ fragment }}</main><footer>'
    '{% if live %}Refreshes every few seconds while this tab is visible.'
    '{% else %}Written by <span class="mono">kvstore stats --html</span>; open it again to see newer data.{% endif %}'
    '</footer>{% if script %}<script>{{ script }}</script>{% endif %}</body></html>\n')


def render_fragment(snapshot: dict[str, Any], *, stamp: bool = True) -> str:
    snap = dict(snapshot)
    snap.setdefault("generated", time.time())
    return _FRAGMENT.render(stamp=stamp, generated=snap["generated"], parts=[
        slots_section(snap), savings_section(snap), store_section(snap), server_section(snap)])


def _csp(script: str) -> str:
    if not script:
        return "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'")


def render_page(snapshot: dict[str, Any], *, live: bool) -> str:
    snap = dict(snapshot)
    snap.setdefault("generated", time.time())
    script = refresh_script(REFRESH_S) if live else ""
    # The CSS and the script are ours, not data: inserted unescaped (the CSP hashes the script's exact text).
    return _PAGE.render(csp=_csp(script), up=snap.get("upstream"), css=Markup(CSS), live=live,
                        generated=snap["generated"], fragment=Markup(render_fragment(snap, stamp=live)),
                        script=Markup(script))
