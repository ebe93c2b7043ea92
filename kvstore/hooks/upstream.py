"""The async llama-server client: one shared httpx.AsyncClient, small JSON calls, streamed forwarding.

Contract: a transport over `kvstore.llama` (request shapes, tokenize semantics): the same calls as the sync
`kvstore.llama_client.LlamaServer`, raising `UpstreamError` (unreachable: 502) or `UpstreamReply` (an error status, passed
on). `forward` streams a client's request and llama-server's reply chunk by chunk (SSE is never buffered). httpx is
the client library of both sides (the sync client too); aiohttp serves.

Liveness (`watch_liveness`): llama-server's `/health` is probed every PROBE_PERIOD s on a side connection (its HTTP
threads answer it without waiting for the main loop, so a busy server answers). When no probe has been answered for
`stall` s the upstream is stalled (frozen, e.g. SIGSTOPped): every wait on it (`call`, `forward`'s first byte and
chunks) ends at once with an `UpstreamTimeout` saying so, and new calls raise `Unavailable` (503) until a probe is
answered again.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Callable, Optional, Protocol

import httpx
from aiohttp import web

from kvstore import llama

from .errors import Unavailable, UpstreamError, UpstreamReply, UpstreamTimeout

log = logging.getLogger("kvstore.hooks")

# RFC 7230 6.1 hop-by-hop headers, plus those aiohttp computes itself.
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Trailers",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding",
))


_KEY_HEADERS = frozenset(h.lower() for h in llama.API_KEY_HEADERS)


def request_headers(headers, *, keep_length: bool = False, strip_keys: bool = False) -> dict[str, str]:
    """Headers forwarded upstream: hop-by-hop and ours removed (Content-Length kept for a streamed body), and with
    `strip_keys` the client's API key in either header llama-server reads."""
    return {k: v for k, v in headers.items()
            if (k.lower() not in HOP_BY_HOP or (keep_length and k.lower() == "content-length"))
            and not k.lower().startswith("x-kv-") and not (strip_keys and k.lower() in _KEY_HEADERS)}


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
# Default of --upstream-stall-timeout: seconds without an answered /health probe before llama-server is called
# stalled; probes are sent this often (a probe waits at most until the stall deadline, and PROBE_PERIOD s at least).
STALL_TIMEOUT = 10.0
PROBE_PERIOD = 1.0
# Request key: the UpstreamError that cut a reply whose headers were already sent (a typed key: aiohttp >= 3.14
# warns about string keys).
CUT: "web.RequestKey[UpstreamError]" = web.RequestKey("kvstore.reply_cut", UpstreamError)
# Request bodies up to this size are read before forwarding, so they can be sent again on a stale connection.
REPLAYABLE_BODY = 1 << 20


class Translation(Protocol):
    """A reply rewritten on its way to the client (`kvstore.anthropic_api.Translation`)."""

    def begin(self, status: int) -> Optional[str]:
        """The translated reply's content type, or None to pass this reply (an error) as it is."""

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send for one decoded chunk of the reply (may be empty)."""

    def finish(self) -> bytes:
        """The last bytes, once llama-server's reply is complete."""


def reply_headers(headers: httpx.Headers) -> dict[str, str]:
    pairs = ((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw)  # names as llama-server spelt them
    return {k: v for k, v in pairs if k.lower() not in HOP_BY_HOP}


def client(keepalive: float = KEEPALIVE, connections: int = 100) -> httpx.AsyncClient:
    """The one client a hooks server shares (and the liveness probe's own, with one connection): no overall time
    limit (the calls set theirs), 30 s to connect, idle connections dropped after `keepalive` s, no environment
    proxies, replies passed on undecoded."""
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30), trust_env=False,
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                                                 keepalive_expiry=keepalive))


class _Wait:
    """One bounded wait on llama-server (an `asyncio.timeout`), which a stall ends early (`stalled` then says so)."""

    __slots__ = ("deadline", "stalled")

    def __init__(self, deadline: asyncio.Timeout):
        self.deadline, self.stalled = deadline, False


class Upstream:
    def __init__(self, url: str, session: httpx.AsyncClient, *, first_byte: float = FIRST_BYTE_TIMEOUT,
                 idle: float = IDLE_TIMEOUT, on_error: Optional[Callable[[], None]] = None, api_key: Optional[str] = None,
                 strip_client_key: bool = False, stall: float = STALL_TIMEOUT,
                 on_stall: Optional[Callable[[], None]] = None):
        """api_key: llama-server's own --api-key, sent on every call in place of the client's. strip_client_key:
        never pass a client's key on (`Authorization`, `X-Api-Key`): with tenant keys it is kvstore's key, not
        llama-server's.
        stall: seconds without an answered /health probe that make llama-server stalled (`watch_liveness`)."""
        self.url = url.rstrip("/")
        self.session = session
        self.first_byte, self.idle = first_byte, idle
        self.on_error = on_error  # called (no arguments) after a connection error: a restarted server is checked
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.strip_client_key = strip_client_key or bool(api_key)
        self.stall = stall
        self.on_stall = on_stall  # called (no arguments) when llama-server becomes stalled
        self.stalled = False  # no /health probe answered for `stall` s; cleared by the next answer
        self.probes_answered = 0
        self._waits: set[_Wait] = set()

    @contextlib.contextmanager
    def _waiting(self, deadline: asyncio.Timeout):
        """Register a wait on llama-server for the liveness watch to end if llama-server stalls; refused (503)
        while it is stalled."""
        self._gate()
        wait = _Wait(deadline)
        self._waits.add(wait)
        try:
            yield wait
        finally:
            self._waits.discard(wait)

    def _gate(self) -> None:
        if self.stalled:
            raise Unavailable(f"llama-server at {self.url} answered no /health probe for {self.stall:g} s "
                              f"(frozen?); retry when it answers")

    async def watch_liveness(self, probe: httpx.AsyncClient, period: float = PROBE_PERIOD) -> None:
        """Probe llama-server's /health on `probe` (a client of its own, so a probe never waits behind requests for
        a connection) every `period` s, forever. Any HTTP answer counts (a loading server's 503 too). No answer for
        `stall` s: stalled, and every registered wait ends now; the next answer clears it."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            try:
                async with asyncio.timeout(max(period, last + self.stall - loop.time())):
                    r = await probe.get(self.url + llama.HEALTH, headers=self.auth)
                    await r.aclose()
                answered = True
            except (TimeoutError, httpx.HTTPError, OSError) as e:
                log.debug("hooks: /health probe of %s: %s", self.url, e or type(e).__name__)
                answered = False
            now = loop.time()
            if answered:
                last = now
                self.probes_answered += 1
                if self.stalled:
                    self.stalled = False
                    log.warning("hooks: llama-server at %s answers /health again: serving", self.url)
            elif not self.stalled and now - last >= self.stall:
                self._stalled(now - last)
            await asyncio.sleep(period)

    def _stalled(self, silent: float) -> None:
        self.stalled = True
        waits = list(self._waits)
        log.error("hooks: llama-server at %s answered no /health probe for %.1f s (frozen?): %d waiting request(s) "
                  "get 504, new ones 503 until it answers", self.url, silent, len(waits))
        if self.on_stall is not None:
            self.on_stall()
        now = asyncio.get_running_loop().time()
        for wait in waits:
            if not wait.deadline.expired():
                wait.stalled = True
                wait.deadline.reschedule(now)

    def _unreachable(self, e: BaseException) -> UpstreamError:
        if self.on_error is not None:
            self.on_error()
        return UpstreamError(f"llama-server at {self.url} unreachable: {e or type(e).__name__}")

    def _timeout(self, path: str, what: str, seconds: float, wait: Optional[_Wait] = None) -> UpstreamTimeout:
        if wait is not None and wait.stalled:
            return UpstreamTimeout(f"llama-server at {self.url} answered no /health probe for {self.stall:g} s "
                                   f"while {path} waited for {what} (frozen?); the slot's state is unknown and was "
                                   f"released")
        return UpstreamTimeout(f"llama-server at {self.url} sent {what} of {path} within {seconds:g} s "
                               f"(frozen or overloaded?); the slot's state is unknown and was released")

    async def call(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        """A small JSON call; raises UpstreamError (unreachable), UpstreamTimeout (no complete reply within
        `timeout`, default the first-byte timeout) or UpstreamReply (error status)."""
        limit = self.first_byte if timeout is None else timeout
        wait = None
        try:
            async with asyncio.timeout(limit) as deadline:
                with self._waiting(deadline) as wait:
                    r = await self._send(self.session.build_request(method, self.url + path, headers=self.auth,
                                                                    json=body), replayable=True)
                    try:
                        data = await r.aread()
                    finally:
                        await r.aclose()
        except TimeoutError as e:
            raise self._timeout(path, "no reply", limit, wait) from e
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

    async def lora_adapters(self) -> list:
        """GET /lora-adapters ([] when the server does not answer it: an older build, or none loaded)."""
        try:
            reply = await self.call("GET", llama.LORA_ADAPTERS)
        except (UpstreamError, UpstreamReply):
            return []
        return reply if isinstance(reply, list) else []

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
                      extra_headers: Optional[dict] = None, tee: Optional[Callable[[bytes], None]] = None,
                      translate: Optional[Translation] = None) -> web.StreamResponse:
        """Stream `request` to llama-server and its reply back, chunk by chunk.

        body: replacement body bytes (else the request body is streamed through). extra_headers: set on the
        reply before prepare(). tee(chunk): sees every chunk as llama-server sent it (metrics), must not keep them
        all. translate: rewrites the reply (decoded) unless its `begin` passes it as it is.
        """
        if body is None and request.body_exists and (request.content_length or 0) <= REPLAYABLE_BODY \
                and request.content_length is not None:
            body = await request.read()
            content_type = request.headers.get("Content-Type")
        else:
            content_type = "application/json"
        streamed = body is None and request.body_exists
        headers = request_headers(request.headers, keep_length=streamed, strip_keys=self.strip_client_key)
        headers.update(self.auth)
        if body is not None and content_type:
            headers["Content-Type"] = content_type
        data: Any = body if body is not None else (request.content.iter_any() if streamed else None)
        req = self.session.build_request(request.method, self.url + path, params=list(request.query.items()),
                                         headers=headers, content=data)
        wait = None
        try:
            async with asyncio.timeout(self.first_byte) as deadline:
                with self._waiting(deadline) as wait:
                    upstream = await self._send(req, replayable=not streamed)
        except TimeoutError as e:
            raise self._timeout(path, "no reply", self.first_byte, wait) from e
        except (httpx.HTTPError, OSError) as e:
            raise self._unreachable(e) from e
        try:
            resp = web.StreamResponse(status=upstream.status_code, reason=upstream.reason_phrase,
                                      headers=reply_headers(upstream.headers))
            content_type = translate.begin(upstream.status_code) if translate is not None else None
            if content_type is not None:
                resp.headers["Content-Type"] = content_type
            else:
                translate = None
            if extra_headers:
                resp.headers.update(extra_headers)
            try:
                await resp.prepare(request)
                # As sent (a compressed body stays compressed), unless it is translated.
                chunks = (upstream.aiter_bytes() if translate else upstream.aiter_raw()).__aiter__()
                while True:
                    wait = None
                    try:
                        async with asyncio.timeout(self.idle) as deadline:
                            with self._waiting(deadline) as wait:
                                chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        return self._cut(request, resp, self._timeout(path, "no further chunk", self.idle, wait))
                    except Unavailable as e:  # stalled between two chunks: cut like a stall within one
                        return self._cut(request, resp, UpstreamTimeout(str(e)))
                    except (httpx.HTTPError, OSError) as e:
                        return self._cut(request, resp, self._unreachable(e))
                    if tee is not None:
                        tee(chunk)
                    out = translate.feed(chunk) if translate else chunk
                    if out:
                        await resp.write(out)
                if translate:
                    await resp.write(translate.finish())
                await resp.write_eof()
            except ConnectionResetError as e:  # aiohttp's ClientConnectionResetError too: the client left first
                log.info("%s %s: client disconnected before the reply was complete (%s)", request.method, path,
                         e or type(e).__name__)
            return resp
        finally:
            await upstream.aclose()
