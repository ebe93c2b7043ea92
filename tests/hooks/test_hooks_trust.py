"""Trust, second pass (issue 20), as a hostile tenant would probe it against the real llama.cpp server: a slot
whose request timed out keeps its owner's cells hidden and erased before anyone else uses them."""
from __future__ import annotations

import secrets
import time

from hooks_support import engine, get, hooks, intro, post, stack

KEY_A, KEY_B = "sk-a-" + "5" * 20, "sk-b-" + "6" * 20
A, B = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))


def test_a_timed_out_slot_stays_its_owners(tmp_path):
    """A's request times out (504). With one slot, B's next request must get that slot: it is erased first, so
    B reuses none of A's cells (cache_n 0); until then B sees only that the slot is another namespace's and cannot
    save it under a name of its own."""
    from kvstore.hooks.auth import tenancy_from

    store = tmp_path / "store"
    up_key = secrets.token_urlsafe(16)
    srv = engine("smollm2", store, parallel=1, api_key=up_key)
    hk = hooks(srv.url, store, tenancy=tenancy_from([KEY_A, KEY_B], [], []), upstream_api_key=up_key,
               upstream_timeout=2)
    with stack(srv, hk):
        u = hk.url
        secret = intro(3) + "The vault code is 4417. User: What is the vault code?\nAssistant:"
        r = post(u, "/completion", {"prompt": secret, "n_predict": 4000, "ignore_eos": True,
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
        while any(sl.get("is_processing") for sl in get(srv.url, "/slots", {"Authorization": f"Bearer {up_key}"}).json):
            assert time.monotonic() < deadline, "llama-server still busy with the abandoned request"
            time.sleep(0.2)
        # B's prompt begins exactly like A's: llama-server would reuse every common cell if they were still there.
        r = post(u, "/completion", {"prompt": secret[:100], "n_predict": 1}, B)
        assert r.status == 200, r.body[:300]
        assert r.json["timings"]["cache_n"] == 0, r.json["timings"]
