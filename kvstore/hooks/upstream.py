"""The async llama-server client: one shared aiohttp ClientSession, small JSON calls, streamed forwarding.

A transport over `kvstore.llama` (request shapes, tokenize semantics): the same calls as the sync
`kvstore.server.LlamaServer`, raising `UpstreamError` (unreachable: 502) or `UpstreamReply` (an error status, passed
on). `forward` streams a client's request and llama-server's reply chunk by chunk (SSE is never buffered).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Optional

import aiohttp
from aiohttp import web

from kvstore import llama

from .errors import UpstreamError, UpstreamReply

log = logging.getLogger("kvstore.hooks")

# RFC 7230 6.1 hop-by-hop headers, plus those aiohttp computes itself.
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Trailers",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding",
))


def request_headers(headers, *, keep_length: bool = False) -> dict[str, str]:
    """Headers forwarded upstream: hop-by-hop and ours removed (Content-Length kept for a streamed body)."""
    return {k: v for k, v in headers.items()
            if (k.lower() not in HOP_BY_HOP or (keep_length and k.lower() == "content-length"))
            and not k.lower().startswith("x-kv-")}


# A pooled connection that the server closed while idle fails like this before any byte of the reply: the request
# never reached llama-server, so sending it again on a fresh connection is safe.
STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)
# Request bodies up to this size are read before forwarding, so they can be sent again on a stale connection.
REPLAYABLE_BODY = 1 << 20


def reply_headers(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


class Upstream:
    def __init__(self, url: str, session: aiohttp.ClientSession):
        self.url = url.rstrip("/")
        self.session = session

    async def call(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        """A small JSON call; raises UpstreamError (unreachable) or UpstreamReply (error status)."""
        kw: dict[str, Any] = {}
        if body is not None:
            kw["json"] = body
        if timeout is not None:
            kw["timeout"] = aiohttp.ClientTimeout(total=timeout)
        for attempt in (1, 2):
            try:
                async with self.session.request(method, self.url + path, **kw) as r:
                    data = await r.read()
                    if r.status >= 400:
                        raise UpstreamReply(r.status, data)
                break
            except STALE_CONNECTION as e:
                if attempt == 2:
                    raise UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}") from e
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}") from e
        try:
            return json.loads(data) if data else None
        except ValueError as e:
            raise UpstreamError(f"llama-server at {self.url} sent invalid JSON for {path}") from e

    async def wait_ready(self, timeout: float = 300.0) -> dict:
        """Poll /props until the model is loaded (503 while loading)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        warned = False
        while True:
            try:
                return await self.call("GET", llama.PROPS, timeout=10)
            except (UpstreamError, UpstreamReply) as e:
                if not warned:
                    log.info("waiting for llama-server at %s (up to %.0f s): %s", self.url, timeout, e)
                    warned = True
                if loop.time() > deadline:
                    raise UpstreamError(f"llama-server at {self.url} not ready after {timeout:.0f}s: {e}") from e
                await asyncio.sleep(0.2)

    async def models(self) -> Optional[dict]:
        """GET /v1/models (None when the server does not answer it)."""
        try:
            return await self.call("GET", llama.MODELS)
        except (UpstreamError, UpstreamReply):
            return None

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """`text`'s tokens as llama-server evaluates it as a prompt; add_special=False for a continuation."""
        return llama.tokens_of(await self.call("POST", llama.TOKENIZE,
                                               llama.tokenize_request(text, add_special=add_special)))

    async def apply_template(self, body: dict, *, add_generation_prompt: Optional[bool] = None) -> str:
        r = await self.call("POST", llama.APPLY_TEMPLATE,
                            llama.template_request(body, add_generation_prompt=add_generation_prompt))
        return llama.prompt_of(r)

    async def completion(self, prompt: Any, **params: Any) -> dict:
        """POST /completion (non-streaming)."""
        return await self.call("POST", llama.COMPLETION, llama.completion_request(prompt, **params)) or {}

    async def slot_action(self, slot_id: int, action: str, filename: Optional[str] = None) -> dict:
        return await self.call("POST", llama.slot_path(slot_id, action), llama.slot_body(filename)) or {}

    async def forward(self, request: web.Request, path: str, *, body: Optional[bytes] = None,
                      extra_headers: Optional[dict] = None, tee: Optional[callable] = None) -> web.StreamResponse:
        """Stream `request` to llama-server and its reply back, chunk by chunk.

        body: replacement body bytes (else the request body is streamed through). extra_headers: set on the
        reply before prepare(). tee(chunk): sees every chunk (metrics), must not keep them all.
        """
        if body is None and request.body_exists and (request.content_length or 0) <= REPLAYABLE_BODY \
                and request.content_length is not None:
            body = await request.read()
            content_type = request.headers.get("Content-Type")
        else:
            content_type = "application/json"
        streamed = body is None and request.body_exists
        headers = request_headers(request.headers, keep_length=streamed)
        if body is not None and content_type:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            data: Any = body if body is not None else (request.content.iter_any() if streamed else None)
            try:
                upstream = await self.session.request(request.method, self.url + path, params=request.query,
                                                      headers=headers, data=data,
                                                      timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
                break
            except STALE_CONNECTION as e:
                if attempt == 2 or streamed:  # a streamed body is consumed: it cannot be sent again
                    raise UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}") from e
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                raise UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}") from e
        async with upstream:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=reply_headers(upstream.headers))
            if extra_headers:
                resp.headers.update(extra_headers)
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    if tee is not None:
                        tee(chunk)
                    await resp.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                # Headers are gone: all we can do is log and cut the reply.
                log.error("%s %s: upstream failed mid-reply: %s", request.method, path, e)
                raise
            await resp.write_eof()
            return resp
