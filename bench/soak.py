"""A soak: a user's traffic against the real `kvstore serve` for a while, with the product's promises checked.

`python -m bench.soak [--model M] [--seconds S] [--clients N] [--slots N] [--max-size MIB] [--restarts K]
[--bucket [--servers N]] [--out JSON]`

What runs: `kvstore serve` (the embedded llama-server) with two tenants (a key file) whose clients send the same
script, so that another tenant's cells would show in `cache_n`: users (one conversation each, named by the user,
one API each: `/completion`, chat completions or the Messages API, streamed or not at random, a pinned one among
them) and articles (questions named after the article, or after the question with the article as parent), N
clients in flight in random order, now and then a bad request. The server is stopped (SIGTERM, with requests in
flight) and started again on the same store K times.

Checked (each failure is listed; the exit status is 1 if any):
- every request answered within its timeout: 200, or 503 with Retry-After (sent again), or a 4xx for a bad one;
- a tenant reuses only what it sent: a reply's `cache_n` never passes what that tenant's conversation had reached
  (prompt and reply tokens) in the requests it sent before that reply came, plus the tokens evaluated for the
  request itself on the way (`X-KV-Fork-Evaluated`) and `SHARED_HEAD` tokens (the chat template's and BOS tokens
  its other conversations share);
- a committed state is kept: after each restart every pinned user (and every user, without a cap) is stored with
  at least the prompt tokens of its last answered turn;
- the disk: the store's objects, sampled every `SAMPLE_S`, never pass `--max-size`;
- no eviction fails (`kvstore_eviction_failures_total`, read before each stop);
- at the end, `kvstore verify` finds every object whole.

`--bucket`: the store in an S3 bucket (SeaweedFS on loopback) with a local cache. Every check holds there too
(SmolLM2, 45 s and 120 s, 48 MiB cap). Before the prune's copies had to fit below the cap, the bucket passed it for
moments by up to 6.4 MB (docs/design.md, "gc" under the bucket store).

`--servers N` (with `--bucket`): N `kvstore serve` on the one bucket, each with its own llama-server and cache,
each request sent to one at random (a round-robin balancer), `--idle-save 1 --evict-period 1` (docs/hooks.md's
advice for several servers); a restart stops and starts them all. The checks are the same but two: a committed
state may be replaced by another server's later save of an older one (the later save wins; the newer is kept in
`displaced`, which the check accepts and counts as `older_state_won`), and the cap is only measured (each
server counts the others' saves at its next eviction; tests/remote/test_bound_s3.py bounds the excess).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx

from kvstore.engine import free_port, wait_healthy
from kvstore.models import model_path

from .targets import BUCKET, ROOT, cleanup, family_total, scrape, seaweed, workdir
from .text import paragraph, question, sentence

SHARED_HEAD = 16  # tokens a tenant's conversations may share (BOS, the template's opening); each starts unique
SAMPLE_S = 0.25
REQUEST_TIMEOUT_S = 180.0
TENANTS = {"A": "soak-key-tenant-a", "B": "soak-key-tenant-b"}
ADMIN_KEY = "soak-key-admin"  # reads /metrics (the evictions)
APIS = ("completion", "chat", "messages")
BAD = [  # (path, body): refused by llama-server or by kvstore, each a 4xx
    ("/completion", {"prompt": "Hello", "n_predict": 2, "temperature": "hot"}),
    ("/completion", {"prompt": 5, "n_predict": 2}),
    ("/completion", {"n_predict": 2, "cache_prompt_name": "nobody"}),
    ("/v1/chat/completions", {"messages": "no", "max_tokens": 2}),
    ("/completion", {"prompt": "Hello", "n_predict": 2, "n": 2}),
]


@dataclass
class Sent:
    """One request as the client saw it."""

    tenant: str
    conv: str  # the conversation whose tokens it may reuse: a user, or an article
    kind: str  # "user", "question", "prime", "bad"
    api: str
    t_sent: float
    t_done: float = 0.0
    status: int = 0
    prompt_n: int = 0
    cache_n: int = 0
    predicted_n: int = 0
    # Of the prompt, the tokens kvstore evaluated first to store a state on the way (X-KV-Fork-Evaluated, a model
    # with a recurrent section): llama-server's timings for the reply count them as cached.
    fork_n: int = 0
    kv_cache: str = ""
    retries: int = 0
    error: str = ""

    @property
    def reached(self) -> int:
        return self.prompt_n + self.cache_n + self.predicted_n


@dataclass
class User:
    tenant: str
    index: int
    api: str
    pinned: bool
    system: str
    generation: int = 0
    turns: list = field(default_factory=list)  # (message, reply)
    last_prompt_tokens: int = 0  # of the last answered turn
    busy: bool = False

    @property
    def name(self) -> str:
        return f"user-{self.index}-g{self.generation}"


class Soak:
    def __init__(self, model: str, wd: Path, *, clients: int, slots: int, ctx: int, max_size_mib: float,
                 seed: int, users: int, articles: int, questions: int, n_predict: int, max_turns: int,
                 one_namespace: bool = False, kill: bool = False, bucket: bool = False, servers: int = 1):
        self.model, self.wd, self.clients, self.slots, self.ctx = model, wd, clients, slots, ctx
        self.max_size = int(max_size_mib * 2**20) if max_size_mib > 0 else 0
        self.n_predict, self.max_turns = n_predict, max_turns
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.active = 0  # jobs under way, less those waiting for a restart to end
        self.closing_since = float("inf")  # when the running restart closed the gate
        self.sent: list[Sent] = []
        self.failures: list[str] = []
        self.max_objects = 0
        self.restarts = 0
        self.store = wd / "store"
        # bucket: the store is an S3 bucket (SeaweedFS on loopback, bench/targets.py) with a local cache.
        self.remote = f"s3://{BUCKET}/soak-{uuid.uuid4().hex[:12]}" if bucket else None
        if servers > 1 and not bucket:
            raise ValueError("several servers share a store only in a bucket: give --bucket")
        self.env = seaweed().env() if bucket else None
        self.keys = wd / "keys"
        # one_namespace, kill: the checks' own checks. Both keys in one namespace must show as a leak; a restart by
        # SIGKILL loses the turns not saved yet, which must show as names not kept.
        self.kill = kill
        self.keys.write_text("".join(f"{key} {'A' if one_namespace else ns}\n" for ns, key in TENANTS.items())
                             + f"{ADMIN_KEY} - admin\n")
        self.evictions = 0
        self.over_unmet = 0  # samples over the cap while pinned and in-use names filled it
        self.older_won = 0  # committed states replaced by another server's later save of an older one
        self.log = open(wd / "serve.log", "ab")
        # Several servers: each its own embedded llama-server and cache on the one bucket; each request goes to one
        # at random, as behind a round-robin balancer.
        self.ports = [free_port() for _ in range(servers)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        self.url = self.urls[0]  # for the checks: every server reads the same bucket
        self.procs: list[subprocess.Popen] = []
        script = random.Random(seed + 1)  # the same texts for both tenants
        systems = [f"Note {i}: {sentence(script)} {paragraph(script, 40)}" for i in range(users)]
        self.articles = [f"Article {k}. {paragraph(script, 260)}" for k in range(articles)]
        self.questions = [[question(script) for _ in range(questions)] for _ in range(articles)]
        self.users = [User(t, i, APIS[i % len(APIS)], pinned=(i == 0), system=systems[i])
                      for t in TENANTS for i in range(users)]
        self.todo = {t: [(k, j) for k in range(articles) for j in range(questions)] for t in TENANTS}
        self.primed: set = set()
        self.answered: dict = {}  # (tenant, question's name) -> its last answered prompt's tokens
        self.message_rng = random.Random(seed + 2)

    # -- the server --------------------------------------------------------------------------------------------
    def store_args(self, server: int = 0) -> list[str]:
        """`--store` (and an S3 store's `--cache`, one per server), as `serve` and `verify` take them."""
        if self.remote:
            return ["--store", self.remote, "--cache", str(self.wd / f"cache-{server}")]
        return ["--store", str(self.store)]

    def start(self) -> None:
        for i, port in enumerate(self.ports):
            # Several servers: a user's newest state reaches the bucket soon (docs/hooks.md), and each server lists
            # the bucket's size often, since it does not see the others' saves.
            often = ["--idle-save", "1", "--evict-period", "1"] if len(self.ports) > 1 else ["--idle-save", "3"]
            cmd = [sys.executable, "-m", "kvstore.cli", "serve", *self.store_args(i), "-m",
                   str(model_path(self.model)), "-np", str(self.slots), "-c", str(self.ctx), "--port", str(port),
                   "--api-key-file", str(self.keys), *often]
            if self.max_size:
                cmd += ["--max-size", str(self.max_size)]
            self.procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                               env=self.env))
        for url, proc in zip(self.urls, self.procs):
            wait_healthy(url, timeout=180, alive=lambda proc=proc: proc.poll() is None)

    def stop(self, kill: bool = False) -> int:
        """Stop every server (SIGTERM, or SIGKILL with `kill`); the first nonzero exit status, else 0."""
        assert self.procs
        for url in self.urls:
            try:
                samples, _ = scrape(url, _admin())
            except OSError:
                continue
            self.evictions += int(family_total(samples, "kvstore_evictions_total"))
            if failed := int(family_total(samples, "kvstore_eviction_failures_total")):
                self.failures.append(f"{url}: {failed} eviction(s) failed (the store may pass its cap): see the "
                                     f"server's log")
        for proc in self.procs:
            proc.kill() if kill else proc.terminate()
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=120))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.failures.append("kvstore serve did not stop within 120 s of SIGTERM")
                codes.append(-9)
        self.procs = []
        return 0 if kill else next((c for c in codes if c != 0), 0)

    def restart(self) -> None:
        """Stop with requests in flight (they finish), start again, check what was committed, go on."""
        self.closing_since = time.monotonic()
        self.gate.clear()
        rc = self.stop(kill=self.kill)
        if rc != 0:
            self.failures.append(f"kvstore serve exited {rc} on SIGTERM")
        while self.active:  # the requests in flight were answered before the exit: let their clients record them
            time.sleep(0.05)
        self.start()
        self.restarts += 1
        self.check_committed()
        self.closing_since = float("inf")
        self.gate.set()

    def check_committed(self) -> None:
        """Every user with an answered turn (with a cap: the pinned ones) and, without a cap, every question named
        on its own, stored with at least the tokens of its last answered prompt."""
        want = [(u.tenant, u.name, u.last_prompt_tokens) for u in self.users
                if u.turns and (u.pinned or not self.max_size)]
        if not self.max_size:
            want += [(t, name, n) for (t, name), n in self.answered.items()]
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for tenant, name, n in want:
                r = http.get(f"/kvstore/states/{name}", headers=_auth(tenant))
                if r.status_code != 200:
                    self.failures.append(f"restart {self.restarts}: {tenant}/{name} not stored: {r.status_code}")
                elif r.json()["n_tokens"] < n and len(self.urls) > 1 and r.json().get("displaced"):
                    # Several servers: the later save wins, and a newer state it replaced is kept in `displaced`.
                    self.older_won += 1
                elif r.json()["n_tokens"] < n:
                    self.failures.append(f"restart {self.restarts}: {tenant}/{name} stored with "
                                         f"{r.json()['n_tokens']} tokens, its last answered prompt had {n}")

    def objects_bytes(self) -> int:
        """The objects' bytes on disk, scanned under the store's lock held exclusively, as `kvstore gc` holds it:
        a save holds it shared from its first object to its commit and an eviction exclusively, so the scan sees
        the objects between them, never an eviction's deletions and a save's new objects both (without the lock, a
        scan during both counted 56 MB against a 48 MiB cap, with the server's count 43 MB after its eviction).
        A bucket: what the cap counts there, the objects in its packs and the loose ones (`_objects_listed`), the
        smaller of two listings (its lock is an object in the bucket; a listing of one page rarely straddles an
        eviction and a save)."""
        if self.remote:
            prefix = self.remote[len(f"s3://{BUCKET}/"):] + "/"
            return min(_objects_listed(seaweed().list_sizes(BUCKET, prefix + "packs/"))
                       + seaweed().bucket_bytes(BUCKET, prefix + "objects/") for _ in range(2))
        with open(self.store / "lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return sum(p.stat().st_size for p in (self.store / "objects").rglob("*") if p.is_file())

    # -- the clients -------------------------------------------------------------------------------------------
    def pick(self):
        """The next thing to send, chosen at random among what is not under way: a user's turn, a question, or
        (one in 16) a bad request."""
        with self.lock:
            if self.rng.random() < 1 / 16:
                return ("bad", self.rng.choice(list(TENANTS)), self.rng.choice(BAD))
            idle = [u for u in self.users if not u.busy]
            todo = [(t, q) for t in TENANTS for q in self.todo[t]]
            if todo and (not idle or self.rng.random() < 0.5):
                t, (k, j) = self.rng.choice(todo)
                self.todo[t].remove((k, j))
                if not self.todo[t]:  # every question asked: ask them again
                    self.todo[t] = [(kk, jj) for kk in range(len(self.articles))
                                    for jj in range(len(self.questions[0])) if (kk, jj) != (k, j)]
                return ("question", t, (k, j))
            if not idle:
                return None
            u = self.rng.choice(idle)
            u.busy = True
            return ("user", u.tenant, u)

    def client(self, deadline: float) -> None:
        clients = [httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) for url in self.urls]
        with contextlib.ExitStack() as stack:
            for c in clients:
                stack.enter_context(c)
            while time.monotonic() < deadline:
                self.gate.wait()
                job = self.pick()
                if job is None:
                    time.sleep(0.05)
                    continue
                kind, tenant, what = job
                with self.lock:
                    http = self.rng.choice(clients)
                    self.active += 1
                try:
                    if kind == "user":
                        self.user_turn(http, what)
                    elif kind == "question":
                        self.ask(http, tenant, *what)
                    else:
                        self.bad(http, tenant, *what)
                except Exception as e:  # a client-side failure is a finding, not a crash of the soak
                    self.failures.append(f"{kind} of {tenant}: {type(e).__name__}: {e}")
                finally:
                    with self.lock:
                        self.active -= 1
                    if kind == "user":
                        what.busy = False

    def send(self, http: httpx.Client, s: Sent, path: str, body: dict, headers: dict) -> Optional[dict]:
        """POST until answered (503: again after its Retry-After); the reply's JSON, its figures put into `s`."""
        stream = bool(body.get("stream"))
        with self.lock:
            self.sent.append(s)
        while True:
            attempt = time.monotonic()
            try:
                doc, kv, status, fork_n = _post(http, path, body, headers, stream)
            except httpx.TransportError as e:
                if self.gate.is_set():
                    raise RuntimeError(f"{path}: {type(e).__name__} {e}") from None
                # under way when SIGTERM came: it should have been finished
                if attempt < self.closing_since and not self.kill:
                    self.failures.append(f"{s.tenant} {s.conv} ({s.kind}) in flight at SIGTERM: cut "
                                         f"({type(e).__name__})")
                s.retries += 1  # the server is restarting: sent again once it is back
                with self.lock:
                    self.active -= 1
                self.gate.wait()
                with self.lock:
                    self.active += 1
                continue
            if status == 503:
                s.retries += 1
                time.sleep(1.0)
                continue
            break
        s.t_done, s.status, s.kv_cache, s.fork_n = time.monotonic(), status, kv, fork_n
        if status == 200:
            _figures(s, doc)
        return doc

    def user_turn(self, http: httpx.Client, u: User) -> None:
        if len(u.turns) >= self.max_turns:  # the context would fill: the user starts a new conversation, and
            # closes the old one (a pinned user would otherwise pin every conversation it ever had)
            r = http.delete(f"/kvstore/states/{u.name}", headers=_auth(u.tenant))
            if r.status_code not in (200, 404):  # 404: evicted (unpinned, under a cap)
                self.failures.append(f"{u.tenant}/{u.name}: DELETE {r.status_code} {r.text[:200]}")
            u.generation, u.turns, u.last_prompt_tokens = u.generation + 1, [], 0
        message = f"{sentence(self.message_rng)} {question(self.message_rng)}"
        headers = {**_auth(u.tenant), "X-KV-Name": u.name}
        if u.pinned:
            headers["X-KV-Pin"] = "1"
        stream = self.message_rng.random() < 0.5
        if u.api == "completion":
            prompt = u.system + "".join(f"\nUser: {m}\nAssistant:{r}" for m, r in u.turns) + \
                f"\nUser: {message}\nAssistant:"
            body = {"prompt": prompt, "n_predict": self.n_predict, "temperature": 0, "stream": stream}
            path = "/completion"
        else:
            msgs = [x for m, r in u.turns for x in ({"role": "user", "content": m},
                                                    {"role": "assistant", "content": r})]
            msgs.append({"role": "user", "content": message})
            if u.api == "chat":
                body = {"messages": [{"role": "system", "content": u.system}, *msgs],
                        "max_tokens": self.n_predict, "temperature": 0, "stream": stream}
                path = "/v1/chat/completions"
            else:
                body = {"model": "soak", "system": u.system, "messages": msgs, "max_tokens": self.n_predict,
                        "temperature": 0, "stream": stream}
                path = "/v1/messages"
        s = Sent(u.tenant, f"user-{u.index}", "user", u.api, time.monotonic())
        doc = self.send(http, s, path, body, headers)
        if s.status != 200:
            self.failures.append(f"{u.tenant}/{u.name} turn {len(u.turns) + 1} on {u.api}: {s.status} {doc}")
            return
        u.turns.append((message, _text(u.api, doc)))
        u.last_prompt_tokens = s.prompt_n + s.cache_n

    def ask(self, http: httpx.Client, tenant: str, k: int, j: int) -> None:
        """Article k's question j: articles of even k are named after the article; of odd k after the question,
        with the article (primed once per tenant) as parent."""
        prompt = f"{self.articles[k]}\nQuestion: {self.questions[k][j]}\nAnswer:"
        headers = _auth(tenant)
        if k % 2 == 0:
            headers["X-KV-Name"] = f"article-{k}"
        else:
            parent = f"article-{k}"
            with self.lock:
                prime = (tenant, k) not in self.primed
                self.primed.add((tenant, k))
            if prime:
                p = Sent(tenant, f"article-{k}", "prime", "state", time.monotonic())
                doc = self.send(http, p, f"/kvstore/states/{parent}", {"prompt": self.articles[k]}, headers)
                if p.status != 200:
                    self.failures.append(f"{tenant}/{parent} prime: {p.status} {doc}")
                    return
            headers = {**headers, "X-KV-Name": f"article-{k}-q{j}", "X-KV-Parent": parent}
        body = {"prompt": prompt, "n_predict": self.n_predict, "temperature": 0,
                "stream": self.message_rng.random() < 0.5}
        s = Sent(tenant, f"article-{k}", "question", "completion", time.monotonic())
        doc = self.send(http, s, "/completion", body, headers)
        if s.status != 200:
            self.failures.append(f"{tenant} article-{k} question {j}: {s.status} {doc}")
        elif k % 2:
            with self.lock:
                self.answered[(tenant, f"article-{k}-q{j}")] = s.prompt_n + s.cache_n

    def bad(self, http: httpx.Client, tenant: str, path: str, body: dict) -> None:
        s = Sent(tenant, "-", "bad", path, time.monotonic())
        self.send(http, s, path, body, _auth(tenant))
        if not 400 <= s.status < 500:
            self.failures.append(f"bad request {path} {json.dumps(body)}: {s.status}, want a 4xx")

    def sampler(self, stop: threading.Event) -> None:
        """The objects' bytes on disk against the cap, while the cap can be met (`/kvstore/stats` bound.last.unmet:
        pinned and in-use names fill it, which the server logs and the summary counts). Several servers: only
        measured; each counts the others' saves at its next eviction, so the bucket may pass the cap by what they
        saved meanwhile (docs/design.md "Bounded store"; tests/remote/test_bound_s3.py bounds it)."""
        while not stop.wait(SAMPLE_S):
            try:
                size = self.objects_bytes()
            except OSError:  # the store not made yet
                continue
            self.max_objects = max(self.max_objects, size)
            if self.max_size and size > self.max_size and len(self.urls) == 1:
                try:
                    bound = httpx.get(self.url + "/kvstore/stats", headers=_admin(), timeout=10).json()["bound"]
                except (httpx.HTTPError, ValueError, KeyError):
                    continue  # restarting
                if (bound.get("last") or {}).get("unmet"):
                    self.over_unmet += 1
                    continue
                self.failures.append(f"the store's objects {size} B passed --max-size {self.max_size} B "
                                     f"(the server's estimate {bound.get('used_bytes')} B)")
                return

    # -- the run -----------------------------------------------------------------------------------------------
    def run(self, seconds: float, restarts: int) -> dict:
        t0 = time.monotonic()
        self.start()
        stop = threading.Event()
        sampler = threading.Thread(target=self.sampler, args=(stop,), daemon=True)
        sampler.start()
        deadline = t0 + seconds
        threads = [threading.Thread(target=self.client, args=(deadline,), daemon=True) for _ in range(self.clients)]
        for t in threads:
            t.start()
        for i in range(restarts):
            time.sleep(max(0.0, t0 + seconds * (i + 1) / (restarts + 1) - time.monotonic()))
            self.restart()
        for t in threads:
            t.join(timeout=seconds + 3 * REQUEST_TIMEOUT_S)
            if t.is_alive():
                self.failures.append("a client still waits for its reply after the run's end")
        stop.set()
        sampler.join()
        rc = self.stop()
        if rc != 0:
            self.failures.append(f"kvstore serve exited {rc} on SIGTERM at the end")
        self.check_tenancy()
        verify = subprocess.run([sys.executable, "-m", "kvstore.cli", "verify", *self.store_args(), "--json"], cwd=ROOT,
                                capture_output=True, text=True, env=self.env)
        if verify.returncode != 0:
            self.failures.append(f"kvstore verify: exit {verify.returncode}: {verify.stdout[-500:]}"
                                 f"{verify.stderr[-500:]}")
        return self.summary(time.monotonic() - t0, verify.stdout)

    def check_tenancy(self) -> None:
        """Each reply's cache_n against what its own tenant's conversation reached in the requests sent before it
        came (the tenants send the same texts, so another tenant's cells would show here)."""
        for s in self.sent:
            if s.status != 200 or s.kind == "bad":
                continue
            own = [r.reached for r in self.sent if r is not s and r.tenant == s.tenant and r.conv == s.conv
                   and r.t_sent < s.t_done and r.status == 200]
            bound = max(own, default=0) + s.fork_n + SHARED_HEAD
            if s.cache_n > bound:
                self.failures.append(f"{s.tenant} {s.conv} ({s.kind}, {s.api}): cache_n {s.cache_n} passes "
                                     f"the {bound} tokens its own tenant had sent")

    def summary(self, wall_s: float, verify_out: str) -> dict:
        ok = [s for s in self.sent if s.status == 200 and s.kind != "bad"]
        kinds: dict = {}
        for s in ok:
            kinds[s.kv_cache or "?"] = kinds.get(s.kv_cache or "?", 0) + 1
        try:
            verified = json.loads(verify_out)
        except ValueError:
            verified = verify_out[-300:]
        return {"model": self.model, "store": "bucket" if self.remote else "local", "servers": len(self.urls),
                "wall_s": round(wall_s, 1),
                "clients": self.clients, "slots": self.slots,
                "requests": len(self.sent), "answered": len(ok),
                "bad_requests": sum(s.kind == "bad" for s in self.sent),
                "retried_503_or_restart": sum(s.retries for s in self.sent),
                "kv_cache": kinds, "prompt_tokens_evaluated": sum(s.prompt_n + s.fork_n for s in ok),
                "prompt_tokens_per_request": round(sum(s.prompt_n + s.fork_n for s in ok) / max(1, len(ok)), 1),
                "user_turns": sum(s.kind == "user" for s in ok), "questions": sum(s.kind == "question" for s in ok),
                "restarts": self.restarts, "evictions": self.evictions, "max_size": self.max_size,
                "samples_over_cap_while_unmet": self.over_unmet, "older_state_won": self.older_won,
                "max_objects_bytes": self.max_objects,
                "verify": verified, "failures": self.failures}


def _objects_listed(packs: list[tuple[str, int]]) -> int:
    """The objects' bytes in a listing of `packs/`, as the cap counts them: a pack is its objects, its index and an
    8-byte trailer, and its index is also stored beside it (`<pack>.idx`, the same bytes), 88 bytes per object and
    42 per pack in all (rust/src/remote/pack.rs). Name records and locks are not objects either. Those bytes are
    0.01% of a real model's objects (blocks of hundreds of KB); with the tiny test models' blocks of a few KB
    they are several percent, and name records, which carry their manifest, are larger than the objects."""
    index = {key[:-len(".idx")]: size for key, size in packs if key.endswith(".idx")}
    return sum(size - index[key] - 8 if key in index else size for key, size in packs if not key.endswith(".idx"))


def _admin() -> dict:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def _auth(tenant: str) -> dict:
    return {"Authorization": f"Bearer {TENANTS[tenant]}"}


def _post(http: httpx.Client, path: str, body: dict, headers: dict, stream: bool):
    """(the reply's JSON, with a stream's events merged; X-KV-Cache; status; X-KV-Fork-Evaluated)."""
    if not stream:
        r = http.post(path, json=body, headers=headers)
        try:
            doc = r.json()
        except ValueError:
            doc = {"raw": r.text[:300]}
        return doc, r.headers.get("X-KV-Cache", ""), r.status_code, int(r.headers.get("X-KV-Fork-Evaluated") or 0)
    with http.stream("POST", path, json=body, headers=headers) as r:
        if r.status_code != 200:
            r.read()
            try:
                return r.json(), "", r.status_code, 0
            except ValueError:
                return {"raw": r.text[:300]}, "", r.status_code, 0
        merged: dict = {"content": "", "events": 0}
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            ev = json.loads(line[5:])
            merged["events"] += 1
            merged["content"] += ev.get("content") or ""  # /completion
            for ch in ev.get("choices") or ():  # chat completions
                merged["content"] += (ch.get("delta") or {}).get("content") or ""
            if ev.get("type") == "content_block_delta":  # Messages
                merged["content"] += (ev.get("delta") or {}).get("text") or ""
            if ev.get("type") == "message_start":
                merged["usage"] = {**ev["message"].get("usage", {}), **merged.get("usage", {})}
            if ev.get("type") == "message_delta" and ev.get("usage"):
                merged["usage"] = {**merged.get("usage", {}), **ev["usage"]}
            if ev.get("timings"):
                merged["timings"] = ev["timings"]
        if not merged["events"]:
            raise RuntimeError(f"{path}: a stream with no event")
        return merged, r.headers.get("X-KV-Cache", ""), 200, int(r.headers.get("X-KV-Fork-Evaluated") or 0)


def _figures(s: Sent, doc: dict) -> None:
    """Tokens evaluated, reused and generated: `timings` where llama-server gives them, else Messages' usage."""
    t = doc.get("timings")
    if t:
        s.prompt_n, s.cache_n = int(t.get("prompt_n", 0)), int(t.get("cache_n", 0))
        s.predicted_n = int(t.get("predicted_n", 0))
    elif "usage" in doc:
        u = doc["usage"]
        s.prompt_n, s.cache_n = int(u.get("input_tokens", 0)), int(u.get("cache_read_input_tokens", 0))
        s.predicted_n = int(u.get("output_tokens", 0))
    elif "n_tokens" in doc:  # a state primed through /kvstore/states/{name}
        s.cache_n = int(doc.get("n_restored") or 0)
        s.prompt_n = int(doc["n_tokens"]) - s.cache_n


def _text(api: str, doc: dict) -> str:
    if "choices" in doc:
        return doc["choices"][0]["message"]["content"]
    if api == "messages" and "content" in doc and isinstance(doc["content"], list):
        return "".join(b.get("text", "") for b in doc["content"] if b.get("type") == "text")
    return doc.get("content", "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="gemma3, smollm2 or a .gguf path")
    p.add_argument("--seconds", type=float, default=240)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--max-size", type=float, default=64, help="MiB; 0: no cap")
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--articles", type=int, default=3)
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--n-predict", type=int, default=12)
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", help="write the summary here as JSON")
    p.add_argument("--bucket", action="store_true", help="the store in an S3 bucket (SeaweedFS on loopback)")
    p.add_argument("--servers", type=int, default=1, help="with --bucket: this many `kvstore serve` on the bucket, "
                   "each request sent to one at random")
    p.add_argument("--one-namespace", action="store_true", help="a check of the checks: both tenants' keys in one "
                   "namespace (the tenancy check must fail)")
    p.add_argument("--kill", action="store_true", help="a check of the checks: restart by SIGKILL (turns not saved "
                   "yet are lost: the committed-state check must fail)")
    args = p.parse_args(argv)
    wd = workdir()
    try:
        soak = Soak(args.model, wd, clients=args.clients, slots=args.slots, ctx=args.ctx,
                    max_size_mib=args.max_size, seed=args.seed, users=args.users, articles=args.articles,
                    questions=args.questions, n_predict=args.n_predict, max_turns=args.max_turns,
                    one_namespace=args.one_namespace, kill=args.kill, bucket=args.bucket, servers=args.servers)
        res = soak.run(args.seconds, args.restarts)
    finally:
        cleanup(wd)
    text = json.dumps(res, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
