"""A benchmark client: one streamed /completion request, timed to the first token, with llama-server's timings."""
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


def post_json(url: str, body: dict, headers: Optional[dict] = None, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def tokenize(base: str, text: str) -> list:
    """The tokens llama-server evaluates for `text` as a prompt (kvstore.llama's request)."""
    return llama.tokens_of(post_json(base + llama.TOKENIZE, llama.tokenize_request(text)))


def complete(base: str, prompt: str, n_predict: int, extra: Optional[dict] = None,
             headers: Optional[dict] = None) -> Result:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": True,
            "stream": True, "return_tokens": True, **(extra or {})}
    req = urllib.request.Request(base + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    t0 = time.perf_counter()
    ttft = None
    text, tokens, timings = [], [], {}
    with urllib.request.urlopen(req, timeout=900) as r:
        kv = r.headers.get("X-KV-Cache", "")
        server = r.headers.get("X-KV-Server") or base
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            chunk = json.loads(line[5:])
            if ttft is None:
                ttft = time.perf_counter() - t0
            text.append(chunk.get("content", ""))
            tokens.extend(chunk.get("tokens") or [])
            if chunk.get("timings"):
                timings = chunk["timings"]
    total = time.perf_counter() - t0
    return Result(prompt_n=int(timings.get("prompt_n", 0)), cache_n=int(timings.get("cache_n", 0)),
                  ttft_s=ttft if ttft is not None else total, total_s=total, text="".join(text),
                  tokens=tokens, kv_cache=kv, server=server, prompt_ms=float(timings.get("prompt_ms") or 0.0))
