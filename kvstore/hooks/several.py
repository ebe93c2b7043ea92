"""Several prompts in one unnamed completion, served in flight together, as llama-server serves them.

Contract: `prompts(body)` says whether a completion body holds several prompts (llama-server's own rule); `serve`
sends each prompt as a request of its own to the hooks themselves, over loopback, and merges the replies as
llama-server does. Each prompt then takes a slot as any request does (the table, the queue, tenancy, metrics),
where one request carrying the lot would hold one slot and run its prompts one after another. Not streamed and not
named: a streamed reply interleaves its prompts' chunks, and a name holds one state; those stay one request.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import httpx
from aiohttp import web

# The native completion paths answer several prompts with a list of results; the OpenAI one with one reply whose
# choices follow the prompts' order.
NATIVE_PATHS = ("/completion", "/completions")
# What each prompt's request carries of the client's: who it is (its key, its namespace where a trusted proxy sets
# it) and kvstore's own fields (X-KV-*); not the body's length or type, which are the new body's.
_KEPT_HEADERS = ("authorization", "x-api-key")
# One value per prompt, comma-separated in the prompts' order.
_KV_HEADERS = ("X-KV-Cache", "X-KV-Slot", "X-KV-Restored-Tokens", "X-KV-Decision")


def prompts(body: dict) -> Optional[list[Any]]:
    """The prompts of a body that holds several, else None. llama-server's rule: a list with no number in it is a
    list of prompts (strings, token lists, objects); with numbers in it, it is one prompt (tokens, or tokens and
    strings mixed)."""
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or len(prompt) < 2 or any(_number(x) for x in prompt):
        return None
    # Each one a prompt llama-server takes (else it is sent as it is, for llama-server to say what is wrong): a
    # string, an object, or a list with numbers in it. A list of strings alone would be split again here.
    if not all(isinstance(x, (str, dict)) or isinstance(x, list) and any(_number(t) for t in x) for x in prompt):
        return None
    return prompt


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _local_url(request: web.Request, path: str) -> str:
    """The hooks' own address: the socket this request came in on (not its Host header, which may name a balancer)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not sockname:
        raise ConnectionResetError("the client went away")
    host, port = sockname[0], sockname[1]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{path}"


async def serve(request: web.Request, path: str, body: dict, each: list[Any], session: httpx.AsyncClient,
                in_flight: int) -> web.Response:
    """Send `body` once per prompt of `each` to the hooks themselves, at most `in_flight` at a time (the slots: a
    long list must not fill the queue, whose bound would refuse the rest), and answer as llama-server answers
    several prompts. The first prompt that fails answers for all (as llama-server's first error does)."""
    url = _local_url(request, path)
    headers = {k: v for k, v in request.headers.items()
               if k.lower() in _KEPT_HEADERS or k.lower().startswith("x-kv-")}
    gate = asyncio.Semaphore(max(1, in_flight))

    async def one(prompt: Any) -> httpx.Response:
        async with gate:
            return await session.post(url, json={**body, "prompt": prompt}, headers=headers, timeout=None)

    replies = await asyncio.gather(*(one(p) for p in each))
    for r in replies:
        if r.status_code != 200:
            return web.Response(status=r.status_code, body=r.content,
                                content_type=r.headers.get("Content-Type", "application/json").split(";")[0])
    results = [r.json() for r in replies]
    kv = {h: ",".join(r.headers.get(h, "") for r in replies) for h in _KV_HEADERS
          if any(h in r.headers for r in replies)}
    if path in NATIVE_PATHS:
        for i, result in enumerate(results):
            result["index"] = i
        return web.json_response(results, headers=kv)
    merged = results[0]
    merged["choices"] = [{**result["choices"][0], "index": i} for i, result in enumerate(results)]
    # Summed over the prompts, as OpenAI's API counts them (llama-server itself reports the first prompt's usage).
    usages = [result.get("usage") or {} for result in results]
    usage = {k: sum(int(u.get(k) or 0) for u in usages) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage["prompt_tokens_details"] = {"cached_tokens": sum(int((u.get("prompt_tokens_details") or {})
                                                               .get("cached_tokens") or 0) for u in usages)}
    merged["usage"] = {**usages[0], **usage}
    return web.json_response(merged, headers=kv)
