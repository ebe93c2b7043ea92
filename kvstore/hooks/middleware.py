"""The one place where an exception becomes an HTTP reply: `error_middleware` and its table.

Contract: handlers and the broker raise; nothing else builds an error reply from an exception. Every error body has
llama-server's (and OpenAI's) shape: `{"error": {"message", "type"}}`.

| exception | status | type |
|---|---|---|
| `BadRequest` (incl. `naming.BadName`), `kvstore.errors.InvalidName` | 400 | invalid_request_error |
| `NotFound`, `kvstore.errors.NameNotFound`, `RouteNotFound` | 404 | not_found_error |
| `NotSupported` | 501 | not_supported_error |
| `Unauthorized` | 401 + `WWW-Authenticate: Bearer` | authentication_error |
| `Forbidden` | 403 | permission_error |
| `QueueFull` | 503 + `Retry-After: 1` | unavailable_error |
| `UpstreamReply` | llama-server's status, its body passed on | - |
| `UpstreamTimeout` | 504 | timeout_error |
| `UpstreamError` | 502 | upstream_error |
| `Unavailable` (llama-server not ready, a slot's save failed) | 503 + `Retry-After: 5` | unavailable_error |
| `kvstore.errors.RemoteUnavailable` (an S3 store's bucket unreachable), `GcLocked` (a gc held the bucket's lock longer than a save waits) | 503 + `Retry-After: 5` | unavailable_error |
| `kvstore.errors.FingerprintMismatch` | 409 | conflict_error |
| `kvstore.errors.StoreFull` | 507 | store_full_error |
| any other `kvstore.errors.KvStoreError` | 500 | store_error |

Once a reply's headers are sent nothing can be changed: such errors are logged by `upstream.forward` and the reply
is cut; aiohttp's own `HTTPException`s pass through untouched.
"""
from __future__ import annotations

import logging
from typing import Optional

from aiohttp import web

from kvstore.errors import FingerprintMismatch, InvalidName, KvStoreError, NameNotFound, StoreFull, error_message

from .errors import (BadRequest, Forbidden, GcLocked, NotFound, NotSupported, QueueFull, RemoteUnavailable,
                     RouteNotFound, Unauthorized, Unavailable, UpstreamError, UpstreamReply, UpstreamTimeout)

log = logging.getLogger("kvstore.hooks")

# (exception class, status, error type, extra headers), first match wins: subclasses before their bases.
STATUSES: tuple[tuple[type, int, str, Optional[dict]], ...] = (
    (BadRequest, 400, "invalid_request_error", None),
    (InvalidName, 400, "invalid_request_error", None),
    (NotFound, 404, "not_found_error", None),
    (NameNotFound, 404, "not_found_error", None),
    (RouteNotFound, 404, "not_found_error", None),
    (NotSupported, 501, "not_supported_error", None),
    (Unauthorized, 401, "authentication_error", {"WWW-Authenticate": "Bearer"}),
    (Forbidden, 403, "permission_error", None),
    (QueueFull, 503, "unavailable_error", {"Retry-After": "1"}),
    (Unavailable, 503, "unavailable_error", {"Retry-After": "5"}),
    (UpstreamTimeout, 504, "timeout_error", None),
    (UpstreamError, 502, "upstream_error", None),
    (RemoteUnavailable, 503, "unavailable_error", {"Retry-After": "5"}),
    (GcLocked, 503, "unavailable_error", {"Retry-After": "5"}),
    (FingerprintMismatch, 409, "conflict_error", None),
    (StoreFull, 507, "store_full_error", None),
    (KvStoreError, 500, "store_error", None),
)


def error(status: int, message: str, kind: str = "invalid_request_error", headers: Optional[dict] = None
          ) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status, headers=headers)


def reply_for(e: BaseException) -> Optional[web.Response]:
    """The reply for an exception, or None when it is not one of ours (it then propagates: a 500 by aiohttp)."""
    if isinstance(e, UpstreamReply):  # e.g. /tokenize refused the prompt: pass llama-server's answer on
        return web.Response(status=e.status, body=e.body, content_type="application/json")
    for cls, status, kind, headers in STATUSES:
        if isinstance(e, cls):
            if status >= 500 and status != 503 and not isinstance(e, UpstreamError):
                log.error("%s %s", type(e).__name__, e)
            elif isinstance(e, RemoteUnavailable):
                log.warning("store unavailable: %s", e)
            return error(status, error_message(e), kind, headers=headers)
    return None


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 - mapped or re-raised
        reply = reply_for(e)
        if reply is None:
            raise
        return reply
