"""A real browser for the status page tests: headless Chromium from Debian's packages, driven by Selenium."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


@pytest.fixture
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    assert chromium and driver_bin, "headless Chromium is missing: run ./dev setup (apt-get install chromium chromium-driver)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(a)
    # Chromium's profile and its temp files (a singleton socket per run, left behind otherwise) go under pytest's
    # temp directory, not /tmp.
    tmp = tmp_path_factory.mktemp("chromium")
    opts.add_argument(f"--user-data-dir={tmp / 'profile'}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(driver_bin, env={**os.environ, "TMPDIR": str(tmp)})
    d = webdriver.Chrome(service=service, options=opts)
    try:
        yield d
    finally:
        d.quit()


def screenshot(d, path: Path) -> None:
    d.set_window_size(1280, int(d.execute_script("return document.body.scrollHeight")) + 60)
    d.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def settled(read, tries: int = 4):
    """Run `read()` (a group of element lookups) again when the live page's refresh replaced the DOM under it.

    The live page swaps its main section every few seconds; an element found before a swap is stale after it.
    A stale read is retried as a whole, so every value in one result comes from one rendering of the page.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    for attempt in range(tries):
        try:
            return read()
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise


def console_errors(d) -> list:
    return [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]


