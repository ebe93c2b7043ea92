"""What a client may reach, and as whom: the one route table, the allowlist it makes, and the gate middleware.

Contract: `ROUTES` is the only list of endpoints. It builds both the aiohttp router (`add_routes`) and the
allowlist checked on the raw request path (before any decoding or normalization): a path must equal a route's
`path` for its method, or fully match its `raw` pattern (templated paths); anything else is 404, so `/slots/0/`,
`/./slots/0`, `//slots/0` and `/%73lots/0` never reach a handler or llama-server. A query parameter given twice is
400 (`?action=bogus&action=save` must not mean two things to two parsers). Then the caller is identified
(`auth.Tenancy`): 401 without a valid key, except for `open` routes. `admin` routes need an admin key once keys
are configured (llama-server's `/slots` shows every slot).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from aiohttp import web

from .auth import Caller, Tenancy
from .errors import BadRequest, Forbidden, RouteNotFound

COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")
CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
RESPONSES_PATHS = ("/responses", "/v1/responses")  # OpenAI's Responses API: llama-server honours id_slot there
# Anthropic's Messages API: llama-server rebuilds the request from the fields it knows and drops id_slot, so the
# hooks make that rebuild themselves and send it to chat completions (`kvstore.anthropic_api`).
MESSAGES_PATHS = ("/v1/messages",)
SLOT_ONLY_PATHS = ("/infill",)  # evaluate in a slot, but never named
# Embeddings and reranking: llama-server runs them in a slot it picks itself (it ignores id_slot there) and
# evaluates from scratch, discarding that slot's cells (measured: a resident state lost), so they are refused, with
# why. (A llama-server without --embeddings / --reranking refuses them too.)
SLOT_CLOBBERING_PATHS = ("/embedding", "/embeddings", "/v1/embeddings", "/rerank", "/reranking", "/v1/rerank",
                         "/v1/reranking")
# llama-server's run-time adapter scales: a change would alter what every kept state's cells were evaluated with,
# unseen by the fingerprint (taken from the adapters at start-up): POST refused, with why; GET forwarded.
LORA_PATH = "/lora-adapters"
HEALTH_PATHS = ("/health", "/v1/health")  # open; until llama-server is ready, a 503 saying why

_NAME = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})+"
_STATE = re.compile(rf"/kvstore/states/{_NAME}")
# Any id-like segment reaches the handler, which answers a bad id with 400 and never forwards the raw path.
_SLOT = re.compile(r"/slots/[A-Za-z0-9+-]{1,20}")


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # the aiohttp path (with `{name}` / `{id}` when `raw` is set)
    handler: str  # the `Handlers` method that answers it
    raw: Optional[re.Pattern] = None  # the allowed raw paths of a templated route
    open: bool = False  # reachable without a key (as on llama-server itself)
    admin: bool = False  # needs an admin key once keys are configured


ROUTES: tuple[Route, ...] = (
    *(Route("POST", p, "completion")
      for p in COMPLETION_PATHS + CHAT_PATHS + RESPONSES_PATHS + MESSAGES_PATHS + SLOT_ONLY_PATHS),
    Route("POST", "/slots/{id}", "slot_action", raw=_SLOT),
    Route("GET", "/kvstore/states", "state_list"),
    Route("POST", "/kvstore/states/{name}", "prime", raw=_STATE),
    Route("GET", "/kvstore/states/{name}", "state_info", raw=_STATE),
    Route("DELETE", "/kvstore/states/{name}", "state_delete", raw=_STATE),
    Route("GET", "/kvstore/stats", "stats"),
    Route("GET", "/kvstore/", "status_page"),
    Route("GET", "/metrics", "prometheus"),
    # Forwarded to llama-server as they are (no slot, no state): read-only facts and stateless computations.
    *(Route("GET", p, "passthrough", open=True) for p in HEALTH_PATHS),
    Route("GET", "/props", "passthrough"),
    Route("GET", LORA_PATH, "passthrough"),
    Route("GET", "/v1/models", "passthrough", open=True),
    Route("GET", "/models", "passthrough", open=True),
    Route("GET", "/slots", "passthrough", admin=True),
    *(Route("POST", p, "passthrough") for p in ("/tokenize", "/detokenize", "/apply-template")),
    # Token counts: the prompt is rendered and tokenized on llama-server's HTTP thread, no slot is touched.
    *(Route("POST", p, "passthrough") for p in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens",
                                                "/responses/input_tokens", "/v1/responses/input_tokens",
                                                "/v1/messages/count_tokens")),
    # llama-server's, but not served: each would spoil a kept state (501 with the reason).
    Route("POST", LORA_PATH, "lora_scales"),
    *(Route("POST", p, "slot_clobbering") for p in SLOT_CLOBBERING_PATHS),
)

EXACT: dict[str, frozenset[str]] = {m: frozenset(r.path for r in ROUTES if r.method == m and r.raw is None)
                                    for m in {r.method for r in ROUTES}}
PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    m: tuple(r.raw for r in ROUTES if r.method == m and r.raw is not None) for m in {r.method for r in ROUTES}}
OPEN = frozenset((r.method, r.path) for r in ROUTES if r.open)
ADMIN_ONLY = frozenset((r.method, r.path) for r in ROUTES if r.admin)
CALLER = web.RequestKey("caller", Caller)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(router: web.UrlDispatcher, handlers: object) -> None:
    """Every route of `ROUTES` on `router`, answered by the `handlers` method it names (no HEAD: not allowed)."""
    for r in ROUTES:
        fn: Handler = getattr(handlers, r.handler)
        router.add_route(r.method, r.path, fn)


def caller(request: web.Request) -> Caller:
    """The Caller the gate identified for this request."""
    return request[CALLER]


def allowed(method: str, raw_path: str) -> bool:
    path = raw_path.split("?", 1)[0]
    if path in EXACT.get(method, ()):
        return True
    return any(p.fullmatch(path) for p in PATTERNS.get(method, ()))


def gate(tenancy: Tenancy) -> Callable:
    """The middleware: allowlist, single-valued query, caller. Runs inside the error middleware."""

    @web.middleware
    async def gate_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        method, path = request.method, request.raw_path.split("?", 1)[0]
        if not allowed(method, request.raw_path):
            raise RouteNotFound(f"{method} {path} is not an endpoint of this server")
        dup = sorted({k for k in request.query if len(request.query.getall(k)) > 1})
        if dup:
            raise BadRequest(f"query parameter(s) {', '.join(dup)} given more than once")
        if (method, path) in OPEN:
            request[CALLER] = Caller("", admin=not tenancy.enabled)
        else:
            request[CALLER] = c = tenancy.caller(request.headers)
            if tenancy.enabled and (method, path) in ADMIN_ONLY and not c.admin:
                raise Forbidden(f"{method} {path} needs an admin key")
        return await handler(request)

    return gate_middleware
