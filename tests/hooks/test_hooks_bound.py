"""A store that stays within its size, on the real server (SmolLM2, 2 slots, two requests in flight): 32 distinct
conversations under `--max-size` (a cap of about six states) keep the stored bytes within the cap plus one state after
every request; the names used last continue exactly as a plain llama-server evaluates them; an old pinned name
survives; a `cache_prompt_ttl: 1` name is gone once it expires; an evicted name is a miss, never an error. With API
keys and quotas, a tenant that floods the store loses only its own names."""
from __future__ import annotations

import queue
import threading
import time

from hooks_support import QUESTIONS, complete, engine, get, hooks, intro, metric, post, stack, turn_prompt

from kvstore import open_store

N_CONV = 32
N_PREDICT = 4


def conversation(i: int) -> str:
    return turn_prompt(f"Conversation {i}. " + intro(i % 12), QUESTIONS[i % len(QUESTIONS)])


def state_bytes(srv_url: str, store) -> int:
    """Stored bytes of one conversation's state (what the cap is sized by), measured on an unbounded server over
    the same store; the name is removed again (its objects are garbage the first eviction sweeps)."""
    with hooks(srv_url, store) as hk:
        r = post(hk.url, "/kvstore/states/calibrate", {"prompt": conversation(0)})
        assert r.status == 200, r.body
        assert request_delete(hk.url, "/kvstore/states/calibrate") == 200
        return int(r.json["stored"]["new_stored_bytes"])


def request_delete(base: str, path: str) -> int:
    from hooks_support import request

    return request(base + path, "DELETE").status


def in_flight(base: str, jobs: list, n: int = 2, headers=None) -> dict:
    """Send `jobs` [(name, prompt)] with `n` requests in flight; {name: (reply, stored bytes right after)}."""
    q: queue.Queue = queue.Queue()
    for j in jobs:
        q.put(j)
    out: dict = {}
    finished: list = []

    def worker():
        while True:
            try:
                name, prompt = q.get_nowait()
            except queue.Empty:
                return
            r = complete(base, prompt, name=name, n_predict=N_PREDICT, headers=headers)
            out[name] = r
            finished.append(name)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    in_flight.finished = finished  # type: ignore[attr-defined]  # the order the replies came back in
    return out


def test_a_capped_store_keeps_recent_names_pins_and_expires(tmp_path):
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv):
        one = state_bytes(srv.url, store)
        cap = 6 * one
        with hooks(srv.url, store, max_size=cap, evict_period=0.3) as hk:
            u = hk.url
            pinned = post(u, "/kvstore/states/old-pinned", {"prompt": conversation(100), "cache_prompt_pin": True})
            assert pinned.status == 200, pinned.body
            # Every conversation, two in flight; after each reply the store is within the cap plus one state.
            peaks = []
            lock = threading.Lock()

            def watch(stop):
                while not stop.is_set():
                    s = get(u, "/kvstore/stats").json["store"]["stored_bytes"]
                    with lock:
                        peaks.append(s)
                    time.sleep(0.05)

            stop = threading.Event()
            watcher = threading.Thread(target=watch, args=(stop,))
            watcher.start()
            replies = in_flight(u, [(f"conv{i}", conversation(i)) for i in range(N_CONV)])
            stop.set()
            watcher.join()
            assert sorted(replies) == sorted(f"conv{i}" for i in range(N_CONV))
            print(f"\n[bound] cap {cap}, one state {one}, peak stored {max(peaks)} ({max(peaks) / cap:.3f} of the cap)")
            assert max(peaks) <= cap + one, (max(peaks), cap, one)
            # The slots' states are saved too (eviction runs after the save that passed the cap).
            hk.run(hk.hooks.wired.table.save_all())
            stats = get(u, "/kvstore/stats").json
            assert stats["store"]["stored_bytes"] <= cap + one * 1.5, stats["store"]
            assert stats["bound"]["max_bytes"] == cap and stats["bound"]["evicted"]["cap"] > 0, stats["bound"]
            assert metric(u, "kvstore_evictions_total", '{reason="cap"}') > 0
            assert metric(u, "kvstore_store_cap_bytes") == cap

            # The pinned name survived every eviction.
            info = get(u, "/kvstore/states/old-pinned")
            assert info.status == 200 and info.json["pinned"] is True, info.body

            names = {s["name"] for s in get(u, "/kvstore/states").json["states"]}
            assert "conv0" not in names and "conv1" not in names, names
            # The two answered last sit in the slots (never evicted); the names kept are conversations answered
            # late, the first ones are gone.
            last = in_flight.finished[-2:]  # type: ignore[attr-defined]
            assert set(last) <= names, (last, names)
            recent = sorted(n for n in names if n.startswith("conv"))
            assert len(recent) >= 2 and all(int(n[4:]) >= N_CONV - 8 for n in recent), recent
            # The two users answered last come back together (one after the other would let the first one's new
            # state push the second out under this tight cap, as it should): each is restored or in its slot and
            # continues as a plain evaluation; an evicted name is a miss, answered.
            recent = last
            follow = {n: conversation(int(n[4:])) + replies[n].json["content"] + "\nUser: Thanks!\nAssistant:"
                      for n in recent + ["conv0"]}
            cont = in_flight(u, [(n, follow[n]) for n in recent])
            cont["conv0"] = complete(u, follow["conv0"], name="conv0", n_predict=N_PREDICT)
            assert cont["conv0"].kind == "miss"
            assert all(cont[n].kind in ("restored", "slot") for n in recent), {n: cont[n].kind for n in recent}
            # A name with a 1 s ttl, stored last so that no cap eviction takes it first (under this tight cap the
            # least recently used name goes, and no save follows it here). Two unnamed requests then take both
            # slots (nothing to save: they have no name), so no slot holds it (a name in a slot is never evicted),
            # and it goes for its ttl alone.
            ttl_before = metric(u, "kvstore_evictions_total", '{reason="ttl"}')
            short = post(u, "/kvstore/states/short", {"prompt": conversation(101), "cache_prompt_ttl": 1})
            assert short.status == 200, short.body
            unnamed = [threading.Thread(target=complete, args=(u, f"Unrelated request {i}: the tide tables of"),
                                        kwargs={"n_predict": N_PREDICT}) for i in range(2)]
            for t in unnamed:
                t.start()
            for t in unnamed:
                t.join(300)
            # The name leaves the index inside the eviction, which is counted once it returns: wait for both.
            ttl_count = lambda: metric(u, "kvstore_evictions_total", '{reason="ttl"}')  # noqa: E731
            deadline = time.monotonic() + 30
            while ((get(u, "/kvstore/states/short").status == 200 or ttl_count() < ttl_before + 1)
                   and time.monotonic() < deadline):
                time.sleep(0.2)
            assert get(u, "/kvstore/states/short").status == 404
            assert ttl_count() >= ttl_before + 1, get(u, "/kvstore/stats").json["bound"]
            kept = open_store(store)
            v = kept.verify()
            assert not v["corrupt"] and not v["missing"], v
    plain = engine("smollm2", None)
    with stack(plain):
        for n, p in follow.items():
            want = complete(plain.url, p, n_predict=N_PREDICT).json["content"]
            assert cont[n].json["content"] == want, (n, cont[n].json["content"], want)


def test_tenants_with_quotas_cannot_evict_each_other(tmp_path):
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv):
        one = state_bytes(srv.url, store)
        keys = tmp_path / "keys"
        keys.write_text(f"ka a quota={4 * one}\nkb b quota={4 * one}\nadmin - admin\n")
        from kvstore.hooks.auth import tenancy_from

        tenancy = tenancy_from(api_key_files=[str(keys)])
        with hooks(srv.url, store, tenancy=tenancy, max_size=40 * one) as hk:
            u = hk.url
            a, b = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
            in_flight(u, [(f"a{i}", conversation(i)) for i in range(3)], headers=a)
            # b floods: three times its quota.
            in_flight(u, [(f"b{i}", conversation(50 + i)) for i in range(12)], headers=b)
            hk.run(hk.hooks.wired.table.save_all())
            a_names = {s["name"] for s in get(u, "/kvstore/states", a).json["states"]}
            b_names = {s["name"] for s in get(u, "/kvstore/states", b).json["states"]}
            assert a_names == {"a0", "a1", "a2"}, a_names
            assert 0 < len(b_names) < 12, b_names
            assert "b11" in b_names and "b0" not in b_names, b_names
            # A tenant sees its own quota, not the store's figures.
            assert get(u, "/kvstore/stats", a).json["bound"] == {"quota": 4 * one}
            plan = open_store(store).evict(quotas={"a": 4 * one, "b": 4 * one}, dry_run=True)["plan"]
            used = {n["namespace"]: n["bytes"] for n in plan["namespaces"]}
            assert used["b"] <= 4 * one + one * 1.5, (used, one)
            assert metric(u, "kvstore_evictions_total", '{reason="quota"}', {"Authorization": "Bearer admin"}) > 0


def test_a_pin_over_the_cap_is_refused_and_the_reply_says_when_a_pin_is_decided(tmp_path):
    """Pins fill a cap of two and a half states: a third pinned prime is stored but not pinned (507); a request that
    asks to pin that stored name is refused at once and changes nothing; a new name's pin is decided at its first
    save, after the reply, which says so (`X-KV-Pin: pending`), and refused there (counted, the name unpinned); a
    name pinned already is answered `X-KV-Pin: 1`."""
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv):
        one = state_bytes(srv.url, store)
        cap = int(2.5 * one)
        with hooks(srv.url, store, max_size=cap) as hk:
            u = hk.url
            for i in (0, 1):
                r = post(u, f"/kvstore/states/pin{i}", {"prompt": conversation(200 + i), "cache_prompt_pin": True})
                assert r.status == 200, r.body
            r = post(u, "/kvstore/states/pin2", {"prompt": conversation(202), "cache_prompt_pin": True})
            assert r.status == 507 and b"not pinned" in r.body, (r.status, r.body)
            before = get(u, "/kvstore/states/pin2")
            assert before.status == 200 and before.json["pinned"] is False, before.body
            # Asked of the stored name with a longer prompt: refused before anything is evaluated.
            r = post(u, "/completion", {"prompt": conversation(202) + " And then?", "n_predict": N_PREDICT,
                                        "cache_prompt_name": "pin2"}, {"X-KV-Pin": "1"})
            assert r.status == 507 and r.json["error"]["type"] == "store_full_error", (r.status, r.body)
            after = get(u, "/kvstore/states/pin2")
            assert after.status == 200 and after.json["pinned"] is False, after.body
            assert after.json["manifest_id"] == before.json["manifest_id"], "the refused request changed the name"
            # A new name: answered, its pin decided at its save.
            refused = metric(u, "kvstore_pins_refused_total")
            r = complete(u, conversation(203), name="new", n_predict=N_PREDICT, headers={"X-KV-Pin": "1"})
            assert r.headers.get("X-KV-Pin") == "pending", dict(r.headers)
            hk.run(hk.hooks.wired.table.save_all())
            assert metric(u, "kvstore_pins_refused_total") == refused + 1
            info = get(u, "/kvstore/states/new")  # in its slot: not evicted
            assert info.status == 200 and info.json["pinned"] is False, info.body
            # A name pinned already: the reply says it is.
            r = complete(u, conversation(200) + " And then?", name="pin0", n_predict=N_PREDICT,
                         headers={"X-KV-Pin": "1"})
            assert r.headers.get("X-KV-Pin") == "1", dict(r.headers)
            assert get(u, "/kvstore/states/pin0").json["pinned"] is True
