"""Restore or recompute (kvstore/hooks/cost.py): the model's logic on given numbers, then on the real server, where a
prefill rate assumed as fast as a GPU's makes recompute win and the measured CPU rate keeps restoring."""
from __future__ import annotations

import threading

import pytest

from hooks_support import MODELS, QUESTIONS, complete, engine, get, hooks, intro, metric, stack, tokenize, turn_prompt

from kvstore.hooks.cost import CostModel, Line

N_PREDICT = 4


def test_a_line_fits_a_fixed_cost_and_a_rate():
    ln = Line()
    assert ln.fit() is None and ln.predict(10) is None
    for x in (1e6, 2e6, 4e6):
        ln.add(x, 0.01 + x / 1e9)  # 10 ms per call, 1 GB/s
    fixed, per = ln.fit()
    assert fixed == pytest.approx(0.01) and per == pytest.approx(1e-9)
    ln2 = Line()
    ln2.add(1e6, 0.002)  # one size only: the mean rate through the origin
    assert ln2.fit() == (0.0, pytest.approx(2e-9))
    ln2.add(0, 1.0)  # nothing of zero size or time is an observation
    ln2.add(5, 0)
    assert len(ln2) == 1


def test_recompute_wins_short_prefixes_against_a_fast_prefill_and_restore_wins_long_ones():
    m = CostModel(assume_prefill_tps=20_000)  # a GPU's prefill
    assert m.decide(1000, 1000).restore, "nothing measured yet: restore, as before the model existed"
    for n in (100, 400, 1600):  # 8 ms per restore, 5 GB/s, 100 KB per token (8B model, f16 KV)
        m.restored(n, n * 100_000, 0.008 + n * 100_000 / 5e9)
    short, long_ = m.decide(32, 32), m.decide(4000, 4000)
    assert not short.restore and short.recompute_s == pytest.approx(32 / 20_000), short
    assert short.restore_s == pytest.approx(0.008 + 32 * 100_000 / 5e9)
    assert long_.restore and long_.restore_s < long_.recompute_s, long_
    # What the slot holds in place is spared either way: a restore that brings little more is not worth it.
    assert not m.decide(4000, 40).restore
    assert short.header().startswith("recompute; restore_ms=8.6; recompute_ms=1.6"), short.header()

    cpu = CostModel()  # measured: these CPUs prefill ~1,000 tokens/s
    for n in (50, 200, 800):
        cpu.prefilled({"prompt_n": n, "prompt_ms": n})
        cpu.restored(n, n * 100_000, 0.008 + n * 100_000 / 2e9)
    cpu.prefilled({"prompt_n": 3, "prompt_ms": 900.0})  # too short to say anything about the rate
    assert cpu.describe()["prefill"] == {"samples": 3, "fixed_s": 0.0, "tokens_per_s": 1000}
    assert all(cpu.decide(n, n).restore for n in (16, 64, 1024, 8192))
    with pytest.raises(ValueError, match="assume-prefill-tps"):
        CostModel(0)
    with pytest.raises(ValueError, match="restore-policy"):
        CostModel(policy="never")
    # "always" (what the restore paths' own tests pin): the same estimates, the restore whatever they say.
    pinned = CostModel(assume_prefill_tps=20_000, policy="always")
    for n in (400, 1600):
        pinned.restored(n, n * 100_000, 0.008 + n * 100_000 / 5e9)
    d = pinned.decide(32, 32)
    assert d.restore and d.restore_s > d.recompute_s, d


def _two_at_a_time(url: str, users: list[int], turn: int, history: dict) -> dict:
    """One turn of each user, two requests in flight; returns {user: Reply}."""
    out: dict = {}

    def one(u: int):
        out[u] = complete(url, turn_prompt(history[u], QUESTIONS[turn]), name=f"user{u}", n_predict=N_PREDICT)

    for i in range(0, len(users), 2):
        ts = [threading.Thread(target=one, args=(u,)) for u in users[i:i + 2]]
        for t in ts:
            t.start()
        for t in ts:
            t.join(600)
    for u in users:
        history[u] = turn_prompt(history[u], QUESTIONS[turn]) + out[u].json["content"] + "\n"
    return out


def _returning(model: str, store, **kw) -> tuple[dict, dict, dict]:
    """Four users on two slots, two in flight: every second turn is a return after eviction. The first return is
    restored whatever the rates (nothing measured yet); returns the replies of the first two returns and of the last
    two, the last two prompts' token counts and /kvstore/stats' cost figures."""
    history = {u: intro(u) for u in range(4)}
    with stack(engine(model, store)) as (srv,):
        with stack(hooks(srv.url, store, **kw)) as (hk,):
            _two_at_a_time(hk.url, [0, 1, 2, 3], 0, history)
            first = _two_at_a_time(hk.url, [0, 1], 1, history)
            kinds = {u: (r.kind, r.headers.get("X-KV-Decision")) for u, r in first.items()}
            assert any(k == "restored" and d.startswith("restore; restore_ms=unknown") for k, d in kinds.values()), kinds
            prompts = {u: turn_prompt(history[u], QUESTIONS[1]) for u in (2, 3)}
            last = _two_at_a_time(hk.url, [2, 3], 1, history)
            n_tokens = {u: len(tokenize(srv.url, p)) for u, p in prompts.items()}
            cost = get(hk.url, "/kvstore/stats").json["cost"]
            decided = {d: metric(hk.url, "kvstore_decisions_total", f'{{decision="{d}"}}')
                       for d in ("restore", "recompute")}
    return last, n_tokens, {"cost": cost, "decided": decided, "first": first}


@pytest.mark.parametrize("model", MODELS)
def test_a_gpu_fast_prefill_recomputes_and_the_measured_cpu_rate_restores(model, tmp_path):
    # As fast as no restore path can be: recompute must win every weighed restore once a restore was measured.
    last, n_tokens, seen = _returning(model, tmp_path / "fast", assume_prefill_tps=1e9, restore_policy="cost")
    assert seen["cost"]["prefill"] == {"assumed": True, "tokens_per_s": 1e9}, seen
    assert seen["cost"]["restore"]["samples"] >= 1, seen
    for u, r in last.items():
        assert r.headers["X-KV-Decision"].startswith("recompute; restore_ms="), r.headers
        assert r.kind == "miss", r.headers
        # The whole prompt evaluated (llama-server may keep the one token a fresh slot starts with).
        assert r.prompt_n >= n_tokens[u] - 1, (u, r.prompt_n, n_tokens[u])
    assert seen["decided"]["recompute"] >= 2, seen
    # Of the first two returns, one may come after the other's restore was measured: recomputed then too.
    assert all(r.kind == ("restored" if r.headers["X-KV-Decision"].startswith("restore") else "miss")
               for r in seen["first"].values()), {u: r.headers for u, r in seen["first"].items()}

    # Measured on these CPUs: restoring is far cheaper than evaluating again, so the same returns are restored.
    last, n_tokens, seen = _returning(model, tmp_path / "measured", restore_policy="cost")  # the default
    assert seen["cost"]["prefill"]["samples"] >= 4 and seen["cost"]["restore"]["samples"] >= 2, seen
    for u, r in last.items():
        assert r.headers["X-KV-Decision"].startswith("restore; restore_ms="), r.headers
        assert "unknown" not in r.headers["X-KV-Decision"], r.headers
        assert r.kind in ("restored", "prefix") and r.prompt_n < n_tokens[u] // 2, (u, r.headers, r.prompt_n)
    assert seen["decided"]["recompute"] == 0 and seen["decided"]["restore"] >= 4, seen
    assert all(r.kind == "restored" for r in seen["first"].values()), {u: r.headers for u, r in seen["first"].items()}
