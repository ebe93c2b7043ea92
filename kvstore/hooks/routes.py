"""What a client may reach, and as whom: the route allowlist and the gate middleware in front of every handler.

The raw request path (before any decoding or normalization) must equal one of `EXACT` for its method, or match
one of `PATTERNS`; anything else is 404, so `/slots/0/`, `/./slots/0`, `//slots/0` and `/%73lots/0` never reach a
handler or llama-server. A query parameter given twice is 400 (`?action=bogus&action=save` must not mean two things
to two parsers). Then the caller is identified (`auth.Tenancy`): 401 without a valid key, except for `OPEN`
routes. `ADMIN_ONLY` routes need an admin key once keys are configured (llama-server's `/slots` shows every slot).
"""
from __future__ import annotations

import re

from aiohttp import web

from .auth import Caller, Tenancy
from .errors import BadRequest, Forbidden, RouteNotFound

COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")
CHAT_PATHS = ("/chat/completions", "/v1/chat/completions")
SLOT_ONLY_PATHS = ("/infill",)  # evaluate in a slot, but never named
# Forwarded to llama-server as they are (no slot, no state): read-only facts and stateless computations.
PASSTHROUGH_GET = ("/health", "/props", "/v1/models", "/models", "/slots")
PASSTHROUGH_POST = ("/tokenize", "/detokenize", "/apply-template", "/embedding", "/embeddings", "/v1/embeddings")
OWN_GET = ("/kvstore/stats", "/kvstore/states", "/kvstore/", "/metrics")

EXACT: dict[str, frozenset[str]] = {
    "GET": frozenset(PASSTHROUGH_GET + OWN_GET),
    "POST": frozenset(COMPLETION_PATHS + CHAT_PATHS + SLOT_ONLY_PATHS + PASSTHROUGH_POST),
}
_NAME = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})+"
PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    "GET": (re.compile(rf"/kvstore/states/{_NAME}"),),
    # Any id-like segment reaches the handler, which answers a bad id with 400 and never forwards the raw path.
    "POST": (re.compile(r"/slots/[A-Za-z0-9+-]{1,20}"), re.compile(rf"/kvstore/states/{_NAME}")),
    "DELETE": (re.compile(rf"/kvstore/states/{_NAME}"),),
}
OPEN = frozenset({("GET", "/health"), ("GET", "/models"), ("GET", "/v1/models")})  # as llama-server's own
ADMIN_ONLY = frozenset({("GET", "/slots")})
CALLER = web.RequestKey("caller", Caller)


def caller(request: web.Request) -> Caller:
    """The Caller the gate identified for this request."""
    return request[CALLER]

def allowed(method: str, raw_path: str) -> bool:
    path = raw_path.split("?", 1)[0]
    if path in EXACT.get(method, ()):
        return True
    return any(p.fullmatch(path) for p in PATTERNS.get(method, ()))


def gate(tenancy: Tenancy):
    """The middleware: allowlist, single-valued query, caller. Runs inside the error middleware."""

    @web.middleware
    async def gate_middleware(request: web.Request, handler) -> web.StreamResponse:
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
