"""The async llama-server client: one shared httpx.AsyncClient, small JSON calls, streamed forwarding.

Contract: a transport over `kvstore.llama` (request shapes, tokenize semantics): the same calls as the sync
`kvstore.llama_client.LlamaServer`, raising `UpstreamError` (unreachable: 502) or `UpstreamReply` (an error status, passed
on). `forward` streams a client's request and llama-server's reply chunk by chunk (SSE is never buffered). httpx is
the client library of both sides (the sync client too); aiohttp serves.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Optional

import httpx
from aiohttp import web

from kvstore import llama

from .errors import UpstreamError, UpstreamReply, UpstreamTimeout

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


# A pooled connection that the server closed while idle fails like this before any byte of the reply (the server
# disconnected without a response, the connection was reset, or the request could not be written): the request never
# reached llama-server, so sending it again on a fresh connection is safe. Only failures before the reply's headers
# are resent (`send`); timeouts are not among them.
STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
ATTEMPTS = 3
# llama-server (cpp-httplib) drops idle keep-alive connections after 5 s: ours are dropped well before.
KEEPALIVE = 2.0
# Defaults of --upstream-timeout and --upstream-idle-timeout. A non-streamed reply's first byte comes only when the
# whole generation is done, so the first-byte bound is generous; the idle bound is the longest gap between chunks.
FIRST_BYTE_TIMEOUT = 600.0
IDLE_TIMEOUT = 120.0
CUT = "kvstore.reply_cut"  # request key: the UpstreamError that cut a reply whose headers were already sent
# Request bodies up to this size are read before forwarding, so they can be sent again on a stale connection.
REPLAYABLE_BODY = 1 << 20


def reply_headers(headers: httpx.Headers) -> dict[str, str]:
    pairs = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw)  # names as llama-server spelt them
    return {k: v for k, v in pairs if k.lower() not in HOP_BY_HOP}


def client(keepalive: float = KEEPALIVE) -> httpx.AsyncClient:
    """The one client a hooks server shares: no overall time limit (the calls set theirs), 30 s to connect, idle
    connections dropped after `keepalive` s, no environment proxies, replies passed on undecoded."""
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30), trust_env=False,
                             limits=httpx.Limits(max_connections=100, max_keepalive_connections=100,
                                                 keepalive_expiry=keepalive))


class Upstream:
    def __init__(self, url: str, session: httpx.AsyncClient, *, first_byte: float = FIRST_BYTE_TIMEOUT,
                 idle: float = IDLE_TIMEOUT, on_error: Optional[Callable[[], None]] = None, api_key: Optional[str] = None,
                 strip_client_key: bool = False):
        """api_key: llama-server's own --api-key, sent on every call in place of the client's. strip_client_key:
        never pass a client's Authorization on (with tenant keys it is kvstore's key, not llama-server's)."""
        self.url = url.rstrip("/")
        self.session = session
        self.first_byte, self.idle = first_byte, idle
        self.on_error = on_error  # called (no arguments) after a connection error: a restarted server is checked
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.strip_client_key = strip_client_key or bool(api_key)

    def _unreachable(self, e: BaseException) -> UpstreamError:
        if self.on_error is not None:
            self.on_error()
        return UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}")

    def _timeout(self, path: str, what: str, seconds: float) -> UpstreamTimeout:
        return UpstreamTimeout(f"llama-server at {self.url} sent {what} of {path} within {seconds:g} s "
                               f"(frozen or overloaded?); the slot's state is unknown and was released")

    async def call(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        """A small JSON call; raises UpstreamError (unreachable), UpstreamTimeout (no complete reply within
        `timeout`, default the first-byte timeout) or UpstreamReply (error status)."""
        limit = self.first_byte if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                r = await self._send(self.session.build_request(method, self.url + path, headers=self.auth,
                                                                json=body), replayable=True)
                try:
                    data = await r.aread()
                finally:
                    await r.aclose()
        except TimeoutError as e:
            raise self._timeout(path, "no reply", limit) from e
        except (httpx.HTTPError, OSError) as e:
            raise self._unreachable(e) from e
        if r.status_code >= 400:
            raise UpstreamReply(r.status_code, data)
        try:
            return json.loads(data) if data else None
        except ValueError as e:
            raise UpstreamError(f"llama-server at {self.url} sent invalid JSON for {path}") from e

    async def _send(self, req: httpx.Request, *, replayable: bool) -> httpx.Response:
        """Send `req` and return the reply once its headers are in (its body still to read); a stale pooled
        connection is retried on a fresh one, up to ATTEMPTS times, when the body can be sent again."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return await self.session.send(req, stream=True)
            except STALE_CONNECTION as e:
                if attempt == ATTEMPTS or not replayable:  # a streamed body is consumed: it cannot be sent again
                    raise
                log.debug("%s %s: resent after %s", req.method, req.url.path, e)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

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

    def _cut(self, request: web.Request, resp: web.StreamResponse, e: UpstreamError) -> web.StreamResponse:
        """llama-server failed after the reply's headers were sent: nothing can be changed but the end. Log one
        line, close the client's connection after what was sent, and note the failure for the handler
        (`request[CUT]`: the slot's state is unknown)."""
        log.error("%s %s: reply cut: %s", request.method, request.path, e)
        request[CUT] = e
        resp.force_close()
        return resp

    async def forward(self, request: web.Request, path: str, *, body: Optional[bytes] = None,
                      extra_headers: Optional[dict] = None, tee: Optional[Callable[[bytes], None]] = None) -> web.StreamResponse:
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
        if self.strip_client_key:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers.update(self.auth)
        if body is not None and content_type:
            headers["Content-Type"] = content_type
        data: Any = body if body is not None else (request.content.iter_any() if streamed else None)
        req = self.session.build_request(request.method, self.url + path, params=list(request.query.items()),
                                         headers=headers, content=data)
        try:
            async with asyncio.timeout(self.first_byte):
                upstream = await self._send(req, replayable=not streamed)
        except TimeoutError as e:
            raise self._timeout(path, "no reply", self.first_byte) from e
        except (httpx.HTTPError, OSError) as e:
            raise self._unreachable(e) from e
        try:
            resp = web.StreamResponse(status=upstream.status_code, reason=upstream.reason_phrase,
                                      headers=reply_headers(upstream.headers))
            if extra_headers:
                resp.headers.update(extra_headers)
            try:
                await resp.prepare(request)
                chunks = upstream.aiter_raw().__aiter__()  # as sent: a compressed body stays compressed
                while True:
                    try:
                        async with asyncio.timeout(self.idle):
                            chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        return self._cut(request, resp, self._timeout(path, "no further chunk", self.idle))
                    except (httpx.HTTPError, OSError) as e:
                        return self._cut(request, resp, self._unreachable(e))
                    if tee is not None:
                        tee(chunk)
                    await resp.write(chunk)
                await resp.write_eof()
            except ConnectionResetError as e:  # aiohttp's ClientConnectionResetError too: the client left first
                log.info("%s %s: client disconnected before the reply was complete (%s)", request.method, path,
                         e or type(e).__name__)
            return resp
        finally:
            await upstream.aclose()
