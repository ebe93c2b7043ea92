"""kvstore.save / kvstore.restore against a plain llama-server whose --slot-save-path is the store's sync dir."""
from __future__ import annotations

import pytest

from conftest import complete, post_ok, tokenize

import kvstore
from kvstore import NameNotFound, ServerError
from kvstore.config import sync_dir
from kvstore.llama_client import LlamaServer


def test_save_erase_restore_into_another_slot(served_smollm2):
    s = served_smollm2
    url, st = s.url, s.store
    prompt = "Alice asked about the weather in Lisbon. The assistant said"
    complete(url, prompt, 0, n_predict=4)
    rep = kvstore.save("alice", 0, server=url, store=st)
    assert rep["n_tokens"] > 0 and rep["slot"] == 0 and rep["n_saved"] == rep["n_tokens"]
    assert rep["save_ms"] is not None and rep["total_s"] > 0
    assert not list(s.sync.iterdir()), "the sync directory is empty after a save"
    toks = st.tokens("alice")
    cont = toks + tokenize(url, " and then")
    ref = complete(url, cont, 0, n_predict=8)  # continuing in the original slot

    post_ok(f"{url}/slots/0?action=erase", {})
    post_ok(f"{url}/slots/1?action=erase", {})
    r = kvstore.restore("alice", 1, server=url, store=st)
    assert r["n_restored"] == len(toks) and r["slot"] == 1
    assert not list(s.sync.iterdir()), "the sync directory is empty after a restore"
    got = complete(url, cont, 1, n_predict=8)
    assert got["content"] == ref["content"]
    assert got["timings"]["cache_n"] >= len(toks) - 1, got["timings"]

    # namespaces keep names apart
    kvstore.save("alice", 1, server=url, store=st, namespace="tenant-b")
    assert st.get("alice", namespace="tenant-b")["n_tokens"] != st.get("alice")["n_tokens"]
    assert not list(s.sync.iterdir())


def test_slot_ids_are_validated(served_smollm2):
    s = served_smollm2
    for bad in (2, 3, -1, 7, "1x", None, True):
        with pytest.raises(ValueError):
            kvstore.save("nobody", bad, server=s.url, store=s.store)
        with pytest.raises(ValueError):
            kvstore.restore("nobody", bad, server=s.url, store=s.store)
    assert s.store.get("nobody") is None
    assert not list(s.sync.iterdir())


def test_restore_unknown_name(served_smollm2):
    s = served_smollm2
    with pytest.raises(NameNotFound):
        kvstore.restore("never-saved", 0, server=s.url, store=s.store)
    assert not list(s.sync.iterdir())


def test_server_client(served_smollm2):
    srv = LlamaServer(served_smollm2.url)
    assert srv.n_slots() == 2
    assert srv.n_ctx_slot() == 1024
    assert srv.tokenize("hello world")
    assert len(srv.slots()) == 2
    fp = srv.fingerprint()
    assert fp["model"].startswith(("blake3:", "sha256:")) and fp["n_ctx_slot"] == "1024"
    assert srv.is_kvstore() is False
    with pytest.raises(ValueError):
        srv.erase_slot(5)
    with pytest.raises(ServerError) as e:  # the server's own error text, status and URL
        srv.post("/slots/0?action=save", {"filename": "../escape.bin"})
    assert e.value.status == 400 and "Invalid filename" in str(e.value) and served_smollm2.url in str(e.value)


def test_unreachable_server(tmp_path):
    from kvstore.engine import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerError) as e:
        kvstore.save("x", 0, server=url, store=tmp_path / "s")
    assert url in str(e.value)


def test_server_not_using_the_sync_dir(served_smollm2, tmp_path):
    """A store whose sync dir is not the server's --slot-save-path: a clear error, nothing stored."""
    s = served_smollm2
    other = kvstore.open_store(tmp_path / "other")
    before = set(s.sync.iterdir())
    with pytest.raises(ServerError) as e:
        kvstore.save("x", 0, server=s.url, store=other)
    assert str(sync_dir(tmp_path / "other")) in str(e.value)
    assert other.get("x") is None
    for p in set(s.sync.iterdir()) - before:  # what the server wrote into its own directory
        p.unlink()


def test_failed_restore_reports_cleared_slot(served_smollm2, state_files):
    """A state the server refuses (another cache layout: fa off): ServerError says the slot was cleared."""
    s = served_smollm2
    # force: the store itself refuses a second layout under one fingerprint (tests/format/test_incomplete.py)
    s.store.ingest("fa-off", str(state_files["smollm2_fa_off"]), fingerprint=LlamaServer(s.url).fingerprint(),
                   force=True)
    with pytest.raises(ServerError) as e:
        kvstore.restore("fa-off", 1, server=s.url, store=s.store)
    assert "cleared" in str(e.value) and "slot 1" in str(e.value)
    assert not list(s.sync.iterdir())


def test_kv_unified_server(start_server, store, tmp_path):
    """With --kv-unified all slots share one stream (n_stream 1), which /props does not report: restore
    re-emits for the slot count first and falls back to one stream; the state continues identically."""
    s = start_server("smollm2", sync_dir(tmp_path / "store"), parallel=2, ctx_size=2048, flash_attn="on",
                     kv_unified=True)
    complete(s.url, "Unified caches share one stream. For example", 0, n_predict=4)
    kvstore.save("u", 0, server=s.url, store=store)
    cont = store.tokens("u") + tokenize(s.url, " and so")
    ref = complete(s.url, cont, 0, n_predict=8)
    post_ok(f"{s.url}/slots/0?action=erase", {})
    r = kvstore.restore("u", 1, server=s.url, store=store)
    assert r["n_restored"] == len(store.tokens("u"))
    assert complete(s.url, cont, 1, n_predict=8)["content"] == ref["content"]
    assert not list(sync_dir(tmp_path / "store").iterdir())


def test_cli_save_restore(served_smollm2):
    import json
    import subprocess
    import sys

    from conftest import ROOT

    s = served_smollm2
    complete(s.url, "Bob likes trains because", 0, n_predict=4)

    def kv(*args):
        r = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", s.store.path, "--json", *args],
                           capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    saved = kv("save", "bob", "--slot", "0", "--server", s.url, "--namespace", "cli")
    restored = kv("restore", "bob", "--slot", "1", "--server", s.url, "--namespace", "cli")
    assert restored["n_restored"] == saved["n_tokens"] > 0
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", s.store.path, "restore", "bob", "--slot",
                        "9", "--server", s.url, "--namespace", "cli"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "slot 9 does not exist" in r.stderr
    assert not list(s.sync.iterdir())
