"""8 concurrent clients, 12 names, 2 slots: every reply equals its single-user reference; no deadlock, no 5xx."""
from __future__ import annotations

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
                                       "cache_prompt_name": f"name{i}"}, {"X-KV-Namespace": ns})
        if r.status != 200:
            errors.append((i, t, r.status, r.body[:300]))
            return
        out[(i, t)] = (r.json["content"], r.kind)
        history = prompt + r.json["content"] + "\n"


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
    differ = {key: (run[key][0], content) for key, (content, _kind) in ref.items() if run[key][0] != content}
    assert not differ, differ
    assert "restored" in kinds  # 12 names on 2 slots: returning names came back from the store
