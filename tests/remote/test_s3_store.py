"""A store in an S3 bucket (a real SeaweedFS, tests/seaweed.py) with the local disk as a cache: the Python API,
the `kvstore` command on `--store s3://...`, and bad input. The two-server tests are in test_s3_servers.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time


from conftest import ROOT, S3_BUCKET, copy_state, tree_snapshot

import kvstore


def kv(*args, env, timeout=180):
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=timeout)
    return r


def _objects_in_bucket(seaweed, url: str) -> list[str]:
    prefix = url[len(f"s3://{S3_BUCKET}/"):]
    return seaweed.list_keys(S3_BUCKET, prefix + "/")


def test_api_round_trip_and_a_second_cache(state_files, seaweed, s3env, s3_url, tmp_path):
    parent, child = state_files["smollm2_parent"], state_files["smollm2_child"]
    a = kvstore.open_store(s3_url, cache=tmp_path / "a")
    assert a.remote == s3_url and os.path.samefile(a.cache_dir, tmp_path / "a")
    assert (tmp_path / "a" / "sync").is_dir()  # llama-server's --slot-save-path lives under the cache
    r1 = a.ingest("article", str(parent), fingerprint={"model": "m"})
    r2 = a.ingest("q1", str(child), parent="article", fingerprint={"model": "m"})
    assert r2["reused_bytes"] > 0 and r2["new_stored_bytes"] < r1["new_stored_bytes"]
    assert _objects_in_bucket(seaweed, s3_url), "nothing was written to the bucket"

    # another machine: an empty cache finds both names at once, restores byte-exact, shares the dedup
    b = kvstore.open_store(s3_url, cache=tmp_path / "b")
    assert {e["name"] for e in b.list()} == {"article", "q1"}
    assert b.get("q1")["parent"] == r1["manifest_id"]
    out = tmp_path / "q1.bin"
    b.materialize("q1", str(out))
    assert out.read_bytes() == child.read_bytes()
    assert b.lookup(b.tokens("article") + [1, 2, 3], fingerprint={"model": "m"})["name"] == "article"
    v = b.verify(where="bucket")
    assert not v["corrupt"] and not v["missing"] and v["objects_checked"] > 0
    v = b.verify(where="cache")
    assert not v["corrupt"] and not v["missing"]

    # a name removed on B is gone for A; gc (grace 0) frees only the removed name's own objects
    assert b.remove("q1")
    assert a.get("q1") is None
    time.sleep(2)  # the bucket's LastModified has 1 s resolution: objects of this second count as young
    g = a.gc(grace_seconds=0)
    assert g["dead_objects"] > 0
    a.materialize("article", str(out))
    assert out.read_bytes() == parent.read_bytes()
    assert not a.verify(where="both")["missing"]


def test_reindex_rebuilds_a_lost_cache(state_files, s3env, s3_url, tmp_path):
    import shutil

    a = kvstore.open_store(s3_url, cache=tmp_path / "a")
    a.ingest("fa_on", str(state_files["smollm2_fa_on"]))
    a.ingest("other", str(state_files["smollm2_fa_off"]), namespace="t")
    del a
    shutil.rmtree(tmp_path / "a")
    a = kvstore.open_store(s3_url, cache=tmp_path / "a")
    r = a.reindex()
    assert isinstance(r, dict)
    assert {(e["namespace"], e["name"]) for e in a.list()} == {("", "fa_on"), ("t", "other")}
    out = tmp_path / "x.bin"
    a.materialize("other", str(out), namespace="t")
    assert out.read_bytes() == state_files["smollm2_fa_off"].read_bytes()


def test_cli_on_a_bucket(state_files, seaweed, s3_url, tmp_path):
    env = seaweed.env()
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")  # the default cache goes here
    f = copy_state(state_files["smollm2_parent"], tmp_path / "p.bin")
    r = kv("--store", s3_url, "ingest", f, "--name", "article", env=env)
    assert r.returncode == 0, r.stderr
    caches = list((tmp_path / "xdg" / "kvstore").iterdir())
    assert len(caches) == 1 and (caches[0] / "sync").is_dir()  # ~/.cache/kvstore/<hash>
    other = ["--store", s3_url, "--cache", tmp_path / "other", "--cache-size", "64M"]
    r = kv(*other, "--json", "ls", env=env)
    assert r.returncode == 0, r.stderr
    assert [e["name"] for e in __import__("json").loads(r.stdout)] == ["article"]
    for cmd in (["stats"], ["verify"], ["verify", "--where", "bucket"], ["verify", "--where", "cache"],
                ["gc", "--dry-run"], ["reindex"]):
        r = kv(*other, *cmd, env=env)
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    r = kv(*other, "stats", env=env)
    assert s3_url in r.stdout
    out = tmp_path / "out.bin"
    r = kv(*other, "materialize", "article", out, env=env)
    assert r.returncode == 0 and out.read_bytes() == f.read_bytes(), r.stderr
    r = kv(*other, "rm", "article", env=env)
    assert r.returncode == 0, r.stderr
    r = kv("--store", s3_url, "--json", "ls", env=env)
    assert r.stdout.strip() == "[]", r.stdout


def test_unreachable_endpoint_is_a_clear_error_and_changes_nothing(seaweed, s3_url, tmp_path):
    from seaweed import free_ports

    env = seaweed.env()
    env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    before = tree_snapshot(tmp_path)
    for cmd in (["ls"], ["stats"], ["verify"], ["gc"], ["reindex"]):
        t0 = time.monotonic()
        r = kv("--store", s3_url, "--cache", tmp_path / "cache", *cmd, env=env, timeout=120)
        took = time.monotonic() - t0
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert r.stderr.startswith("kvstore: error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "127.0.0.1" in r.stderr or s3_url in r.stderr, r.stderr  # says which endpoint or bucket
        assert took < 60, f"{cmd}: {took:.0f} s to give up"
    assert tree_snapshot(tmp_path) == before


def test_missing_bucket_is_a_clear_error(seaweed, tmp_path):
    env = seaweed.env()
    r = kv("--store", "s3://no-such-bucket-here/x", "--cache", tmp_path / "c", "ls", env=env)
    assert r.returncode == 2 and "no-such-bucket-here" in r.stderr, (r.stdout, r.stderr)
    assert not (tmp_path / "c").exists()


def test_save_restore_through_a_plain_llama_server(s3env, s3_url, tmp_path, start_server):
    """kvstore.save/restore(store=S3 store) with llama-server's --slot-save-path = the cache's sync dir."""
    from conftest import complete, post_ok, tokenize

    from kvstore.config import sync_dir_of

    st = kvstore.open_store(s3_url, cache=tmp_path / "cache")
    srv = start_server("smollm2", sync_dir_of(st), parallel=2, ctx_size=2048, flash_attn="on")
    prompt = "Alice asked about the weather in Lisbon. The assistant said"
    complete(srv.url, prompt, 0, n_predict=4)
    rep = kvstore.save("alice", 0, server=srv.url, store=st)
    assert rep["n_tokens"] > 0
    toks = st.tokens("alice")
    cont = toks + tokenize(srv.url, " and then")
    ref = complete(srv.url, cont, 0, n_predict=8)
    post_ok(f"{srv.url}/slots/1?action=erase", {})
    other = kvstore.open_store(s3_url, cache=tmp_path / "cold")  # another machine's empty cache
    post_ok(f"{srv.url}/slots/0?action=erase", {})
    r = kvstore.restore("alice", 1, server=srv.url, store=st)
    assert r["n_restored"] == len(toks)
    assert complete(srv.url, cont, 1, n_predict=8)["content"] == ref["content"]
    assert other.get("alice")["n_tokens"] == len(toks)
    assert not list(sync_dir_of(st).iterdir())


def test_bucket_errors_are_503_in_the_one_table():
    import json

    from kvstore.errors import GcLocked, RemoteUnavailable
    from kvstore.hooks.middleware import reply_for

    for exc in (RemoteUnavailable("the bucket of s3://x/y did not answer"), GcLocked("a gc holds s3://x/y")):
        r = reply_for(exc)
        assert r is not None and r.status == 503 and r.headers["Retry-After"] == "5"
        assert json.loads(r.body)["error"] == {"message": str(exc), "type": "unavailable_error"}
