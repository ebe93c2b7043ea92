"""Tenant isolation (issue 8), against the real llama.cpp server: keys -> namespaces, filtered stats and lists,
X-KV-Namespace only where allowed, no KV cells or prompt cache shared across namespaces, the raw slot API on own
slots only, the route allowlist on raw paths, and an embedded llama-server only the hooks can use."""
from __future__ import annotations

import http.client
import json
import secrets
from urllib.parse import urlsplit

import pytest

from hooks_support import complete, engine, get, hooks, intro, post, request, stack

KEY_A, KEY_B, KEY_ADMIN, KEY_PROXY = "sk-a-" + "1" * 20, "sk-b-" + "2" * 20, "sk-admin-" + "3" * 16, "sk-proxy-4444"
A, B, ADMIN, PROXY = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B, KEY_ADMIN, KEY_PROXY))
NS_A = "tenant-a"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from kvstore.hooks.auth import key_namespace, tenancy_from

    root = tmp_path_factory.mktemp("tenants")
    store = root / "store"
    keys = root / "keys"
    keys.write_text(f"# tenants\n{KEY_A} {NS_A}\n{KEY_PROXY} - namespace-header\n")
    up_key = secrets.token_urlsafe(16)
    srv = engine("smollm2", store, api_key=up_key)
    tenancy = tenancy_from([KEY_B], [str(keys)], [KEY_ADMIN])
    hk = hooks(srv.url, store, tenancy=tenancy, upstream_api_key=up_key)
    with stack(srv, hk):
        yield {"srv": srv, "hk": hk, "u": hk.url, "store": store, "up_key": up_key, "ns_b": key_namespace(KEY_B)}


def _prompt(i: int, tail: str = "User: Hello!\nAssistant:") -> str:
    return intro(i) + tail


def test_keys_required(env):
    u = env["u"]
    for headers in (None, {"Authorization": "Bearer nope"}, {"Authorization": KEY_A}, {"X-Api-Key": "nope"},
                    {"Authorization": "Bearer nope", "X-Api-Key": KEY_A}):
        for method, path, body in (("GET", "/kvstore/stats", None), ("POST", "/completion", {"prompt": "hi"}),
                                   ("GET", "/props", None), ("POST", "/slots/0?action=erase", {})):
            r = request(u + path, method, body, headers)
            assert r.status == 401, (path, headers, r.status, r.body)
            assert r.json["error"]["type"] == "authentication_error" and r.headers["WWW-Authenticate"] == "Bearer"
    assert get(u, "/health").status == 200  # open: load balancers and clients probing readiness
    assert get(u, "/v1/models").status == 200  # open in llama-server too
    assert get(u, "/props", A).status == 200
    st = get(u, "/kvstore/stats", A).json
    assert st["tenancy"]["mode"] == "keys" and st["namespace"] == NS_A
    assert get(u, "/kvstore/stats", B).json["namespace"] == env["ns_b"]
    # Anthropic's clients send the key as X-Api-Key; llama-server reads it when Authorization is absent, so do we.
    assert get(u, "/kvstore/stats", {"X-Api-Key": KEY_A}).json["namespace"] == NS_A


def test_the_anthropic_client_with_a_tenant_key(env):
    """Anthropic's own client (its key in X-Api-Key) through the hooks: a named conversation is answered and, streamed,
    accumulated by the client into one message, reusing the slot; kept in the key's namespace, so another tenant's
    request of the same name starts from nothing (no cell reused); a wrong key is the client's AuthenticationError."""
    import anthropic

    def client(key: str) -> "anthropic.Anthropic":
        return anthropic.Anthropic(base_url=env["u"], api_key=key, max_retries=0)

    ask = [{"role": "user", "content": _prompt(3, "") + "What is my name?"}]
    # Greedy: this client's own parameters no longer include the sampling fields; llama-server reads them.
    sampling = {"model": "m", "max_tokens": 6,
                "extra_body": {"temperature": 0, "top_k": 1, "cache_prompt_name": "anthro"}}
    try:
        raw = client(KEY_A).messages.with_raw_response.create(messages=ask, **sampling)
        first = raw.parse()
        assert raw.headers["X-KV-Name"] == "anthro" and first.content[0].type == "text", raw.headers
        follow = ask + [{"role": "assistant", "content": first.content[0].text},
                        {"role": "user", "content": "And which city do I live in?"}]
        with client(KEY_A).messages.stream(messages=follow, **sampling) as stream:
            kind = stream.response.headers["X-KV-Cache"]
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert kind in ("slot", "restored") and final.content[0].text == text and text, (kind, final)
        assert final.stop_reason in ("max_tokens", "end_turn") and final.usage.output_tokens > 0, final
        # The first turn's prompt was reused whole (less the one token llama-server always evaluates again).
        prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
        assert (final.usage.cache_read_input_tokens or 0) >= prompt - 1, (final.usage, first.usage)
        other = client(KEY_B).messages.with_raw_response.create(messages=follow, **sampling)
        assert other.headers["X-KV-Cache"] == "miss", other.headers
        assert other.parse().usage.cache_read_input_tokens == 0, other.parse().usage
        with pytest.raises(anthropic.AuthenticationError):
            client("sk-nope").messages.create(messages=ask, **sampling)
    finally:  # the module's other tests list these namespaces' names
        for key in (A, B):
            request(env["u"] + "/kvstore/states/anthro", "DELETE", None, key)


def test_embedded_server_needs_its_key(env):
    srv, key = env["srv"], env["up_key"]
    for method, path in (("GET", "/slots"), ("GET", "/props"), ("POST", "/slots/0?action=erase"),
                         ("POST", "/completion")):
        r = request(srv.url + path, method, {} if method == "POST" else None)
        assert r.status == 401, (path, r.status)
        # A tenant's key is kvstore's, not llama-server's.
        assert request(srv.url + path, method, {} if method == "POST" else None, A).status == 401
    assert request(srv.url + "/slots", "GET", None, {"Authorization": f"Bearer {key}"}).status == 200


def test_stats_lists_metrics_filtered(env):
    u = env["u"]
    r = post(u, "/kvstore/states/a-secret", {"prompt": _prompt(0)}, A)
    assert r.status == 200, r.body
    slot = int(r.headers["X-KV-Slot"])
    for body in (get(u, "/kvstore/stats", B).body, get(u, "/kvstore/states", B).body, get(u, "/metrics", B).body):
        assert b"a-secret" not in body and NS_A.encode() not in body, body[:400]
    other = get(u, "/kvstore/stats", B).json["slots"][slot]
    assert other == {"id": slot, "busy": False, "other_namespace": True}
    mine = get(u, "/kvstore/stats", A).json["slots"][slot]
    assert mine["name"] == "a-secret" and mine["namespace"] == NS_A
    assert get(u, "/kvstore/stats", ADMIN).json["slots"][slot]["name"] == "a-secret"
    listed = get(u, "/kvstore/states", ADMIN).json
    assert listed["namespace"] is None and any(s["name"] == "a-secret" for s in listed["states"]), listed
    assert [s["name"] for s in get(u, "/kvstore/states", A).json["states"]] == ["a-secret"]
    assert get(u, "/slots", B).status == 403  # llama-server's slot list shows every tenant's slots
    assert get(u, "/slots", ADMIN).status == 200


def test_namespace_header_only_where_allowed(env):
    u = env["u"]
    if get(u, "/kvstore/states/a-secret", A).status != 200:
        assert post(u, "/kvstore/states/a-secret", {"prompt": _prompt(0)}, A).status == 200
    spoof = {**B, "X-KV-Namespace": NS_A}
    r = get(u, "/kvstore/states/a-secret", spoof)
    assert r.status == 403 and r.json["error"]["type"] == "permission_error", r.body
    r = post(u, "/completion", {"prompt": _prompt(0) + " Hi", "n_predict": 1, "cache_prompt_name": "a-secret"}, spoof)
    assert r.status == 403, r.body
    assert request(u + "/kvstore/states/a-secret", "DELETE", None, spoof).status == 403
    assert get(u, "/kvstore/states", spoof).status == 403
    # Its own namespace by header is fine; a key allowed to (a trusted front proxy) may choose any.
    assert get(u, "/kvstore/states", {**B, "X-KV-Namespace": env["ns_b"]}).status == 200
    r = get(u, "/kvstore/states/a-secret", {**PROXY, "X-KV-Namespace": NS_A})
    assert r.status == 200 and r.json["name"] == "a-secret", r.body
    assert get(u, "/kvstore/states/a-secret", {**ADMIN, "X-KV-Namespace": NS_A}).status == 200


def test_no_kv_cells_cross_namespaces(env):
    """A slot given to another namespace is erased first: B's prompt that starts like A's reuses nothing."""
    u = env["u"]
    s1 = complete(u, _prompt(1), name="a-cells-1", headers=A).headers["X-KV-Slot"]
    s2 = complete(u, _prompt(2), name="a-cells-2", headers=A).headers["X-KV-Slot"]
    assert s1 != s2
    r = complete(u, _prompt(1, "User: Hi\nAssistant:"), headers=A)  # same namespace: reused in place
    assert r.headers["X-KV-Slot"] == s1 and r.json["timings"]["cache_n"] > 20, r.json["timings"]
    # B gets the least recently used slot each time: A's a-cells-2, then A's unnamed turn; each starts like B's.
    b_unnamed = complete(u, _prompt(2, "User: What?\nAssistant:"), headers=B)
    b_named = complete(u, _prompt(1, "User: Who?\nAssistant:"), name="b-cells", headers=B)
    assert (b_unnamed.headers["X-KV-Slot"], b_named.headers["X-KV-Slot"]) == (s2, s1)
    for r in (b_unnamed, b_named):
        assert r.json["timings"]["cache_n"] == 0, (r.headers["X-KV-Slot"], r.json["timings"])
    # A's unsaved turn was saved before the erase: A continues from the store.
    r = complete(u, _prompt(2) + " Hi", name="a-cells-2", headers=A)
    assert r.kind == "restored" and r.json["timings"]["cache_n"] >= 20, (r.kind, r.json["timings"])


def test_raw_slot_api_own_slots_only(env):
    u = env["u"]
    a = complete(u, _prompt(3), name="a-raw", headers=A)
    x = int(a.headers["X-KV-Slot"])
    b = complete(u, _prompt(4), name="b-raw", headers=B)
    y = int(b.headers["X-KV-Slot"])
    assert x != y
    for action, body in (("save", {"filename": "stolen"}), ("erase", {}), ("restore", {"filename": "b-raw"})):
        r = post(u, f"/slots/{x}?action={action}", body, B)
        assert r.status == 403 and r.json["error"]["type"] == "permission_error", (action, r.status, r.body)
    assert get(u, "/kvstore/states/stolen", B).status == 404
    # A's unsaved turn is still in its slot, untouched.
    r = complete(u, _prompt(3) + " Hello", name="a-raw", headers=A)
    assert r.kind == "slot" and int(r.headers["X-KV-Slot"]) == x
    # Own slot: fine; an admin may use any.
    r = post(u, f"/slots/{y}?action=save", {"filename": "b-copy"}, B)
    assert r.status == 200 and r.json["n_saved"] > 0, r.body
    assert post(u, f"/slots/{x}?action=save", {"filename": "admin-copy"}, ADMIN).status == 200


def test_python_client_sends_the_tenant_key(env, monkeypatch):
    import kvstore
    from kvstore.errors import ServerError

    u = env["u"]
    x = int(complete(u, _prompt(5), name="a-client", headers=A).headers["X-KV-Slot"])
    with pytest.raises(ServerError) as e:  # no key: the proxy refuses, nothing is saved
        kvstore.save("a-client-copy", x, server=u)
    assert e.value.status == 401
    r = kvstore.save("a-client-copy", x, server=u, api_key=KEY_A)
    assert r["namespace"] == NS_A and r["n_saved"] > 0, r
    assert get(u, "/kvstore/states/a-client-copy", A).status == 200
    assert get(u, "/kvstore/states/a-client-copy", B).status == 404
    monkeypatch.setenv("KVSTORE_API_KEY", KEY_B)  # the environment's key is B's: A's slot is not B's to save
    with pytest.raises(ServerError) as e:
        kvstore.save("b-steals", x, server=u)
    assert e.value.status == 403
    assert kvstore.restore("a-client-copy", x, server=u, api_key=KEY_A)["n_restored"] > 0


def _raw(u: str, method: str, target: str, headers: dict, body: bytes = b"{}") -> tuple[int, bytes]:
    """One request with the target sent byte for byte (no client-side normalization)."""
    p = urlsplit(u)
    c = http.client.HTTPConnection(p.hostname, p.port, timeout=60)
    try:
        c.putrequest(method, target, skip_accept_encoding=True)
        for k, v in {**headers, "Content-Type": "application/json", "Content-Length": str(len(body))}.items():
            c.putheader(k, v)
        c.endheaders(body)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def test_route_allowlist_on_raw_paths(env):
    u, sync = env["u"], env["store"] / "sync"
    before = set(p.name for p in sync.iterdir())
    body = json.dumps({"filename": "escaped"}).encode()
    for method, target in (("POST", "/slots/0/?action=save"), ("POST", "/./slots/0?action=save"),
                           ("POST", "//slots/0?action=save"), ("POST", "/%73lots/0?action=save"),
                           ("POST", "/slots%2F0?action=save"), ("POST", "/v1/../slots/0?action=save"),
                           ("POST", "/kvstore/../slots/0?action=restore"), ("DELETE", "/slots/0"),
                           ("PUT", "/completion"), ("GET", "/completion"), ("GET", "/nothing"),
                           ("POST", "/props"), ("GET", "/metrics/"), ("GET", "//health")):
        status, data = _raw(u, method, target, A, body)
        assert status == 404, (method, target, status, data)
        assert json.loads(data)["error"]["type"] == "not_found_error"
    for target in ("/slots/0?action=bogus&action=save", "/slots/0?action=save&action=save"):
        status, data = _raw(u, "POST", target, A, body)
        assert status == 400 and b"more than once" in data, (target, status, data)
    assert _raw(u, "POST", "/slots/0?action=bogus", A, body)[0] == 400
    # llama-server never saw them: no file was written for "escaped" (a save behind an earlier request may
    # still be ingesting and finish meanwhile: files may go, none may come).
    after = set(p.name for p in sync.iterdir())
    assert not after - before, after - before
    assert not any("escaped" in name for name in after)
    assert get(u, "/kvstore/states/escaped", A).status == 404


def test_prompt_cache_off_with_keys(tmp_path):
    """llama-server's host prompt cache is keyed by tokens: with tenants the embedded server runs without it."""
    from kvstore.cli import build_parser
    from kvstore.engine import EmbeddedServer
    from kvstore.hooks.serve import engine_config

    args = build_parser().parse_args(["serve", "--store", str(tmp_path), "-m", "smollm2", "-np", "1", "-c", "1024",
                                      "--cache-ram", "64"])
    args.store = tmp_path
    multi, single = engine_config(args, multi_tenant=True), engine_config(args, multi_tenant=False)
    assert multi.cache_ram == 0 and single.cache_ram == 64
    assert multi.api_key and single.api_key and multi.api_key != single.api_key

    def guessed_prefix_cache_n(cfg) -> int:
        with EmbeddedServer(cfg) as srv:
            auth = {"Authorization": f"Bearer {cfg.api_key}"}
            for prompt in (_prompt(5), _prompt(6)):  # A's prompt, then another one evicts it to the RAM cache
                assert complete(srv.url, prompt, headers=auth, n_predict=1).status == 200
            return complete(srv.url, _prompt(5, "User: Guess"), headers=auth, n_predict=1).json["timings"]["cache_n"]

    assert guessed_prefix_cache_n(single) > 20  # the side channel exists with the cache on
    assert guessed_prefix_cache_n(multi) == 0


def test_single_tenant_says_so(tmp_path, caplog):
    store = tmp_path / "store"
    srv = engine("smollm2", store, parallel=1)
    with stack(srv), hooks(srv.url, store) as hk:
        assert get(hk.url, "/kvstore/stats").json["tenancy"]["mode"] == "single-tenant"
    assert any("single-tenant" in r.getMessage() for r in caplog.records)


def test_key_file_format(tmp_path):
    from kvstore.hooks.auth import key_namespace, parse_key_file, tenancy_from

    e = parse_key_file("k1\nk2 team-x\nk3 - admin,namespace-header  # note\n\n# only a comment\n")
    assert e["k1"].namespace == key_namespace("k1") and not e["k1"].admin
    assert e["k2"].namespace == "team-x" and e["k3"].admin and e["k3"].namespace_header
    for bad in ("k1 ns bogus-flag", "k1 a b c", "k1 ../x", "k1\nk1"):
        with pytest.raises(ValueError):
            parse_key_file(bad)
    f = tmp_path / "keys"
    f.write_text("k1 shared\n")
    t = tenancy_from(["k2"], [str(f)], ["k1"])
    admin = t.caller({"Authorization": "Bearer k1"})
    assert admin.admin and admin.namespace == "shared"
    assert t.caller({"Authorization": "Bearer k2"}).namespace == key_namespace("k2")
    assert t.caller({"X-Api-Key": "k2"}).namespace == key_namespace("k2")
    assert t.caller({"Authorization": "Bearer k1", "X-Api-Key": "k2"}).admin  # Authorization first, as llama-server


def test_a_clients_key_is_not_passed_to_llama_server():
    """With tenant keys (or an upstream key) neither header llama-server reads a key from is forwarded: a tenant's
    key is kvstore's, and kvstore sends llama-server's own."""
    from kvstore.hooks.upstream import request_headers

    sent = {"Authorization": "Bearer sk-a", "X-Api-Key": "sk-a", "x-api-key": "sk-a", "X-KV-Name": "n",
            "Content-Type": "application/json", "Connection": "close", "anthropic-version": "2023-06-01"}
    assert request_headers(sent, strip_keys=True) == {"Content-Type": "application/json",
                                                      "anthropic-version": "2023-06-01"}
    assert request_headers(sent)["X-Api-Key"] == "sk-a"  # single-tenant, no upstream key: as llama-server gets it


def test_several_prompts_in_one_request_are_the_callers(env):
    """A completion with several prompts is split into requests of the caller's own (its key goes with each): no key
    is a 401 for the whole; tenant A's prompts run in both slots, in A's namespace, so that B's request of the same
    prompt reuses none of A's cells."""
    u = env["u"]
    prompts = [_prompt(7), _prompt(8)]
    r = post(u, "/completion", {"prompt": prompts, "n_predict": 1})
    assert r.status == 401, r.body[:300]
    r = post(u, "/completion", {"prompt": prompts, "n_predict": 1, "temperature": 0}, A)
    assert r.status == 200 and len(r.json) == 2 and len(r.headers["X-KV-Slot"].split(",")) == 2, r.headers
    r = complete(u, prompts[0], headers=B, n_predict=1)
    assert r.json["timings"]["cache_n"] == 0, (r.headers["X-KV-Slot"], r.json["timings"])
