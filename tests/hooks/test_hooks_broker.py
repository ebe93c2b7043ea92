"""Unit tests of the broker's decisions (what to restore, what to save), without HTTP.

Only llama-server is a stand-in here: a recording fake of the slot actions and `/tokenize` that writes a real slot
file on save (`tests/make_states.py`'s, read-only) and reads the file the store materialized on restore. The store
is a real `kvstore._core.Store` on tmp_path; the slot table, the sync dir, the transfer logic and the metrics are
the real ones. The end-to-end behaviour is tested on the real server in test_hooks_*.py.
"""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Optional

import pytest

import kvstore
import slotfile
from kvstore.hooks.auth import Caller
from kvstore.hooks.broker import Broker, Once
from kvstore.hooks.errors import BadRequest, NotFound, UpstreamReply
from kvstore.hooks.metrics import Metrics
from kvstore.hooks.naming import Naming
from kvstore.hooks.slot_api import SlotApi
from kvstore.hooks.slots import SlotTable
from kvstore.hooks.store import AsyncStore
from kvstore.hooks.syncdir import SyncDir
from kvstore.hooks.transfer import Transfer, layout_is_empty

B = 16  # the store's block size: the real states hold 325 and 342 tokens
FP = {"model": "m"}  # the fingerprint the broker's server reports (states are ingested with it)


def tokens_of(path: Path) -> list[int]:
    return [int(t) for t in slotfile.parse(path.read_bytes())["tokens"]["tokens"]]


class FakeUpstream:
    """llama-server's slot API and tokenizer. A save writes `state` (a real slot file; None: an empty slot, as
    llama-server answers `n_saved: 0`) into the sync dir; a restore reads the file the store wrote and answers its
    token count. `refuse` makes restores fail like a bad file; `prompt` is what /tokenize answers."""

    def __init__(self, sync: Path, state: Optional[Path]):
        self.sync, self.state = sync, state
        self.calls: list[tuple] = []
        self.restored: list[list[int]] = []  # the tokens of each file a restore loaded
        self.refuse = False
        self.prompt: list[int] = list(range(1000, 1040))  # shares nothing with the stored states
        self.tokenized = 0

    async def slot_action(self, slot_id, action, filename=None):
        self.calls.append((action, slot_id))
        if action == "save":
            if self.state is None:
                return {"n_saved": 0}
            shutil.copyfile(self.state, self.sync / filename)
            return {"n_saved": len(tokens_of(self.state))}
        if action == "restore":
            if self.refuse:
                raise UpstreamReply(400, b'{"error": {"message": "failed to restore"}}')
            toks = tokens_of(self.sync / filename)
            self.restored.append(toks)
            return {"n_restored": len(toks)}
        return {}

    async def tokenize(self, text):
        self.tokenized += 1
        return list(self.prompt)


@pytest.fixture
def states(state_files) -> dict[str, Path]:
    return {"parent": state_files["smollm2_parent"], "child": state_files["smollm2_child"]}


def make(tmp_path: Path, states: dict[str, Path], *, names=(), n_slots=2, saves="child"):
    core = kvstore.open_store(tmp_path / "store", block_size=B)
    for n in names:  # stored before the server starts: the parent's state under each name
        core.ingest(n, str(states["parent"]), fingerprint=FP)
    sync = SyncDir(tmp_path / "sync")
    up, store, metrics = FakeUpstream(sync.path, states[saves] if saves else None), AsyncStore(core), Metrics()
    transfer = Transfer(up, store, sync, metrics, n_slots=n_slots, fingerprint=dict(FP))
    table = SlotTable(n_slots, save=transfer.save)
    return Broker(up, store, transfer, table, metrics), up, core


def tokens_fn(broker, text="a prompt of some tokens"):
    return Once(lambda: broker.prompt_tokens({"prompt": text}, False))


async def hold(broker, naming, fn=None):
    fn = fn or tokens_fn(broker)
    async with broker.hold(naming, fn) as (lease, kind, n):
        broker.table.evaluated(lease.slot, fn.value or [])  # as the completion handler does
        return lease.slot, kind, n


def test_stored_name_is_restored_without_tokenizing(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["alice"])
    slot, kind, n = asyncio.run(hold(broker, Naming("", "alice")))
    assert (kind, n) == ("restored", 325)
    assert up.restored == [tokens_of(states["parent"])] and slot.key == ("", "alice")
    assert up.tokenized == 0  # the plan skips the prompt: the name has its own state


def test_resident_name_is_used_in_place(tmp_path, states):
    broker, up, core = make(tmp_path, states)

    async def two():
        first = await hold(broker, Naming("", "bob"))
        second = await hold(broker, Naming("", "bob"))
        return first, second

    (s1, k1, _), (s2, k2, n2) = asyncio.run(two())
    assert k1 == "miss" and (k2, n2) == ("slot", 0) and s1 is s2
    assert [c[0] for c in up.calls] == []  # nothing saved or restored


def test_parent_restored_when_name_is_new_and_recorded_at_save(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["article"])

    async def go():
        slot, kind, n = await hold(broker, Naming("", "q1", "article"))
        await broker.transfer.save(slot)
        return slot, kind

    slot, kind = asyncio.run(go())
    assert kind == "parent" and slot.parent == "article"
    assert core.get("q1")["parent"] == core.get("article")["manifest_id"]  # lineage, as the store records it
    assert core.tokens("q1") == tokens_of(states["child"])


def test_stored_name_beats_resident_parent(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["q1"])

    async def go():
        await hold(broker, Naming("", "article"))  # now resident in a slot
        return await hold(broker, Naming("", "q1", "article"))

    slot, kind, _ = asyncio.run(go())
    assert kind == "restored" and slot.key == ("", "q1")


def test_longest_stored_prefix_restored_for_a_new_name(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["other"])
    parent = tokens_of(states["parent"])
    up.prompt = parent[:5 * B + 3] + [1, 2, 3]  # leaves the stored state after 83 tokens
    slot, kind, n = asyncio.run(hold(broker, Naming("", "new")))
    assert (kind, n) == ("prefix", 325)
    assert up.restored == [parent] and slot.parent == "other"
    assert up.tokenized == 1  # tokenized once, for plan and prepare together


def test_prefix_shorter_than_a_block_is_a_miss(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["x"])
    up.prompt = tokens_of(states["parent"])[:B - 1] + [1, 2, 3]
    _, kind, _ = asyncio.run(hold(broker, Naming("", "new")))
    assert kind == "miss" and up.restored == []


def test_refused_restore_is_a_miss_and_clears_the_slot(tmp_path, states):
    broker, up, core = make(tmp_path, states, names=["alice"])
    up.refuse = True

    async def go():
        async with broker.hold(Naming("", "alice"), tokens_fn(broker)) as (lease, kind, n):
            return lease.slot, kind

    slot, kind = asyncio.run(go())
    assert kind == "miss" and slot.tokens == [] and not slot.dirty
    assert broker.metrics.snapshot()["restore_failures"] == 1


def test_evicting_a_dirty_slot_saves_it_first(tmp_path, states):
    broker, up, core = make(tmp_path, states, n_slots=1)

    async def go():
        await hold(broker, Naming("", "a"))
        await hold(broker, Naming("", "b"))

    asyncio.run(go())
    assert [x["name"] for x in core.list()] == ["a"]  # a saved before b took its slot
    assert up.calls[0] == ("save", 0)


def test_unknown_parent_at_save_keeps_the_state(tmp_path, states):
    broker, up, core = make(tmp_path, states)

    async def go():
        slot, _, _ = await hold(broker, Naming("", "child"))
        broker.table.set_parent(slot, "gone")
        return await broker.transfer.save(slot)

    info = asyncio.run(go())
    assert info["n_tokens"] == 342 and core.get("child")["parent"] is None


def test_layout_learned_from_the_first_non_empty_save(tmp_path, states):
    broker, up, core = make(tmp_path, states, saves=None)

    async def save(name):
        slot, _, _ = await hold(broker, Naming("", name))
        return await broker.transfer.save(slot)

    assert asyncio.run(save("empty")) == {"n_saved": 0, "save": {"n_saved": 0}}  # llama-server saved nothing
    assert broker.transfer.layout is None and "layout" not in broker.transfer.expect()
    up.state = states["child"]
    asyncio.run(save("full"))
    layout = core.get("full")["layout"]
    assert broker.transfer.expect() == {**FP, "layout": layout}
    assert not layout_is_empty(layout) and layout_is_empty("kv[-]")


def test_state_api_not_found_and_failed_raw_restore(tmp_path, states):
    b, up, core = make(tmp_path, states, names=["kept"])
    broker = SlotApi(b.up, b.store, b.transfer, b.table)
    with pytest.raises(NotFound):
        asyncio.run(broker.info("", "nope"))
    with pytest.raises(NotFound):
        asyncio.run(broker.delete("", "nope"))
    with pytest.raises(NotFound):
        asyncio.run(broker.restore_raw(0, Caller(""), "nope"))
    up.refuse = True
    with pytest.raises(BadRequest, match="restore of 'kept' failed"):
        asyncio.run(broker.restore_raw(1, Caller(""), "kept"))
    assert asyncio.run(broker.info("", "kept"))["resident_slot"] == 1


def test_a_waiting_request_has_its_state_materialized_meanwhile(tmp_path, states):
    """Overlap the wait: every slot busy, a returning user's state is materialized while it waits; once a slot
    frees only the load is left (the prefetched file is what llama-server loads). A state saved again meanwhile is
    materialized again, never restored stale; no file stays in the sync dir."""
    broker, up, core = make(tmp_path, states, names=["alice", "bob"], n_slots=1, saves=None)
    sync = broker.transfer.sync.path

    async def go(resave: bool):
        busy = broker.table.acquire(key=("", "other"))
        await busy.__aenter__()
        waiting = asyncio.ensure_future(hold(broker, Naming("", "alice" if not resave else "bob")))
        written = lambda: [p for p in sync.iterdir() if not p.name.endswith(".tmp")]  # noqa: E731 (renamed in)
        for _ in range(500):  # the prefetch's materialize, in a worker thread, while the request waits
            await asyncio.sleep(0.01)
            if written() and not waiting.done():
                break
        files = written()
        assert len(files) == 1 and not waiting.done(), files
        assert tokens_of(files[0]) == tokens_of(states["parent"])  # alice's state, whole, before any slot freed
        if resave:
            core.ingest("bob", str(states["child"]), fingerprint=FP)  # a newer state of the name meanwhile
        await busy.__aexit__(None, None, None)
        return await waiting

    slot, kind, n = asyncio.run(go(False))
    assert kind == "restored" and up.restored[-1] == tokens_of(states["parent"])
    assert broker.metrics.snapshot()["restores_prefetched"] == 1
    slot, kind, n = asyncio.run(go(True))
    assert kind == "restored" and up.restored[-1] == tokens_of(states["child"]), "restored the stale prefetch"
    assert broker.metrics.snapshot()["restores_prefetched"] == 1
    assert list(sync.iterdir()) == []


def test_a_bucket_stores_prefetch_is_trusted_unless_this_process_changed_the_name(tmp_path, states, monkeypatch):
    """On a bucket store the plan takes this machine's index's yes for "is the name stored?" (no round trip; a
    restore confirms against the record), and asks the bucket only on a no.
    The prefetch's read of the name's record (when the request arrived) is the request's read:
    asking again once a slot frees would cost a returning user one more round trip, so it is asked only when this
    process saved, removed or evicted since (AsyncStore.changes; None while such a change runs). A save of the
    name through the proxy while the request waits is still never restored stale. (A local store, whose read is an
    index lookup, always asks: the test above.) The store here is a local one that says it is a bucket's."""
    broker, up, core = make(tmp_path, states, names=["alice", "bob"], n_slots=1, saves=None)
    store = broker.transfer.store
    monkeypatch.setattr(AsyncStore, "remote", property(lambda self: "s3://bucket/prefix"))
    asked = []
    plain_get = store.get

    async def counted_get(name, *, namespace):
        asked.append(name)
        return await plain_get(name, namespace=namespace)

    monkeypatch.setattr(store, "get", counted_get)
    newer = tmp_path / "newer.bin"

    async def go(name: str, resave: bool):
        busy = broker.table.acquire(key=("", "other"))
        await busy.__aenter__()
        waiting = asyncio.ensure_future(hold(broker, Naming("", name)))
        for _ in range(500):  # until the prefetch wrote its file
            await asyncio.sleep(0.01)
            if [p for p in broker.transfer.sync.path.iterdir() if not p.name.endswith(".tmp")]:
                break
        if resave:
            shutil.copy(states["child"], newer)
            assert store.changes("", name) is not None
            await store.ingest(name, str(newer), namespace="", fingerprint=FP)  # this process saves it meanwhile
        await busy.__aexit__(None, None, None)
        return await waiting

    asked.clear()
    slot, kind, n = asyncio.run(go("alice", False))
    assert kind == "restored" and up.restored[-1] == tokens_of(states["parent"])
    # never asked: the plan took this machine's index's yes (the restore confirms against the record), and the
    # prefetch's read was trusted once the slot freed
    assert broker.metrics.snapshot()["restores_prefetched"] == 1 and asked == [], asked
    asked.clear()
    slot, kind, n = asyncio.run(go("bob", True))
    assert kind == "restored" and up.restored[-1] == tokens_of(states["child"]), "restored the stale prefetch"
    assert broker.metrics.snapshot()["restores_prefetched"] == 1 and asked == ["bob"], asked  # the check
    # A name this machine's index lacks is asked of the bucket (another server may have saved it).
    asked.clear()
    assert asyncio.run(broker.stored("", "nobody")) is False and asked == ["nobody"], asked
    assert list(broker.transfer.sync.path.iterdir()) == []


def test_a_change_under_way_leaves_no_mark_and_every_change_moves_it(tmp_path, states):
    """AsyncStore.changes: None while a save of the name runs, a new mark after it; an eviction moves every mark."""
    core = kvstore.open_store(tmp_path / "store", block_size=B)
    store = AsyncStore(core)
    copy = tmp_path / "s.bin"

    async def go():
        before, other = store.changes("", "n"), store.changes("", "m")
        shutil.copy(states["parent"], copy)
        saving = asyncio.ensure_future(store.ingest("n", str(copy), namespace="", fingerprint=FP))
        await asyncio.sleep(0)
        during = store.changes("", "n")
        await saving
        after = store.changes("", "n")
        assert store.changes("", "m") == other  # another name's mark did not move
        await store.evict(max_bytes=None, low_water=1.0, quotas={}, protect=[], dry_run=True)
        return before, during, after, other, store.changes("", "n"), store.changes("", "m")

    before, during, after, other, evicted, evicted_other = asyncio.run(go())
    assert during is None and None not in (before, after) and before != after
    assert evicted not in (after, None) and evicted_other not in (other, None)


def test_the_cost_model_learns_llama_servers_own_load_time_not_its_queue_wait(tmp_path, states):
    """A restore answered late because llama-server was decoding another slot (bench/slotwait.py: up to a whole
    prompt's evaluation) is not a slow restore: the cost model takes the load time llama-server reports
    (`timings.restore_ms`), or the stored states would soon all be recomputed (W2 with 2 in flight did so)."""
    broker, up, core = make(tmp_path, states, names=["alice"])
    plain_action = up.slot_action

    async def queued(slot_id, action, filename=None):
        r = await plain_action(slot_id, action, filename)
        if action == "restore":
            await asyncio.sleep(0.5)  # waited behind another slot's decode step
            r["timings"] = {"restore_ms": 2.0}
        return r

    up.slot_action = queued
    slot, kind, n = asyncio.run(hold(broker, Naming("", "alice")))
    assert kind == "restored"
    restore = broker.transfer.cost.describe()["restore"]
    size = states["parent"].stat().st_size
    assert restore["samples"] == 1
    assert size / restore["bytes_per_s"] < 0.25, restore  # the materialize plus 2 ms, not the 0.5 s wait
