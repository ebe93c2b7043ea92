"""LoRA adapters: the KV of a prompt depends on them, so a server's adapters are part of its states' fingerprint and
a per-request `lora` is refused. The adapter is a seeded tiny one for SmolLM2 (tests/tinymodels.py)."""
from __future__ import annotations

from kvstore.config import sync_dir
from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy
from kvstore.models import smollm2_path

from hooks_support import complete, engine, get, hooks, intro, post, stack
from tinymodels import write_tiny_lora


def test_states_are_bound_to_the_servers_adapters(tmp_path):
    """A state saved by a server with an adapter is not restored by one without it on the same store (nor the
    reverse): its KV was computed with other weights. Without the adapter in the fingerprint the second server
    would restore it and continue from cells it never computed."""
    store = tmp_path / "store"
    adapter = write_tiny_lora(tmp_path / "lora.gguf", smollm2_path())
    prompt, more = intro(0) + "What is my name?", " And where do I live?"
    cfg = EngineConfig(model=str(smollm2_path()), parallel=2, ctx_size=2048, cache_ram=0, lora=(str(adapter),),
                       slot_save_path=str(sync_dir(store)))
    with_lora = EmbeddedServer(cfg)
    wait_healthy(with_lora.url)
    with stack(with_lora, hooks(with_lora.url, store)) as (_, h):
        fp = h.hooks.wired.transfer.fingerprint
        assert fp.get("lora", "").startswith("sha256:"), fp
        first = complete(h.url, prompt, name="ada", n_predict=6)
        refused = post(h.url, "/completion", {"prompt": prompt, "n_predict": 2, "lora": [{"id": 0, "scale": 0.0}]})
        assert refused.status == 400 and "lora" in refused.json["error"]["message"], refused.body[:300]
        # The adapters can be read through kvstore, not rescaled at run time (the fingerprint is taken at start-up).
        adapters = post(h.url, "/lora-adapters", [{"id": 0, "scale": 0.0}])
        assert adapters.status == 501 and "--lora" in adapters.json["error"]["message"], adapters.body[:300]
        shown = get(h.url, "/lora-adapters")
        assert shown.status == 200 and [a["scale"] for a in shown.json] == [1.0], shown.body[:300]
        h.run(h.hooks.wired.table.save_all())
    plain = engine("smollm2", store)  # the same model and store, no adapter
    with stack(plain, hooks(plain.url, store)) as (_, h):
        assert "lora" not in h.hooks.wired.transfer.fingerprint
        r = complete(h.url, prompt + first.json["content"] + more, name="ada", n_predict=6)
        assert r.kind == "miss", r.headers
        # What the server without the adapter answers alone: the adapter's cells were not used.
        post(plain.url, "/slots/0?action=erase", {})
        post(plain.url, "/slots/1?action=erase", {})
        alone = complete(plain.url, prompt + first.json["content"] + more, n_predict=6)
        assert r.json["content"] == alone.json["content"], (r.json["content"], alone.json["content"])
        assert first.json["content"] != complete(plain.url, prompt, n_predict=6).json["content"], \
            "the adapter does not change the output: this test would not see a state restored across it"
