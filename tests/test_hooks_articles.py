"""Batch jobs over shared documents: articles x questions, question-major, with named parents.

Each article is primed once (POST /kvstore/states/{article}: evaluated with n_predict 0, stored); every
question then names the article as its parent and sends article + question as one string prompt, so the
question's tokens extend the parent's exactly and only the question is evaluated — on Gemma 3 too (SWA,
no --swa-full): a state that ends exactly where the question starts needs no rollback to a checkpoint.
"""
from __future__ import annotations

import pytest

from hooks_support import MODELS, complete, engine, hooks, post, stack, tokenize

ARTICLES = [
    "The honeybee colony is a remarkable society. A single queen lays all of the eggs, while thousands of "
    "worker bees clean the hive, feed the young, build wax comb and gather nectar and pollen from flowers. "
    "Drones exist only to mate with queens from other colonies. In winter the bees cluster together and "
    "shiver their flight muscles to keep the centre of the cluster warm enough for the queen to survive.\n",
    "Glaciers form where more snow falls in winter than melts in summer. Over many years the snow is pressed "
    "into dense blue ice that slowly flows downhill under its own weight. As a glacier moves it scrapes the "
    "rock beneath it, carving deep valleys shaped like the letter U and carrying boulders far from where "
    "they started. Many glaciers around the world are now shrinking because summers have become warmer.\n",
    "The printing press built by Johannes Gutenberg around 1440 used movable metal type, oil based ink and a "
    "screw press adapted from those used to make wine. Books that had taken scribes months to copy by hand "
    "could now be produced in days, and their price fell quickly. Within fifty years presses were working "
    "in more than two hundred European cities, spreading news, science and new religious ideas.\n",
]
QUESTIONS = ["Question: What is the main topic of the text above? Answer:",
             "Question: Name one fact from the text. Answer:",
             "Question: Summarize the text in three words. Answer:"]
# Tokens evaluated beyond the question's own. SmolLM2: none (measured 0; 2 covers a tokenizer merge at the
# article/question boundary). Gemma 3 (SWA): llama-server resumes a sliding-window cache from its newest
# context checkpoint, which it takes 5 tokens before the end of each evaluated prompt, even when the new prompt
# extends the cached one exactly: measured on a plain server with no restore at all (prime 83 tokens with
# n_predict 0, then article + question: cache_n 78, prompt_n = question + 5), as in state-format.md 3
# (cache_n 295 of 300). The restored parent carries that checkpoint (SCKP appendix), so the cost stays 5.
SLACK = {"smollm2": 2, "gemma3": 7}


@pytest.mark.parametrize("model", MODELS)
def test_articles_by_questions_with_parents(model, tmp_path):
    store = tmp_path / "store"
    srv = engine(model, store)
    with stack(srv), hooks(srv.url, store) as hk:
        primed = {}
        for i, art in enumerate(ARTICLES):
            r = post(hk.url, f"/kvstore/states/article{i}", {"prompt": art})
            assert r.status == 200, r.body
            art_tokens = tokenize(srv.url, art)
            assert r.json["n_tokens"] == len(art_tokens)
            primed[i] = r.json["timings"]["prompt_n"]
        rows = []
        for q, question in enumerate(QUESTIONS):  # question-major: every request finds another article resident
            for i, art in enumerate(ARTICLES):
                prompt = art + question
                r = complete(hk.url, prompt, parent=f"article{i}", n_predict=4)
                n_q = len(tokenize(srv.url, prompt)) - len(tokenize(srv.url, art))
                rows.append((i, q, r.kind, r.prompt_n, n_q))
                assert r.kind == "parent", rows[-1]
                assert r.prompt_n <= n_q + SLACK[model], rows[-1]
        # Chat: the article as a system message (primed without the generation prompt), the question as the
        # next message; the rendered question conversation starts with exactly the primed tokens.
        msgs = [{"role": "system", "content": ARTICLES[0]}]
        r = post(hk.url, "/kvstore/states/chat-article0", {"messages": msgs})
        assert r.status == 200, r.body
        asked = msgs + [{"role": "user", "content": "What is the main topic?"}]
        r = post(hk.url, "/v1/chat/completions",
                 {"messages": asked, "max_tokens": 4, "temperature": 0, "cache_prompt_parent": "chat-article0"})
        assert r.status == 200, r.body
        assert r.kind == "parent"
        chat_n = r.timings["prompt_n"]
        rendered = [post(hk.url, "/apply-template", {"messages": m, "add_generation_prompt": g}).json["prompt"]
                    for m, g in ((msgs, False), (asked, True))]
        chat_q = len(tokenize(srv.url, rendered[1])) - len(tokenize(srv.url, rendered[0]))
        # Unnamed requests use prefix lookup: with no slot holding the article, the stored article is found
        # by its tokens and restored ("prefix"); only the question is evaluated.
        for s in (0, 1):
            assert post(hk.url, f"/slots/{s}?action=erase", {}).status == 200
        r = complete(hk.url, ARTICLES[1] + QUESTIONS[0], n_predict=2)
        n_q = len(tokenize(srv.url, ARTICLES[1] + QUESTIONS[0])) - len(tokenize(srv.url, ARTICLES[1]))
        assert r.kind == "prefix" and r.prompt_n <= n_q + SLACK[model], (r.kind, r.prompt_n, n_q)
        stats = hk.hooks.metrics.snapshot()
    print(f"\n[{model}] primed articles: prompt_n {primed}")
    print(f"[{model}] (article, question, kind, prompt_n, question tokens): {rows}")
    print(f"[{model}] chat question after a primed system message: prompt_n {chat_n} for {chat_q} new tokens; "
          f"counters {stats}")
    assert chat_n <= chat_q + SLACK[model], (chat_n, chat_q)
