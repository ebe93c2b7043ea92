"""Unit tests of the one rule for using a slot in place (`SlotTable.usable`) on every path that hands out a slot,
of forking a busy name into an idle slot, and of who holds a name after overlapping requests (no llama-server:
the save callback is recorded). The real-server paths are in test_hooks_inflight.py."""
from __future__ import annotations

import asyncio

from kvstore.hooks.slots import SlotTable

ART = list(range(100, 160))  # an article's tokens
Q1, Q2 = [1, 2, 3], [4, 5, 6]


def make(extension_only: bool, n=2):
    saved = []

    async def save(slot):
        saved.append((slot.id, slot.key, list(slot.tokens)))

    return SlotTable(n, save=save, extension_only=lambda: extension_only), saved


def fill(t: SlotTable, slot_id: int, key, tokens, *, dirty=True, owner=""):
    s = t.slots[slot_id]
    s.namespace, s.name = key if key else ("", None)
    s.tokens, s.dirty, s.owner, s.last_used = list(tokens), dirty, owner, 1.0


def test_resident_name_in_place_only_when_the_prompt_extends_it():
    async def go(extension_only, prompt):
        t, saved = make(extension_only)
        fill(t, 0, ("", "article"), ART + Q1)
        async with t.acquire(key=("", "article"), tokens=prompt) as lease:
            return lease.slot.id, lease.resident, saved, lease.slot.key

    # Full attention: the fork inside the content is llama-server's cheap rollback: in place.
    assert asyncio.run(go(False, ART + Q2)) == (0, True, [], ("", "article"))
    # SWA / recurrent: the same slot, not in place: its dirty state is saved first (then a cut is restored).
    slot, resident, saved, key = asyncio.run(go(True, ART + Q2))
    assert (slot, resident, key) == (0, False, ("", "article")) and saved == [(0, ("", "article"), ART + Q1)]
    # A prompt that extends everything the slot holds is in place on any model.
    assert asyncio.run(go(True, ART + Q1 + [9, 9]))[:3] == (0, True, [])
    # Tokens not known: as before (in place).
    assert asyncio.run(go(True, None))[:2] == (0, True)


def test_resident_parent_in_place_only_when_the_prompt_extends_it():
    async def go(extension_only, parent_tokens):
        t, _ = make(extension_only)
        fill(t, 0, ("", "article"), parent_tokens, dirty=False)
        fill(t, 1, ("", "other"), [7] * 10, dirty=False)
        async with t.acquire(key=("", "q2"), parent=("", "article"), tokens=ART + Q2, better_than=1 << 40) as l:
            return l.slot.id, l.parent_resident

    assert asyncio.run(go(True, ART)) == (0, True)  # the article alone: the question extends it
    assert asyncio.run(go(False, ART + Q1)) == (0, True)
    assert asyncio.run(go(True, ART + Q1))[1] is False  # holds more than the article: not in place


def test_similar_slot_in_place_follows_the_same_rule():
    from kvstore.hooks import cut

    async def go(extension_only):
        t, _ = make(extension_only)
        fill(t, 0, None, ART + Q1)
        async with t.acquire(tokens=ART + Q2) as lease:
            return lease.lcp, cut.in_place(lease)

    assert asyncio.run(go(False)) == (len(ART), len(ART))
    # An SWA model gets the lease (the slot's content is its namespace's), but keeps nothing in place of a cut.
    assert asyncio.run(go(True)) == (0, 0)


def test_a_busy_name_forks_into_an_idle_slot_only_when_asked():
    async def go(fork):
        t, _ = make(True)
        fill(t, 0, ("", "article"), ART + Q1)
        await t.slots[0].lock.acquire()  # a request of the name is in flight there
        try:
            got = await asyncio.wait_for(_lease(t, fork), 0.2)
        except asyncio.TimeoutError:
            got = None
        return got

    async def _lease(t, fork):
        async with t.acquire(key=("", "article"), tokens=ART + Q2, fork=fork) as lease:
            return lease.slot.id, lease.resident, lease.slot.key

    assert asyncio.run(go(False)) is None  # waits for the busy slot
    assert asyncio.run(go(True)) == (1, False, ("", "article"))


def test_the_request_that_finishes_last_holds_the_name():
    """Two slots hold one name while both requests run; whichever finishes last keeps the label, the other's
    older content lets the name go (it is never saved under it)."""
    async def go(last):
        t, saved = make(True)
        fill(t, 0, ("", "article"), ART + Q1)
        fill(t, 1, ("", "article"), ART + Q2)
        first = 1 - last
        await t.slots[last].lock.acquire()  # still running when the first one finishes
        t.evaluated(t.slots[first], ART + [first])
        t.slots[last].lock.release()
        t.evaluated(t.slots[last], ART + [last])
        return [(s.key, s.dirty) for s in t.slots], t.resident(("", "article")).id

    for last in (0, 1):
        labels, holder = asyncio.run(go(last))
        assert holder == last
        assert labels[last] == (("", "article"), True) and labels[1 - last] == (None, False)
