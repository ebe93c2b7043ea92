"""The GGUF header reader: the sliding window of both test models, and a clear error for other files."""
from __future__ import annotations

import pytest

from kvstore.gguf import GGUFError, metadata, sliding_window


def test_sliding_window_of_the_test_models(models):
    assert sliding_window(str(models["gemma3"])) == 512
    assert sliding_window(str(models["smollm2"])) == 0
    meta = metadata(str(models["gemma3"]), {"gemma3.block_count"})
    assert meta["general.architecture"] == "gemma3" and meta["gemma3.block_count"] == 18


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(GGUFError, match="not a GGUF"):
        sliding_window(str(p))
    p.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(3))
    with pytest.raises(GGUFError, match="truncated"):
        sliding_window(str(p))


def test_n_swa_is_part_of_the_fingerprint(models, start_server):
    """From a real server's /props: Gemma 3 states are bound to its window, SmolLM2's carry no n_swa key."""
    from conftest import http
    from kvstore.fingerprint import server_fingerprint

    s = start_server("gemma3", None, parallel=1, ctx_size=1024)
    status, props = http(s.url + "/props")
    assert status == 200
    assert server_fingerprint(props)["n_swa"] == "512"
    assert "n_swa" not in server_fingerprint({"model_path": str(models["smollm2"])})
