"""States stored at a fork on the recurrent and hybrid families (hooks/fork.py), against the real llama.cpp server
on the seeded tiny Mamba-2 and LFM2 (tests/tinymodels.py: no such GGUF ships on PyPI): five questions on each of
two articles, as users send them — two in flight, in both orders, named by the article and by the question, with
no parents. llama-server cannot continue a recurrent state where a prompt leaves it, so without a state at the
fork every question evaluates its article again (plain llama-server: 5 articles' worth each). Here an article is
evaluated once: its first question stores a state a block before its own end on the way (fork.guess), which the
next question extends all of; that one evaluates from there (at most a block more than its own tokens) and, where
it leaves a block or more past it, stores the state at the fork itself (another leaving there meanwhile waits for
it); every other question restores one of them and evaluates at most a block more than its own tokens."""
from __future__ import annotations

import threading

import pytest

from corpus import ARTICLES, QUESTIONS
from hooks_support import complete, get, hooks, metric, post, stack, tiny_engine, tokenize

ASKED = [*QUESTIONS, "Question: Which word in the text is the longest? Answer:",
         "Question: Is the text about nature? Answer:"]
N_ARTICLES = 2
# Each article three of the corpus's texts long (~250 tokens): a state a block before the first question's end
# lies inside the article (fork.guess).
LONG = [ARTICLES[a] + "\n\n" + ARTICLES[(a + 1) % 3] + "\n\n" + ARTICLES[(a + 2) % 3] for a in range(3)]
# A request evaluates its question's tokens, plus one or two where the article meets the question.
SLACK = 2
BLOCK = 32  # the store's block: a state at a fork lies on one, at most a block before where a question leaves


@pytest.mark.parametrize("arch", ["mamba2", "lfm2"])
@pytest.mark.parametrize("order", ["article-major", "question-major"])
@pytest.mark.parametrize("naming", ["article", "question"])
def test_questions_on_an_article_continue_the_state_stored_at_the_fork(arch, order, naming, tmp_path):
    store = tmp_path / "store"
    srv = tiny_engine(arch, store, tmp_path / "models")
    with stack(srv, hooks(srv.url, store)) as (_, h):
        jobs = [(a, q) for a in range(N_ARTICLES) for q in range(len(ASKED))]
        if order == "question-major":
            jobs.sort(key=lambda j: (j[1], j[0]))
        n_article = {a: len(tokenize(h.url, LONG[a])) for a in range(N_ARTICLES)}
        n_own = {j: len(tokenize(h.url, LONG[j[0]] + ASKED[j[1]])) - n_article[j[0]] for j in jobs}
        pending, lock, out, errors = list(jobs), threading.Lock(), {}, []

        def worker() -> None:
            try:
                while True:
                    with lock:
                        if not pending:
                            return
                        a, q = pending.pop(0)
                    name = f"article{a}" if naming == "article" else f"a{a}-q{q}"
                    r = complete(h.url, LONG[a] + ASKED[q], name=name, n_predict=4)
                    fork_n = int(r.headers.get("X-KV-Fork-Evaluated") or 0)
                    out[(a, q)] = (r.prompt_n + fork_n, fork_n, r.kind)
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        assert sorted(out) == sorted(jobs)
        print(f"\n[{arch} {order} name={naming}] (evaluated, of them at the fork, kind): "
              f"{[(j, out[j]) for j in jobs]}")
        for a in range(N_ARTICLES):
            mine = [out[(a, q)] for q in range(len(ASKED))]
            evaluated = sum(m[0] for m in mine)
            own = sum(n_own[(a, q)] for q in range(len(ASKED)))
            # Plain llama-server: 5 * article + own. The article once here (before: twice).
            assert evaluated <= n_article[a] + own + (BLOCK + SLACK) * len(ASKED), (a, evaluated, n_article[a], own,
                                                                                    mine)
            # The first question stored a state on the way, and at most one more stored the state at the fork
            # (others leaving there waited for it)...
            assert 1 <= sum(1 for m in mine if m[1]) <= 2, mine
            # ... and every question but the first continued one: its own tokens, and at most a block more.
            cheap = [q for q in range(len(ASKED)) if out[(a, q)][0] <= n_own[(a, q)] + BLOCK + SLACK]
            assert len(cheap) >= len(ASKED) - 1, (a, mine, n_own)
        assert metric(h.url, "kvstore_fork_states_total") >= N_ARTICLES
        names = {s["name"] for s in get(h.url, "/kvstore/states").json["states"]}
        assert sum(1 for n in names if n.startswith("fork-")) >= N_ARTICLES, names


def test_a_state_at_a_fork_serves_only_its_own_namespace(tmp_path):
    """Tenant A's questions store states at the fork of an article; tenant B asking about the same article finds
    none of them: no state at a fork in its listing, a full evaluation (which stores B's own state on the way), and
    B's second question continues B's own."""
    store = tmp_path / "store"
    srv = tiny_engine("lfm2", store, tmp_path / "models")
    with stack(srv, hooks(srv.url, store)) as (_, h):
        n_article = len(tokenize(h.url, LONG[0]))

        def ask(ns: str, q: int):
            r = complete(h.url, LONG[0] + ASKED[q], name=f"q{q}", n_predict=4, headers={"X-KV-Namespace": ns})
            return r, int(r.headers.get("X-KV-Fork-Evaluated") or 0)

        for q in range(3):
            ask("tenant-a", q)
        names_a = {s["name"] for s in get(h.url, "/kvstore/states", {"X-KV-Namespace": "tenant-a"}).json["states"]}
        assert any(n.startswith("fork-") for n in names_a), names_a
        names_b = {s["name"] for s in get(h.url, "/kvstore/states", {"X-KV-Namespace": "tenant-b"}).json["states"]}
        assert names_b == set(), names_b
        first, fork_n = ask("tenant-b", 0)
        assert first.kind == "miss" and first.prompt_n + fork_n >= n_article, (first.headers, first.prompt_n)
        second, fork_n = ask("tenant-b", 1)
        n_own = len(tokenize(h.url, LONG[0] + ASKED[1])) - n_article
        assert second.prompt_n + fork_n <= n_own + 32 + 2, (second.headers, second.prompt_n, fork_n)  # B's own


def test_a_users_state_under_a_forks_name_is_never_overwritten(tmp_path):
    """A user's own state stored under the very name a state at a fork would take is kept as it was: the fork is
    not stored over it, and the questions are still answered (a state on the way at another point may be)."""
    from kvstore.hooks import fork

    store = tmp_path / "store"
    srv = tiny_engine("lfm2", store, tmp_path / "models")
    with stack(srv, hooks(srv.url, store)) as (_, h):
        t0, t1 = (tokenize(h.url, ARTICLES[0] + ASKED[q]) for q in (0, 1))
        at = next(i for i, (a, b) in enumerate(zip(t0, t1)) if a != b)  # where the second question leaves the first
        taken = fork.name(t1[:at])
        assert post(h.url, f"/kvstore/states/{taken}", {"prompt": ARTICLES[1]}).status == 200
        mine = get(h.url, f"/kvstore/states/{taken}").json
        for q in range(3):
            r = complete(h.url, ARTICLES[0] + ASKED[q], name=f"q{q}", n_predict=4)
            assert r.status == 200, r.body[:300]
        kept = get(h.url, f"/kvstore/states/{taken}").json
        assert (kept["manifest_id"], kept["n_tokens"]) == (mine["manifest_id"], mine["n_tokens"]), (mine, kept)


def test_a_prime_stores_no_state_on_the_way_and_its_questions_continue_it(tmp_path):
    """A state primed under a name (`POST /kvstore/states/{name}`) is the whole prompt: no state is stored a block
    before its end (that is for a named request's first prompt); the questions with the primed article as parent
    continue it, each evaluating its own tokens."""
    store = tmp_path / "store"
    srv = tiny_engine("mamba2", store, tmp_path / "models")
    with stack(srv, hooks(srv.url, store)) as (_, h):
        primed = post(h.url, "/kvstore/states/art", {"prompt": LONG[0]})
        assert primed.status == 200 and "X-KV-Fork-Evaluated" not in primed.headers, dict(primed.headers)
        assert [s["name"] for s in get(h.url, "/kvstore/states").json["states"]] == ["art"]
        n_article = len(tokenize(h.url, LONG[0]))
        for q in range(2):
            r = complete(h.url, LONG[0] + ASKED[q], name=f"q{q}", parent="art", n_predict=4)
            n_own = len(tokenize(h.url, LONG[0] + ASKED[q])) - n_article
            assert r.kind in ("parent", "restored") and r.prompt_n <= n_own + SLACK, (r.kind, r.prompt_n, n_own)
        assert metric(h.url, "kvstore_fork_states_total") == 0
