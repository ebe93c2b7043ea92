"""The proxy's own exceptions (no aiohttp): what a handler, the broker or the upstream client may raise.

Each maps to one HTTP status in `middleware.py`; the store's exceptions (`kvstore.errors`) are mapped there too.
"""
from __future__ import annotations

from .slot import QueueFull  # noqa: F401 - re-exported: every slot is busy and the wait queue is full (503)


class BadRequest(Exception):
    """The request itself is wrong (400); str() is the reason for the client."""


class NotFound(Exception):
    """The requested state does not exist (404)."""

    def __init__(self, namespace: str, name: str):
        super().__init__(f"no state named {name!r} in namespace {namespace!r}")
        self.namespace, self.name = namespace, name


class UpstreamError(Exception):
    """llama-server could not be reached or answered garbage (502)."""


class UpstreamReply(Exception):
    """llama-server answered with an error status; `status` and `body` are passed on to the client."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"llama-server answered {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class NotStored(Exception):
    """The broker found no stored state to restore (the request goes on without it)."""


class RestoreFailed(Exception):
    """Materializing or restoring a stored state failed; the slot is empty, the request goes on without it."""
