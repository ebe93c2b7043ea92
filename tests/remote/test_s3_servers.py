"""Many servers, one store: two `kvstore serve` processes (each its own embedded llama-server and cache directory)
on one bucket of a real SeaweedFS. The two servers are started once for the module (tests run in file order and
leave them running); a test that stops, kills or restarts one brings it back before it ends."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, S3_BUCKET
from hooks_support import QUESTIONS, complete, get, intro, metric, post, tokenize, turn_prompt
from s3_nodes import Node
from corpus import ARTICLES, QUESTIONS as ARTICLE_QUESTIONS

SLACK = 2  # SmolLM2: a tokenizer merge at the boundary of a stored state (as in test_hooks_users.py)


@pytest.fixture(scope="module")
def pair(seaweed, tmp_path_factory):
    root = tmp_path_factory.mktemp("s3pair")
    url = f"s3://{S3_BUCKET}/pair"
    env = seaweed.env()
    a = Node("a", url, root / "cache-a", env)
    # B writes what it restores from the bucket as the objects arrive, as a server does whose bucket is on
    # another machine (`KVSTORE_S3_STREAM`, auto: on unless the endpoint is loopback); A once all arrived.
    b = Node("b", url, root / "cache-b", {**env, "KVSTORE_S3_STREAM": "on"})
    try:
        # one at a time: two model loads at once only slow each other on a small machine
        a.start()
        b.start()
        yield a, b
    finally:
        a.close()
        b.close()


def kv(*args, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def wait_stored(node: Node, name: str, timeout: float = 60) -> dict:
    """Until `node` finds `name` in the store (another node's save reached the bucket)."""
    deadline = time.monotonic() + timeout
    while True:
        r = get(node.url, f"/kvstore/states/{name}")
        if r.status == 200:
            return r.json
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name} never found {name!r}: {r.status} {r.body[:300]!r}")
        time.sleep(0.3)


def names(node: Node) -> set[str]:
    r = get(node.url, "/kvstore/states")
    assert r.status == 200, r.body
    return {s["name"] for s in r.json["states"]}


def verify_bucket(node: Node, cache) -> dict:
    """`kvstore verify --where bucket` from a fresh cache: every name's objects are in the bucket, unharmed."""
    r = kv("--store", node.store, "--cache", cache, "--json", "verify", "--where", "bucket", env=node.env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return json.loads(r.stdout)


# ---- a user, an article, a restart ------------------------------------------------------------------------------

def test_user_served_by_a_then_b_is_restored_and_continues_the_same(pair):
    a, b = pair
    p1 = turn_prompt(intro(0), QUESTIONS[0])
    stayer = complete(a.url, p1, name="stayer", n_predict=6)
    mover = complete(a.url, p1, name="mover", n_predict=6)
    assert mover.json["content"] == stayer.json["content"]
    p2 = turn_prompt(p1 + mover.json["content"] + "\n", QUESTIONS[1])
    wait_stored(b, "mover")  # A's idle save is in the bucket: B finds it without being told

    ranges0 = metric(b.url, "kvstore_bucket_requests_total", '{kind="get_range"}')
    moved = complete(b.url, p2, name="mover", n_predict=8)
    # B read the state's objects from the bucket (its cache never held them), and /metrics counts those reads.
    assert metric(b.url, "kvstore_bucket_requests_total", '{kind="get_range"}') > ranges0
    # A scrape lists the names (to count them); the bucket's totals are listed at most once a minute, so a
    # scrape every few seconds does not list every pack and loose object of the bucket each time.
    lists = [metric(b.url, "kvstore_bucket_requests_total", '{kind="list"}') for _ in range(4)]
    assert lists[3] - lists[1] <= 2, lists
    new = len(tokenize(b.url, p2)) - len(tokenize(b.url, p1))
    assert moved.kind == "restored", (moved.kind, moved.headers)
    assert int(moved.headers["X-KV-Restored-Tokens"]) >= len(tokenize(b.url, p1))
    assert moved.prompt_n <= new + SLACK, (moved.prompt_n, new)
    stayed = complete(a.url, p2, name="stayer", n_predict=8)
    # (the mover's first turn may have reused the stayer's saved slot in place: then the stayer is restored on A)
    assert stayed.kind in ("slot", "restored"), stayed.headers
    assert moved.json["content"] == stayed.json["content"]  # the same greedy continuation


def test_article_primed_on_a_is_a_parent_on_b(pair):
    a, b = pair
    r = post(a.url, "/kvstore/states/article0", {"prompt": ARTICLES[0]})
    assert r.status == 200, r.body  # acknowledged: its objects and its name are in the bucket
    q = ARTICLE_QUESTIONS[0]
    got = complete(b.url, ARTICLES[0] + q, name="q0-on-b", parent="article0", n_predict=6)
    assert got.kind == "parent", got.headers
    q_tokens = len(tokenize(b.url, ARTICLES[0] + q)) - len(tokenize(b.url, ARTICLES[0]))
    assert got.prompt_n <= q_tokens + SLACK, (got.prompt_n, q_tokens)
    ref = complete(a.url, ARTICLES[0] + q, name="q0-on-a", parent="article0", n_predict=6)
    assert ref.json["content"] == got.json["content"]


def test_both_restarted_with_empty_caches_lose_nothing(pair):
    a, b = pair
    made = {"stayer", "mover", "article0", "q0-on-b", "q0-on-a"}  # the last perhaps still unsaved in A's slot
    for node in (a, b):
        assert node.stop() == 0, node.log_tail()  # SIGTERM saves the dirty slots (into the bucket)
        shutil.rmtree(node.cache)
    for node in (a, b):
        node.start()
    assert names(a) == names(b) == made
    p = turn_prompt(intro(0), QUESTIONS[0])
    r = complete(b.url, p, name="stayer", n_predict=4)
    assert r.kind == "restored" and int(r.headers["X-KV-Restored-Tokens"]) >= len(tokenize(b.url, p)), r.headers
    got = complete(a.url, ARTICLES[0] + ARTICLE_QUESTIONS[1], name="q1-on-a", parent="article0", n_predict=4)
    assert got.kind == "parent"


# ---- faults -----------------------------------------------------------------------------------------------------

def test_kill_a_during_an_upload(pair, seaweed, tmp_path):
    a, b = pair
    prefix = "pair/packs/"  # the bucket layout of rust/src/remote/mod.rs: a save's objects travel in packs
    before = len(seaweed.list_keys(S3_BUCKET, prefix))
    answered: list = []

    def prime():
        try:
            answered.append(post(a.url, "/kvstore/states/article1", {"prompt": ARTICLES[1] + ARTICLES[2]}))
        except OSError as e:  # the connection dies with A
            answered.append(e)

    t = threading.Thread(target=prime)
    t.start()
    deadline = time.monotonic() + 120
    while len(seaweed.list_keys(S3_BUCKET, prefix)) == before and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    a.kill()  # as soon as the first of the save's objects is in the bucket
    t.join(60)
    mid_upload = not answered or isinstance(answered[0], OSError) or answered[0].status != 200
    print(f"\nkill -9 of A {'during' if mid_upload else 'after'} the upload of article1")

    report = verify_bucket(b, tmp_path / "verify")  # no name points at a missing object
    assert not report["missing"] and not report["corrupt"], report
    listed = names(b)
    if "article1" in listed:  # committed before the kill: then whole
        r = complete(b.url, ARTICLES[1] + ARTICLES[2] + "Question:", name="q-after-kill", parent="article1",
                     n_predict=2)
        assert r.kind == "parent"
    r = complete(b.url, turn_prompt(intro(1), QUESTIONS[0]), name="b-keeps-serving", n_predict=4)
    assert r.status == 200
    a.start()  # on the cache it was killed with
    assert names(a) == names(b)
    r = kv("--store", a.store, "--cache", a.cache, "verify", "--where", "cache", env=a.env)
    assert r.returncode == 0, (r.stdout, r.stderr)


def wait_clean(node: Node, timeout: float = 60) -> None:
    """Until no slot of `node` holds unsaved changes (its idle save has run)."""
    deadline = time.monotonic() + timeout
    while any(s["dirty"] for s in get(node.url, "/kvstore/stats").json["slots"]):
        assert time.monotonic() < deadline, get(node.url, "/kvstore/stats").json["slots"]
        time.sleep(0.3)


def test_bucket_stopped_while_serving(pair, seaweed):
    a, b = pair
    # on A: "cached" saved (its objects in A's cache) and then evicted from both slots by two other names
    p_cached = turn_prompt(intro(2), QUESTIONS[0])
    complete(a.url, p_cached, name="cached", n_predict=2)
    for i in (3, 4):
        complete(a.url, turn_prompt(intro(i), QUESTIONS[0]), name=f"filler{i}", n_predict=2)
    p_b_only = turn_prompt(intro(5), QUESTIONS[0])
    complete(b.url, p_b_only, name="b-only", n_predict=2)
    wait_stored(a, "b-only")  # saved by B; A knows the name but its cache never held the objects
    wait_clean(a)
    failures0 = metric(a.url, "kvstore_remote_failures_total")

    seaweed.stop()
    try:
        t0 = time.monotonic()
        # what needs the bucket is a clear 503 with a JSON error, not a hang: a state only the bucket has ...
        r = post(a.url, "/slots/0?action=restore", {"filename": "b-only"})
        assert r.status == 503 and r.json["error"]["type"] == "unavailable_error", (r.status, r.body)
        assert r.headers.get("Retry-After"), r.headers
        # ... and a save (acknowledged only once in the bucket): the state stays in its slot
        r = post(a.url, "/kvstore/states/article2", {"prompt": ARTICLES[2]})
        assert r.status == 503 and r.json["error"]["type"] == "unavailable_error", (r.status, r.body)
        # the local cache keeps serving what it holds
        r = complete(a.url, p_cached + " Yes.", name="cached", n_predict=2)
        assert r.kind == "restored", r.headers
        # both slots now hold states that cannot be saved: a third name gets a 503 too, at once
        r = post(a.url, "/completion", {"prompt": p_b_only + " Yes.", "n_predict": 2, "cache_prompt_name": "b-only"})
        assert r.status == 503, (r.status, r.body)
        assert time.monotonic() - t0 < 120, "answers to what needs the bucket must not hang"
        assert metric(a.url, "kvstore_remote_failures_total") > failures0
    finally:
        seaweed.start()
    # the saves catch up when the bucket is back (A's idle save): the article primed during the outage, and the
    # newer state of "cached"
    stored = wait_stored(b, "article2", timeout=120)
    assert stored["n_tokens"] == len(tokenize(a.url, ARTICLES[2]))
    wait_clean(a, timeout=120)
    assert wait_stored(b, "cached")["n_tokens"] > len(tokenize(a.url, p_cached))
    r = complete(a.url, p_b_only + " Yes.", name="b-only", n_predict=2)
    assert r.kind == "restored", r.headers


def test_gc_on_a_while_b_saves(pair, tmp_path):
    a, b = pair
    saved: list[str] = []
    deferred: list[str] = []  # a save a gc held off past its wait: 503, the state kept in its slot, saved later
    refused: list[str] = []
    errors: list = []

    def saves():
        for i in range(6):
            name = f"gc-race-{i}"
            r = post(b.url, f"/kvstore/states/{name}", {"prompt": ARTICLES[i % 3] + f" Note {i}."})
            if r.status == 200:
                saved.append(name)
            elif r.status == 503 and "gc holds" in r.json["error"]["message"]:
                deferred.append(name)
            elif r.status == 503:  # no slot free: the other held a state a gc kept from saving; refused, not lost
                refused.append(name)
            else:
                errors.append((name, r.status, r.body[:200]))

    t = threading.Thread(target=saves)
    t.start()
    runs = 0
    while t.is_alive() and runs < 3:
        r = kv("--store", a.store, "--cache", a.cache, "gc", "--grace", "0", env=a.env)
        # saves in flight may hold the gc off past its wait: then it says so (GcLocked) and changes nothing
        assert r.returncode == 0 or (r.returncode == 2 and "lock" in r.stderr.lower()), (r.stdout, r.stderr)
        runs += 1
    t.join()
    assert not errors, errors
    assert len(saved) + len(deferred) + len(refused) == 6 and saved and runs >= 1, (saved, deferred, refused)
    for name in deferred:  # caught up by B's idle save once no gc runs
        wait_stored(a, name, timeout=120)
    r = kv("--store", a.store, "--cache", a.cache, "gc", "--grace", "0", env=a.env)
    assert r.returncode == 0, r.stderr
    report = verify_bucket(a, tmp_path / "verify")
    assert not report["missing"] and not report["corrupt"], report
    for name in saved + deferred:  # every state B saved restores, on A as well
        i = int(name.rsplit("-", 1)[1])
        got = complete(a.url, ARTICLES[i % 3] + f" Note {i}. Question:", name=f"after-{name}", parent=name,
                       n_predict=1)
        assert got.kind == "parent", (name, got.headers)
