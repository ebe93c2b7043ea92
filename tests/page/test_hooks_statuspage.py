"""GET /kvstore/ on a real `kvstore serve` (the hooks in front of a real llama-server), read by headless Chromium."""
from __future__ import annotations


import re

from hooks_support import complete, engine, get, hooks, post, request, stack
from browser_support import browser, console_errors, screenshot, settled  # noqa: F401  (fixture)

ARTICLE = "The lighthouse keeper kept a log of every ship that passed the rocky point. " * 6


def test_status_page_of_a_running_server(tmp_path, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    store = tmp_path / "store"
    with stack(engine("smollm2", store, parallel=1)) as (srv,):
        with stack(hooks(srv.url, store)) as (hk,):
            assert complete(hk.url, ARTICLE, name="article").kind == "miss"
            complete(hk.url, ARTICLE + " Q: who kept the log?", name="q1", parent="article")
            r = complete(hk.url, ARTICLE + " Q: what did he log?", name="q2", parent="article")  # evicts q1
            assert r.kind == "parent" and int(r.headers["X-KV-Restored-Tokens"]) > 0
            r = complete(hk.url, ARTICLE + " Q: who kept the log? A:", name="q1")  # evicts q2, restores q1
            assert r.kind == "restored"
            page = get(hk.url, "/kvstore/")
            assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
            frag = get(hk.url, "/kvstore/?fragment=1").body.decode()
            assert "<html" not in frag and 'id="slots"' in frag
            browser.get(hk.url + "/kvstore/")

            def read_page():
                slot = browser.find_element(By.CSS_SELECTOR, 'tr[data-slot="0"]').find_element(By.CSS_SELECTOR, ".name")
                kinds = {}
                for tr in browser.find_elements(By.CSS_SELECTOR, "#savings table:not(.narrow) tbody tr"):
                    cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                    kinds[cells[0]] = cells
                root = browser.find_element(By.CSS_SELECTOR, "ul.tree > li")
                top = root.find_element(By.CSS_SELECTOR, ":scope > .node").get_attribute("data-name")
                kids = sorted(k.get_attribute("data-name")
                              for k in root.find_elements(By.CSS_SELECTOR, ":scope > ul > li > .node"))
                charts = len(browser.find_elements(By.CSS_SELECTOR, "#savings svg.chart"))
                return slot.text, kinds, top, kids, charts

            slot_name, kinds, top, kids, charts = settled(read_page)
            assert slot_name == "q1"
            assert kinds["restored"][2] == "1" and int(kinds["restored"][5].replace(",", "")) > 0, kinds
            assert kinds["parent"][2] == "2" and kinds["miss"][2] == "1", kinds
            assert top == "article" and kids == ["q1", "q2"]
            assert charts
            assert console_errors(browser) == []
            screenshot(browser, tmp_path / "serve.png")


def test_status_page_shows_evictions_over_time_of_a_capped_store(tmp_path, browser):  # noqa: F811
    """Under --max-size of about two states, five names saved one after another: older ones are evicted for the cap,
    and the page's store section shows them per interval (the cap card's count and the evictions over time agree)."""
    from selenium.webdriver.common.by import By

    store = tmp_path / "store"
    with stack(engine("smollm2", store, parallel=1)) as (srv,):
        with stack(hooks(srv.url, store)) as (calib,):  # one state's stored bytes, what the cap is sized by
            r = post(calib.url, "/kvstore/states/calibrate", {"prompt": ARTICLE})
            assert r.status == 200, r.body
            one = int(r.json["stored"]["new_stored_bytes"])
            assert request(calib.url + "/kvstore/states/calibrate", "DELETE").status == 200
        with stack(hooks(srv.url, store, max_size=2 * one, evict_period=0.3)) as (hk,):
            for i in range(5):  # one slot: each new name saves the previous one, the store passes its cap
                complete(hk.url, f"Logbook page {i}. " + ARTICLE, name=f"page{i}")
            stats = get(hk.url, "/kvstore/stats").json
            assert stats["bound"]["enabled"] is True and stats["bound"]["evicted"]["cap"] > 0, stats["bound"]
            browser.get(hk.url + "/kvstore/")

            def read_page():
                card = browser.find_element(By.ID, "store-cap").text
                fig = browser.find_element(By.ID, "evictions-over-time")
                totals = {e.get_attribute("data-reason"): int(e.find_element(By.TAG_NAME, "b").text.replace(",", ""))
                          for e in fig.find_elements(By.CSS_SELECTOR, "[data-reason]")}
                cap_rects = len(fig.find_elements(By.CSS_SELECTOR, "svg.chart rect.e-cap"))
                tips = [t.get_attribute("textContent") for t in fig.find_elements(By.CSS_SELECTOR, "g.col > title")]
                return card, fig.is_displayed(), totals, cap_rects, tips

            card, shown, totals, cap_rects, tips = settled(read_page)
            assert shown and set(totals) == {"cap", "ttl", "quota"}, totals
            assert totals["cap"] >= stats["bound"]["evicted"]["cap"] > 0, (totals, stats["bound"])
            assert f"cap {totals['cap']:,}," in card, card  # the cap card counts the same evictions
            # per interval: the columns' counts add up to the total, and at least one column is drawn for the cap
            per_bucket = sum(int(n) for t in tips for n in re.findall(r"(\d+) cap\b", t))
            assert cap_rects >= 1 and per_bucket == totals["cap"], (cap_rects, tips, totals)
            assert console_errors(browser) == []
            screenshot(browser, tmp_path / "evictions.png")
