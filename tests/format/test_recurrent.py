"""Recurrent and hybrid models (tests/tinymodels.py): llama-server loads them and answers deterministically,
their slot files have the sections llama.cpp's source says (checked by an independent reader below), they
come back byte for byte through the store, and a state that went evict -> store -> restore into another slot
continues exactly like a server that kept it (tokens and top probabilities), through `kvstore serve`."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from conftest import Server, post_ok, tokenize

import kvstore
from kvstore.api import inspect_state
from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy

ARCHS = ("lfm2", "mamba2")
F32, F16 = 0, 1
# What each tiny model's memory holds (from tinymodels.py's hyperparameters and llama.cpp's n_embd_r/n_embd_s):
# attention layers (K/V row bytes, f16 cache), recurrent layers with r and s row bytes (f32 states).
EXPECT = {
    # LFM2: 2 attention layers of 2 KV heads x 16 (f16: 64 B); 2 short-conv layers: r = n_embd*(l_cache-1) f32,
    # s = 0 (no ssm state); n_layer written in the recurrent section is the model's 4.
    "lfm2": dict(kv_layers=2, kv_row=64, n_layer=4, r=[(F32, 64 * 2 * 4)] * 2, s=[(F32, 0)] * 2),
    # Mamba-2: r = (d_conv-1)*(d_inner + 2*n_group*d_state) f32, s = d_state*d_inner f32, 3 layers.
    "mamba2": dict(kv_layers=None, n_layer=3, r=[(F32, 3 * (128 + 2 * 16) * 4)] * 3, s=[(F32, 16 * 128 * 4)] * 3),
}
PROMPT = ("The lighthouse keeper wrote in his log every evening. The storm had passed, the lamp was clean, "
          "and the supply boat was due on Thursday.\n")
FOLLOW = "Keeper: The boat arrived early, carrying"
N_GEN, N_NEXT, N_PROBS = 12, 8, 5


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Both tiny models, generated once per session (or reused from $KVSTORE_TINY_MODELS)."""
    from tinymodels import tiny_model_path

    d = Path(os.environ.get("KVSTORE_TINY_MODELS") or tmp_path_factory.mktemp("tiny-models"))
    return {a: tiny_model_path(a, d) for a in ARCHS}


# ---------------------------------------------------------------------------------------------------------------
# an independent reader of the layout llama.cpp writes (llama-kv-cache.cpp / llama-memory-recurrent.cpp)

class _R:
    def __init__(self, b: bytes, off: int = 0):
        self.b, self.o = b, off

    def u32(self) -> int:
        (v,) = struct.unpack_from("<I", self.b, self.o)
        self.o += 4
        return v

    def i32(self) -> int:
        (v,) = struct.unpack_from("<i", self.b, self.o)
        self.o += 4
        return v

    def u64(self) -> int:
        (v,) = struct.unpack_from("<Q", self.b, self.o)
        self.o += 8
        return v

    def skip(self, n: int) -> None:
        assert self.o + n <= len(self.b), "truncated"
        self.o += n


def _kv(r: _R, exp: dict) -> dict:
    n_stream = r.u32()
    cells, stream = 0, None
    for s in range(n_stream):
        count = r.u32()
        if not count:
            continue
        assert stream is None, "one stream holds the slot's cells"
        cells, stream = count, s
        r.skip(count * 12)  # pos, n_seq_id = 1, seq_id
        assert r.u32() == 0, "flash attention on: V not transposed"
        assert r.u32() == exp["kv_layers"]
        assert (r.u32(), r.u32()) == (0, 0), "f16 cache: no rotation"
        for _ in range(2 * exp["kv_layers"]):  # K of each layer, then V of each layer
            assert (r.i32(), r.u64()) == (F16, exp["kv_row"])
            r.skip(count * exp["kv_row"])
    return {"n_stream": n_stream, "cells": cells, "stream": stream}


def _rec(r: _R, exp: dict) -> dict:
    count = r.u32()
    pos = []
    for _ in range(count):
        pos.append(r.i32())
        assert r.u32() == 0, "a slot save writes n_seq_id 0"
    assert (r.u32(), r.u32()) == (0, exp["n_layer"])  # s_trans, n_layer
    for ty, row in exp["r"] + exp["s"]:
        assert (r.i32(), r.u64()) == (ty, row)
        r.skip(count * row)
    return {"cells": count, "pos": pos}


def read_slot_file(data: bytes, arch: str) -> dict:
    """Walk a whole file; every byte must be accounted for."""
    exp = EXPECT[arch]
    r = _R(data)
    assert (r.u32(), r.u32()) == (0x67677371, 4)
    n_words = r.u32()
    words = struct.unpack_from(f"<{n_words}i", data, r.o)
    r.skip(4 * n_words)
    out = {"n_tokens": words[2], "kv": _kv(r, exp) if exp["kv_layers"] else None, "rec": _rec(r, exp), "ckpt": []}
    if r.o < len(data):
        assert (r.u32(), r.u32()) == (0x504B4353, 1), "only the SCKP appendix may follow"
        for _ in range(r.u32()):
            n_tokens, pos_min, pos_max = struct.unpack_from("<qii", data, r.o)
            r.skip(16)
            end = r.o + 8 + r.u64()
            # PARTIAL_ONLY: a hybrid's checkpoint holds only its recurrent section
            assert r.u32() == 0xAF143CD8
            r.i32()
            rec = _rec(r, exp)
            assert r.o == end, "checkpoint blob = io magic, seq id, recurrent section"
            assert r.u64() == 0 and r.u64() == 0, "no draft model, no speculative state"
            out["ckpt"].append({"n_tokens": n_tokens, "pos_max": pos_max, "rec": rec})
    assert r.o == len(data)
    return out


# ---------------------------------------------------------------------------------------------------------------
# one plain llama-server per model: the slot files, and the reference continuation of a slot it kept

def _gen(url: str, prompt, slot: int, n: int, n_probs: int = 0) -> dict:
    body = {"prompt": prompt, "id_slot": slot, "cache_prompt": True, "n_predict": n, "temperature": 0.0,
            "top_k": 1, "seed": 1, "ignore_eos": True, "n_probs": n_probs, "return_tokens": True}
    return post_ok(url + "/completion", body)


def _tokenize(url: str, text: str) -> list[int]:
    """As llama-server tokenizes a string prompt (special tokens added and parsed)."""
    return post_ok(url + "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]


def _probs(reply: dict) -> list:
    return [(p["id"], [(t["id"], t["prob"]) for t in p.get("top_probs", p.get("probs", []))])
            for p in reply["completion_probabilities"]]


@pytest.fixture(scope="module", params=ARCHS)
def recorded(request, tiny_models, tmp_path_factory):
    arch = request.param
    save = tmp_path_factory.mktemp(f"slots-{arch}")
    srv = Server(tiny_models[arch], save, parallel=2, ctx_size=2048, flash_attn="on")
    try:
        url, files = srv.url, {}

        def save_slot(slot: int, name: str) -> None:
            post_ok(url + f"/slots/{slot}?action=save", {"filename": f"{name}.bin"})
            files[name] = save / f"{name}.bin"

        save_slot(0, "empty")
        first = _gen(url, PROMPT, 0, 1)
        save_slot(0, "prompt")
        gen = _gen(url, PROMPT, 0, N_GEN)
        save_slot(0, "gen")
        again = _gen(url, PROMPT, 1, N_GEN)  # the same request in the other slot, from empty
        save_slot(1, "np2_slot1")
        # Token ids, not text: re-tokenized text need not give the generated ids back, and a recurrent state
        # cannot be cut back to a shorter common prefix (llama-server would roll back to a checkpoint).
        prompt_next = _tokenize(url, PROMPT) + gen["tokens"] + tokenize(url, "\n" + FOLLOW)
        # The reference: slot 0 kept its state and continues.
        ref = _gen(url, prompt_next, 0, N_NEXT, N_PROBS)
        yield dict(arch=arch, files=files, first=first, gen=gen, again=again, ref=ref, prompt_next=prompt_next,
                   gen_prompt=PROMPT, url=url)
    finally:
        srv.close()


def test_loads_and_answers_deterministically(recorded):
    gen, again = recorded["gen"], recorded["again"]
    assert gen["content"] == again["content"], "two identical greedy requests must agree"
    assert gen["tokens_predicted"] == N_GEN
    # seeded weights scaled to stay O(1): the output is not one repeated token
    ids = [i for i, _ in _probs(recorded["ref"])]
    assert len(set(ids)) > 1, ids
    assert recorded["first"]["content"] == gen["content"][: len(recorded["first"]["content"])]


def test_slot_files_have_the_expected_sections(recorded):
    arch, files = recorded["arch"], recorded["files"]
    walked = {k: read_slot_file(p.read_bytes(), arch) for k, p in files.items()}
    empty = walked["empty"]
    assert empty["n_tokens"] == 0 and empty["rec"]["cells"] == 0 and not empty["ckpt"]
    for k in ("prompt", "gen", "np2_slot1"):
        w = walked[k]
        n = w["n_tokens"]
        # one recurrent cell: the state after the last decoded token
        assert w["rec"] == {"cells": 1, "pos": [n - 1]}, (k, w["rec"])
        if w["kv"] is not None:
            assert (w["kv"]["n_stream"], w["kv"]["cells"]) == (2, n), (k, w["kv"])
            assert w["kv"]["stream"] == (1 if k == "np2_slot1" else 0)
        # llama-server checkpoints recurrent state while it evaluates a prompt (at n_prompt - 4)
        assert w["ckpt"], f"{k}: no checkpoint"
        for c in w["ckpt"]:
            assert c["rec"]["cells"] == 1 and c["rec"]["pos"] == [c["pos_max"]] and c["n_tokens"] <= n
    assert walked["gen"]["n_tokens"] == walked["prompt"]["n_tokens"] + N_GEN - 1
    # the core reads the same structure: layout names the recurrent part, blocks: KV by position + whole states
    info = inspect_state(str(files["gen"]))
    e = EXPECT[arch]
    assert info["layout"].endswith(f"rec[{e['n_layer']}:f32/{e['r'][0][1]}*{len(e['r'])};"
                                   f"f32/{e['s'][0][1]}*{len(e['s'])}]"), info["layout"]
    assert ("kv[" in info["layout"]) == (e["kv_layers"] is not None)
    assert info["n_checkpoints"] == len(walked["gen"]["ckpt"])
    n_kv_blocks = -(-walked["gen"]["n_tokens"] // 32) if e["kv_layers"] else 0
    assert info["blocks"] == n_kv_blocks + 1 + info["n_checkpoints"]
    assert inspect_state(str(files["empty"]))["blocks"] == 0


def test_round_trip_byte_exact_and_states_dedup(recorded, tmp_path):
    store = kvstore.open_store(tmp_path / "store")
    for name, path in recorded["files"].items():
        data = path.read_bytes()
        if name == "empty":  # an empty slot is not a state: refused at ingest, as for transformer models
            with pytest.raises(kvstore.FormatError):
                store.ingest(name, str(path))
            continue
        rep = store.ingest(name, str(path))
        assert rep["file_bytes"] == len(data)
        out = tmp_path / f"{name}.out"
        store.materialize(name, str(out))
        assert out.read_bytes() == data, f"{recorded['arch']} {name}: materialized bytes differ"
    # the same state saved twice is stored once (its recurrent block and everything else)
    again = store.ingest("gen-again", str(recorded["files"]["gen"]))
    assert again["new_raw_bytes"] == 0 or again["new_objects"] <= 1, again  # at most a new manifest
    assert store.get("gen-again")["layout"] == store.get("gen")["layout"]
    # slot 0 and slot 1 computed the same tokens the same way: the slot-1 file adds no state bytes
    assert store.tokens("np2_slot1") == store.tokens("gen")
    # a prefix state of a recurrent or hybrid state is never emitted (design.md "Recurrent and hybrid models")
    cut = tmp_path / "gen.cut"
    r = store.materialize_prefix("gen", len(store.tokens("gen")) // 2, str(cut))
    assert r["missing"] == [] and "recurrent" in r["reason"], r
    assert not cut.exists()


# ---------------------------------------------------------------------------------------------------------------
# fidelity through kvstore serve: evict -> store -> restore into the other slot -> continue

def _engine(model: Path, store: Path) -> EmbeddedServer:
    from kvstore.config import sync_dir

    cfg = EngineConfig(model=str(model), parallel=2, ctx_size=2048, cache_ram=0, threads=2, ubatch_size=256,
                       flash_attn="on", slot_save_path=str(sync_dir(store)))
    srv = EmbeddedServer(cfg)
    wait_healthy(srv.url)
    return srv


def _same_continuation(got: dict, ref: dict, what: str) -> None:
    # the restored state was used: only the new tokens were evaluated, as on the server that kept the slot
    assert got["timings"]["prompt_n"] == ref["timings"]["prompt_n"], (what, got["timings"], ref["timings"])
    assert got["content"] == ref["content"], what
    assert _probs(got) == _probs(ref), what


def test_restore_into_another_slot_and_after_restart_continues_exactly(recorded, tiny_models, tmp_path):
    from hooks_support import hooks, post, stack

    arch = recorded["arch"]
    store = tmp_path / "store"
    nxt = {"prompt": recorded["prompt_next"], "n_predict": N_NEXT, "temperature": 0.0, "top_k": 1, "seed": 1,
           "ignore_eos": True, "n_probs": N_PROBS}
    srv = _engine(tiny_models[arch], store)
    with stack(srv), hooks(srv.url, store) as hk:
        body = {"prompt": recorded["gen_prompt"], "n_predict": N_GEN, "temperature": 0.0, "top_k": 1, "seed": 1,
                "ignore_eos": True, "cache_prompt_name": "doc"}
        r = post(hk.url, "/completion", body)
        assert r.status == 200, r.body[:300]
        assert r.json["content"] == recorded["gen"]["content"]
        slot = int(r.headers["X-KV-Slot"])
        other = 1 - slot
        assert post(hk.url, f"/slots/{slot}?action=save", {"filename": "doc"}).status == 200
        assert post(hk.url, f"/slots/{slot}?action=save", {"filename": "doc-kept"}).status == 200  # for later
        assert post(hk.url, f"/slots/{slot}?action=erase").status == 200
        r = post(hk.url, f"/slots/{other}?action=restore", {"filename": "doc"})
        assert r.status == 200, r.body[:300]
        r = post(hk.url, "/completion", {**nxt, "cache_prompt_name": "doc"})
        assert r.status == 200, r.body[:300]
        assert int(r.headers["X-KV-Slot"]) == other
        got = r.json
    ref = recorded["ref"]
    _same_continuation(got, ref, "restored into another slot")
    # both stopped; a fresh llama-server and hooks on the same store restore the state by name
    srv = _engine(tiny_models[arch], store)
    with stack(srv), hooks(srv.url, store) as hk:
        r = post(hk.url, "/completion", {**nxt, "cache_prompt_name": "doc-kept"})
        assert r.status == 200, r.body[:300]
        assert r.kind == "restored", r.kind
        _same_continuation(r.json, ref, "after a restart")
        # parents: prime a document, erase its slot, then a question with the document as parent; the parent
        # ends where the question starts, so llama-server extends the restored state without a rollback
        doc = _tokenize(srv.url, PROMPT)
        question = tokenize(srv.url, "\nQuestion: when is the boat due?\nAnswer:")
        r = post(hk.url, "/kvstore/states/article", {"prompt": doc})
        assert r.status == 200, r.body[:300]
        assert post(hk.url, f"/slots/{r.json['id_slot']}?action=erase").status == 200
        body = {**nxt, "prompt": doc + question, "n_probs": 0, "cache_prompt_parent": "article",
                "cache_prompt_name": "q1"}
        r = post(hk.url, "/completion", body)
        assert r.status == 200, r.body[:300]
        assert r.kind == "parent", r.kind
        assert r.prompt_n == len(question), (r.prompt_n, len(question))
