"""Failure rules at the HTTP surface: bad names (400), raw slot API, a corrupt object (the request still
succeeds, the failure is counted), upstream down (502)."""
from __future__ import annotations


import pytest

import kvstore
from hooks_support import (QUESTIONS, complete, engine, get, hooks, intro, metric, post, request, stack, tokenize,
                           wait_idle)


def test_bad_names_raw_slots_corrupt_object_upstream_down(tmp_path, state_files, caplog):
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store) as hk:
        u = hk.url
        # -- bad names: 400 with the core's reason, llama-server never sees them
        for body, headers in [({"cache_prompt_name": "../etc/passwd"}, None), ({}, {"X-KV-Name": "a/b"}),
                              ({"cache_prompt_parent": ""}, None), ({}, {"X-KV-Namespace": "x\\y"})]:
            r = post(u, "/completion", {"prompt": "hi", "n_predict": 1, **body}, headers)
            assert r.status == 400, (body, headers, r.status, r.body)
            err = r.json["error"]
            assert err["type"] == "invalid_request_error" and err["message"], err
        r = post(u, "/slots/0?action=save", {"filename": "a/../b"})
        assert r.status == 400 and r.json["error"]["message"]
        for bad in ("2", "-1", "x"):
            r = post(u, f"/slots/{bad}?action=save", {"filename": "ok"})
            assert r.status == 400 and "slot" in r.json["error"]["message"], (bad, r.body)

        # -- raw slot API, through kvstore.save / kvstore.restore pointed at the hooks
        r = complete(u, intro(0), n_predict=2)
        slot = int(r.headers["X-KV-Slot"])
        saved = kvstore.save("raw-state", slot, server=u, namespace="t1")
        assert saved["n_saved"] > 0, saved
        info = get(u, "/kvstore/states/raw-state", {"X-KV-Namespace": "t1"})
        assert info.status == 200 and info.json["n_tokens"] == saved["n_saved"]
        assert get(u, "/kvstore/states/raw-state").status == 404  # another namespace
        restored = kvstore.restore("raw-state", 1 - slot, server=u, namespace="t1")
        assert restored["n_restored"] == saved["n_saved"], restored
        r = complete(u, intro(0) + " More", name="raw-state", headers={"X-KV-Namespace": "t1"}, n_predict=2)
        assert r.kind == "slot" and int(r.headers["X-KV-Slot"]) == 1 - slot and r.prompt_n <= 3
        assert post(u, "/slots/0?action=restore", {"filename": "never-saved"}).status == 404
        r = post(u, f"/slots/{slot}?action=erase", {})
        assert r.status == 200 and "n_erased" in r.json
        assert get(u, "/slots").status == 200  # passthrough

        # -- a corrupt object: the request still succeeds by evaluating the prompt; nothing else is lost
        def objects():
            return {p for p in (store / "objects").rglob("*") if p.is_file()}

        for s in (0, 1):  # drop unsaved slot contents, so that priming saves nothing but its own state
            assert post(u, f"/slots/{s}?action=erase", {}).status == 200
        assert post(u, "/kvstore/states/other", {"prompt": intro(1)}).status == 200
        before = objects()
        assert post(u, "/kvstore/states/victim", {"prompt": intro(2)}).status == 200
        new = sorted(objects() - before, key=lambda p: p.stat().st_size)
        assert new, "priming stored no new object"
        target = new[-1]  # the largest: a KV block
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.chmod(0o644)
        target.write_bytes(bytes(data))
        for s in (0, 1):  # make both states non-resident
            assert post(u, f"/slots/{s}?action=erase", {}).status == 200
        failures = metric(u, "kvstore_restore_failures_total")
        r = complete(u, intro(2) + "Hello", name="victim", n_predict=2)
        assert r.kind == "miss" and r.prompt_n >= 60, (r.kind, r.prompt_n)
        assert metric(u, "kvstore_restore_failures_total") == failures + 1
        r = complete(u, intro(1) + "Hello", name="other", n_predict=2)
        assert r.kind == "restored" and r.prompt_n <= 4, (r.kind, r.prompt_n)
        assert metric(u, "kvstore_hits_total", '{kind="restored"}') >= 1

        # -- a state of another cache layout (saved with flash attention off) under this server's model
        # fingerprint: refused by the layout the hooks learned from this server's saves, before llama-server
        # sees it (which would wipe the slot); the request is evaluated in full
        fp = get(u, "/kvstore/stats").json["fingerprint"]
        layout = fp.pop("layout")
        other = kvstore.Store(str(store)).ingest("fa-off", str(state_files["smollm2_fa_off"]), fingerprint=fp,
                                                 force=True)  # the store's own check would refuse it first
        assert kvstore.Store(str(store)).get("fa-off")["layout"] != layout, other
        failures = metric(u, "kvstore_restore_failures_total")
        caplog.clear()
        with caplog.at_level("ERROR", logger="kvstore.hooks"):
            r = complete(u, intro(3), name="fa-off", n_predict=2)
        assert r.status == 200 and r.kind == "miss" and r.prompt_n >= 60, (r.kind, r.prompt_n)
        assert metric(u, "kvstore_restore_failures_total") == failures + 1
        refused = [rec.getMessage() for rec in caplog.records if "restore failed" in rec.getMessage()]
        assert refused and "materialize fa-off" in refused[-1] and "layout" in refused[-1], refused

        # -- upstream down: 502 with the reason
        srv.close()
        r = post(u, "/completion", {"prompt": "hi", "n_predict": 1})
        assert r.status == 502 and "unreachable" in r.json["error"]["message"], r.body
        r = request(u + "/health")
        assert r.status == 502


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_a_request_llama_server_refuses_stores_nothing_under_its_name(model, tmp_path):
    """One slot, holding alpha's saved state. Requests named beta (a completion, a chat, a prime) whose prompt is over
    the slot's context are refused by llama-server and evaluate nothing: the slot still holds alpha's content, so
    beta must not be marked as evaluated there (its next save would store alpha's content as beta). Then beta's
    real request is stored with its own tokens."""
    store = tmp_path / "store"
    srv = engine(model, store, parallel=1)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        u, table = h.url, h.hooks.wired.table
        prompt = intro(0) + QUESTIONS[0]
        assert complete(u, prompt, name="alpha", n_predict=4).kind == "miss"
        h.run(table.save_all())
        alpha = h.run(h.hooks.wired.store.tokens("alpha", namespace=""))
        too_long = "word " * 3000  # over the slot's 2,048 tokens
        refused = [post(u, "/completion", {"prompt": too_long, "n_predict": 2, "cache_prompt_name": "beta"}),
                   post(u, "/v1/chat/completions", {"messages": [{"role": "user", "content": too_long}],
                                                    "max_tokens": 2}, {"X-KV-Name": "beta"}),
                   post(u, "/kvstore/states/beta", {"prompt": too_long})]
        for r in refused:
            assert r.status == 400 and "context" in r.json["error"]["message"], (r.status, r.body[:300])
        h.run(table.save_all())
        assert [s["name"] for s in get(u, "/kvstore/states").json["states"]] == ["alpha"]
        assert h.run(h.hooks.wired.store.tokens("alpha", namespace="")) == alpha
        assert not any(s.dirty for s in table.slots), [s.as_dict() for s in table.slots]
        # beta's own request: stored with its own tokens (its prompt, then its reply), not alpha's.
        beta_prompt = intro(1) + QUESTIONS[1]
        r = complete(u, beta_prompt, name="beta", n_predict=4)
        assert r.status == 200
        h.run(table.save_all())
        beta = h.run(h.hooks.wired.store.tokens("beta", namespace=""))
        assert beta[:len(tokenize(u, beta_prompt))] == tokenize(u, beta_prompt), (len(beta), len(alpha))


def test_several_completions_per_request_are_refused_and_other_slots_keep_their_states(tmp_path):
    """`n: 2` (OpenAI's n, llama-server's n_cmpl): llama-server would run the second completion in another slot of its
    own choosing, copying over (and then clearing) what that slot holds: here alice's unsaved turn (measured
    without this guard: alice's next turn then found nothing, cache_n 0). Refused with the reason, on every
    slot-managed path; alice continues in place."""
    store = tmp_path / "store"
    srv = engine("smollm2", store, parallel=2)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        u = h.url
        first = complete(u, intro(0) + QUESTIONS[0], name="alice", n_predict=4)
        refused = [post(u, "/completion", {"prompt": intro(3), "n_predict": 4, "n": 2}),
                   post(u, "/completion", {"prompt": intro(3), "n_predict": 4, "n_cmpl": 2}),
                   post(u, "/v1/chat/completions", {"messages": [{"role": "user", "content": intro(3)}], "n": 2,
                                                    "max_tokens": 4}),
                   post(u, "/v1/responses", {"input": intro(3), "n": 2, "max_output_tokens": 4})]
        for r in refused:
            assert r.status == 400 and "several completions" in r.json["error"]["message"], (r.status, r.body[:300])
        assert post(u, "/completion", {"prompt": intro(3), "n_predict": 2, "n": 1}).status == 200
        again = complete(u, intro(0) + QUESTIONS[0] + first.json["content"] + QUESTIONS[1], name="alice",
                         n_predict=4)
        assert again.kind == "slot" and again.json["timings"]["cache_n"] >= first.prompt_n - 1, again.json["timings"]


SLACK = {"smollm2": 0, "gemma3": 8}  # as in tests/hooks/test_hooks_client_apis.py


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_bad_requests_displace_no_one(model, tmp_path):
    """Two slots hold alice's and bob's unsaved turns. Bad requests, unnamed and named, that llama-server refuses (a
    field of the wrong type, a prompt that is no prompt, messages its template cannot render), and an empty prompt,
    take a slot and evaluate nothing; requests without a prompt
    or messages are refused before they take one. Afterwards both users still continue in place: a bad request
    displaced no one (its slot's state was saved on the way, and is still resident under its name)."""
    store = tmp_path / "store"
    srv = engine(model, store, parallel=2)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        u, table = h.url, h.hooks.wired.table
        users = {"alice": intro(0) + QUESTIONS[0], "bob": intro(1) + QUESTIONS[0]}
        replies = {n: complete(u, p, name=n, n_predict=4) for n, p in users.items()}

        def labels() -> dict:
            """The slots' labels once every lease has ended (a reply reaches the client before its lease ends)."""
            wait_idle(table)
            return {s.id: s.name for s in table.slots}

        held = labels()
        assert sorted(held.values()) == ["alice", "bob"], held
        evaluate_nothing = [  # reach llama-server in a slot kvstore leases (the displaced state saved), evaluate nothing
            ("/completion", {"prompt": "Hello", "n_predict": 2, "temperature": "hot"}, 400),
            ("/completion", {"prompt": 5, "n_predict": 2}, 400),
            ("/completion", {"prompt": "Hello", "n_predict": "many", "cache_prompt_name": "carol"}, 400),  # new name
            # a text block without its text: llama-server's chat template fails on it, a 500
            ("/v1/messages", {"model": "m", "max_tokens": 2,
                              "messages": [{"role": "user", "content": [{"type": "text"}]}]}, 500),
        ]
        empty_prompt = h.run(h.hooks.wired.broker.prompt_tokens({"prompt": ""}, False)) == []  # SmolLM2: no BOS
        if empty_prompt:
            # an empty prompt: llama-server answers, having evaluated and generated nothing (before, carol's label
            # stayed on the cells another name left there, and they were saved as carol). Gemma 3 adds a BOS token:
            # its empty prompt is one token, evaluated.
            evaluate_nothing.append(("/completion", {"prompt": "", "n_predict": 3, "cache_prompt_name": "carol"}, 200))
        for path, body, status in evaluate_nothing:
            r = post(u, path, body)
            assert r.status == status, (body, r.status, r.body[:300])
            assert status == 200 or r.json["error"]["message"], r.body[:300]
            assert labels() == held, (body, [s.as_dict() for s in table.slots])
        for path, body, says in [("/completion", {"n_predict": 2, "cache_prompt_name": "carol"}, "`prompt`"),
                                 ("/kvstore/states/carol", {"prompt": ["Hello", "Bye"]}, "one prompt"),
                                 ("/v1/chat/completions", {"max_tokens": 2}, "`messages`"),
                                 ("/v1/chat/completions", {"messages": "Hello"}, "`messages`")]:
            r = post(u, path, body)
            assert r.status == 400 and says in r.json["error"]["message"], (path, body, r.status, r.body[:300])
        if empty_prompt:  # priming nothing would store what the slot held (before: another name's 64 tokens)
            r = post(u, "/kvstore/states/carol", {"prompt": ""})
            assert r.status == 400 and "no tokens" in r.json["error"]["message"], (r.status, r.body[:300])
        assert labels() == held
        h.run(table.save_all())
        assert get(u, "/kvstore/states/carol").status == 404
        for n, p in users.items():
            r = complete(u, p + replies[n].json["content"] + QUESTIONS[1], name=n, n_predict=2)
            assert r.kind == "slot", (n, r.kind, r.headers.get("X-KV-Slot"))
            # reused up to the end of the first prompt (Gemma 3: from its newest checkpoint, a few tokens before)
            assert r.json["timings"]["cache_n"] >= replies[n].prompt_n - SLACK[model], r.json["timings"]
