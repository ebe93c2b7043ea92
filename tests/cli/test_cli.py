"""The `kvstore` command, run as a separate process like a user would."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, copy_state, tree_snapshot

from kvstore.cli import valid_server_filename


def kv(*args, env=None, check_rc=None):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, env=e, timeout=300)
    if check_rc is not None:
        assert r.returncode == check_rc, (args, r.returncode, r.stdout, r.stderr)
    return r


def test_ingest_ls_stats_materialize_rm_gc_verify(state_files, tmp_path):
    s = tmp_path / "store"
    parent, child = state_files["smollm2_parent"], state_files["smollm2_child"]
    # Both in namespace t: dedup works within a namespace only (docs/design.md "Objects", Scope).
    r = kv("--store", s, "ingest", parent, "--name", "article", "--namespace", "t", "--fingerprint", "model=m1",
           "n_ctx_slot=2048", check_rc=0)
    assert "article" in r.stdout and "MiB" in r.stdout
    r = kv("--store", s, "--json", "ingest", child, "--name", "q1", "--parent", "article", "--namespace", "t",
           check_rc=0)
    rep = json.loads(r.stdout)
    assert rep["n_tokens"] > 300 and rep["reused_bytes"] > 0 and rep["parent_manifest"]

    r = kv("--store", s, "ls", check_rc=0)
    assert "article" in r.stdout and "q1" in r.stdout and "TOKENS" in r.stdout and "ALONE" in r.stdout
    r = kv("--store", s, "--json", "ls", "--namespace", "t", check_rc=0)
    items = json.loads(r.stdout)
    assert [i["name"] for i in items] == ["article", "q1"]
    # What each alone holds (what evicting it would free): the question shares the article's blocks, so each owns
    # only what the other does not reference, and together they own less than the store holds.
    owned = {i["name"]: i["owned_bytes"] for i in items}
    assert owned["article"] > 0 and owned["q1"] > 0, owned
    assert kv("--store", s, "--json", "ls", "--namespace", "", check_rc=0).stdout.strip() == "[]"

    r = kv("--store", s, "stats", "--json", check_rc=0)  # --json also after the command
    st = json.loads(r.stdout)
    assert st["names"] == 2 and st["stored_bytes"] > 0 and st["dedup_ratio"] > 1.0
    assert sum(owned.values()) < st["stored_bytes"], (owned, st["stored_bytes"])
    r = kv("--store", s, "stats", check_rc=0)
    assert "MiB" in r.stdout and "dedup ratio" in r.stdout

    out = tmp_path / "out.bin"
    kv("--store", s, "materialize", "q1", out, "--namespace", "t", check_rc=0)
    assert out.read_bytes() == child.read_bytes()
    r = kv("--store", s, "--json", "info", out, check_rc=0)
    assert json.loads(r.stdout)["n_tokens"] == rep["n_tokens"]
    r = kv("--store", s, "info", out, check_rc=0)
    assert "tokens" in r.stdout

    # $KVSTORE_DIR is the default store
    r = kv("--json", "stats", env={"KVSTORE_DIR": str(s)}, check_rc=0)
    assert json.loads(r.stdout)["names"] == 2

    kv("--store", s, "rm", "q1", "--namespace", "t", check_rc=0)
    r = kv("--store", s, "rm", "q1", "--namespace", "t", check_rc=2)
    assert r.stderr.startswith("kvstore: error: ") and len(r.stderr.strip().splitlines()) == 1
    snap = tree_snapshot(s / "objects")
    r = kv("--store", s, "--json", "gc", "--dry-run", "--grace", "0", check_rc=0)
    g = json.loads(r.stdout)
    assert g["dry_run"] and g["dead_objects"] > 0
    assert tree_snapshot(s / "objects") == snap
    r = kv("--store", s, "gc", "--grace", "0", check_rc=0)
    assert "MiB" in r.stdout
    assert tree_snapshot(s / "objects") != snap
    r = kv("--store", s, "verify", check_rc=0)
    assert "ok" in r.stdout
    kv("--store", s, "materialize", "article", out, "--namespace", "t", check_rc=0)
    assert out.read_bytes() == parent.read_bytes()


@pytest.mark.parametrize("how", ["garbage", "truncated", "missing", "bad-name", "unknown-name", "bad-fp"])
def test_errors_exit_2_with_one_line(how, state_files, tmp_path):
    s = tmp_path / "store"
    f = tmp_path / "f.bin"
    if how == "garbage":
        f.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
        args = ["ingest", f, "--name", "x"]
    elif how == "truncated":
        f.write_bytes(state_files["smollm2_fa_on"].read_bytes()[:1000])
        args = ["ingest", f, "--name", "x"]
    elif how == "missing":
        args = ["ingest", tmp_path / "nope.bin", "--name", "x"]
    elif how == "bad-name":
        args = ["ingest", state_files["smollm2_fa_on"], "--name", "../x"]
    elif how == "unknown-name":
        args = ["materialize", "nobody", tmp_path / "o.bin"]
    else:
        args = ["ingest", state_files["smollm2_fa_on"], "--name", "x", "--fingerprint", "novalue"]
    r = kv("--store", s, *args, check_rc=2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvstore: error: "), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o.bin").exists()


def test_usage_error_exit_2(tmp_path):
    r = kv("--store", tmp_path / "s", "frobnicate")
    assert r.returncode == 2
    r = kv("--help", check_rc=0)
    assert "sync" in r.stdout and "serve" in r.stdout


def test_sync_dir(state_files, tmp_path):
    """`kvstore sync DIR` for a llama-server run by hand with --slot-save-path DIR."""
    s = tmp_path / "store"
    d = tmp_path / "slots"
    d.mkdir()
    copy_state(state_files["smollm2_fa_on"], d / "alice.bin")
    copy_state(state_files["smollm2_np2_slot1"], d / "bob.bin")
    (d / "notes.txt").write_text("not a state")
    r = kv("--store", s, "--json", "sync", d, check_rc=0)
    doc = json.loads(r.stdout)
    assert {e["name"]: e["action"] for e in doc["files"]} == {"alice": "ingested", "bob": "ingested"}
    # unchanged files are recognised by content and skipped
    r = kv("--store", s, "--json", "sync", d, check_rc=0)
    assert {e["name"]: e["action"] for e in json.loads(r.stdout)["files"]} == {"alice": "unchanged",
                                                                                "bob": "unchanged"}
    # a new save over an old name is ingested again
    copy_state(state_files["smollm2_fa_off"], d / "alice.bin")
    r = kv("--store", s, "sync", d, "--remove", check_rc=0)
    assert "ingested" in r.stdout and "unchanged" in r.stdout
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    # lay out named states for action=restore
    r = kv("--store", s, "--json", "sync", d, "--materialize", "alice", "bob", check_rc=0)
    assert (d / "alice.bin").read_bytes() == state_files["smollm2_fa_off"].read_bytes()
    assert (d / "bob.bin").read_bytes() == state_files["smollm2_np2_slot1"].read_bytes()
    # re-emitted for a one-slot server
    kv("--store", s, "sync", d, "--materialize", "bob", "--n-stream", "1", check_rc=0)
    r = kv("--json", "info", d / "bob.bin", check_rc=0)
    assert json.loads(r.stdout)["n_stream"] == 1
    # a bad file is reported (exit 2) but the others are still synced
    (d / "broken.bin").write_bytes(b"junk" * 10)
    r = kv("--store", s, "--json", "sync", d, check_rc=2)
    doc = json.loads(r.stdout)
    assert {e["name"]: e["action"] for e in doc["files"]}["broken"] == "error"
    assert "broken.bin" in r.stderr
    (d / "broken.bin").unlink()
    # names that are not valid llama-server file names are not materialized into DIR
    kv("--store", s, "ingest", state_files["smollm2_fa_on"], "--name", "what?", check_rc=0)
    r = kv("--store", s, "sync", d, "--materialize", "what?", check_rc=2)
    assert not (d / "what?.bin").exists()
    assert "what?" in r.stderr


def test_valid_server_filename():
    for ok in ("a.bin", "été.bin", ".kv-0123.bin", "user 1.bin"):
        assert valid_server_filename(ok), ok
    for bad in ("", "a/b", "a\\b", "../x", "..x", ".", "x.", " x", "x ", "a:b", "a*b", "a?b", 'a"b', "a<b",
                "a|b", "tab\tx", "x" * 256, "a\uff0eb", "a\u2215b"):
        assert not valid_server_filename(bad), bad
