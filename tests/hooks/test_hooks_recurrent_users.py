"""Returning users on the recurrent and hybrid families (the seeded tiny Mamba-2 and LFM2 of tests/tinymodels.py:
no such GGUF ships on PyPI), four users on two slots, each sending its conversation as the tokens it was given
(its prompt, then its reply's tokens as generated, then the new question): one request at a time in round robin,
so every returning user was displaced and is restored, then all four in flight at once. A recurrent state cannot
be rolled back into, yet none needs to be: its cells sit at the state's last position, so a prompt that carries
the stored tokens resumes at the end, restored or kept, and evaluates its new tokens plus the reply's last one
(sampled, never decoded). A fall back to llama-server's checkpoint, at the end of the previous prompt, would
evaluate the whole reply again (24 tokens more here)."""
from __future__ import annotations

import threading

import pytest

from hooks_support import QUESTIONS, complete, hooks, intro, stack, tiny_engine, tokenize

N_USERS = 4
N_PREDICT = 24
# Beyond the new tokens: the reply's last token, which the stored state does not hold.
SLACK = 1


def turn(base: str, user: int, history: list[int], t: int, ns: str) -> tuple[list[int], dict]:
    """Send user's turn t; returns its history after the reply, and what the turn measured."""
    question = tokenize(base, f"User: {QUESTIONS[t % len(QUESTIONS)]}\nAssistant:")[1:]  # no second BOS
    prompt = history + question
    r = complete(base, prompt, name=f"user{user}", n_predict=N_PREDICT, return_tokens=True,
                 headers={"X-KV-Namespace": ns})
    tokens = r.json["tokens"]
    assert len(tokens) == N_PREDICT, (user, t, len(tokens))  # no early stop: the bound below is the reply's
    return prompt + tokens, {"kind": r.kind, "evaluated": r.prompt_n, "new": len(question), "reply": tokens}


@pytest.mark.parametrize("arch", ["mamba2", "lfm2"])
def test_returning_users_resume_at_the_end_of_their_recurrent_state(arch, tmp_path):
    store = tmp_path / "store"
    srv = tiny_engine(arch, store, tmp_path / "models")
    with stack(srv, hooks(srv.url, store)) as (_, h):
        first = {u: tokenize(h.url, intro(u)) for u in range(N_USERS)}

        def run(ns: str, order: list[tuple[int, int]]) -> tuple[dict, dict]:
            history = dict(first)
            out = {}
            for u, t in order:
                history[u], out[(u, t)] = turn(h.url, u, history[u], t, ns)
            return out, history

        kept, _ = run("kept", [(u, t) for u in range(N_USERS) for t in range(3)])
        rr, history = run("rr", [(u, t) for t in range(3) for u in range(N_USERS)])
        for (u, t), m in sorted(rr.items()):
            assert kept[(u, t)]["kind"] == ("slot" if t else "miss"), ((u, t), kept[(u, t)])
            # Restored, the user continues as if it had kept its slot.
            assert m["reply"] == kept[(u, t)]["reply"], (u, t)
            if t:
                assert m["kind"] == "restored", ((u, t), m)
                assert m["evaluated"] <= m["new"] + SLACK, ((u, t), m)
                assert kept[(u, t)]["evaluated"] <= m["new"] + SLACK, ((u, t), kept[(u, t)])

        # All four at once, two turns each: twice the requests there are slots, in whatever order they land.
        inflight: dict = {}
        errors: list = []

        def user(u: int) -> None:
            try:
                conv = history[u]
                for t in (3, 4):
                    conv, inflight[(u, t)] = turn(h.url, u, conv, t, "rr")
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=user, args=(u,)) for u in range(N_USERS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        assert not errors, errors
        print(f"\n[{arch}] in flight: {[(k, v['kind'], v['evaluated'], v['new']) for k, v in sorted(inflight.items())]}")
        assert sorted(inflight) == [(u, t) for u in range(N_USERS) for t in (3, 4)]
        assert any(m["kind"] == "restored" for m in inflight.values()), inflight
        for (u, t), m in inflight.items():
            assert m["kind"] in ("restored", "slot"), ((u, t), m)
            assert m["evaluated"] <= m["new"] + SLACK, ((u, t), m)
