"""Files that parse but are not whole, and files of another layout than the namespace's states under one
fingerprint, are refused at ingest with an error a user can act on, and change nothing (rust/src/format/
complete.rs, the store's layout rows). `--force`, the right `--model` and a real server's own saves (also with
`--swa-full` and `--ctx-checkpoints 0`) are stored."""
from __future__ import annotations

import json

import pytest

from conftest import complete, tree_snapshot
from test_bad_files import kv, refused_by_cli

import kvstore
from kvstore import FingerprintMismatch, FormatError
from kvstore.fingerprint import model_fingerprint


def _cut(state_files, oracle, tmp_path, case="gemma3_parent"):
    """The real file and a copy cut where its first KV section ends (a torn write at a section boundary)."""
    src = state_files[case]
    data = src.read_bytes()
    parsed = oracle.parse(data)
    ends = [s["end"] for s in parsed["sections"]]
    assert len(ends) == 2 and ends[1] < len(data) and "appendix" in parsed, (ends, len(data))
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[: ends[0]])
    return src, cut


def _objects(store_dir):
    return tree_snapshot(store_dir / "objects")


def _listing(store_dir):
    r = kv("--store", store_dir, "--json", "ls")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_gemma_file_cut_at_a_section_boundary_is_refused(state_files, models, oracle, tmp_path):
    src, cut = _cut(state_files, oracle, tmp_path)
    st = tmp_path / "store"
    gguf = models["gemma3"]
    # Bound to its model (the layer count and the window come from the GGUF): refused on the first save already.
    r = kv("--store", st, "ingest", cut, "--name", "cut", "--model", gguf)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip()
    assert line.startswith("kvstore: error: slot file incomplete:") and "two KV sections" in line, line
    assert "1 KV section" in line and "save the slot again" in line, line
    assert not [k for k in _objects(st) if not k.endswith("/")]
    with pytest.raises(FormatError, match="slot file incomplete"):
        kvstore.open_store(st).ingest("cut", str(cut), fingerprint=model_fingerprint(str(gguf)))

    # With no model given, the namespace's earlier states say what a whole file of this fingerprint looks like.
    bind = ("--fingerprint", "model=gemma3")
    assert kv("--store", st, "ingest", src, "--name", "whole", *bind).returncode == 0
    before, names = _objects(st), _listing(st)
    r = kv("--store", st, "ingest", cut, "--name", "cut", *bind)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert "has layout" in line and "cut short" in line and "--force" in line, line
    assert _objects(st) == before and _listing(st) == names
    with pytest.raises(FingerprintMismatch) as e:
        kvstore.open_store(st).ingest("cut", str(cut), fingerprint={"model": "gemma3"})
    assert e.value.key == "layout" and e.value.stored != e.value.server, vars(e.value)
    # The whole file is still what `whole` restores.
    out = tmp_path / "out.bin"
    kvstore.open_store(st).materialize("whole", str(out))
    assert out.read_bytes() == src.read_bytes()

    # The second boundary is where the SCKP appendix starts: such a file is what `--ctx-checkpoints 0` writes,
    # which llama-server loads, so it is not refused (the documented limit of the check).
    data = src.read_bytes()
    short = tmp_path / "no-appendix.bin"
    short.write_bytes(data[: oracle.parse(data)["sections"][1]["end"]])
    assert kv("--store", st, "ingest", short, "--name", "no-appendix", "--model", gguf).returncode == 0


def test_another_models_file_under_one_fingerprint_is_refused_unless_forced(state_files, models, tmp_path):
    st = tmp_path / "store"
    bind = ("--fingerprint", "model=m")  # one model named for both: the mistake the check catches
    assert kv("--store", st, "ingest", state_files["smollm2_parent"], "--name", "smol", *bind).returncode == 0
    before, names = _objects(st), _listing(st)
    gemma = state_files["gemma3_parent"]
    r = kv("--store", st, "ingest", gemma, "--name", "gemma", *bind)
    assert r.returncode == 2, r.stderr
    line = r.stderr.strip()
    assert "states stored under the same fingerprint in this namespace" in line and "--fingerprint" in line, line
    assert _objects(st) == before and _listing(st) == names
    # Another namespace has its own states: nothing there to differ from (and nothing of this one is revealed).
    assert kv("--store", st, "ingest", gemma, "--name", "gemma", "--namespace", "t2", *bind).returncode == 0
    # With no fingerprint a state is bound to nothing: no layout is compared.
    assert kv("--store", st, "ingest", gemma, "--name", "unbound").returncode == 0
    # Its own model's fingerprint, or --force, stores it.
    assert kv("--store", st, "ingest", gemma, "--name", "g1", "--model", models["gemma3"]).returncode == 0
    assert kv("--store", st, "ingest", gemma, "--name", "g2", "--force", *bind).returncode == 0
    # A SmolLM2 file bound to the Gemma model is refused by the model's shape (30 layers, no window).
    r = kv("--store", st, "ingest", state_files["smollm2_fa_on"], "--name", "s", "--model", models["gemma3"])
    assert r.returncode == 2 and "slot file incomplete" in r.stderr, r.stderr
    s = kvstore.open_store(st)
    assert {e["name"] for e in s.list(namespace="")} == {"smol", "unbound", "g1", "g2"}
    with pytest.raises(FingerprintMismatch):  # the forced layout is now the namespace's: SmolLM2's differs
        s.ingest("smol2", str(state_files["smollm2_parent"]), fingerprint={"model": "m"})
    assert s.ingest("smol2", str(state_files["smollm2_parent"]), fingerprint={"model": "m"},
                    force=True)["n_tokens"] > 0


@pytest.mark.parametrize("kw", [dict(swa_full=True), dict(ctx_checkpoints=0)], ids=["swa-full", "no-checkpoints"])
def test_a_real_gemma_servers_saves_are_whole(kw, start_server, tmp_path):
    """The risk the check carries: a server run with --swa-full or --ctx-checkpoints 0 must still save files
    that pass. Each is saved through the server's own fingerprint (n_layer, n_swa from its GGUF)."""
    from kvstore.api import save
    from kvstore.config import sync_dir
    from make_states import ARTICLE

    st = kvstore.open_store(tmp_path / "store")
    srv = start_server("gemma3", sync_dir(tmp_path / "store"), parallel=2, ctx_size=2048, flash_attn="on", **kw)
    r = complete(srv.url, ARTICLE, 1, n_predict=4)
    n = r["timings"]["prompt_n"]
    rep = save("art", 1, server=srv.url, store=st)
    assert rep["n_tokens"] >= n
    got = st.get("art")
    assert got["fingerprint"]["n_layer"] == "18" and got["fingerprint"]["n_swa"] == "512", got["fingerprint"]
    assert got["layout"].count("kv[") == 2, got["layout"]
