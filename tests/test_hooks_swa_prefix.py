"""Sliding-window model (Gemma 3), articles x questions named by article and without parents: every returning
question restores its article's stored state cut at the common prefix with the prompt (hooks/prefix.py), so
llama-server evaluates only what follows it. Before prefix cuts the same requests re-evaluated the article
(SWA: the stored state ends inside the previous question, and no checkpoint lies at the fork).
"""
from __future__ import annotations

from hooks_support import CTX, complete, engine, hooks, metric, stack, tokenize
from test_hooks_articles import ARTICLES, QUESTIONS

from kvstore.hooks.prefix import swa_cells


def test_returning_questions_evaluate_only_what_follows_the_common_prefix(tmp_path):
    store = tmp_path / "store"
    srv = engine("gemma3", store)
    cells = swa_cells(512, 512, CTX // 2, False, False, 2)
    assert cells == 1024
    with stack(srv), hooks(srv.url, store, swa_cells=cells) as hk:
        rows = []
        for q, question in enumerate(QUESTIONS):  # question-major: each article was evicted since its last question
            for i, art in enumerate(ARTICLES):
                prompt = art + question
                toks = tokenize(srv.url, prompt)
                r = complete(hk.url, prompt, name=f"article{i}", n_predict=4)
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
        assert metric(hk.url, "kvstore_prefix_unavailable_total") == 0
