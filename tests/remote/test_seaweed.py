"""The SeaweedFS test fixture itself: a real S3 server that can be taken away and brought back with its data."""
from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from conftest import S3_BUCKET


def _put(url: str, data: bytes, headers=None) -> int:
    req = urllib.request.Request(url, data=data, method="PUT", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_bucket_survives_stop_and_start(seaweed):
    key = f"fixture-check/{time.time_ns()}.bin"
    assert _put(f"{seaweed.endpoint}/{S3_BUCKET}/{key}", b"x" * 5000) == 200
    # the conditional create the store's names rely on: a second create of the same key is refused
    assert _put(f"{seaweed.endpoint}/{S3_BUCKET}/{key}", b"y", {"If-None-Match": "*"}) == 412
    seaweed.stop()
    t0 = time.monotonic()
    with pytest.raises(OSError):  # gone: refused at once, no hang
        urllib.request.urlopen(f"{seaweed.endpoint}/{S3_BUCKET}", timeout=10)
    assert time.monotonic() - t0 < 5
    seaweed.start()
    assert key in seaweed.list_keys(S3_BUCKET, "fixture-check/")
    assert seaweed.get_object(S3_BUCKET, key) == b"x" * 5000


def test_env_is_explicit(seaweed):
    import os

    env = seaweed.env({})
    assert env["AWS_ENDPOINT_URL"] == seaweed.endpoint and env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert os.environ.get("AWS_ENDPOINT_URL") != seaweed.endpoint  # not leaked into this process
