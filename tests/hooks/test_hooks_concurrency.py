"""8 concurrent clients, 12 names, 2 slots: every reply equals its single-user reference; no deadlock, no 5xx.

llama.cpp's results depend slightly on how sequences are batched together, so a greedy token whose two best
candidates are nearly tied in the single-user reference may flip when two slots decode at once. Such a flip is
accepted (at most one); any other difference (a wrong state restored, cross-talk between names) fails.
"""
from __future__ import annotations

import math
import threading

from hooks_support import QUESTIONS, engine, hooks, intro, post, stack, turn_prompt

NAMES = 12
CLIENTS = 8
TURNS = 2


def conversation(base: str, ns: str, i: int, out: dict, errors: list) -> None:
    history = intro(i)
    for t in range(TURNS):
        prompt = turn_prompt(history, QUESTIONS[t])
        r = post(base, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0, "top_k": 1,
                                       "n_probs": 2, "return_tokens": True, "cache_prompt_name": f"name{i}"},
                 {"X-KV-Namespace": ns})
        if r.status != 200:
            errors.append((i, t, r.status, r.body[:300]))
            return
        out[(i, t)] = (r.json["content"], r.kind, r.json.get("tokens") or [], margins(r.json))
        history = prompt + r.json["content"] + "\n"


def margins(reply: dict) -> list[float]:
    """Per generated token: the probability gap between the two best candidates (1.0 when unknown)."""
    out = []
    for p in reply.get("completion_probabilities") or []:
        top = p.get("top_probs") or p.get("top_logprobs") or []
        probs = sorted((t["prob"] if "prob" in t else math.exp(t["logprob"]) for t in top), reverse=True)
        out.append(probs[0] - probs[1] if len(probs) >= 2 else 1.0)
    return out


def near_tie(ref: tuple, got: tuple, margin: float = 0.05) -> bool:
    """The first token where `got` leaves `ref` was a near tie in the reference."""
    ref_tokens, got_tokens, ref_margins = ref[2], got[2], ref[3]
    k = next((j for j, (a, b) in enumerate(zip(ref_tokens, got_tokens)) if a != b), None)
    return k is not None and k < len(ref_margins) and ref_margins[k] < margin


def test_eight_clients_twelve_names_two_slots(tmp_path):
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store, max_queue=16) as hk:
        ref, errors = {}, []
        for i in range(NAMES):
            conversation(hk.url, "ref", i, ref, errors)
        run = {}

        def client(k):
            for i in range(k, NAMES, CLIENTS):
                conversation(hk.url, "run", i, run, errors)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not any(th.is_alive() for th in threads), "deadlock: clients still waiting after 300 s"
        stats = hk.hooks.metrics.snapshot()
    assert not errors, errors
    assert len(run) == NAMES * TURNS
    kinds = [run[(i, 1)][1] for i in range(NAMES)]
    print(f"\nconcurrent second turns by kind: { {k: kinds.count(k) for k in set(kinds)} }; counters {stats}")
    differ = {key: (run[key][0], want[0]) for key, want in ref.items() if run[key][0] != want[0]}
    ties = {key for key in differ if near_tie(ref[key], run[key])}
    # A flipped near tie changes that name's later turns too; anything else is a real difference.
    flipped = {i for i, _t in ties}
    real = {key: v for key, v in differ.items() if key[0] not in flipped}
    assert not real and len(flipped) <= 1, (differ, ties)
    assert "restored" in kinds  # 12 names on 2 slots: returning names came back from the store
