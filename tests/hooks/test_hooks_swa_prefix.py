"""Sliding-window model (Gemma 3), articles x questions named by article and without parents: every returning
question restores its article's stored state cut at the common prefix with the prompt (hooks/cut.py), so
llama-server evaluates only what follows it. Before prefix cuts the same requests re-evaluated the article
(SWA: the stored state ends inside the previous question, and no checkpoint lies at the fork). Another tenant
sending the same prompts gets nothing of the first tenant's (docs/hooks.md, tenants): no cut crosses namespaces.
"""
from __future__ import annotations

from hooks_support import CTX, complete, engine, hooks, metric, stack, tokenize
from corpus import ARTICLES, QUESTIONS

from kvstore.hooks.auth import tenancy_from
from kvstore.hooks.cut import swa_cells

KEY_A, KEY_B = "sk-swa-a-" + "5" * 16, "sk-swa-b-" + "6" * 16
A, B = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))


def test_returning_questions_evaluate_only_what_follows_the_common_prefix(tmp_path):
    store = tmp_path / "store"
    srv = engine("gemma3", store)
    cells = swa_cells(512, 512, CTX // 2, False, False, 2)
    assert cells == 1024
    with stack(srv), hooks(srv.url, store, swa_cells=cells, tenancy=tenancy_from([KEY_A, KEY_B], [], [])) as hk:
        rows = []
        for q, question in enumerate(QUESTIONS):  # question-major: each article was evicted since its last question
            for i, art in enumerate(ARTICLES):
                prompt = art + question
                toks = tokenize(srv.url, prompt)
                r = complete(hk.url, prompt, name=f"article{i}", n_predict=4, headers=A)
                restored = int(r.headers["X-KV-Restored-Tokens"])
                rows.append((q, i, r.kind, restored, r.prompt_n, len(toks)))
                if q == 0:
                    assert r.kind == "miss", rows[-1]
                    continue
                assert r.kind == "restored", rows[-1]
                # P = the common prefix with the stored state: the article and the shared "Question:" tokens
                assert restored >= len(tokenize(srv.url, art)) - 1, rows[-1]
                assert restored < len(toks), rows[-1]
                assert r.prompt_n == len(toks) - restored, rows[-1]
        # Tenant B, same prompts, same names and unnamed: no state of A's is cut for it, nor its cells reused.
        for i, name in enumerate(("article0", None)):
            prompt = ARTICLES[i] + QUESTIONS[-1]
            n = len(tokenize(srv.url, prompt))
            r = complete(hk.url, prompt, name=name, n_predict=4, headers=B)
            # ("slot": the unnamed one lands in B's own slot, which shares only the BOS token with it)
            assert r.kind in ("miss", "slot") and r.headers["X-KV-Restored-Tokens"] == "0", (name, r.kind)
            assert (r.prompt_n, r.timings["cache_n"]) == (n, 0), (name, r.timings)
        assert metric(hk.url, "kvstore_prefix_unavailable_total", headers=A) == 0
