"""The status page of a `kvstore serve` on an S3 store while the bucket is down (issue 20, item 6): a real SeaweedFS
is stopped under a running server; `GET /kvstore/` and its refresh fragment still answer 200 with what the server
knows (slots, counters, the names its local index holds) and say the bucket is unreachable, with the store's error;
once the bucket is back, the notice is gone and the store's totals are shown again."""
from __future__ import annotations

import time
from html import unescape as html_unescape

import pytest
from markupsafe import escape

from conftest import S3_BUCKET
from hooks_support import QUESTIONS, complete, get, intro, turn_prompt
from s3_nodes import Node

NOTICE = 'id="bucket-unreachable"'


@pytest.fixture(scope="module")
def node(seaweed, tmp_path_factory):
    root = tmp_path_factory.mktemp("s3page")
    n = Node("page", f"s3://{S3_BUCKET}/page", root / "cache", seaweed.env())
    try:
        yield n.start()
    finally:
        n.close()


def page(node: Node, fragment: bool) -> tuple[int, str, dict]:
    r = get(node.url, "/kvstore/?fragment=1" if fragment else "/kvstore/")
    return r.status, r.body.decode("utf-8", "replace"), r.headers


def wait_clean(node: Node, timeout: float = 60) -> None:
    """Until no slot holds unsaved changes (the idle save has put the state in the bucket)."""
    deadline = time.monotonic() + timeout
    while any(s["dirty"] for s in get(node.url, "/kvstore/stats").json["slots"]):
        assert time.monotonic() < deadline, get(node.url, "/kvstore/stats").json["slots"]
        time.sleep(0.3)


def test_page_renders_with_the_bucket_stopped_and_says_so(node, seaweed):
    r = complete(node.url, turn_prompt(intro(1), QUESTIONS[0]), name="kept-name", n_predict=2)
    assert r.status == 200, r.body
    wait_clean(node)
    for fragment in (False, True):
        status, html, _ = page(node, fragment)
        assert status == 200 and NOTICE not in html and 'data-name="kept-name"' in html, (status, html[:2000])

    seaweed.stop()
    try:
        stats = get(node.url, "/kvstore/stats")
        # /kvstore/stats and the page degrade on one path (AsyncStore.stats_or_unavailable): the same message
        assert stats.status == 200 and stats.json["store"].get("unavailable"), (stats.status, stats.body[:500])
        message = stats.json["store"]["unavailable"]
        for fragment in (False, True):
            status, html, headers = page(node, fragment)
            assert status == 200, (fragment, status, html[:2000])
            assert NOTICE in html and "The bucket is unreachable" in html, html[:3000]
            notice = html.split(NOTICE, 1)[1].split("</p>", 1)[0]
            # the store's own error, as /kvstore/stats has it (its detail differs from one failed request to the next)
            assert message.startswith("bucket s3://") and str(escape(message.split(" (")[0])) in notice, (message, notice)
            # what the server knows still shows: its slots, its counters, the names in its local index
            assert 'id="slots"' in html and 'data-slot="0"' in html and 'data-slot="1"' in html
            assert 'id="savings"' in html and 'data-name="kept-name"' in html
            if not fragment:
                csp = html.split('http-equiv="Content-Security-Policy" content="', 1)[1].split('"', 1)[0]
                csp = html_unescape(csp)
                assert "default-src 'none'" in csp and "script-src 'sha256-" in csp, csp
                assert headers.get("Cache-Control") == "no-store"
            else:
                assert "<html" not in html and "<script" not in html
    finally:
        seaweed.start()

    # the bucket back: the notice goes with the next request, the totals are there again
    deadline = time.monotonic() + 120
    while True:
        status, html, _ = page(node, True)
        if status == 200 and NOTICE not in html:
            break
        assert time.monotonic() < deadline, (status, html[:2000])
        time.sleep(0.5)
    for fragment in (False, True):
        status, html, _ = page(node, fragment)
        assert status == 200 and NOTICE not in html and 'data-name="kept-name"' in html
    stats = get(node.url, "/kvstore/stats").json["store"]
    assert "unavailable" not in stats and stats["bucket_objects"], stats
