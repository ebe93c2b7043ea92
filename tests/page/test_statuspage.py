"""The status page (kvstore/page): rendered from a real store and read back by a real browser.

The store is built from real slot files (an article and two questions saved with `parent=`), written by the real
`kvstore stats --html`, and opened in headless Chromium (Debian's `chromium` + `chromium-driver`, installed by
./dev) through Selenium. The live parts (slots, savings, refresh) are rendered from a synthetic snapshot: they
need a running hooks server, which the hooks wiring tests cover.
"""
from __future__ import annotations

import hashlib
import base64
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from browser_support import browser, console_errors, screenshot, settled  # noqa: F401  (fixture)
from kvstore.page import History, operator_view, render_fragment, render_page, store_snapshot

EVIL = '<b>x<img src=x onerror=alert(1)>'  # no '/': names may not hold one
EVIL_NS = "t<i>en"


def build_store(state_files, root: Path):
    import kvstore

    st = kvstore.open_store(root)
    st.ingest("article", str(state_files["smollm2_parent"]), namespace="docs")
    st.ingest("q1", str(state_files["smollm2_child"]), namespace="docs", parent="article")
    st.ingest("q2", str(state_files["smollm2_parent"]), namespace="docs", parent="article")
    st.ingest(EVIL, str(state_files["smollm2_fa_on"]), namespace=EVIL_NS)
    st.ingest("solo", str(state_files["gemma3_fa_on"]))
    return st


def test_html_page_of_a_real_store_in_chromium(state_files, tmp_path, browser):
    from selenium.webdriver.common.by import By

    st = build_store(state_files, tmp_path / "store")
    page = tmp_path / "status.html"
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", str(tmp_path / "store"), "stats", "--html",
                        str(page)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    browser.get(page.as_uri())

    # the names, each under its namespace
    docs = browser.find_element(By.CSS_SELECTOR, 'div.namespace[data-namespace="docs"]')
    assert "docs" in docs.find_element(By.TAG_NAME, "h3").text
    assert [e.text for e in docs.find_elements(By.CSS_SELECTOR, "table.names td.name")] == ["article", "q1", "q2"]
    default = browser.find_element(By.CSS_SELECTOR, 'div.namespace[data-namespace=""]')
    assert [e.text for e in default.find_elements(By.CSS_SELECTOR, "table.names td.name")] == ["solo"]

    # the lineage: one root, the article, with exactly its two questions below it
    roots = docs.find_elements(By.CSS_SELECTOR, "ul.tree > li")
    assert len(roots) == 1
    assert roots[0].find_element(By.CSS_SELECTOR, ":scope > .node").get_attribute("data-name") == "article"
    kids = roots[0].find_elements(By.CSS_SELECTOR, ":scope > ul > li > .node")
    assert sorted(k.get_attribute("data-name") for k in kids) == ["q1", "q2"]

    # sizes and ratios, as the store reports them
    s = st.stats()
    assert browser.find_element(By.ID, "dedup-ratio").text == f"{s['dedup_ratio']:.2f}×"
    assert browser.find_element(By.ID, "compression-ratio").text == f"{s['compression_ratio']:.2f}×"
    assert browser.find_element(By.ID, "total-ratio").text == f"{s['total_ratio']:.2f}×"
    art = st.get("article", namespace="docs")
    row = docs.find_element(By.CSS_SELECTOR, 'tr[data-name="article"]')
    assert f"{art['n_tokens']:,}" in row.text and "MiB" in row.text
    bars = browser.find_element(By.CSS_SELECTOR, "#store svg.bars")
    assert "logical" in bars.text and "stored (compressed)" in bars.text

    # a name and a namespace with HTML in them are shown as text, nothing injected
    evil = browser.find_element(By.CSS_SELECTOR, "div.namespace:last-of-type")
    assert evil.get_attribute("data-namespace") == EVIL_NS
    assert evil.find_element(By.CSS_SELECTOR, "h3 .name").text == EVIL_NS
    assert evil.find_element(By.CSS_SELECTOR, "td.name").text == EVIL
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main i:not(.sw), main b b") == []

    assert console_errors(browser) == []
    screenshot(browser, tmp_path / "status.png")


# ---------------------------------------------------------------------------------------------------------------
# the live parts, from a synthetic snapshot

def live_snapshot(store_part=None) -> dict:
    t = [1000.0]
    h = History(bucket_s=5, max_buckets=8, clock=lambda: t[0])
    for i, kind in enumerate(["miss", "restored", "slot", "prefix", "parent", "slot"] * 4):
        t[0] += 3.0
        h.request(kind, 400 if kind == "miss" else 10, 0 if kind in ("miss", "slot") else 390, 400)
        h.latency("restore" if kind != "slot" else "save", 0.01 * (i + 1))
    return {
        "generated": 2000.0, "upstream": "http://127.0.0.1:9/", "n_slots": 2, "queue_length": 0,
        "fingerprint": {"model": "m<script>x</script>", "layout": "f16"},
        "slots": [{"id": 0, "name": "<script>alert(1)</script>", "namespace": "a&b", "n_tokens": 77, "dirty": True,
                   "busy": True, "last_used": 5.0, "parent": "art\"icle"},
                  {"id": 1, "name": None, "namespace": "", "n_tokens": 0, "dirty": False, "busy": False,
                   "last_used": 0.0, "parent": None}],
        "slot_clock": 10.0, "history": h.snapshot(), "store": store_part,
    }


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_render_page_live_parts():
    html = render_page(live_snapshot(), live=True)
    p = Tags()
    p.feed(html)
    tags = [t for t, _ in p.tags]
    # slots table: one row per slot, the busy and unsaved badges
    rows = [a for t, a in p.tags if t == "tr" and "data-slot" in a]
    assert [a["data-slot"] for a in rows] == ["0", "1"]
    assert "unsaved changes" in html and ">busy<" in html and ">empty<" in html
    # two time-series charts with columns, one per kind legend entry
    assert tags.count("svg") == 2 and tags.count("rect") > 10
    for k in ("slot", "restored", "parent", "prefix", "miss"):
        assert f'class="sw k-{k}"' in html
    # escaping: user strings appear only as text
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "m<script>x" not in html and "a&amp;b" in html and "art&#34;icle" in html  # markupsafe: &#34; for "
    assert tags.count("script") == 1  # the refresh script, and nothing else
    # the one script is the one the Content-Security-Policy allows, and it fetches the fragment
    script = html.split("<script>")[1].split("</script>")[0]
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = next(a["content"] for t, a in p.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert f"script-src 'sha256-{digest}'" in csp and "connect-src 'self'" in csp and "fragment" in script
    # latency percentiles from the samples fed
    assert re.search(r"<td>restore</td><td class=\"n\">16</td>", html)


def test_static_page_has_no_script_and_no_live_sections():
    html = render_page({"store": None, "generated": 1.0}, live=False)
    assert "<script" not in html and "script-src" not in html
    assert 'id="slots"' not in html and 'id="savings"' not in html
    frag = render_fragment(live_snapshot())
    assert frag.startswith('<p class="note" id="generated">') and "<html" not in frag and "<script" not in frag


def test_history_buckets_cover_since_start_in_bounded_memory():
    t = [0.0]
    h = History(bucket_s=1, max_buckets=4, clock=lambda: t[0])
    for i in range(10):
        t[0] = float(i)
        h.request("miss", 10, 0, 10)
    snap = h.snapshot()
    assert len(snap["buckets"]) <= 4 and snap["bucket_s"] == 4.0  # 1 s -> 2 s -> 4 s columns
    assert sum(b["requests"]["miss"] for b in snap["buckets"]) == 10 == snap["totals"]["miss"]["requests"]
    assert sum(b["evaluated"] for b in snap["buckets"]) == 100
    h.request("restored", 5, 95)  # prompt unknown: at least evaluated + restored
    assert h.snapshot()["totals"]["restored"]["prompt"] == 100
    for x in (0.3, 0.1, 0.2, 0.4):
        h.latency("restore", x)
    lat = h.snapshot()["latency"]["restore"]
    assert (lat["p50"], lat["p90"], lat["max"], lat["count"]) == (0.2, 0.4, 0.4, 4)
    assert h.snapshot()["latency"]["save"]["p50"] is None
    with pytest.raises(ValueError):
        h.request("bogus", 1)


def test_history_evictions_per_bucket_by_reason_merge_when_the_ring_is_full():
    t = [0.0]
    h = History(bucket_s=1, max_buckets=4, clock=lambda: t[0])
    h.evicted("cap", 2)
    t[0] = 1.5
    h.evicted("ttl")
    t[0] = 3.2
    h.evicted("quota", 3)
    h.evicted("cap")
    snap = h.snapshot()
    none = {"cap": 0, "ttl": 0, "quota": 0}
    assert snap["bucket_s"] == 1.0
    assert [b["evicted"] for b in snap["buckets"]] == [
        {**none, "cap": 2}, {**none, "ttl": 1}, none, {**none, "quota": 3, "cap": 1}]
    t[0] = 4.0  # a fifth bucket: the ring of four merges pairwise, each column now 2 s
    h.evicted("cap", 5)
    snap = h.snapshot()
    assert snap["bucket_s"] == 2.0 and len(snap["buckets"]) == 3
    assert [b["evicted"] for b in snap["buckets"]] == [
        {"cap": 2, "ttl": 1, "quota": 0}, {"cap": 1, "ttl": 0, "quota": 3}, {**none, "cap": 5}]
    assert snap["evicted"] == {"cap": 8, "ttl": 1, "quota": 3}
    assert all(sum(b["requests"].values()) == 0 for b in snap["buckets"])  # evictions are not requests
    with pytest.raises(ValueError):
        h.evicted("lru")

    # rendered in the store section only while a bound is in play, one column per bucket, totals by reason
    store_part = {"path": "/s", "stats": {}, "namespaces": []}
    bound = {"enabled": True, "max_bytes": 1 << 20, "used_bytes": 1000, "evicted": {"cap": 8, "ttl": 1, "quota": 3}}
    html = render_fragment({"history": snap, "store": store_part, "bound": bound, "generated": 10.0})
    fig = html.split('<div id="evictions-over-time">')[1].split("</figure>")[0]
    assert re.findall(r'<span data-reason="(\w+)">\w+ <b>([0-9,]+)</b>', fig) == [
        ("cap", "8"), ("ttl", "1"), ("quota", "3")]
    assert len(re.findall(r'<rect class="e-cap"', fig)) == 3 and len(re.findall(r'<rect class="e-quota"', fig)) == 1
    assert "+2s: 1 cap, 3 quota" in fig
    off = render_fragment({"history": snap, "store": store_part, "bound": {**bound, "enabled": False}})
    assert "evictions-over-time" not in off and "evictions-over-time" not in render_fragment(
        {"history": snap, "store": store_part})


def test_another_tenants_slot_renders_as_in_use_only():
    slots = live_snapshot()["slots"]
    masked = [{"id": s["id"], "busy": s["busy"], "other_namespace": True} for s in slots]  # Slot.view's shape
    html = render_fragment({**live_snapshot(), "slots": masked})
    assert "alert" not in html and "another namespace" in html


def test_operator_view_is_loopback_without_key_or_namespace():
    assert operator_view("127.0.0.1", {}) and operator_view("::1", {})
    assert not operator_view("127.0.0.1", {"Authorization": "Bearer k"})
    assert not operator_view("127.0.0.1", {"X-KV-Namespace": ""})
    assert not operator_view("10.1.2.3", {}) and not operator_view(None, {}) and not operator_view("sock", {})


def test_restored_beyond_the_prompt_does_not_stack_above_it():
    t = [0.0]
    h = History(clock=lambda: t[0])
    h.request("restored", 100, 900, 400)  # a long state restored, the prompt shares only 300 of it
    html = render_fragment({"history": h.snapshot(), "generated": 1.0})
    heights = [float(x) for x in re.findall(r'<rect class="c-(?:eval|rest|reuse)"[^>]* height="([0-9.]+)"', html)]
    ymax_label = re.findall(r'<text class="tick"[^>]*>([0-9,]+)</text>', html)
    assert len(heights) == 2 and "400" in ymax_label and "1,000" not in ymax_label


def test_store_snapshot_lineage_names(state_files, tmp_path):
    st = build_store(state_files, tmp_path / "store")
    snap = store_snapshot(st)
    docs = next(n for n in snap["namespaces"] if n["namespace"] == "docs")
    by = {n["name"]: n for n in docs["names"]}
    assert by["article"]["children"] == ["q1", "q2"] and by["q1"]["parent"] == "article"
    assert by["q1"]["parent_id"] == by["article"]["manifest_id"]
    # the article saved again: its old manifest has no name, the questions hang under "an earlier state"
    st.ingest("article", str(state_files["smollm2_child"]), namespace="docs")
    docs = next(n for n in store_snapshot(st, "docs")["namespaces"])
    by = {n["name"]: n for n in docs["names"]}
    assert by["q1"]["parent"] is None and by["q1"]["parent_id"] and by["article"]["children"] == []
    html = render_page({"store": store_snapshot(st, "docs")}, live=False)
    assert "an earlier state" in html and "solo" not in html  # a tenant's view lists only its namespace
    out = tmp_path / "docs.html"
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", str(tmp_path / "store"), "stats", "--html",
                        str(out), "--namespace", "docs"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert 'data-name="q1"' in page and 'data-name="solo"' not in page and "namespace docs only" in page


# ---------------------------------------------------------------------------------------------------------------
# the live page's refresh, in the browser, against a tiny page server (a stand-in for the hooks' route)

def test_live_page_refreshes_in_chromium(tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    n = {"fragments": 0}

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            snap = {**live_snapshot(), "generated": 2000.0 + n["fragments"]}
            if "fragment=1" in self.path:
                n["fragments"] += 1
                body = render_fragment(snap)
            else:
                body = render_page(snap, live=True)
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        browser.get(f"http://127.0.0.1:{srv.server_address[1]}/kvstore/")
        from selenium.common.exceptions import StaleElementReferenceException

        first = settled(lambda: browser.find_element(By.ID, "generated").text)
        WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: d.find_element(By.ID, "generated").text != first)
        assert n["fragments"] >= 1
        assert browser.find_element(By.ID, "kv-status").text == "live"
        name = settled(lambda: browser.find_element(By.CSS_SELECTOR, 'tr[data-slot="0"] .name').text)
        assert name == "<script>alert(1)</script>"
        assert console_errors(browser) == []
        screenshot(browser, tmp_path / "live.png")
    finally:
        srv.shutdown()
