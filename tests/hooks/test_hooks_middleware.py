"""Unit tests of the error middleware: each exception the proxy raises becomes one HTTP status and body.

A tiny aiohttp app whose handler raises the exception under test, served on a loopback port (no llama-server);
the real proxy's replies for bad names, missing states and upstream failures are tested in test_hooks_errors.py.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvstore.errors import (CorruptObject, FingerprintMismatch, InvalidName, KvStoreError, NameNotFound,
                            StoreFull)
from kvstore.hooks.errors import (BadRequest, NotFound, QueueFull, Unavailable, UpstreamError, UpstreamReply,
                                  UpstreamTimeout)
from kvstore.hooks.middleware import error_middleware, reply_for
from kvstore.hooks.naming import BadName


def served(exc: BaseException):
    """(status, headers, body) of a request to a handler that raises `exc`."""

    async def handler(request):
        raise exc

    async def go():
        app = web.Application(middlewares=[error_middleware])
        app.router.add_get("/", handler)
        async with TestClient(TestServer(app)) as client:
            r = await client.get("/")
            return r.status, dict(r.headers), await r.read()

    return asyncio.run(go())


@pytest.mark.parametrize("exc, status, kind", [
    (BadRequest("request body is not valid JSON"), 400, "invalid_request_error"),
    (BadName("name: contains '/'"), 400, "invalid_request_error"),
    (InvalidName("name contains '/'"), 400, "invalid_request_error"),
    (NotFound("ns", "alice"), 404, "not_found_error"),
    (NameNotFound("no state named 'alice'"), 404, "not_found_error"),
    (QueueFull("all 2 slots busy and 64 requests waiting"), 503, "unavailable_error"),
    (UpstreamError("llama-server at http://x unreachable"), 502, "upstream_error"),
    (UpstreamTimeout("llama-server at http://x sent no reply of /completion within 5 s"), 504, "timeout_error"),
    (Unavailable("not ready: waiting for llama-server at http://x"), 503, "unavailable_error"),
    (FingerprintMismatch("model differs"), 409, "conflict_error"),
    (StoreFull("disk full"), 507, "store_full_error"),
    (CorruptObject("object 3fa2c1d0: hash mismatch"), 500, "store_error"),
    (KvStoreError("something in the store"), 500, "store_error"),
])
def test_status_and_body(exc, status, kind):
    got, headers, body = served(exc)
    assert got == status
    err = json.loads(body)["error"]
    assert err["type"] == kind
    assert err["message"] == str(exc.args[0])  # the exception's own text, unquoted (KeyError would quote it)
    assert ("Retry-After" in headers) == isinstance(exc, (QueueFull, Unavailable))


def test_not_found_names_the_state():
    _, _, body = served(NotFound("team", "alice"))
    assert json.loads(body)["error"]["message"] == "no state named 'alice' in namespace 'team'"


def test_upstream_reply_is_passed_on():
    body = b'{"error": {"code": 400, "message": "bad prompt", "type": "invalid_request_error"}}'
    status, headers, got = served(UpstreamReply(400, body))
    assert status == 400 and got == body and headers["Content-Type"].startswith("application/json")


def test_other_exceptions_are_not_ours():
    assert reply_for(RuntimeError("bug")) is None
    status, _, _ = served(RuntimeError("bug"))
    assert status == 500  # aiohttp's own reply; the middleware does not hide a bug as a client error
    status, _, _ = served(web.HTTPNotFound())
    assert status == 404
