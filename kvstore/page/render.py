"""One self-contained HTML page from a snapshot: `render_page(snapshot, live=...)` and `render_fragment(snapshot)`.

Contract: pure functions of the snapshot (shape in kvstore/page/__init__.py); no I/O, no aiohttp. The page
embeds its CSS, its SVG charts and (live only) its refresh script; it loads nothing, and its Content-Security-
Policy says so: no connections except the live page's own URL, and no script but the refresh script (by hash),
so a string that slipped through escaping still could not run or load anything.
The fragment is the inner HTML of `<main id="kv-main">`, which the live page fetches and swaps in.
"""
from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

from kvstore.page import fmt
from kvstore.page.fmt import esc
from kvstore.page.live import savings_section, server_section, slots_section
from kvstore.page.store_view import store_section
from kvstore.page.style import CSS, refresh_script

REFRESH_S = 5.0


def render_fragment(snapshot: dict[str, Any], *, stamp: bool = True) -> str:
    snap = dict(snapshot)
    snap.setdefault("generated", time.time())
    when = f'<p class="note" id="generated">As of {esc(fmt.utc(snap["generated"]))}.</p>' if stamp else ""
    return when + slots_section(snap) + savings_section(snap) + store_section(snap) + server_section(snap)


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
    up = snap.get("upstream")
    sub = f"in front of {esc(up)}" if up else "store snapshot (no server)"
    status = ('<span id="kv-status" class="live">live</span>' if live
              else f'<span id="kv-status">written {esc(fmt.utc(snap["generated"]))}</span>')
    foot = ("Refreshes every few seconds while this tab is visible." if live
            else "Written by <span class=\"mono\">kvstore stats --html</span>; open it again to see newer data.")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(_csp(script))}">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>kvstore{' · ' + esc(up) if up else ''}</title><style>{CSS}</style></head><body>"
            f'<header><h1>kvstore</h1><span class="sub">{sub}</span>{status}</header>'
            f'<main id="kv-main">{render_fragment(snap, stamp=live)}</main><footer>{foot}</footer>'
            + (f"<script>{script}</script>" if script else "") + "</body></html>\n")
