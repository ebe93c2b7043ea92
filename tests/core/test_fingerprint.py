"""Refusal: a state is only handed to a server with the same fingerprint (model, fit of the slot context)."""
from __future__ import annotations

import pytest

from conftest import complete

import kvstore
from kvstore import FingerprintMismatch
from kvstore.fingerprint import model_file_hash
from kvstore.llama_client import LlamaServer


@pytest.fixture
def smol_fp(models):
    return {"model": model_file_hash(str(models["smollm2"])), "n_ctx_slot": "2048"}


def test_materialize_expect(store, state_files, smol_fp, models, tmp_path):
    src = state_files["smollm2_fa_on"]
    store.ingest("s", str(src), fingerprint=smol_fp)
    assert store.get("s")["fingerprint"]["model"] == smol_fp["model"]
    out = tmp_path / "out.bin"

    other_model = {"model": model_file_hash(str(models["gemma3"])), "n_ctx_slot": "2048"}
    with pytest.raises(FingerprintMismatch) as e:
        store.materialize("s", str(out), expect=other_model)
    assert "model" in str(e.value)
    assert not out.exists()

    n = store.get("s")["n_tokens"]
    with pytest.raises(FingerprintMismatch) as e:  # a slot context too small for the state
        store.materialize("s", str(out), expect={**smol_fp, "n_ctx_slot": str(n - 1)})
    assert "n_ctx_slot" in str(e.value)
    assert not out.exists()

    # another (larger) context is not another identity; keys only one side has are not compared
    store.materialize("s", str(out), expect={**smol_fp, "n_ctx_slot": "8192", "unrelated": "x"})
    assert out.read_bytes() == src.read_bytes()


def test_ingest_binds_layout(store, state_files, tmp_path):
    """The layout (cache types, flash attention) comes from the file itself: fa on/off and q8 are different."""
    layouts = {}
    for case in ("smollm2_fa_on", "smollm2_fa_off", "smollm2_q8"):
        store.ingest(case, str(state_files[case]))
        layouts[case] = store.get(case)["layout"]
    assert len(set(map(str, layouts.values()))) == 3, layouts


def test_restore_into_other_model_is_refused_before_the_server(served_smollm2, served_gemma3):
    """A smollm2 state restored through kvstore.restore into a gemma3 server: FingerprintMismatch, and the
    gemma3 server's slot is untouched (its cache is still used) and nothing is written to its sync dir."""
    smol = served_smollm2
    complete(smol.url, "The capital of France is", 1, n_predict=2)
    kvstore.save("foreign", 1, server=smol.url, store=smol.store, namespace="fp")
    tmp = smol.sync / "foreign.bin"
    smol.store.materialize("foreign", str(tmp), namespace="fp")
    g = served_gemma3
    try:  # the same state, bound to the smollm2 server, in the gemma3 server's store
        g.store.ingest("foreign", str(tmp), namespace="fp", fingerprint=LlamaServer(smol.url).fingerprint())
    finally:
        tmp.unlink()

    prompt = "Gemma keeps this slot warm: one two three four five six seven"
    first = complete(g.url, prompt, 1, n_predict=1)
    with pytest.raises(FingerprintMismatch) as e:
        kvstore.restore("foreign", 1, server=g.url, store=g.store, namespace="fp")
    assert "model" in str(e.value)
    assert not list(g.sync.iterdir())
    again = complete(g.url, prompt, 1, n_predict=1)
    assert again["timings"]["cache_n"] > 0, "the gemma3 slot was touched"
    assert again["content"] == first["content"]


def test_ingest_refuses_a_file_cut_at_a_section_boundary(store, state_files, oracle, tmp_path):
    """A gemma3 file cut after its first KV section parses as a valid one-section (llama-like) file; the server's
    known layout is what tells the two apart, so ingest with it refuses the file and stores nothing."""
    src = state_files["gemma3_fa_on"]
    data = src.read_bytes()
    full = kvstore._core.inspect_state(str(src))["layout"]
    cut = oracle.parse(data)["sections"][1]["start"]
    short = tmp_path / "short.bin"
    short.write_bytes(data[:cut])
    assert kvstore._core.inspect_state(str(short))["layout"] != full  # it parses, as something else
    before = store.stats()
    with pytest.raises(FingerprintMismatch) as e:
        store.ingest("g", str(short), fingerprint={"model": "m", "layout": full})
    assert "layout" in str(e.value)
    assert store.get("g") is None and store.stats() == before
    # the intact file passes the same check, and `layout` is not part of the stored identity
    store.ingest("g", str(src), fingerprint={"model": "m", "layout": full})
    assert store.get("g")["fingerprint"] == {"model": "m"} and store.get("g")["layout"] == full
