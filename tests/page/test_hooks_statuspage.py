"""GET /kvstore/ on a real `kvstore serve` (the hooks in front of a real llama-server), read by headless Chromium."""
from __future__ import annotations


from hooks_support import complete, engine, get, hooks, stack
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
