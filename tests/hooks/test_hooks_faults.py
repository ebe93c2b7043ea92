"""Faults of `kvstore serve` against a real llama-server: frozen (SIGSTOP), restarted and absent upstreams, closed
connections under load, a client that hangs up, deeply nested JSON, and files left in the sync directory.

Every request has a timeout; every process started here is killed in `finally`.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hooks_support import ROOT, THREADS, complete, engine, get, hooks, intro, post, request, stack, tokens_for

from kvstore.config import sync_dir
from kvstore.engine import free_port, wait_healthy


class External:
    """llama-server in its own process (`python -m kvstore.engine`), so that it can be stopped, continued and
    restarted under the hooks."""

    def __init__(self, store: Path, log: Path, port: int = 0, ctx: int = 2048):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "ab")
        cmd = [sys.executable, "-m", "kvstore.engine", "--model", "smollm2", "--port", str(self.port), "-np", "2",
               "-c", str(ctx), "--cache-ram", "0", "--slot-save-path", str(sync_dir(store))]
        if THREADS:
            cmd += ["-t", str(THREADS)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.url, 120, alive=lambda: self.proc.poll() is None)
        except BaseException:
            self.close()
            raise

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.cont()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def slot_names(url: str) -> list:
    return [s["name"] for s in get(url, "/kvstore/stats").json["slots"]]


def test_frozen_upstream_answers_504_and_releases_the_slot(tmp_path):
    """SIGSTOP llama-server: a named request gets a 504 within the first-byte timeout, not a hang; its slot no longer
    claims the name (its state is unknown); after SIGCONT the next request is served."""
    store = tmp_path / "store"
    up = External(store, tmp_path / "llama.log")
    # the stall probe is kept out of the way (60 s): this test is about the first-byte timeout
    with stack(up), hooks(up.url, store, upstream_timeout=5, upstream_idle_timeout=5,
                          upstream_stall_timeout=60) as hk:
        assert hk.hooks.wired.up.first_byte == 5
        hk.hooks.wired.up.first_byte = 300  # a loaded machine may take longer than 5 s for a real evaluation
        prompt = intro(0) + "User: Hi\nAssistant:"
        assert complete(hk.url, prompt, name="frozen", n_predict=2).kind == "miss"
        assert "frozen" in slot_names(hk.url)
        hk.hooks.wired.up.first_byte = 5
        up.stop()
        try:
            t0 = time.monotonic()
            r = request(hk.url + "/completion", "POST", {"prompt": prompt + " Hello", "n_predict": 2,
                                                         "cache_prompt_name": "frozen"}, timeout=60)
            took = time.monotonic() - t0
            assert r.status == 504, (r.status, r.body[:300])
            assert "within 5 s" in r.json["error"]["message"], r.json
            assert took < 20, took
            assert "frozen" not in slot_names(hk.url)  # never saved under the name: what the slot holds is unknown
            assert get(hk.url, "/kvstore/stats").json["queue_length"] == 0
        finally:
            up.cont()
            hk.hooks.wired.up.first_byte = 300
        deadline = time.monotonic() + 60  # llama-server finishes the abandoned request first
        while any(s.get("is_processing") for s in get(up.url, "/slots").json):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        r = complete(hk.url, prompt + " Hello", name="frozen", n_predict=2)
        assert r.kind == "miss", r.kind  # evaluated again, not "slot"


def wait_until_served(url: str, prompt: str, seconds: float = 60) -> None:
    """Until the hooks answer 200 to a short request again (each try has its own timeout)."""
    deadline = time.monotonic() + seconds
    while True:
        r = request(url + "/completion", "POST", {"prompt": prompt, "n_predict": 1}, timeout=60)
        if r.status == 200:
            return
        assert r.status == 503, (r.status, r.body[:300])  # stalled until a /health probe is answered
        assert time.monotonic() < deadline, r.body[:300]
        time.sleep(0.5)


def test_stalled_upstream_is_504_in_seconds_then_503_and_recovers(tmp_path):
    """SIGSTOP llama-server with the first-byte timeout at its 600 s default: the /health probe goes unanswered, so
    the waiting named request gets a 504 within 15 s (the default 10 s stall timeout) saying so, its slot no longer
    claims the name, a new request gets 503 + Retry-After while it is stopped, and after SIGCONT the same server
    answers 200 again without a restart."""
    store = tmp_path / "store"
    up = External(store, tmp_path / "llama.log")
    with stack(up), hooks(up.url, store) as hk:
        assert (hk.hooks.wired.up.first_byte, hk.hooks.wired.up.stall) == (600, 10)
        prompt = intro(3) + "User: Hi\nAssistant:"
        assert complete(hk.url, prompt, name="stalled", n_predict=2).kind == "miss"
        assert "stalled" in slot_names(hk.url)
        up.stop()
        try:
            t0 = time.monotonic()
            r = request(hk.url + "/completion", "POST", {"prompt": prompt + " Hello", "n_predict": 2,
                                                         "cache_prompt_name": "stalled"}, timeout=60)
            took = time.monotonic() - t0
            assert r.status == 504, (r.status, r.body[:300])
            assert "answered no /health probe for 10 s" in r.json["error"]["message"], r.json
            assert took < 15, took
            assert "stalled" not in slot_names(hk.url)  # never saved under the name: what the slot holds is unknown
            stats = get(hk.url, "/kvstore/stats").json
            assert stats["queue_length"] == 0 and stats["counters"].get("upstream_stalls") == 1, stats["counters"]
            assert not any(s["busy"] for s in stats["slots"]), stats["slots"]
            r = request(hk.url + "/completion", "POST", {"prompt": "Hello", "n_predict": 1}, timeout=30)
            assert r.status == 503 and r.headers.get("Retry-After"), (r.status, r.body[:300])
            assert "/health probe" in r.json["error"]["message"], r.json
            h = request(hk.url + "/health", timeout=30)  # a load balancer's check sees it too
            assert h.status == 503, (h.status, h.body[:300])
        finally:
            up.cont()
        wait_until_served(hk.url, "Hello")
        assert up.proc.poll() is None  # the same llama-server process
        r = complete(hk.url, prompt + " Hello", name="stalled", n_predict=2)
        assert r.kind == "miss", r.kind  # evaluated again, not "slot"
        assert get(hk.url, "/kvstore/stats").json["counters"].get("upstream_restarts", 0) == 0


# A long reply, streamed: llama-server's own completion, and Anthropic's Messages API (which the hooks translate
# from a chat completion chunk by chunk).
LONG_STREAMS = {
    "/completion": {"prompt": intro(4), "n_predict": 1000, "ignore_eos": True, "stream": True, "temperature": 0},
    "/v1/messages": {"model": "m", "max_tokens": 1000, "stream": True, "temperature": 0, "messages": [
        {"role": "user", "content": intro(4) + "Count from 1 to 1000 in words, separated by commas."}]},
}


@pytest.mark.parametrize("path", LONG_STREAMS)
def test_a_stream_started_before_a_stall_is_cut(path, tmp_path):
    """A streamed reply under way when llama-server is SIGSTOPped: the connection is closed within the stall
    timeout (the idle timeout stays at 120 s), the slot is released and no longer claims the name. A Messages
    stream so cut ends without `message_stop`: an Anthropic client sees it incomplete."""
    store = tmp_path / "store"
    up = External(store, tmp_path / "llama.log")
    with stack(up), hooks(up.url, store, upstream_stall_timeout=3) as hk:
        host, port = hk.url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        received = b""
        try:
            conn.request("POST", path, body=json.dumps({**LONG_STREAMS[path], "cache_prompt_name": "streamed"}),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200
            received = resp.fp.read1(64)
            assert received  # the first chunk arrived
            up.stop()
            t0 = time.monotonic()
            while chunk := resp.fp.read1(65536):  # what was under way, then the end: the hooks closed the connection
                received += chunk
                assert time.monotonic() - t0 < 30
            took = time.monotonic() - t0
        finally:
            up.cont()
            conn.close()
        assert took < 15, took
        if path == "/v1/messages":
            assert b"event: message_start" in received and b"message_stop" not in received, received[-300:]
        stats = get(hk.url, "/kvstore/stats").json
        assert stats["counters"].get("upstream_stalls") == 1, stats["counters"]
        assert not any(s["busy"] for s in stats["slots"]) and "streamed" not in slot_names(hk.url), stats["slots"]
        wait_until_served(hk.url, "Hello")


def test_a_long_alive_evaluation_is_not_cut_by_the_stall_probe(tmp_path):
    """llama-server answers /health from its HTTP threads while its main loop evaluates: a request whose evaluation
    takes several times the stall timeout (3 s here) is served whole, and no stall is seen. (Were /health blocked by
    the main loop, this request would get a 504.)"""
    store = tmp_path / "store"
    # 4,096 cells a slot: the prompt and a generation long enough to take several stall timeouts even on a fast
    # machine (1,000 tokens in a 1,024-cell slot took only 4.3 s: the slot filled and generation stopped)
    up = External(store, tmp_path / "llama.log", ctx=8192)
    stall = 3.0
    with stack(up):
        # ~12 s of generation at this machine's present rate (4 stall timeouts; the check below wants more than 2)
        n_predict = tokens_for(4 * stall, up.url, at_most=3000)
        with hooks(up.url, store, upstream_stall_timeout=stall) as hk:
            text = " ".join(intro(i % 5) for i in range(12))  # ~900 tokens of prompt, then a long generation
            body = {"prompt": text, "n_predict": n_predict, "ignore_eos": True, "temperature": 0,
                    "cache_prompt_name": "long"}
            answered = hk.hooks.wired.up.probes_answered
            r = request(hk.url + "/completion", "POST", body, timeout=600)
            assert r.status == 200, (r.status, r.body[:300])
            t = r.json["timings"]
            spent = (t["prompt_ms"] + t["predicted_ms"]) / 1000  # llama-server's own measure of its work
            assert spent > 2 * stall, f"evaluation took {spent:.1f} s: too short to show anything; make it longer"
            assert hk.hooks.wired.up.probes_answered - answered >= spent / 2  # probes were answered meanwhile
            assert get(hk.url, "/kvstore/stats").json["counters"].get("upstream_stalls", 0) == 0


def test_restarted_upstream_is_detected_and_names_restored(tmp_path):
    """llama-server restarts on the same port under the hooks: the hooks notice (its slots' task ids went back) and
    restore the name from the store instead of claiming `X-KV-Cache: slot` for an empty slot."""
    store = tmp_path / "store"
    up = External(store, tmp_path / "llama.log")
    try:
        with hooks(up.url, store) as hk:
            text = intro(1)
            r = post(hk.url, "/kvstore/states/returning", {"prompt": text})
            assert r.status == 200, r.body
            assert complete(hk.url, text + "User: Hi\nAssistant:", name="returning", n_predict=2).kind == "slot"
            time.sleep(2)  # the watch checks within ~0.5 s of a reply; leave it time on a loaded machine
            port = up.port
            up.close()
            up = External(store, tmp_path / "llama2.log", port=port)
            deadline = time.monotonic() + 30
            while get(hk.url, "/kvstore/stats").json["counters"].get("upstream_restarts", 0) < 1:
                assert time.monotonic() < deadline, "restart not detected"
                time.sleep(0.5)
            r = complete(hk.url, text + "User: Hello again\nAssistant:", name="returning", n_predict=2)
            assert r.kind == "restored", r.kind
            assert r.prompt_n <= 12, r.prompt_n
    finally:
        up.close()


@contextlib.contextmanager
def serve_process(upstream: str, store: Path):
    """`kvstore serve --upstream URL` in a subprocess: yields (process, its URL) once it says it listens (30 s at
    most); killed on the way out if still running."""
    proc = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "serve", "--upstream", upstream, "--store", str(store),
                             "--port", "0", "--idle-save", "0", "--restore-policy", "always"], cwd=ROOT,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        got: list = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert got and "listening on http://" in got[0], f"kvstore serve did not listen within 30 s: {got}"
        yield proc, got[0].split("listening on ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def sigterm_exits_0(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.stderr.read()[-2000:]


def test_upstream_absent_at_start(tmp_path):
    """`kvstore serve` listens at once without llama-server: 503 + Retry-After, /health says why; it becomes ready
    when llama-server appears, and SIGTERM exits 0."""
    store = tmp_path / "store"
    port = free_port()
    up = None
    try:
        with serve_process(f"http://127.0.0.1:{port}", store) as (proc, url):
            for path in ("/health", "/v1/health"):
                h = request(url + path, timeout=10)
                assert h.status == 503 and h.json["error"]["message"].startswith("waiting for llama-server"), \
                    (path, h.status, h.body)
            r = request(url + "/completion", "POST", {"prompt": "hi", "n_predict": 1}, timeout=10)
            assert r.status == 503 and r.headers.get("Retry-After"), (r.status, r.body)
            up = External(store, tmp_path / "llama.log", port=port)
            wait_healthy(url, 60, alive=lambda: proc.poll() is None)
            assert complete(url, "Hello", n_predict=1).status == 200
            sigterm_exits_0(proc)
    finally:
        if up is not None:
            up.close()


def test_sigterm_while_waiting_for_upstream_exits_0(tmp_path):
    with serve_process(f"http://127.0.0.1:{free_port()}", tmp_path / "store") as (proc, _):
        sigterm_exits_0(proc)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    store = tmp_path_factory.mktemp("faults") / "store"
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store) as hk:
        yield srv, hk, store


@pytest.mark.timeout(1500)  # minutes on a 2-core machine shared with other work
def test_three_in_flight_over_200_requests_see_no_errors(served):
    """A client keeping 3 requests in flight, 200 short requests: 2 names and some unnamed ones on 2 slots (each
    unnamed one displaces a named state: a save, then a restore), completions and chats, and pauses longer than
    llama-server's keep-alive: every reply is a 200."""
    _, hk, _ = served
    lock = threading.Lock()
    todo = list(range(200))
    errors: list = []

    def worker(w: int) -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            name = f"load-{i % 2}" if i % 10 else None
            body = {"prompt": f"Note {i % 3}: question {i}", "n_predict": 1, "temperature": 0}
            if name:
                body["cache_prompt_name"] = name
            path = "/v1/chat/completions" if i % 7 == 0 else "/completion"
            if path != "/completion":
                body = {"messages": [{"role": "user", "content": body["prompt"]}], "max_tokens": 1,
                        **({"cache_prompt_name": name} if name else {})}
            try:
                r = request(hk.url + path, "POST", body, timeout=120)
                if r.status != 200:
                    errors.append((i, r.status, r.body[:200]))
            except Exception as e:  # noqa: BLE001 - counted
                errors.append((i, type(e).__name__, str(e)))
            if i % 100 == 0:
                time.sleep(5.5)  # past llama-server's 5 s keep-alive: pooled connections must not go stale

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not any(t.is_alive() for t in threads)
    assert errors == [], errors[:5]


@pytest.mark.parametrize("path", ["/completion", "/kvstore/states/deep", "/slots/0?action=save"])
def test_deeply_nested_json_is_400(served, path):
    """100,000 levels of nesting: a 400 from the body parser (was a 500 with a RecursionError)."""
    _, hk, _ = served
    body = b"[" * 100_000 + b"]" * 100_000
    conn = http.client.HTTPConnection(hk.url.split("//")[1], timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        status, data = resp.status, resp.read()
    finally:
        conn.close()
    assert status == 400, (status, data[:300])
    assert "nested too deeply" in json.loads(data)["error"]["message"]


def test_client_hanging_up_is_one_info_line(served, caplog):
    """A client that disconnects mid-stream: one INFO line, no ERROR and no traceback; the slot is released."""
    _, hk, _ = served
    caplog.set_level(logging.INFO)
    host, port = hk.url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/completion", body=json.dumps({"prompt": intro(2), "n_predict": 200, "stream": True,
                                                             "temperature": 0}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.fp.read1(64)  # the first chunk arrived: now hang up
    finally:
        conn.sock.close() if conn.sock else None
        conn.close()
    deadline = time.monotonic() + 60
    while any(s["busy"] for s in get(hk.url, "/kvstore/stats").json["slots"]) or \
            not any("client disconnected" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records][-10:]
        time.sleep(0.2)
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert bad == [], [(r.name, r.getMessage()) for r in bad]
    assert complete(hk.url, "Hello", n_predict=1).status == 200


def test_sync_dir_holds_only_the_hooks_files(tmp_path):
    """Files left in sync/ (a raw llama-server save, a killed process's temp file) are removed at start-up, and
    later ones once they are `sync_sweep` seconds old."""
    store = tmp_path / "store"
    sync = sync_dir(store)
    sync.mkdir(parents=True)
    (sync / "stolen.bin").write_bytes(b"x" * 100)
    (sync / ".kv-0123.bin").write_bytes(b"y")
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store, sync_sweep=1.0) as hk:
        assert sorted(p.name for p in sync.iterdir()) == []
        # llama-server's own slot API, bypassing the hooks, leaves a file behind
        r = post(srv.url, "/slots/0?action=save", {"filename": "raw.bin"})
        assert r.status == 200, r.body
        assert (sync / "raw.bin").exists()
        deadline = time.monotonic() + 20
        while (sync / "raw.bin").exists():
            assert time.monotonic() < deadline, list(sync.iterdir())
            time.sleep(0.3)
        assert complete(hk.url, "Hello", name="kept", n_predict=1).status == 200


def test_failed_save_keeps_the_state_in_its_slot():
    """Unit test of the slot table's eviction rule (one piece of logic, no server): when the dirty state in the
    least recently used slot fails to save, the request takes another slot; with no other slot free it gets 503;
    the state stays labelled and dirty, and is saved by the next idle save."""
    import asyncio

    from kvstore.hooks.errors import Unavailable
    from kvstore.hooks.slots import SlotTable

    async def run() -> None:
        failing = {"on": True}
        saved = []

        async def save(slot):
            if failing["on"]:
                raise OSError("Can not write request body")
            saved.append(slot.key)

        t = SlotTable(2, save=save)
        async with t.acquire(key=("", "a")) as lease:
            t.evaluated(lease.slot, [1, 2])
        async with t.acquire(key=("", "b")) as lease:
            t.evaluated(lease.slot, [3])
        # both dirty; "c" evicts the LRU ("a", slot 0), whose save fails: it takes slot 1 ("b" fails too) -> 503
        with pytest.raises(Unavailable):
            async with t.acquire(key=("", "c")):
                pass
        assert [(s.name, s.dirty) for s in t.slots] == [("a", True), ("b", True)]
        failing["on"] = False
        async with t.acquire(key=("", "c")) as lease:
            assert lease.slot.id == 0 and saved == [("", "a")]
        assert await t.save_idle(0) == 1 and saved == [("", "a"), ("", "b")]
        assert [(s.name, s.dirty) for s in t.slots] == [("c", False), ("b", False)]

        # one fails, the other is clean: the request takes the clean one
        t2 = SlotTable(2, save=save)
        async with t2.acquire(key=("", "x")) as lease:
            t2.evaluated(lease.slot, [1])
        async with t2.acquire(key=("", "y")) as lease:
            pass
        t2.touch(t2.slots[1])
        failing["on"] = True
        t2.slots[0].last_used, t2.slots[1].last_used = 0.0, 1.0
        async with t2.acquire(key=("", "z")) as lease:
            assert lease.slot.id == 1
        assert (t2.slots[0].name, t2.slots[0].dirty) == ("x", True)

    asyncio.run(run())


def test_upstream_timeout_flags(tmp_path):
    from kvstore.cli import build_parser

    a = build_parser().parse_args(["serve", "--upstream", "http://x", "--upstream-timeout", "5",
                                   "--upstream-idle-timeout", "7", "--upstream-stall-timeout", "3"])
    assert (a.upstream_timeout, a.upstream_idle_timeout, a.upstream_stall_timeout) == (5.0, 7.0, 3.0)
    d = build_parser().parse_args(["serve"])
    assert d.upstream_timeout >= 300 and d.upstream_idle_timeout >= 60 and d.upstream_stall_timeout == 10
