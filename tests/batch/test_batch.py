"""`kvstore batch` as a user runs it: the `kvstore` command in its own process, against a real `kvstore serve`
(the hooks in front of a real llama-server), on articles x questions named by article, shuffled, with as many
requests in flight as slots and twice that. Also: the output format, resume after kill -9, bad lines, exit
codes, and the memory bound on 100,000 lines."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from corpus import ARTICLES, QUESTIONS, SLACK
from hooks_support import engine, hooks, post, stack

ROOT = Path(__file__).resolve().parents[2]


def kv_batch(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvstore.cli", "batch", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def write_batch(path: Path, order: str, *, name_by_article=True, n_predict=4, seed=0, head="", api="completion"
                ) -> list[dict]:
    """Articles x questions; `head` starts every prompt, so batches on one server share nothing cached. api:
    "completion" (`/completion`, `prompt`), "responses" (`/v1/responses`, the prompt as `input`) or "messages"
    (Anthropic's Message Batches lines: `params` with the prompt as the user's message, no `url`)."""
    def body(a: int, q: int) -> dict:
        named = {"cache_prompt_name": f"article-{a}-{zlib.crc32(head.encode()):08x}"} if name_by_article else {}
        if api == "responses":
            return {"input": head + ARTICLES[a] + QUESTIONS[q], "max_output_tokens": n_predict, "temperature": 0,
                    **named}
        if api == "messages":
            return {"messages": [{"role": "user", "content": head + ARTICLES[a] + QUESTIONS[q]}],
                    "max_tokens": n_predict, "temperature": 0, **named}
        return {"prompt": head + ARTICLES[a] + QUESTIONS[q], "n_predict": n_predict, "temperature": 0, **named}

    def line(a: int, q: int) -> dict:
        if api == "messages":
            return {"custom_id": f"a{a}-q{q}", "params": body(a, q)}
        return {"custom_id": f"a{a}-q{q}", "method": "POST", "url": "/v1/responses" if api == "responses" else
                "/completion", "body": body(a, q)}

    reqs = [line(a, q) for a in range(len(ARTICLES)) for q in range(len(QUESTIONS))]
    if order == "question-major":
        reqs.sort(key=lambda r: (r["custom_id"].split("-")[1], r["custom_id"]))
    elif order == "shuffled":
        random.Random(seed).shuffle(reqs)
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return reqs


def check_output(path: Path, ids: set) -> list[dict]:
    """The documented schema (OpenAI's batch output; Anthropic's result lines for its Message Batches lines): one
    line per request, every id once."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for d in lines:
        if "result" in d:
            assert set(d) == {"custom_id", "result"}, d
            result = d["result"]
            assert result["type"] in ("succeeded", "errored"), result
            if result["type"] == "succeeded":
                assert set(result) == {"type", "message"} and result["message"]["type"] == "message", result
            else:
                assert set(result["error"]) == {"type", "error"} and set(result["error"]["error"]) == {
                    "type", "message"}, result
            continue
        assert set(d) == {"id", "custom_id", "response", "error"}, d
        assert d["id"].startswith("batch_req_")
        if d["error"] is None:
            r = d["response"]
            assert set(r) == {"status_code", "request_id", "body"} and isinstance(r["status_code"], int), r
        else:
            assert d["response"] is None and set(d["error"]) == {"code", "message"}
    answered = [d["custom_id"] for d in lines if d.get("error") is None and d.get("result", {}).get("type") in (
        None, "succeeded")]
    assert sorted(answered) == sorted(ids), "every request answered exactly once"
    return lines


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def kvserve(request, tmp_path_factory):
    store = tmp_path_factory.mktemp(f"batch-{request.param}")
    srv = engine(request.param, store, parallel=2, ctx=4096)
    h = hooks(srv.url, store)
    with stack(srv, h):
        yield request.param, h.url


@pytest.mark.parametrize("order,concurrency,api", [("shuffled", 2, "completion"), ("question-major", 4, "completion"),
                                                   ("article-major", 2, "completion"), ("shuffled", 4, "responses"),
                                                   ("question-major", 2, "messages")])
def test_articles_by_name_in_any_order_evaluate_each_article_once(kvserve, tmp_path, order, concurrency, api):
    model, url = kvserve
    # The slots start empty: the ideal counts every token once, and a chat template's head (SmolLM2's default system
    # prompt) left in a slot by an earlier batch on this server would be reused below it.
    for slot in range(2):
        assert post(url, f"/slots/{slot}?action=erase", {}).status == 200
    inp, out, summary = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "summary.json"
    reqs = write_batch(inp, order, seed=concurrency, head=f"Batch {order} {concurrency} {api}. ", api=api)
    r = kv_batch(inp, "-o", out, "--server", url, "--concurrency", concurrency, "--summary", summary, "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = check_output(out, {q["custom_id"] for q in reqs})
    if api == "messages":  # Anthropic's result lines
        assert all(d["result"]["message"]["content"][0]["type"] == "text" for d in lines), lines[:2]
    else:
        text = "output" if api == "responses" else "content"
        assert all(d["response"]["status_code"] == 200 and d["response"]["body"][text] is not None for d in lines)
    s = json.loads(summary.read_text())
    assert s["requests"] == s["answered"] == len(reqs) and s["errors"] == 0
    # A Responses or Messages prompt is the chat template around the text: its head (shared by every request) may be
    # one more prefix, the parent of every article.
    prefixes = (len(ARTICLES), len(ARTICLES) + 1) if api != "completion" else (len(ARTICLES),)
    assert s["concurrency"] == concurrency and s["kvstore"] is True and s["prefixes"] in prefixes, s
    # Tokens: each article once, each question once; the per-request slack is llama-server's own rollback to its
    # checkpoint a few tokens before a stored prompt's end on Gemma 3 (corpus.SLACK), which plain serving pays too.
    assert s["ideal"] < s["evaluated"] + 1
    assert s["evaluated"] <= s["ideal"] + SLACK[model] * (len(reqs) + len(ARTICLES)), s
    assert s["evaluated"] < 0.5 * s["prompt_tokens"], s
    # The shared prefixes it stored are gone again.
    listed = json.loads(subprocess.run(["curl", "-s", url + "/kvstore/states"], capture_output=True).stdout)
    names = {x["name"] for x in listed["states"]}
    assert not any(n.startswith("batch-") for n in names), names


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """One kvstore serve (SmolLM2, 2 slots) for the tests that check the command's behaviour, not its tokens."""
    store = tmp_path_factory.mktemp("batch-smol")
    srv = engine("smollm2", store, parallel=2, ctx=4096)
    h = hooks(srv.url, store)
    with stack(srv, h):
        yield h


def test_resume_after_kill9_answers_every_request_once(tmp_path, smol):
    """kill -9 while requests are in flight, then the same command again: nothing lost, nothing twice."""
    h = smol
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs = write_batch(inp, "shuffled", n_predict=24, name_by_article=False)
    p = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "batch", str(inp), "-o", str(out), "--server",
                          h.url, "-q"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        assert p.poll() is None, p.stderr.read()[-2000:]
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = [json.loads(x)["custom_id"] for x in out.read_text().splitlines()]
    assert 3 <= len(before) < len(reqs), "killed mid-run"
    r = kv_batch(inp, "-o", out, "--server", h.url, "-q", "--summary", tmp_path / "s.json")
    assert r.returncode == 0, r.stderr[-3000:]
    check_output(out, {q["custom_id"] for q in reqs})
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["skipped"] == len(set(before)) and s["answered"] == len(reqs) - len(set(before))


def test_bad_lines_are_answered_with_errors_and_the_batch_goes_on(tmp_path, smol):
    h = smol
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = {"custom_id": "ok", "method": "POST", "url": "/completion",
            "body": {"prompt": ARTICLES[0] + QUESTIONS[0], "n_predict": 2}}
    chat = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}}
    resp = {"custom_id": "resp", "method": "POST", "url": "/v1/responses",
            "body": {"input": [{"role": "user", "content": "Hello there"}], "max_output_tokens": 2}}
    anthropic = {"custom_id": "anthropic", "params": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}
    lines = [json.dumps(good), "{not json", json.dumps({"method": "POST", "url": "/completion", "body": {}}),
             json.dumps({**good, "custom_id": "bad-url", "url": "/v1/embeddings"}), json.dumps(good),
             json.dumps({**good, "custom_id": "two", "body": {"prompt": ["a", "b"]}}), json.dumps(chat),
             json.dumps({**resp, "custom_id": "no-input", "body": {"input": []}}), json.dumps(resp),
             json.dumps(anthropic), json.dumps({"custom_id": "no-messages", "params": {"max_tokens": 2}}),
             json.dumps({"custom_id": "no-params", "params": "Hi"})]
    inp.write_text("\n".join(lines) + "\n")
    r = kv_batch(inp, "-o", out, "--server", h.url, "-q")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    docs = [json.loads(x) for x in out.read_text().splitlines()]
    errors = {d["error"]["message"] for d in docs if d.get("error")}
    errored = {d["custom_id"]: d["result"]["error"]["error"] for d in docs
               if d.get("result", {}).get("type") == "errored"}
    assert any("line 2 is not JSON" in m for m in errors), errors
    assert any("line 3: missing `custom_id`" in m for m in errors), errors
    assert any("line 4: unknown `url` '/v1/embeddings'" in m for m in errors), errors
    assert any("line 5: duplicate custom_id 'ok'" in m for m in errors), errors
    assert any("line 6: `prompt` must be one string" in m for m in errors), errors
    assert any("line 8: a Responses request needs `input`" in m for m in errors), errors
    # Anthropic's Message Batches lines are answered in Anthropic's result format, errors with its error types.
    assert errored["no-messages"]["type"] == "invalid_request_error", errored
    assert "line 11: a chat or Messages request needs `messages`" in errored["no-messages"]["message"], errored
    assert "line 12: `params` must be a JSON object" in errored["no-params"]["message"], errored
    ok = {d["custom_id"]: d["response"] for d in docs if "response" in d and d["error"] is None}
    assert set(ok) == {"ok", "chat", "resp"} and all(v["status_code"] == 200 for v in ok.values())
    assert ok["resp"]["body"]["object"] == "response"
    succeeded = [d["result"]["message"] for d in docs if d.get("result", {}).get("type") == "succeeded"]
    assert [m["content"][0]["type"] for m in succeeded] == ["text"], succeeded
    assert ok["chat"]["body"]["choices"][0]["message"]["role"] == "assistant"
    # Nothing listening: nothing could run, exit 2 with one line.
    r = kv_batch(inp, "-o", tmp_path / "o2.jsonl", "--server", "http://127.0.0.1:9", "-q")
    assert r.returncode == 2 and "nothing could run" in r.stderr, r.stderr[-2000:]


def test_100k_lines_plan_in_bounded_memory(tmp_path):
    """A dry run (plan only) of 100,000 requests, 1,000 articles x 100 questions as token ids (so no tokenize
    calls are needed): the peak RSS (VmHWM of the command's own process) stays small and the plan finds one prefix
    per article."""
    store = tmp_path / "store"
    srv = engine("smollm2", store, parallel=1, ctx=2048)
    with stack(srv):
        rng = random.Random(5)
        inp = tmp_path / "in.jsonl"
        with open(inp, "w") as f:
            arts = [[rng.randrange(1, 40_000) for _ in range(rng.randrange(100, 200))] for _ in range(1000)]
            order = [(a, q) for a in range(1000) for q in range(100)]
            rng.shuffle(order)
            for a, q in order:
                body = {"prompt": arts[a] + [q + 1, 17, 17, q + 2], "n_predict": 8}
                f.write(json.dumps({"custom_id": f"a{a}-q{q}", "method": "POST", "url": "/completion",
                                    "body": body}) + "\n")
        del arts
        size_mib = inp.stat().st_size / 2**20
        r = kv_batch(inp, "-o", tmp_path / "out.jsonl", "--server", srv.url, "--dry-run", "-q", "--summary",
                     tmp_path / "s.json")
        assert r.returncode == 0, r.stderr[-2000:]
        s = json.loads((tmp_path / "s.json").read_text())
        print(f"100k lines ({size_mib:.0f} MiB of JSON, {s['prompt_tokens']} prompt tokens): peak RSS "
              f"{s['peak_rss_mib']} MiB, {s['wall_s']} s")
        assert s["requests"] == 100_000 and s["prefixes"] == 1000 and s["ideal"] is None
        # What grows with the input is a small record per request (offsets, the plan's order): not its prompts,
        # which stay in the input file and a spool file on disk. Measured: ~100 MiB, ~40 of it the interpreter.
        assert s["peak_rss_mib"] < 200, s
