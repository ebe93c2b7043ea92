"""Prefix states of a sliding-window model (Gemma 3): the first P tokens of a stored state, cut out by
`kvstore._core.cut_state`, restore through the raw slot API and llama-server resumes at exactly P.

For each cut the test restores the emitted file into slot 1 of server A, sends the prefix plus new tokens,
and checks `timings.prompt_n` = only the new tokens. A second server R evaluates the same tokens itself (from
scratch, or for a cut inside the reply by generating that reply itself and going on from its live slot); the
greedy tokens and the top-5 log-probabilities of every generated token must be equal bit for bit. That holds
because the cut keeps R's physical cell layout (`fill_masked`, format/cut.rs "Cell layout"). Without it the
window sits at other cell indices and some CPU kernels sum in another order: one case checks that tokens still
agree and probabilities stay within TOL (llama-server's own cache path differs from R by more; docs/design.md
"Prefix states").
Rows are bit-identical between two evaluations only when both computed them in ubatches of >= 64 tokens whose
sizes are multiples of 4 (llama.cpp's CPU matmul takes other kernels for small ubatches and for the 1-3 rows
left over; docs/state-format measurements). So the base prompt, every cut P and the new tokens are multiples of
4 and the new tokens number >= 64; otherwise R would differ for reasons that have nothing to do with the cut.

FA_F16_NONDETERMINISTIC: with flash attention on and an f16 cache, the comparison that was bit-identical when run
alone differed by up to 0.06 in probability in the loaded full suite, and once (a near-tie) in the greedy token,
so that configuration is compared with TOL up to a near-tie (`close_until_a_tie`); f16 without flash attention
and q8_0 stay bit-exact.
"""
from __future__ import annotations

import math

import pytest

from conftest import post_ok
from make_states import ARTICLE, QUESTION

import kvstore._core as core
from kvstore.gguf import sliding_window

N_SWA = 512  # gemma3-270m: gemma3.attention.sliding_window
SWA_CELLS = 1024  # the servers' SWA cache per slot: pad256(n_swa + n_ubatch) = pad256(512 + 512)
TOL = 0.1  # max |delta probability| of a top-5 token where bit identity cannot hold (measured: <= 0.063)

SENTENCES = [s.strip() + "." for s in ARTICLE.split(".") if s.strip()]
TEXT = ARTICLE + " " + " ".join(reversed(SENTENCES))  # ~620 tokens: longer than the window
NEW = " ".join(SENTENCES[3:9]) + QUESTION  # ~100 new tokens after the cut

CONFIGS = {
    "fa_on_f16": dict(flash_attn="on"),
    "fa_off_f16": dict(flash_attn="off"),
    "fa_on_q8_0": dict(flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0"),
}


def greedy(url: str, tokens: list[int], slot: int, cache: bool) -> dict:
    return post_ok(url + "/completion", {"prompt": tokens, "id_slot": slot, "cache_prompt": cache, "n_predict": 12,
                                         "temperature": 0.0, "n_probs": 5, "seed": 1, "ignore_eos": True})


def top(reply: dict) -> list[dict[int, float]]:
    return [{t["id"]: t["logprob"] for t in c["top_logprobs"]} for c in reply["completion_probabilities"]]


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, models, tmp_path_factory):
    """Server A (restores cuts), server R (the reference), and a base state of A: TEXT plus a 24-token reply."""
    from conftest import Server

    d = tmp_path_factory.mktemp("prefix")
    assert sliding_window(str(models["gemma3"])) == N_SWA
    kw = dict(parallel=2, ctx_size=4096, ubatch_size=512, **CONFIGS[request.param])
    a = Server(models["gemma3"], d, **kw)
    r = Server(models["gemma3"], None, **kw)
    try:
        text = post_ok(a.url + "/tokenize", {"content": TEXT, "add_special": True})["tokens"]
        new = post_ok(a.url + "/tokenize", {"content": NEW, "add_special": False})["tokens"]
        text, new = text[: len(text) // 4 * 4], new[: len(new) // 4 * 4]
        assert len(text) > N_SWA + 64 and len(new) >= 64, (len(text), len(new))
        post_ok(a.url + "/completion", {"prompt": text, "id_slot": 0, "cache_prompt": True, "n_predict": 25,
                                        "temperature": 0.0, "seed": 1, "ignore_eos": True})
        post_ok(a.url + "/slots/0?action=save", {"filename": "base.bin"})
        base = core.inspect_state(str(d / "base.bin"))
        yield dict(a=a, r=r, dir=d, cfg=request.param, tokens=[int(t) for t in base["tokens"]], n_text=len(text),
                   new=new)
    finally:
        a.close()
        r.close()


def cut_and_resume(pair, p: int, in_reply: bool = False, fill: int = SWA_CELLS) -> tuple[dict, dict, dict]:
    d, a, r = pair["dir"], pair["a"], pair["r"]
    info = core.cut_state(str(d / "base.bin"), p, N_SWA, str(d / f"cut{p}.bin"), fill_masked=fill)
    assert "missing" not in info, info
    assert info["window"] == [max(0, p - N_SWA), p]
    got = post_ok(a.url + "/slots/1?action=restore", {"filename": f"cut{p}.bin"})
    assert got["n_restored"] == p
    prompt = pair["tokens"][:p] + pair["new"]
    ours = greedy(a.url, prompt, 1, cache=True)
    if not in_reply:
        ref = greedy(r.url, prompt, 0, cache=False)
        assert ref["timings"]["prompt_n"] == len(prompt)
    else:
        # The reply's rows were computed one token at a time. R produces the same reply itself, stops at P and
        # goes on from its live slot: its SWA ring still holds rows older than the window, so it needs no
        # checkpoint and evaluates only the new tokens, exactly as the state's own server would have.
        n_text = pair["n_text"]
        reply = post_ok(r.url + "/completion", {"prompt": pair["tokens"][:n_text], "id_slot": 1, "cache_prompt": True,
                                                "n_predict": p - n_text + 1, "temperature": 0.0, "seed": 1,
                                                "ignore_eos": True, "return_tokens": True})
        assert pair["tokens"][n_text:p] == reply["tokens"][: p - n_text], "R must produce the same reply"
        ref = greedy(r.url, prompt, 1, cache=True)
        assert ref["timings"]["prompt_n"] == len(pair["new"]), ref["timings"]
    return info, ours, ref


def cuts(pair) -> dict[str, int]:
    n, n_text = len(pair["tokens"]), pair["n_text"]
    return {
        "inside a block": 100,
        "at a block boundary": 320,  # 10 x 32
        "before the stored window": (n - N_SWA - 40) // 4 * 4,  # its SWA rows are older than the body's ring
        "window past 0": 600,
        "inside the reply": n_text + 12,
    }


def test_prefix_resumes_at_p_and_continues_like_a_fresh_server(pair):
    n = len(pair["tokens"])
    for where, p in cuts(pair).items():
        assert 0 < p < n, (where, p, n)
        info, ours, ref = cut_and_resume(pair, p, in_reply=where == "inside the reply")
        # nothing before P is evaluated again: no rollback to an earlier checkpoint, no re-prefill
        assert ours["timings"]["prompt_n"] == len(pair["new"]), (where, p, ours["timings"])
        assert ours["timings"]["cache_n"] == p, (where, p, ours["timings"])
        if where == "before the stored window":
            assert any(o[1] is not None for o in info["origins"]), f"rows before the ring come from a checkpoint: {info}"
        ta = [c["id"] for c in ours["completion_probabilities"]]
        tb = [c["id"] for c in ref["completion_probabilities"]]
        if pair["cfg"] != "fa_on_f16":
            assert ta == tb, f"{pair['cfg']} {where} P={p}: {ours['content']!r} != {ref['content']!r}"
            for i, (x, y) in enumerate(zip(top(ours), top(ref))):
                assert x == y, f"{pair['cfg']} {where} P={p} token {i}: {x} != {y}"
        else:
            close_until_a_tie(ta, tb, top(ours), top(ref), f"{pair['cfg']} {where} P={p}")


def close_until_a_tie(ta: list[int], tb: list[int], xs: list[dict], ys: list[dict], what: str) -> None:
    """FA_F16_NONDETERMINISTIC: probabilities within TOL at every step; the greedy tokens may part only where the
    two candidates are within TOL of each other in both replies (a near-tie flipped), and are compared up to it."""
    for i, (a, b, x, y) in enumerate(zip(ta, tb, xs, ys)):
        dp = max(abs(math.exp(x[k]) - math.exp(y[k])) for k in x.keys() & y.keys())
        assert dp <= TOL, f"{what} token {i}: {x} vs {y}"
        if a != b:
            assert {a, b} <= x.keys() & y.keys(), f"{what} token {i}: {a} != {b}, not a near-tie: {x} vs {y}"
            assert all(abs(math.exp(z[a]) - math.exp(z[b])) <= TOL for z in (x, y)), f"{what} token {i}: {x} vs {y}"
            return


def test_window_alone_stays_close(pair):
    """Without fill_masked the window sits at other cells than in R: same tokens, probabilities within TOL."""
    p = 600
    info, ours, ref = cut_and_resume(pair, p, fill=0)
    assert ours["timings"]["prompt_n"] == len(pair["new"]) and ours["timings"]["cache_n"] == p
    assert [c["id"] for c in ours["completion_probabilities"]] == [c["id"] for c in ref["completion_probabilities"]]
    for i, (x, y) in enumerate(zip(top(ours), top(ref))):
        dp = max(abs(math.exp(x[k]) - math.exp(y[k])) for k in x.keys() & y.keys())
        assert dp <= TOL, f"{pair['cfg']} P={p} token {i}: {x} vs {y}"

def test_missing_window_rows_are_reported_not_emitted(pair, tmp_path):
    """A cut of a cut lacks the rows before the first cut's window; another stored state lends them."""
    d, n = pair["dir"], len(pair["tokens"])
    first = tmp_path / "first.bin"
    info = core.cut_state(str(d / "base.bin"), n - 10, 64, str(first))
    assert info["window"] == [n - 74, n - 10]
    out = tmp_path / "second.bin"
    assert core.cut_state(str(first), n - 100, 64, str(out)) == {"missing": [[n - 164, n - 100]]}
    assert not out.exists(), "nothing is written for a prefix that cannot be emitted"
    lent = core.cut_state(str(first), n - 100, 64, str(out), extras=[str(d / "base.bin")])
    assert lent["window"] == [n - 164, n - 100] and all(o[0] == 1 for o in lent["origins"]), lent


def test_store_cuts_a_stored_state_with_rows_lent_by_another(pair, tmp_path):
    """Store.materialize_prefix: rows the state lacks come from another stored state with identical rows; the
    emitted file resumes at P exactly like the reference server."""
    import kvstore

    d, n = pair["dir"], len(pair["tokens"])
    store = kvstore.Store(str(tmp_path / "store"))
    fp = {"model": "gemma3-test", "n_swa": str(N_SWA)}
    # "late": the base cut at n - 8, so its SWA rows start at n - 8 - 512
    assert "window" in core.cut_state(str(d / "base.bin"), n - 8, N_SWA, str(tmp_path / "late.bin"))
    store.ingest("late", str(tmp_path / "late.bin"), fingerprint=fp)
    p = 300
    lacking = n - 8 - N_SWA
    out = d / "stored_cut.bin"
    got = store.materialize_prefix("late", p, str(out), fill_masked=SWA_CELLS)
    assert got["missing"] == [[0, lacking]] and not out.exists(), got
    # without n_swa in the fingerprint an SWA state is never cut
    store.ingest("no-swa", str(tmp_path / "late.bin"), fingerprint={"model": "gemma3-test"})
    assert "n_swa" in store.materialize_prefix("no-swa", p, str(out))["reason"]

    store.ingest("base", str(d / "base.bin"), fingerprint=fp)
    base_id = store.get("base")["manifest_id"]
    got = store.materialize_prefix("late", p, str(out), fill_masked=SWA_CELLS)
    assert got["window"] == [0, p] and got["n_tokens"] == p, got
    assert any(o[0] == base_id and o[2] == 0 for o in got["origins"]), got
    post_ok(pair["a"].url + "/slots/1?action=restore", {"filename": out.name})
    prompt = pair["tokens"][:p] + pair["new"]
    ours = greedy(pair["a"].url, prompt, 1, cache=True)
    ref = greedy(pair["r"].url, prompt, 0, cache=False)
    assert ours["timings"]["prompt_n"] == len(pair["new"]) and ours["timings"]["cache_n"] == p
    assert top(ours) == top(ref)
