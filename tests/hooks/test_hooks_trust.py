"""Trust, second pass (issue 20), as a hostile tenant would probe it against the real llama.cpp server: a slot
whose request timed out keeps its owner's cells hidden and erased before anyone else uses them."""
from __future__ import annotations

import secrets
import time

from hooks_support import engine, get, hooks, intro, metric, post, stack, tokens_for

KEY_A, KEY_B = "sk-a-" + "5" * 20, "sk-b-" + "6" * 20
A, B = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))


def test_a_timed_out_slot_stays_its_owners(tmp_path):
    """A's request times out (504). With one slot, B's next request must get that slot: it is erased first, so
    B reuses none of A's cells (cache_n 0); until then B sees only that the slot is another namespace's and cannot
    save it under a name of its own."""
    from kvstore.hooks.auth import tenancy_from

    store = tmp_path / "store"
    up_key = secrets.token_urlsafe(16)
    own_key = {"Authorization": f"Bearer {up_key}"}  # llama-server's own, for asking it directly
    srv = engine("smollm2", store, parallel=1, api_key=up_key)
    with stack(srv):
        # A's request: ~6 s of generation, past the 2 s bound even if this machine runs threefold faster meanwhile
        # (and not the minute a full slot takes, which llama-server sometimes spends on it after the 504)
        n_predict = tokens_for(6, srv.url, own_key)
        hk = hooks(srv.url, store, tenancy=tenancy_from([KEY_A, KEY_B], [], []), upstream_api_key=up_key,
                   upstream_timeout=2)
        with stack(hk):
            u = hk.url
            secret = intro(3) + "The vault code is 4417. User: What is the vault code?\nAssistant:"
            r = post(u, "/completion", {"prompt": secret, "n_predict": n_predict, "ignore_eos": True,
                                        "cache_prompt_name": "a-secret"}, A)
            assert r.status == 504, (r.status, r.body[:300])
            slot = get(u, "/kvstore/stats", B).json["slots"][0]
            assert slot == {"id": 0, "busy": slot["busy"], "other_namespace": True}, slot
            saved = post(u, "/slots/0?action=save", {"filename": "stolen"}, B)
            assert saved.status == 403, (saved.status, saved.body[:300])
            names_b = get(u, "/kvstore/states", B).json["states"]
            assert names_b == [], names_b
            # llama-server may still be generating A's abandoned reply; B's request must not hit the 2 s bound
            # waiting for that slot, so wait until llama-server (asked directly, with its own key) is idle.
            deadline = time.monotonic() + 300
            while any(sl.get("is_processing") for sl in get(srv.url, "/slots", own_key).json):
                assert time.monotonic() < deadline, "llama-server still busy with the abandoned request"
                time.sleep(0.2)
            # B's prompt begins exactly like A's: llama-server would reuse every common cell if they were still there.
            r = post(u, "/completion", {"prompt": secret[:100], "n_predict": 1}, B)
            assert r.status == 200, r.body[:300]
            assert r.json["timings"]["cache_n"] == 0, r.json["timings"]


def _b_probes_a_secret(root, a_stored_it: bool) -> dict:
    """Tenant B primes a text it made up, then A's secret text, then another made-up text, on a fresh store
    where A stored the secret first (or never did); what B can read back: its replies and its stats."""
    from kvstore.hooks.auth import tenancy_from

    store, keys = root / "store", root / "keys"
    keys.write_text(f"{KEY_A} tenant-a\n{KEY_B} tenant-b\n{KEY_ADMIN} - admin\n")
    up_key = secrets.token_urlsafe(16)
    # One slot: every prime starts from an erased slot, so a state's bytes do not depend on what ran before.
    srv = engine("smollm2", store, parallel=1, api_key=up_key)
    hk = hooks(srv.url, store, tenancy=tenancy_from([], [str(keys)], []), upstream_api_key=up_key)
    with stack(srv, hk):
        u = hk.url
        if a_stored_it:
            r = post(u, "/kvstore/states/a-secret", {"prompt": SECRET}, A)
            assert r.status == 200 and r.json["stored"]["new_objects"] > 1, r.body[:300]
        replies = []
        for name, text in (("b-made-up-1", intro(5) + "User: Plan my week.\nAssistant:"), ("b-guess", SECRET),
                           ("b-made-up-2", intro(7) + "User: Name a river.\nAssistant:")):
            r = post(u, f"/kvstore/states/{name}", {"prompt": text}, B)
            assert r.status == 200, r.body[:300]
            replies.append({k: r.json["stored"][k] for k in DEDUP_FIELDS}
                           | {"file_hash": get(u, f"/kvstore/states/{name}", B).json["file_hash"]})
        stats = get(u, "/kvstore/stats", B).json
        page = get(u, "/kvstore/", B).body.decode()
        return {"replies": replies, "stats": stats, "page": page, "metric": metric(u, "kvstore_store_bytes", headers=B),
                "admin": get(u, "/kvstore/stats", ADMIN).json}


KEY_ADMIN = "sk-admin-" + "7" * 16
ADMIN = {"Authorization": f"Bearer {KEY_ADMIN}"}
SECRET = intro(3) + "The vault code is 4417. User: What is the vault code?\nAssistant:"
MANIFEST_SLACK = 16  # bytes: see test_dedup_is_no_oracle_across_tenants
DEDUP_FIELDS = ("n_tokens", "blocks", "new_objects", "new_raw_bytes", "new_stored_bytes", "reused_bytes")


def test_dedup_is_no_oracle_across_tenants(tmp_path):
    """What B reads back after priming A's exact secret text (the reply's dedup figures, its /kvstore/stats, its
    /metrics) is exactly what it reads on a store where A never stored that text: objects are addressed per
    namespace, and a tenant's sizes are its own namespace's. Were dedup shared, B's guess would report reused bytes
    and fewer new objects than a made-up text of its length."""
    (tmp_path / "with").mkdir()
    (tmp_path / "without").mkdir()
    seen = _b_probes_a_secret(tmp_path / "with", True)
    fresh = _b_probes_a_secret(tmp_path / "without", False)
    # The same slot files (file hash) stored as the same objects; only the stored size of each manifest may differ
    # by a few bytes: its JSON carries the save time, and zstd packs other digits a byte or two differently.
    for mine, ref in zip(seen["replies"], fresh["replies"]):
        assert {k: v for k, v in mine.items() if k != "new_stored_bytes"} == \
            {k: v for k, v in ref.items() if k != "new_stored_bytes"}, (seen["replies"], fresh["replies"])
        assert abs(mine["new_stored_bytes"] - ref["new_stored_bytes"]) <= MANIFEST_SLACK, (mine, ref)
    guess = seen["replies"][1]
    assert guess["reused_bytes"] == 0 and guess["new_objects"] == fresh["replies"][1]["new_objects"] > 1, guess
    # B's store figures are its namespace's, the same with or without A's state; the admin sees the whole store.
    b_store, b_fresh = seen["stats"]["store"], fresh["stats"]["store"]
    exact = ("names", "manifests", "objects", "logical_bytes", "unique_raw_bytes", "block_size")
    assert seen["stats"]["store_scope"] == "namespace", seen["stats"]
    assert {k: b_store[k] for k in exact} == {k: b_fresh[k] for k in exact}, (b_store, b_fresh)
    assert abs(b_store["stored_bytes"] - b_fresh["stored_bytes"]) <= 3 * MANIFEST_SLACK, (b_store, b_fresh)
    assert b_store["names"] == 3 and b_store["bucket_bytes"] is None, b_store
    assert b_store["stored_bytes"] == sum(r["new_stored_bytes"] for r in seen["replies"]), b_store
    assert (seen["metric"], fresh["metric"]) == (b_store["stored_bytes"], b_fresh["stored_bytes"])
    assert 'id="sizes-scope">Sizes and ratios are for namespace tenant-b only' in seen["page"]
    admin = seen["admin"]
    assert admin["store_scope"] == "store" and admin["store"]["names"] == 4, admin["store"]
    assert admin["store"]["stored_bytes"] > b_store["stored_bytes"]
