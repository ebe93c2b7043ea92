"""Unit tests of the broker's decisions (what to restore, what to save), without HTTP.

Only llama-server and the store are stand-ins here: a recording fake of the three calls the broker makes to each
(slot actions and tokenize; ingest/materialize/lookup/get/remove). The slot table, the sync dir, the transfer
logic and the metrics are the real ones. The end-to-end behaviour is tested on the real server in test_hooks_*.py.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvstore.errors import NameNotFound
from kvstore.hooks.auth import Caller
from kvstore.hooks.broker import Broker, Once
from kvstore.hooks.errors import BadRequest, NotFound, UpstreamReply
from kvstore.hooks.metrics import Metrics
from kvstore.hooks.naming import Naming
from kvstore.hooks.slots import SlotTable
from kvstore.hooks.syncdir import SyncDir
from kvstore.hooks.transfer import Transfer, layout_is_empty

B = 4  # block size of the fake store
LAYOUT = "kv[f16,f16,fa=0]"


class FakeUpstream:
    """llama-server's slot API: records every call; `refuse` makes restores fail like a bad file."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.refuse = False
        self.tokenized = 0

    async def slot_action(self, slot_id, action, filename=None):
        self.calls.append((action, slot_id))
        if action == "restore" and self.refuse:
            raise UpstreamReply(400, b'{"error": {"message": "failed to restore"}}')
        if action == "save":
            return {"n_saved": 7}
        return {"n_restored": 12} if action == "restore" else {}

    async def tokenize(self, text):
        self.tokenized += 1
        return list(range(len(text)))


class FakeStore:
    """The store's async face: names -> {layout, ...}; `hit` is what lookup answers."""

    block_size = B

    def __init__(self, names=(), hit=None, layout=LAYOUT):
        self.names = {n: {"name": n, "layout": layout} for n in names}
        self.hit = hit
        self.layout = layout
        self.ingested: list[tuple] = []
        self.materialized: list[str] = []

    async def ingest(self, name, path, *, namespace, fingerprint, parent=None):
        if parent is not None and parent not in self.names:
            raise NameNotFound(f"no state named {parent!r}")
        self.ingested.append((name, parent, dict(fingerprint)))
        self.names[name] = {"name": name, "layout": self.layout}
        return {"n_tokens": 7, "file_bytes": 100, "new_stored_bytes": 10, "layout": self.layout}

    async def materialize(self, name, path, *, namespace, expect, n_stream):
        if name not in self.names:
            raise NameNotFound(f"no state named {name!r}")
        self.materialized.append(name)
        return {"file_bytes": 100}

    async def materialize_manifest(self, manifest_id, path, *, expect, n_stream):
        self.materialized.append(manifest_id)
        return {"file_bytes": 100}

    async def lookup(self, tokens, *, namespace, fingerprint):
        return self.hit

    async def get(self, name, *, namespace):
        return self.names.get(name)

    async def remove(self, name, *, namespace):
        return self.names.pop(name, None) is not None


def make(tmp_path: Path, *, names=(), hit=None, n_slots=2):
    up, store, metrics = FakeUpstream(), FakeStore(names, hit), Metrics()
    transfer = Transfer(up, store, SyncDir(tmp_path / "sync"), metrics, n_slots=n_slots, fingerprint={"model": "m"})
    table = SlotTable(n_slots, save=transfer.save)
    return Broker(up, store, transfer, table, metrics), up, store


def tokens_fn(broker, text="a prompt of some tokens"):
    return Once(lambda: broker.prompt_tokens({"prompt": text}, False))


async def hold(broker, naming, fn=None):
    fn = fn or tokens_fn(broker)
    async with broker.hold(naming, fn) as (lease, kind, n):
        broker.table.evaluated(lease.slot, fn.value or [])  # as the completion handler does
        return lease.slot, kind, n


def test_stored_name_is_restored_without_tokenizing(tmp_path):
    broker, up, store = make(tmp_path, names=["alice"])
    slot, kind, n = asyncio.run(hold(broker, Naming("", "alice")))
    assert (kind, n) == ("restored", 12)
    assert store.materialized == ["alice"] and slot.key == ("", "alice")
    assert up.tokenized == 0  # the plan skips the prompt: the name has its own state


def test_resident_name_is_used_in_place(tmp_path):
    broker, up, store = make(tmp_path)

    async def two():
        first = await hold(broker, Naming("", "bob"))
        second = await hold(broker, Naming("", "bob"))
        return first, second

    (s1, k1, _), (s2, k2, n2) = asyncio.run(two())
    assert k1 == "miss" and (k2, n2) == ("slot", 0) and s1 is s2
    assert [c[0] for c in up.calls] == []  # nothing saved or restored


def test_parent_restored_when_name_is_new_and_recorded_at_save(tmp_path):
    broker, up, store = make(tmp_path, names=["article"])

    async def go():
        slot, kind, n = await hold(broker, Naming("", "q1", "article"))
        await broker.transfer.save(slot)
        return slot, kind

    slot, kind = asyncio.run(go())
    assert kind == "parent" and slot.parent == "article"
    assert store.ingested[0][:2] == ("q1", "article")


def test_stored_name_beats_resident_parent(tmp_path):
    broker, up, store = make(tmp_path, names=["q1"])

    async def go():
        await hold(broker, Naming("", "article"))  # now resident in a slot
        return await hold(broker, Naming("", "q1", "article"))

    slot, kind, _ = asyncio.run(go())
    assert kind == "restored" and slot.key == ("", "q1")


def test_longest_stored_prefix_restored_for_a_new_name(tmp_path):
    hit = {"manifest_id": "ab" * 32, "name": "other", "n_common": 2 * B}
    broker, up, store = make(tmp_path, hit=hit)
    slot, kind, n = asyncio.run(hold(broker, Naming("", "new")))
    assert (kind, n) == ("prefix", 12)
    assert store.materialized == [hit["manifest_id"]] and slot.parent == "other"
    assert up.tokenized == 1  # tokenized once, for plan and prepare together


def test_prefix_shorter_than_a_block_is_a_miss(tmp_path):
    broker, up, store = make(tmp_path, hit={"manifest_id": "cd" * 32, "name": "x", "n_common": B - 1})
    _, kind, _ = asyncio.run(hold(broker, Naming("", "new")))
    assert kind == "miss" and store.materialized == []


def test_refused_restore_is_a_miss_and_clears_the_slot(tmp_path):
    broker, up, store = make(tmp_path, names=["alice"])
    up.refuse = True

    async def go():
        async with broker.hold(Naming("", "alice"), tokens_fn(broker)) as (lease, kind, n):
            return lease.slot, kind

    slot, kind = asyncio.run(go())
    assert kind == "miss" and slot.tokens == [] and not slot.dirty
    assert broker.metrics.snapshot()["restore_failures"] == 1


def test_evicting_a_dirty_slot_saves_it_first(tmp_path):
    broker, up, store = make(tmp_path, n_slots=1)

    async def go():
        await hold(broker, Naming("", "a"))
        await hold(broker, Naming("", "b"))

    asyncio.run(go())
    assert [i[0] for i in store.ingested] == ["a"]  # a saved before b took its slot
    assert up.calls[0] == ("save", 0)


def test_unknown_parent_at_save_keeps_the_state(tmp_path):
    broker, up, store = make(tmp_path)

    async def go():
        slot, _, _ = await hold(broker, Naming("", "child"))
        broker.table.set_parent(slot, "gone")
        return await broker.transfer.save(slot)

    info = asyncio.run(go())
    assert info["n_tokens"] == 7 and store.ingested == [("child", None, {"model": "m"})]


def test_layout_learned_from_the_first_non_empty_save(tmp_path):
    broker, up, store = make(tmp_path)
    store.layout = "kv[-]"

    async def save(name):
        slot, _, _ = await hold(broker, Naming("", name))
        await broker.transfer.save(slot)

    asyncio.run(save("empty"))
    assert broker.transfer.layout is None and "layout" not in broker.transfer.expect()
    store.layout = LAYOUT
    asyncio.run(save("full"))
    assert broker.transfer.expect() == {"model": "m", "layout": LAYOUT}
    assert layout_is_empty("kv[-]") and not layout_is_empty(LAYOUT)


def test_state_api_not_found_and_failed_raw_restore(tmp_path):
    broker, up, store = make(tmp_path, names=["kept"])
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
