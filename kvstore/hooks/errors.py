"""The proxy's own exceptions (no aiohttp): what a handler, the broker, the slot table or the upstream client
may raise.

Contract: each maps to one HTTP status in `middleware.py` (the store's exceptions, `kvstore.errors`, are mapped
there too). This module imports nothing of the proxy's, so every other module of it may import this one.
"""
from __future__ import annotations

from kvstore.errors import GcLocked, RemoteUnavailable  # noqa: F401 - re-exported for the table in middleware.py


class BadRequest(Exception):
    """The request itself is wrong (400); str() is the reason for the client."""


class NotFound(Exception):
    """The requested state does not exist (404)."""

    def __init__(self, namespace: str, name: str):
        super().__init__(f"no state named {name!r} in namespace {namespace!r}")
        self.namespace, self.name = namespace, name


class Unauthorized(Exception):
    """No valid API key (401)."""


class Forbidden(Exception):
    """A valid key asking for another namespace's state or slot, or an admin route (403)."""


class RouteNotFound(Exception):
    """The raw method and path are not on the route allowlist (404)."""


class NotSupported(Exception):
    """An endpoint of llama-server's that the hooks cannot serve without risking a kept state (501); str() says why
    and what to do instead."""


class UpstreamError(Exception):
    """llama-server could not be reached or answered garbage (502)."""


class UpstreamTimeout(UpstreamError):
    """llama-server did not answer (first byte) or stopped sending (idle) in time (504); the slot's state is unknown."""


class Unavailable(Exception):
    """The hooks cannot serve now (llama-server not ready yet, or a slot that could not be saved): 503 +
    Retry-After."""


class QueueFull(Exception):
    """Every slot is busy and the wait queue is at its bound (503 + Retry-After)."""


class SaveFailed(Unavailable):
    """A dirty slot could not be saved before reuse (it keeps its state)."""


class UpstreamReply(Exception):
    """llama-server answered with an error status; `status` and `body` are passed on to the client."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"llama-server answered {status}: {body[:300]!r}")
        self.status = status
        self.body = body


def remote_unavailable(e: BaseException) -> bool:
    """Did this fail because an S3 store's bucket could not be reached (`RemoteUnavailable`, raised by the core
    within a bounded time), directly or as the cause of `e`? Such failures are 503s; the local cache keeps serving
    what it holds."""
    return isinstance(e, RemoteUnavailable) or isinstance(e.__cause__, RemoteUnavailable)


class NotStored(Exception):
    """The broker found no stored state to restore (the request goes on without it)."""


class RestoreFailed(Exception):
    """Materializing or restoring a stored state failed; the slot is empty, the request goes on without it."""
