"""Unit tests of SlotTable's choices (no llama-server: the save callback is recorded)."""
from __future__ import annotations

import asyncio

import pytest

from kvstore.hooks.errors import QueueFull
from kvstore.hooks.slot import common_prefix
from kvstore.hooks.slots import SlotTable


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(n=2, max_queue=64):
    saved = []

    async def save(slot):
        await asyncio.sleep(0)
        saved.append((slot.id, slot.key))

    clock = Clock()
    return SlotTable(n, save=save, max_queue=max_queue, clock=clock), saved, clock


def run(coro):
    return asyncio.run(coro)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_empty_first_then_lru_and_resident_in_place():
    async def go():
        t, saved, clock = make()
        async with t.acquire(key=("", "a")) as l:
            assert l.slot.id == 0 and not l.resident
            l.slot.dirty = True
            clock.t = 1
            t.touch(l.slot)
        async with t.acquire(key=("", "b")) as l:
            assert l.slot.id == 1  # empty before LRU
            l.slot.dirty = True
            clock.t = 2
            t.touch(l.slot)
        async with t.acquire(key=("", "a")) as l:
            assert l.slot.id == 0 and l.resident
            clock.t = 3
            t.touch(l.slot)
        assert saved == []
        async with t.acquire(key=("", "c")) as l:  # LRU is slot 1 (b): saved first, then relabelled
            assert l.slot.id == 1 and l.slot.key == ("", "c") and not l.slot.dirty
        assert saved == [(1, ("", "b"))]
    run(go())


def test_clean_slot_is_not_saved_and_parent_used_in_place():
    async def go():
        t, saved, clock = make()
        async with t.acquire(key=("", "article")) as l:
            l.slot.tokens = [1, 2, 3]
            t.touch(l.slot)
        async with t.acquire(key=("", "q1"), parent=("", "article")) as l:
            assert l.parent_resident and l.slot.id == 0
            assert l.slot.key == ("", "q1") and l.slot.parent == "article"
        assert saved == []
    run(go())


def test_waits_for_busy_resident_name_and_queue_bound():
    async def go():
        t, saved, clock = make(n=1, max_queue=1)
        order = []
        gate = asyncio.Event()

        async def first():
            async with t.acquire(key=("", "a")) as l:
                order.append(("first", l.slot.id))
                await gate.wait()

        async def second():
            async with t.acquire(key=("", "a")) as l:
                order.append(("second", l.slot.id, l.resident))

        f = asyncio.create_task(first())
        await asyncio.sleep(0)
        s = asyncio.create_task(second())
        await asyncio.sleep(0)
        assert t.queue_length == 1
        with pytest.raises(QueueFull):
            async with t.acquire(key=("", "b")):
                pass
        gate.set()
        await asyncio.gather(f, s)
        assert order == [("first", 0), ("second", 0, True)]
        assert t.queue_length == 0
    run(go())


def test_unnamed_prefers_best_prefix_unless_store_is_better():
    async def go():
        t, saved, clock = make()
        t.slots[0].tokens = [1, 2, 3, 4]
        t.slots[0].owner = t.slots[1].owner = ""  # content of the default namespace
        t.slots[0].last_used = 5
        t.slots[1].tokens = [9, 9]
        t.slots[1].last_used = 1
        async with t.acquire(tokens=[1, 2, 3, 7]) as l:
            assert l.slot.id == 0 and l.lcp == 3
        async with t.acquire(tokens=[1, 2, 3, 7], better_than=10) as l:
            assert l.slot.id == 1 and l.lcp == 0  # store has more: take the LRU slot and restore into it
    run(go())


def test_unnamed_request_saves_named_dirty_slot_first():
    async def go():
        t, saved, clock = make(n=1)
        async with t.acquire(key=("ns", "a")) as l:
            l.slot.dirty = True
            l.slot.tokens = [1, 2]
        async with t.acquire(tokens=[1, 2, 3], namespace="ns") as l:
            assert l.lcp == 2 and l.slot.name is None and not l.slot.dirty
        assert saved == [(0, ("ns", "a"))]
    run(go())


def test_errors_release_the_slot():
    async def go():
        t, saved, clock = make(n=1)
        with pytest.raises(RuntimeError):
            async with t.acquire(key=("", "a")):
                raise RuntimeError("boom")
        assert not t.slots[0].busy
        async with asyncio.timeout(1):
            async with t.acquire(key=("", "b")):
                pass
    run(go())


def test_cancelled_handler_keeps_slot_locked_until_save_ends():
    async def go():
        release = asyncio.Event()
        done = []

        async def slow_save(slot):
            await release.wait()
            done.append(slot.id)

        t = SlotTable(1, save=slow_save)
        t.slots[0].name, t.slots[0].dirty = "a", True

        async def handler():
            async with t.acquire(key=("", "b")):
                pass

        h = asyncio.create_task(handler())
        await asyncio.sleep(0.01)
        h.cancel()
        await asyncio.gather(h, return_exceptions=True)
        assert t.slots[0].busy  # the save still runs, so nobody may use the slot
        release.set()
        await asyncio.sleep(0.01)
        assert done == [0] and not t.slots[0].busy
    run(go())


def test_save_idle_and_save_all():
    async def go():
        t, saved, clock = make()
        for s, name in zip(t.slots, "ab"):
            s.name, s.dirty, s.last_used = name, True, 0
        clock.t = 10
        t.slots[1].last_used = 9
        assert await t.save_idle(5) == 1
        assert saved == [(0, ("", "a"))] and t.slots[0].name == "a" and not t.slots[0].dirty
        assert await t.save_all() == 1
        assert saved[-1] == (1, ("", "b"))
    run(go())


def test_fifo_under_contention_no_deadlock():
    async def go():
        t, saved, clock = make(n=2)
        served = []

        async def client(i):
            async with t.acquire(key=("", f"n{i % 5}")) as l:
                await asyncio.sleep(0.001 * (i % 3))
                l.slot.dirty = True
                served.append(i)

        async with asyncio.timeout(10):
            await asyncio.gather(*(client(i) for i in range(40)))
        assert sorted(served) == list(range(40))
        names = [s.name for s in t.slots]
        assert len(set(names)) == len(names)  # a name is never in two slots
    run(go())


def test_in_place_reuse_stays_inside_a_namespace():
    """A slot's content is reused in place only by requests of the same namespace (tenant isolation)."""
    async def go():
        t, saved, clock = make()
        prompt = list(range(100))
        async with t.acquire(tokens=prompt, namespace="tenant-a") as l:
            l.slot.tokens = prompt
            assert l.slot.namespace == "tenant-a"
            clock.t = 1
            t.touch(l.slot)
        first = l.slot.id
        async with t.acquire(tokens=prompt + [7], namespace="tenant-b") as l:
            assert l.lcp == 0 and l.slot.id != first  # the other tenant's slot is not a prefix source
        async with t.acquire(tokens=prompt + [7], namespace="tenant-a") as l:
            assert l.slot.id == first and l.lcp == 100
    run(go())


def test_other_namespace_gets_the_slot_erased_after_its_save():
    events = []

    async def save(slot):
        events.append(("save", slot.id, slot.key))

    async def erase(slot):
        events.append(("erase", slot.id, slot.owner))

    async def go():
        t = SlotTable(1, save=save, erase=erase)
        async with t.acquire(key=("a", "x")) as l:
            t.evaluated(l.slot, [1, 2, 3])
        async with t.acquire(tokens=[1, 2, 3, 4], namespace="a") as l:  # same namespace: reused in place
            assert l.lcp == 3
        assert events == [("save", 0, ("a", "x"))]
        async with t.acquire(tokens=[1, 2, 3, 4], namespace="b") as l:  # another: erased, nothing reused
            assert l.lcp == 0 and l.slot.owner == "b" and l.slot.tokens == []
        assert events[1:] == [("erase", 0, "a")]
        async with t.acquire(tokens=[5], namespace="b"):
            pass
        assert len(events) == 2  # b's own content: no erase

        def refuse(slot):
            raise PermissionError(slot.id)

        with pytest.raises(PermissionError):
            async with t.acquire(slot_id=0, guard=refuse):
                pass
        assert not t.slots[0].busy  # a refused lease releases the slot

    run(go())


def test_one_rule_for_who_sees_a_slot():
    """Slot.visible_to is the one rule behind /kvstore/stats, the status page and the raw slot API's guard."""
    async def go():
        t = SlotTable(3, save=lambda s: asyncio.sleep(0))
        async with t.acquire(key=("a", "x")) as l:
            t.evaluated(l.slot, [1, 2, 3])
        async with t.acquire(tokens=[7, 8], namespace="a") as l:  # a's unnamed cells: owner "a", no label
            t.evaluated(l.slot, [7, 8])
        return t

    t = run(go())
    named, unnamed, empty = sorted(t.slots, key=lambda s: (s.name is None, not s.tokens))
    assert (named.name, unnamed.owner, empty.owner) == ("x", "a", None)
    for s in (named, unnamed, empty):
        assert s.visible_to(None) and s.visible_to("a")
    # another tenant (also the default namespace "") sees neither a's label nor a's unnamed cells
    for viewer in ("b", ""):
        assert not named.visible_to(viewer) and not unnamed.visible_to(viewer) and empty.visible_to(viewer)
        seen = {d["id"]: d for d in t.as_list(viewer)}
        assert seen[unnamed.id] == {"id": unnamed.id, "busy": False, "other_namespace": True}
        assert seen[empty.id]["name"] is None and "other_namespace" not in seen[empty.id]
    assert t.as_list(None) == [s.as_dict() for s in t.slots]


def test_a_prefix_under_way_is_waited_for_not_evaluated_twice_at_once():
    """Two questions about one article in flight, nothing stored: the second waits for the slot evaluating the
    article (its content then serves in place) instead of evaluating the article again in the idle slot. A prompt
    that shares less than a block more, or another namespace's request, does not wait."""
    article = list(range(1000, 1100))

    async def go():
        t, _, _ = make(2)
        q1, q2, other = article + [1, 2, 3], article + [4, 5, 6], list(range(5000, 5100))
        first_done = asyncio.Event()
        order: list = []

        async def first():
            async with t.acquire(tokens=q1, namespace="n") as l:
                assert l.slot.inflight == q1
                order.append(("first", l.slot.id))
                await asyncio.sleep(0.05)
                t.evaluated(l.slot, q1 + [7])
            first_done.set()

        async def second():
            await asyncio.sleep(0.01)
            async with t.acquire(tokens=q2, namespace="n", better_than=0) as l:
                assert first_done.is_set(), "took the idle slot while the article was under way"
                order.append(("second", l.slot.id, l.lcp))

        async def unrelated():  # shares nothing: takes the idle slot at once
            await asyncio.sleep(0.01)
            async with t.acquire(tokens=other, namespace="n") as l:
                assert not first_done.is_set()
                order.append(("unrelated", l.slot.id))
                await asyncio.sleep(0.1)

        await asyncio.gather(first(), second(), unrelated())
        assert order[0] == ("first", 0) and ("unrelated", 1) in order
        assert ("second", 0, len(article)) in order  # in place on the article's slot
        assert all(not s.inflight for s in t.slots)

        # A recurrent model (no fork served): only a prompt extending the whole request under way waits for it.
        t3 = SlotTable(2, save=lambda s: asyncio.sleep(0), forks_served=lambda: False)
        async with t3.acquire(tokens=q1, namespace="n"):
            async with t3.acquire(tokens=q2, namespace="n") as l:
                assert l.slot.id == 1  # q2 leaves q1 at the question: nothing to wait for
            waited = asyncio.ensure_future(t3.acquire(tokens=q1 + [9] * 40, namespace="n").__aenter__())
            await asyncio.sleep(0.01)
            assert not waited.done(), "a prompt extending the request under way waits for it"
            waited.cancel()

        # A store that already covers the article (better_than), or another namespace under way: no wait.
        for kw in (dict(namespace="n", better_than=len(article)), dict(namespace="m", better_than=0)):
            t2, _, _ = make(2)
            async with t2.acquire(tokens=q1, namespace="n"):
                async with t2.acquire(tokens=q2, **kw) as l:
                    assert l.slot.id == 1, kw
    run(go())


def test_a_request_under_way_is_seen_only_by_its_own_namespace_even_while_its_slot_is_saved():
    """The slot of another namespace's state is taken by tenant b, whose prompt is under way there while a's dirty
    state is still being saved (the slot's owner is still a): a's request with the same prefix never waits on it
    (its timing would tell a what b is evaluating)."""
    article = list(range(1000, 1100))

    async def go():
        gate = asyncio.Event()

        async def slow_save(slot):
            await gate.wait()

        t = SlotTable(1, save=slow_save)
        async with t.acquire(key=("a", "doc"), tokens=[7] * 40, namespace="a") as l:
            l.slot.dirty = True
        cm = t.acquire(tokens=article + [1], namespace="b")
        taking = asyncio.ensure_future(cm.__aenter__())
        await asyncio.sleep(0.01)  # b holds the slot, a's state still saving: owner a, b's prompt under way
        s = t.slots[0]
        assert s.busy and s.owner == "a" and s.inflight_namespace == "b"
        assert not t._shared_in_flight(article + [2], "a", [], 0)
        assert t._shared_in_flight(article + [2], "b", [], 0)
        gate.set()
        lease = await taking
        assert lease.slot.owner == "b"
        await cm.__aexit__(None, None, None)
        assert not s.busy and s.inflight == [] and s.inflight_namespace is None
    run(go())


def test_a_request_that_uses_no_slot_leaves_a_waiter_the_slot_it_continues():
    """Both slots free at once, two requests waiting: one question whose article is in slot 0, one whose article
    is in neither. The second takes slot 1 even though slot 0 is the least recently used, so the first continues
    its article in place. Only waiters of the picker's own namespace count: another tenant's pick is plain LRU."""
    article_a, article_b, other = list(range(1000, 1100)), list(range(2000, 2100)), list(range(5000, 5100))

    async def go():
        t, _, clock = make(2)
        for i, content in enumerate((article_a, article_b)):
            async with t.acquire(key=("n", f"s{i}"), tokens=content, namespace="n") as l:
                t.evaluated(l.slot, content)
            clock.t += 1  # slot 0 is the least recently used
        waiting = asyncio.get_running_loop().create_future()
        t._waiting[waiting] = ("n", article_a + [1, 2])  # as _wait_pick records a waiter
        assert t._pick(None, None, other, None, 0, "n").slot.id == 1
        assert t._pick(None, None, other, None, 0, "m").slot.id == 0  # another tenant: LRU, as if none waited
        del t._waiting[waiting]
        assert t._pick(None, None, other, None, 0, "n").slot.id == 0  # nobody waits for it: LRU
    run(go())


def test_a_refused_request_gives_the_slot_back_its_label_unless_something_was_loaded():
    """`refused`: llama-server evaluated nothing. The displaced state (saved on the way) is labelled again, with its
    tokens; not when a state was loaded into the slot for the request, nor when the name went to another slot,
    nor when the slot was erased for another namespace."""
    events = []

    async def save(slot):
        events.append(("save", slot.key))

    async def erase(slot):
        events.append(("erase", slot.owner))

    async def go():
        t = SlotTable(2, save=save, erase=erase)
        async with t.acquire(key=("a", "x")) as l:
            t.evaluated(l.slot, [1, 2, 3])
        async with t.acquire(key=("a", "y")) as l:
            t.evaluated(l.slot, [4, 5])
        async with t.acquire(key=("a", "z")) as l:  # a name with nothing stored, refused: x is back, clean
            assert l.slot.name == "z" and events == [("save", ("a", "x"))]
            t.unchanged(l)
        assert (t.slots[0].key, t.slots[0].tokens, t.slots[0].dirty) == (("a", "x"), [1, 2, 3], False)
        async with t.acquire(tokens=[9], namespace="a") as l:  # unnamed, refused: x again (it was clean)
            assert l.slot.id == 0 and l.slot.name is None
            t.unchanged(l)
        assert t.slots[0].key == ("a", "x")
        async with t.acquire(key=("a", "z")) as l:  # a state loaded for the request: the label stays z's
            t.loaded(l.slot)
            t.unchanged(l)
        assert t.slots[0].key == ("a", "z")
        async with t.acquire(key=("a", "w")) as l:  # the name it displaced is loaded into the other slot meanwhile
            displaced = l.before[:2]
            t.slots[1 - l.slot.id].hold(displaced)
            t.unchanged(l)
        assert l.slot.key == ("a", "w") and t.slots[1 - l.slot.id].key == displaced
        async with t.acquire(key=("b", "v")) as l:  # another namespace: erased first, nothing to give back
            assert events[-1] == ("erase", "a")
            t.unchanged(l)
        assert t.slots[l.slot.id].key == ("b", "v")

    run(go())
