"""W1 many users / few slots, W2 articles x questions, W3 restart: the same requests for every target.

The *ideal* of a request is the number of its prompt tokens that its session never put through the model
before (computed from token lists, no server involved): what a perfect cache would evaluate.
"""
from __future__ import annotations

import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvstore.hooks.slots import common_prefix as lcp

from . import text
from .client import chat, chat_tokens, complete, post_json, tokenize




@dataclass
class Tally:
    prompt_n: int = 0
    cache_n: int = 0
    ideal: int = 0
    requests: int = 0
    ttft_returning: list = field(default_factory=list)
    kv_cache: dict = field(default_factory=dict)
    # Several servers: a returning request served by another server than the session's previous one has "moved";
    # `restored` there, its state came from the bucket (that server's cache never held its newest blocks).
    last_server: dict = field(default_factory=dict)
    returning: int = 0
    moved: int = 0
    restored_from_bucket: int = 0
    # Each returning request's (TTFT s, prompt_n, prompt_ms): its TTFT over llama-server's own time evaluating what
    # it evaluated (for kvstore: its new tokens alone), what the restore path and the proxy add; and, in
    # `alone_ratio`, over what its tokens take evaluated alone (the rate of the same target's one-at-a-time run),
    # which requests in flight cannot be, since a batch's prompt_ms counts every request evaluated in it.
    returning_evals: list = field(default_factory=list)

    def add(self, res, ideal: int, returning: bool, session=None) -> None:
        self.prompt_n += res.prompt_n
        self.cache_n += res.cache_n
        self.ideal += ideal
        self.requests += 1
        if returning:
            self.ttft_returning.append(res.ttft_s)
            if res.prompt_ms > 0:
                self.returning_evals.append((res.ttft_s, res.prompt_n, res.prompt_ms))
            self.returning += 1
            if session in self.last_server and self.last_server[session] != res.server:
                self.moved += 1
                self.restored_from_bucket += res.kv_cache == "restored"
        if session is not None:
            self.last_server[session] = res.server
        if res.kv_cache:
            self.kv_cache[res.kv_cache] = self.kv_cache.get(res.kv_cache, 0) + 1

    def summary(self) -> dict:
        t = sorted(self.ttft_returning)
        over_eval = [ttft / (ms / 1000) for ttft, _, ms in self.returning_evals]
        p95 = t[min(len(t) - 1, int(0.95 * len(t)))] if t else 0.0
        return {"requests": self.requests, "prompt_n": self.prompt_n, "cache_n": self.cache_n, "ideal": self.ideal,
                "ratio_to_ideal": round(self.prompt_n / self.ideal, 3) if self.ideal else None,
                "ttft_returning_p50_s": round(statistics.median(t), 4) if t else None,
                "ttft_returning_p95_s": round(p95, 4) if t else None, "kv_cache": self.kv_cache,
                "ttft_returning_over_own_eval_p50": round(statistics.median(over_eval), 3) if over_eval else None,
                "returning": self.returning, "moved": self.moved, "restored_from_bucket": self.restored_from_bucket,
                "returning_evals": [[round(ttft, 4), n, round(ms, 1)] for ttft, n, ms in self.returning_evals]}


def eval_ms_per_token(row: dict) -> float | None:
    """Median of llama-server's prompt_ms per evaluated token over a row's returning requests."""
    rates = [ms / n for _, n, ms in row.get("returning_evals") or () if n > 0]
    return statistics.median(rates) if rates else None


def alone_ratio(row: dict, alone: dict) -> float | None:
    """Median over `row`'s returning requests of TTFT / (its prompt_n at `alone`'s rate): a returning user's time to
    first token over the evaluation of its tokens alone, `alone` being the same target's one-at-a-time run."""
    rate = eval_ms_per_token(alone)
    xs = [ttft / (n * rate / 1000) for ttft, n, _ in row.get("returning_evals") or () if n > 0]
    return round(statistics.median(xs), 3) if rate and xs else None


class Session:
    """What one session (a user, an article) has put through the model so far."""

    def __init__(self):
        self.seen: list = []

    def ideal(self, tokens: list) -> int:
        return len(tokens) - lcp(tokens, self.seen)

    def record(self, tokens: list, generated: list) -> None:
        # The last sampled token is never decoded, so it is not in the KV cache.
        seq = tokens + generated[:-1]
        if len(seq) > len(self.seen) or lcp(seq, self.seen) < len(self.seen):
            self.seen = seq


def run_w1(target, p: dict, restart_at: int = 0, api: str = "completion") -> dict:
    """Users take turns in a seeded random order, `inflight` requests at a time; conversations grow each turn.

    api: "completion" sends each turn as one prompt string on `/completion` (the name in `cache_prompt_name`);
    "chat" and "messages" send it as a chat client does, the conversation's messages on OpenAI's chat completions or
    Anthropic's Messages API (the name in the `X-KV-Name` header, which either SDK sets with `extra_headers`), so
    llama-server applies the model's chat template and the reply comes back as text that the next turn carries."""
    rng = random.Random(p["seed"])
    system = "System: You are a helpful assistant. " + text.paragraph(rng, p["system_words"]) + "\n"
    users = [f"user{i}" for i in range(p["users"])]
    history = {u: system for u in users}
    sessions = {u: Session() for u in users}
    turn = {u: 0 for u in users}
    msgs = {u: [text.paragraph(random.Random(f"{p['seed']}-{u}-{t}"), p["msg_words"]) for t in range(p["turns"])]
            for u in users}
    if p.get("first_words"):  # a long history of each user's own (a document pasted into the first turn)
        for u in users:
            msgs[u][0] = text.paragraph(random.Random(f"{p['seed']}-{u}-doc"), p["first_words"]) + " " + msgs[u][0]
    tally = Tally()
    kv = target.spec.kind == "kvstore"

    conversation: dict = {u: [] for u in users}  # the chat APIs' messages so far

    def one(u: str):
        url = target.url_for(users.index(u), turn[u]) if hasattr(target, "url_for") else target.url
        if api != "completion":
            messages = conversation[u] + [{"role": "user", "content": msgs[u][turn[u]]}]
            tokens = chat_tokens(target.url, system, messages)
            res = chat(url, api, system, messages, p["n_predict"], {"X-KV-Name": u} if kv else None)
            # The reply's tokens as the next turn's template will carry them (the chat APIs return text only).
            res.tokens = tokenize(target.url, res.text, add_special=False)
            return u, messages, tokens, res
        prompt = history[u] + "User: " + msgs[u][turn[u]] + "\nAssistant:"
        tokens = tokenize(target.url, prompt)
        extra = {"cache_prompt_name": u} if kv else {}
        res = complete(url, prompt, p["n_predict"], extra)
        return u, prompt, tokens, res

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=p["inflight"]) as pool:
        for rnd in range(p["turns"]):
            if restart_at and rnd == restart_at:
                target.restart()
            order = users[:]
            rng.shuffle(order)
            for u, prompt, tokens, res in pool.map(one, order):
                tally.add(res, sessions[u].ideal(tokens), returning=turn[u] > 0, session=u)
                sessions[u].record(tokens, res.tokens)
                if api != "completion":
                    conversation[u] = prompt + [{"role": "assistant", "content": res.text}]
                else:
                    history[u] = prompt + res.text + "\n"
                turn[u] += 1
    out = tally.summary()
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["final_history_tokens_max"] = max(len(s.seen) for s in sessions.values())
    return out


def run_w2(target, p: dict, order: str, parents: bool, naming: str = "question", inflight: int = 1) -> dict:
    """Articles x questions, prompt = article + question; `order` is article-major or question-major.

    naming: "question" (a name per question, `a{a}-q{q}`) or "article" (every question of an article under the
    article's name, as a user naming the state after the article would); `inflight` requests at a time, sent in
    order (so requests of one article overlap in article-major order)."""
    rng = random.Random(p["seed"])
    articles = [text.paragraph(rng, rng.randint(p["article_words"][0], p["article_words"][1]))
                for _ in range(p["articles"])]
    questions = [[text.question(rng) for _ in range(p["questions"])] for _ in articles]
    pairs = [(a, q) for a in range(len(articles)) for q in range(p["questions"])]
    if order == "question-major":
        pairs.sort(key=lambda aq: (aq[1], aq[0]))
    sessions = [Session() for _ in articles]
    primed: dict = {}
    prime_lock = threading.Lock()
    tally = Tally()
    kv = target.spec.kind == "kvstore"

    def prime(a: int, head: str) -> None:
        # The client primes the article once; its evaluation counts like any other.
        with prime_lock:
            if a in primed:
                return
            head_tokens = tokenize(target.url, head)
            r = post_json(f"{target.url_for(a, 0)}/kvstore/states/a{a}", {"prompt": head})
            pn = int((r.get("timings") or {}).get("prompt_n", r.get("prompt_n", len(head_tokens))))
            pn += int(r.get("fork_evaluated") or 0)  # a state stored at a fork on the way (recurrent models)
            primed[a] = (pn, head_tokens)

    def one(aq):
        a, q = aq
        head = articles[a] + "\n\nQuestion:"
        prompt = head + " " + questions[a][q] + "\nAnswer:"
        tokens = tokenize(target.url, prompt)
        extra = {}
        if kv:
            extra["cache_prompt_name"] = f"a{a}-q{q}" if naming == "question" else f"article{a}"
            if parents:
                extra["cache_prompt_parent"] = f"a{a}"
                prime(a, head)
        return a, tokens, complete(target.url_for(a, 0), prompt, p["n_predict"], extra)

    t0 = time.perf_counter()
    counted = set()
    with ThreadPoolExecutor(max_workers=inflight) as pool:
        for a, tokens, res in pool.map(one, pairs):
            if a in primed and a not in counted:
                pn, head_tokens = primed[a]
                tally.prompt_n += pn
                tally.ideal += sessions[a].ideal(head_tokens)
                sessions[a].record(head_tokens, [0])
                counted.add(a)
            tally.add(res, sessions[a].ideal(tokens), returning=bool(sessions[a].seen), session=a)
            sessions[a].record(tokens, res.tokens)
    out = tally.summary()
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out
