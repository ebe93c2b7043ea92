"""A benchmark client: one streamed request, timed to the first token, with the tokens llama-server evaluated.

`complete` sends a native `/completion` (llama-server's `timings`); `chat` sends a conversation as a chat client does,
on OpenAI's chat completions (the final chunk's `timings`) or Anthropic's Messages API (`usage` in `message_start`:
`input_tokens` evaluated, `cache_read_input_tokens` reused; no `timings`, so no prompt_ms).
"""
from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Optional

from kvstore import llama


@dataclass
class Result:
    prompt_n: int
    cache_n: int
    ttft_s: float
    total_s: float
    text: str
    tokens: list = field(default_factory=list)
    kv_cache: str = ""  # X-KV-Cache reply header (kvstore only)
    prompt_ms: float = 0.0  # llama-server's own time evaluating the prompt tokens it evaluated (timings)
    server: str = ""  # who answered: a balancer's X-KV-Server reply header, else the URL asked
    # Of prompt_n, the tokens kvstore evaluated first to store a state at a fork (X-KV-Fork-Evaluated; a model
    # with a recurrent section), which llama-server's timings for the reply do not count.
    fork_n: int = 0


def post_json(url: str, body: dict, headers: Optional[dict] = None, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def tokenize(base: str, text: str, *, add_special: bool = True) -> list:
    """The tokens llama-server evaluates for `text` as a prompt (kvstore.llama's request)."""
    return llama.tokens_of(post_json(base + llama.TOKENIZE, llama.tokenize_request(text, add_special=add_special)))


def chat_tokens(base: str, system: str, messages: list) -> list:
    """The tokens llama-server evaluates for a chat request (its template applied, then tokenized)."""
    doc = {"messages": [{"role": "system", "content": system}, *messages]}
    return tokenize(base, llama.prompt_of(post_json(base + llama.APPLY_TEMPLATE, llama.template_request(doc))))


def _sse(r):
    """The JSON documents of a server-sent event stream's `data:` lines, until `[DONE]`."""
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


CHAT_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


@dataclass
class _Stream:
    ttft_s: float
    total_s: float
    kv_cache: str
    server: str
    fork_n: int


def _stream(base: str, path: str, body: dict, headers: Optional[dict], on_chunk) -> _Stream:
    """POST `body` to `path` as a streamed request, handing each event's JSON to `on_chunk`: the time to the first
    event, the total, and who answered."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    t0 = time.perf_counter()
    ttft = None
    with urllib.request.urlopen(req, timeout=900) as r:
        kv = r.headers.get("X-KV-Cache", "")
        server = r.headers.get("X-KV-Server") or base
        fork_n = int(r.headers.get("X-KV-Fork-Evaluated") or 0)
        for chunk in _sse(r):
            if ttft is None:
                ttft = time.perf_counter() - t0
            on_chunk(chunk)
    total = time.perf_counter() - t0
    return _Stream(ttft if ttft is not None else total, total, kv, server, fork_n)


def chat(base: str, api: str, system: str, messages: list, max_tokens: int,
         headers: Optional[dict] = None) -> Result:
    """One streamed conversation turn: `messages` (user/assistant turns) after `system`, as `api` ("chat" or
    "messages") carries them."""
    if api == "chat":
        body = {"messages": [{"role": "system", "content": system}, *messages], "max_tokens": max_tokens,
                "temperature": 0, "stream": True}
    else:
        body = {"model": "bench", "system": system, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "stream": True}
    text: list = []
    timings: dict = {}
    usage: dict = {}

    def on_chunk(chunk: dict) -> None:
        if api == "chat":
            for choice in chunk.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
        elif chunk.get("type") == "message_start":
            usage.update(chunk["message"].get("usage") or {})
        elif chunk.get("type") == "content_block_delta":
            text.append((chunk.get("delta") or {}).get("text") or "")
        if chunk.get("timings"):
            timings.update(chunk["timings"])

    st = _stream(base, CHAT_PATHS[api], body, headers, on_chunk)
    if api == "messages":
        prompt_n, cache_n = int(usage.get("input_tokens", 0)), int(usage.get("cache_read_input_tokens", 0))
    else:
        prompt_n, cache_n = int(timings.get("prompt_n", 0)), int(timings.get("cache_n", 0))
    return Result(prompt_n=prompt_n + st.fork_n, cache_n=cache_n, ttft_s=st.ttft_s, total_s=st.total_s,
                  text="".join(text), kv_cache=st.kv_cache, server=st.server,
                  prompt_ms=float(timings.get("prompt_ms") or 0.0), fork_n=st.fork_n)


def complete(base: str, prompt: str, n_predict: int, extra: Optional[dict] = None,
             headers: Optional[dict] = None) -> Result:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": True,
            "stream": True, "return_tokens": True, **(extra or {})}
    text: list = []
    tokens: list = []
    timings: dict = {}

    def on_chunk(chunk: dict) -> None:
        text.append(chunk.get("content", ""))
        tokens.extend(chunk.get("tokens") or [])
        if chunk.get("timings"):
            timings.update(chunk["timings"])

    st = _stream(base, "/completion", body, headers, on_chunk)
    return Result(prompt_n=int(timings.get("prompt_n", 0)) + st.fork_n, cache_n=int(timings.get("cache_n", 0)),
                  ttft_s=st.ttft_s, total_s=st.total_s, text="".join(text), tokens=tokens, kv_cache=st.kv_cache,
                  server=st.server, prompt_ms=float(timings.get("prompt_ms") or 0.0), fork_n=st.fork_n)
