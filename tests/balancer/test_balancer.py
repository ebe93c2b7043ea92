"""Many servers behind a real balancer: a real HAProxy, configured by `kvstore balancer-config`, in front of two
`kvstore serve` (each its own embedded llama-server, SmolLM2, 2 slots) on one SeaweedFS bucket, all with tenant
keys. Which server answered is HAProxy's `X-KV-Server` reply header, checked against the servers' own counters.

The servers and the balancer are started once for the module; tests run in file order and share the users'
conversations (the last test kills a server and does not bring it back)."""
from __future__ import annotations

import threading
import time

import pytest

from conftest import S3_BUCKET
from corpus import ARTICLES, QUESTIONS as ARTICLE_QUESTIONS
from haproxy import HAProxy
from hooks_support import QUESTIONS, get, intro, metric, post, turn_prompt
from s3_nodes import Node

SLACK = 2  # SmolLM2: a tokenizer merge at the boundary of a stored state (as in test_s3_servers.py)
KEYS = {"team": "sk-team", "alice": "sk-alice", "bob": "sk-bob"}
ADMIN = "sk-admin"
USERS = [f"user{i}" for i in range(6)]


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


class Farm:
    def __init__(self, nodes, lb):
        self.nodes, self.lb = nodes, lb
        self.by_server = {f"kv{i + 1}": n for i, n in enumerate(nodes)}  # the generator's server names, in order
        self.history = {u: intro(i) for i, u in enumerate(USERS)}  # each user's conversation so far
        self.turns = {u: 0 for u in USERS}
        self.last_prompt = dict(self.history)  # each user's previous prompt (what their stored state starts with)
        self.home: dict[str, str] = {}  # user -> the server that served all their turns


@pytest.fixture(scope="module")
def farm(seaweed, tmp_path_factory):
    root = tmp_path_factory.mktemp("balancer")
    keys = root / "keys"
    keys.write_text("".join(f"{k} {ns}\n" for ns, k in KEYS.items()) + f"{ADMIN} - admin\n")
    env = seaweed.env()
    nodes = [Node(n, f"s3://{S3_BUCKET}/balancer", root / f"cache-{n}", env, extra=("--api-key-file", str(keys)))
             for n in ("a", "b")]
    lb = HAProxy(root / "haproxy", [])
    try:
        for n in nodes:  # one at a time: two model loads at once only slow each other on a small machine
            n.start()
        lb = HAProxy(root / "haproxy", [n.url for n in nodes], check_interval=0.5).start()
        yield Farm(nodes, lb)
    finally:
        lb.stop()
        for n in nodes:
            n.close()


def ask(url: str, prompt, *, name=None, key=KEYS["team"], n_predict=4, headers=None, path="/completion"):
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "seed": 1}
    if name is not None:
        body["cache_prompt_name"] = name
    return post(url, path, body, {**auth(key), **(headers or {})})


def served(node: Node) -> int:
    """Requests the node itself routed to a slot (its /metrics), whatever their cache kind."""
    return int(sum(metric(node.url, "kvstore_requests_total", f'{{kind="{k}"}}', auth(ADMIN))
                   for k in ("slot", "restored", "parent", "prefix", "miss")))


def wait_clean(node: Node, timeout: float = 60) -> None:
    """Until no slot of `node` holds unsaved changes: every state it served is in the bucket."""
    deadline = time.monotonic() + timeout
    while any(s.get("dirty") for s in get(node.url, "/kvstore/stats", auth(ADMIN)).json["slots"]):
        assert time.monotonic() < deadline, "idle save never ran"
        time.sleep(0.2)


def turn(farm: Farm, user: str, n_predict: int = 4):
    """The user's next turn through the balancer: (its prompt, the user's previous prompt, the reply)."""
    prompt = turn_prompt(farm.history[user], QUESTIONS[farm.turns[user] % len(QUESTIONS)])
    r = ask(farm.lb.url, prompt, name=user, n_predict=n_predict)
    assert r.status == 200, (r.status, r.body[:300])
    prev = farm.last_prompt[user]
    answered(farm, user, prompt, r)
    return prompt, prev, r


def answered(farm: Farm, user: str, prompt: str, r) -> None:
    farm.history[user] = prompt + r.json["content"] + "\n"
    farm.last_prompt[user] = prompt
    farm.turns[user] += 1


def tokens(url: str, text: str) -> int:
    r = post(url, "/tokenize", {"content": text, "add_special": True, "parse_special": True}, auth(KEYS["team"]))
    assert r.status == 200, r.body
    return len(r.json["tokens"])


# ---- affinity ---------------------------------------------------------------------------------------------------

def test_a_name_always_lands_on_the_same_server(farm):
    before = {s: served(n) for s, n in farm.by_server.items()}
    seen: dict[str, list] = {u: [] for u in USERS}
    for _ in range(3):
        for u in USERS:
            prompt, prev, r = turn(farm, u)
            seen[u].append(r.headers["X-KV-Server"])
            if farm.turns[u] > 1:  # a returning user: their state, from this server's slot or its own cache
                assert r.kind in ("slot", "restored"), (u, r.headers)
                assert r.prompt_n <= tokens(farm.lb.url, prompt) - tokens(farm.lb.url, prev) + SLACK, (u, r.timings)
    for u, servers in seen.items():
        assert len(set(servers)) == 1, (u, servers)
        farm.home[u] = servers[0]
    assert set(farm.home.values()) == {"kv1", "kv2"}, farm.home  # the names spread over both
    # the servers' own counters agree with the balancer's header
    for s, n in farm.by_server.items():
        assert served(n) - before[s] == sum(len(v) for u, v in seen.items() if farm.home[u] == s), s


def test_the_name_in_a_header_routes_like_the_name_in_the_body(farm):
    for n in farm.nodes:
        wait_clean(n)  # every user's newest state is stored (for the GET by name below)
    for u in USERS:  # the chat API with the name only in X-KV-Name (nothing in the body names it)
        r = post(farm.lb.url, "/tokenize", {"content": "a chat turn"}, {**auth(KEYS["team"]), "X-KV-Name": u})
        assert r.status == 200 and r.headers["X-KV-Server"] == farm.home[u], (u, r.headers)
        r = post(farm.lb.url, "/tokenize", {"content": "x", "cache_prompt_name": u}, auth(KEYS["team"]))
        assert r.headers["X-KV-Server"] == farm.home[u], (u, r.headers)
        r = get(farm.lb.url, f"/kvstore/states/{u}", auth(KEYS["team"]))  # the name in the path
        assert r.status == 200 and r.headers["X-KV-Server"] == farm.home[u], (u, r.status, r.headers)


def test_bodies_past_the_buffer(farm, tmp_path):
    """HAProxy sees at most tune.bufsize bytes (here its 16 KiB minimum) minus 1 KiB reserve and the headers: a name
    in the body past that point is not seen; the header always is; a name placed first in the body still is."""
    # (unbounded: these requests follow each other, and a stream still closing must not move the next one)
    small = HAProxy(tmp_path / "small", [n.url for n in farm.nodes], buffer_size=16384, balance_factor=0).start()
    try:
        big = "word " * 4000  # 20 kB
        for u in USERS:
            r = post(small.url, "/tokenize", {"content": big}, {**auth(KEYS["team"]), "X-KV-Name": u})
            assert r.status == 200 and r.headers["X-KV-Server"] == farm.home[u], (u, r.status)
            r = post(small.url, "/tokenize", {"cache_prompt_name": u, "content": big}, auth(KEYS["team"]))
            assert r.status == 200 and r.headers["X-KV-Server"] == farm.home[u], (u, r.status)
        # the name after the cut: the raw head of the body is hashed instead, the same for every such name
        where = {post(small.url, "/tokenize", {"content": big, "cache_prompt_name": u}, auth(KEYS["team"]))
                 .headers["X-KV-Server"] for u in USERS}
        assert len(where) == 1, where
    finally:
        small.stop()


def test_unnamed_questions_about_one_article_meet_on_one_server(farm):
    where = {}
    for a, article in enumerate(ARTICLES):
        for q in ARTICLE_QUESTIONS[:2]:
            r = ask(farm.lb.url, article + "\n" + q, n_predict=2)
            assert r.status == 200, r.body[:300]
            where.setdefault(a, []).append((r.headers["X-KV-Server"], int(r.timings.get("cache_n", 0))))
    for a, hits in where.items():
        assert len({s for s, _ in hits}) == 1, (a, hits)
        # the second question found the article in that server's slot
        assert hits[1][1] >= tokens(farm.lb.url, ARTICLES[a]) - SLACK, (a, hits)
    # The same questions through the Responses API meet on one server too: keyed by the first input item's text, not
    # the raw body's head (the two bodies begin differently), and the second finds the article in that slot.
    for a, article in enumerate(ARTICLES):
        for i, q in enumerate(ARTICLE_QUESTIONS[:2]):
            item = [{"role": "user", "content": article + "\n" + q}]
            body = ({"max_output_tokens": 2, "input": item} if i == 0 else
                    {"temperature": 0, "model": "m", "store": False, "input": item, "max_output_tokens": 2})
            r = post(farm.lb.url, "/v1/responses", body, auth(KEYS["team"]))
            assert r.status == 200, r.body[:300]
            where[a].append((r.headers["X-KV-Server"], r.json["usage"]["input_tokens_details"]["cached_tokens"]))
    for a, hits in where.items():
        assert len({s for s, _ in hits[2:]}) == 1, (a, hits)
        assert hits[3][1] >= tokens(farm.lb.url, ARTICLES[a]) - SLACK, (a, hits)
    # And through Anthropic's Messages API: keyed by the first message's text (its body begins otherwise again).
    for a, article in enumerate(ARTICLES):
        for i, q in enumerate(ARTICLE_QUESTIONS[:2]):
            body = {"messages": [{"role": "user", "content": article + "\n" + q}], "max_tokens": 2}
            if i:
                body = {"model": "m", "temperature": 0, **body}
            r = post(farm.lb.url, "/v1/messages", body, auth(KEYS["team"]))
            assert r.status == 200, r.body[:300]
            where[a].append((r.headers["X-KV-Server"], r.json["usage"]["cache_read_input_tokens"]))
    for a, hits in where.items():
        assert len({s for s, _ in hits[4:]}) == 1, (a, hits)
        assert hits[5][1] >= tokens(farm.lb.url, ARTICLES[a]) - SLACK, (a, hits)
    # OpenAI's prompt_cache_key routes unnamed requests whose prompts share nothing to one server (4 keys: the
    # raw heads alone would put both requests of a key on one server for all four with probability 1/16).
    for k in range(4):
        servers = set()
        for i in range(2):
            body = {"model": "m", "prompt_cache_key": f"team-{k}", "max_tokens": 1, "temperature": 0,
                    "messages": [{"role": "user", "content": f"{intro(2 * i + k)} Request {i} of key {k}."}]}
            r = post(farm.lb.url, "/v1/chat/completions", body, auth(KEYS["team"]))
            assert r.status == 200, r.body[:300]
            servers.add(r.headers["X-KV-Server"])
        assert len(servers) == 1, (k, servers)


# ---- bounded load -----------------------------------------------------------------------------------------------

def burst(url: str, n: int = 8) -> list[str]:
    """`n` requests at once with one hot prompt head (an article everybody asks about, unnamed)."""
    out: list = [None] * n
    go = threading.Barrier(n)

    def one(i):
        go.wait()
        r = ask(url, ARTICLES[0] + f"\nQuestion {i}: what is said in sentence {i}? Answer:", n_predict=6)
        out[i] = r.headers.get("X-KV-Server") if r.status == 200 else f"error {r.status}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def test_one_hot_prompt_does_not_take_a_whole_server(farm, tmp_path):
    unbounded = HAProxy(tmp_path / "unbounded", [n.url for n in farm.nodes], balance_factor=0).start()
    try:
        without = burst(unbounded.url)
    finally:
        unbounded.stop()
    assert len(set(without)) == 1 and not without[0].startswith("error"), without  # the control: all on one
    with_bound = burst(farm.lb.url)  # hash-balance-factor 170 (the default): a 7th in flight on one server spills
    assert all(not s.startswith("error") for s in with_bound), with_bound
    other = [s for s in with_bound if s != without[0]]
    assert other and len(other) < len(with_bound), with_bound  # spilled to the other server, mostly stayed


# ---- tenants ----------------------------------------------------------------------------------------------------

def test_tenant_keys_pass_through(farm):
    p = turn_prompt(intro(7), QUESTIONS[0])
    r = post(farm.lb.url, "/completion", {"prompt": p, "n_predict": 2, "cache_prompt_name": "notes"})
    assert r.status == 401 and r.headers.get("X-KV-Server"), (r.status, r.headers)  # the server said so
    r = ask(farm.lb.url, p, name="notes", key="sk-wrong")
    assert r.status == 401, r.status
    r = ask(farm.lb.url, p, name="notes", key=KEYS["alice"])
    assert r.status == 200, r.body[:300]
    home = r.headers["X-KV-Server"]
    again = ask(farm.lb.url, p + r.json["content"] + "\nUser: And then?\nAssistant:", name="notes",
                key=KEYS["alice"])
    assert again.status == 200 and again.kind in ("slot", "restored") and again.headers["X-KV-Server"] == home
    bob = ask(farm.lb.url, p, name="notes", key=KEYS["bob"])  # the same name, another tenant: not alice's state
    assert bob.status == 200 and bob.kind == "miss", bob.headers
    wait_clean(farm.by_server[home])
    r = get(farm.lb.url, "/kvstore/states/notes", auth(KEYS["alice"]))
    assert r.status == 200 and r.json["namespace"] == "alice", (r.status, r.body[:200])
    other = next(n for s, n in farm.by_server.items() if s != home)  # from the other server too: the bucket
    assert get(other.url, "/kvstore/states/notes", auth(KEYS["alice"])).status == 200
    assert get(other.url, "/kvstore/states/notes", auth(KEYS["team"])).status == 404  # team's namespace has none


# ---- a server dies ----------------------------------------------------------------------------------------------

def test_a_killed_server_s_users_are_restored_on_the_other(farm):
    victim = max(set(farm.home.values()), key=lambda s: sum(h == s for h in farm.home.values()))
    survivor = next(s for s in farm.by_server if s != victim)
    moved = [u for u in USERS if farm.home[u] == victim]
    stayed = [u for u in USERS if farm.home[u] == survivor]
    for n in farm.nodes:
        wait_clean(n)  # every acknowledged turn is in the bucket
    acked = dict(farm.last_prompt)  # the prompt of each user's last acknowledged turn

    # one request in flight on the victim when it is killed (-9: no shutdown save)
    in_flight = moved[0]
    prompt = turn_prompt(farm.history[in_flight], QUESTIONS[farm.turns[in_flight] % len(QUESTIONS)])
    answer: list = []
    t = threading.Thread(target=lambda: answer.append(
        ask(farm.lb.url, prompt, name=in_flight, n_predict=32)))
    t.start()
    node = farm.by_server[victim]
    deadline = time.monotonic() + 60
    while not any(s.get("busy") for s in get(node.url, "/kvstore/stats", auth(ADMIN)).json["slots"]):
        assert time.monotonic() < deadline and t.is_alive(), "the request never reached the victim"
        time.sleep(0.02)
    node.kill()
    t.join(300)
    r = answer[0]
    # nothing had been sent to the client: HAProxy retried it on the survivor (else it is the one error allowed)
    print(f"\nin flight at the kill: {r.status} from {r.headers.get('X-KV-Server')} ({r.kind})")
    if r.status == 200:
        assert r.headers["X-KV-Server"] == survivor and r.kind == "restored", r.headers
        answered(farm, in_flight, prompt, r)
    farm.lb.wait_state(victim, "DOWN")

    for u in moved + stayed:
        p, prev, r = turn(farm, u)
        assert r.headers["X-KV-Server"] == survivor, (u, r.headers)
        if u in moved and not (u == in_flight and answer[0].status == 200):
            # from the bucket: every acknowledged token of theirs came back, only the new turn was evaluated
            assert r.kind == "restored", (u, r.headers)
            assert int(r.headers["X-KV-Restored-Tokens"]) >= tokens(farm.lb.url, acked[u]), (u, r.headers)
        else:
            assert r.kind in ("slot", "restored"), (u, r.headers)
        assert r.prompt_n <= tokens(farm.lb.url, p) - tokens(farm.lb.url, prev) + SLACK, (u, r.timings)
    names = {s["name"] for s in get(farm.by_server[survivor].url, "/kvstore/states", auth(KEYS["team"])).json["states"]}
    assert set(USERS) <= names, names  # no state lost
