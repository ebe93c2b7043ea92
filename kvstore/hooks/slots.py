"""The slot table: which llama-server slot serves which request.

Contract: only `SlotTable` picks, evicts and writes slot fields; a slot is never saved or restored while it
is processing (below).

A `Slot` mirrors one llama-server slot: the (namespace, name) whose state it holds (None: unnamed or empty),
the tokens it holds (best effort: the last tokenized prompt; unnamed requests and named ones with nothing to
restore are always tokenized), whether it has changes not yet in the store,
and an `asyncio.Lock` held for as long as a request uses it. Handlers hold a slot via
`async with table.acquire(...) as lease`, so errors and disconnects release it. A slot is never saved or
restored while it is processing: both happen under its lock, and every request to llama-server that
evaluates anything carries the `id_slot` of a slot its handler holds.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from .errors import QueueFull, SaveFailed, Unavailable
from .slot import Key, Lease, Slot, common_prefix, extends

log = logging.getLogger("kvstore.hooks")

class SlotTable:
    """Picks a slot for each request, evicts (saves) what it displaces, queues when all are busy."""

    def __init__(self, n_slots: int, *, save: Callable[[Slot], Awaitable[object]],
                 save_behind: Optional[Callable[[Slot], Awaitable[object]]] = None,
                 erase: Optional[Callable[[Slot], Awaitable[Any]]] = None, max_queue: int = 64,
                 clock: Callable[[], float] = time.monotonic,
                 extension_only: Callable[[], bool] = lambda: False, min_shared: int = 32,
                 forks_served: Callable[[], bool] = lambda: True):
        self.slots = [Slot(i) for i in range(n_slots)]
        # Tokens (one store block) a request under way must share with a waiting prompt beyond what an idle slot or
        # the store offers, for the waiting request to wait for it rather than evaluate that prefix again at once.
        self.min_shared = min_shared
        # Can a state serve a prompt that forks inside it, in place or cut at the fork (hooks/cut.py)? Not a
        # recurrent or hybrid one: waiting for a request under way then pays only if the prompt extends all of it.
        self.forks_served = forks_served
        # True when llama-server can use a slot's content in place only if the prompt extends all of it (an SWA
        # cache, a recurrent state: cut.extension_only); asked at each pick, since the layout is learned late.
        self.extension_only = extension_only
        self._save = save
        # The save of a state displaced for another request (hooks/behind.py: the ingest may run behind it).
        self._save_behind = save_behind or save
        self._erase = erase  # llama-server's action=erase; None only in unit tests of picking
        self.max_queue = max_queue
        self.clock = clock
        self._waiters: list[asyncio.Future] = []
        # What each waiting request would use in place: its namespace and prompt (when tokenized), so that a request
        # that uses no slot's content does not take the one a waiter of its namespace is waiting to continue.
        self._waiting: dict[asyncio.Future, tuple[str, Sequence[int]]] = {}

    # ---- inspection -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.slots)

    @property
    def queue_length(self) -> int:
        return len(self._waiters)

    def resident(self, key: Optional[Key]) -> Optional[Slot]:
        if key is None:
            return None
        for s in self.slots:
            if s.key == key:
                return s
        return None

    @property
    def all_busy(self) -> bool:
        """Would a request wait for a slot now?"""
        return all(s.busy for s in self.slots)

    def best_idle_lcp(self, tokens: Optional[Sequence[int]]) -> int:
        """The longest prefix of `tokens` held by an idle slot whose content is free to reuse."""
        if not tokens:
            return 0
        return max((common_prefix(s.tokens, tokens) for s in self.slots if not s.busy), default=0)

    def as_list(self, viewer: Optional[str] = None) -> list[dict[str, Any]]:
        """Every slot as `viewer` may see it (`Slot.view`; None: everything)."""
        return [s.view(viewer) for s in self.slots]

    # ---- picking ----------------------------------------------------------------------------------------------
    def _idle(self) -> list[Slot]:
        return [s for s in self.slots if not s.busy]

    def _lru(self, idle: list[Slot]) -> Optional[Slot]:
        """Empty first, then least recently used."""
        if not idle:
            return None
        return min(idle, key=lambda s: (not s.empty, s.last_used, s.id))

    def usable(self, slot: Slot, tokens: Optional[Sequence[int]]) -> bool:
        """May the slot's content serve this prompt in place? The one rule for every path that hands a request a
        slot as it is (its name resident, its parent resident, a similar slot): always on a full-attention model
        (llama-server keeps the common prefix); elsewhere only if the prompt extends all the slot holds (`extends`)
        — otherwise its state is saved if dirty and a stored state, cut at the fork where the model allows, is
        restored instead. Unknown tokens (not tokenized) keep the old answer: usable."""
        if tokens is None or not slot.tokens or not self.extension_only():
            return True
        return extends(slot.tokens, tokens)

    def _pick(self, key: Optional[Key], parent: Optional[Key], tokens: Optional[Sequence[int]],
              slot_id: Optional[int], better_than: int, namespace: str = "", avoid: frozenset = frozenset(),
              fork: bool = False) -> Optional[Lease]:
        """A lease on a free slot, or None (wait). avoid: slots whose dirty state failed to save for this request;
        when only they are free, raise Unavailable rather than reuse them without their state. fork: when the
        name is busy in a slot, take an idle one instead of waiting (a stored state covers what the busy slot
        shares with the prompt: the broker decided)."""
        if slot_id is not None:
            s = self.slots[slot_id]
            return None if s.busy else Lease(s, resident=key is not None and s.key == key)
        if key is not None:
            r = self.resident(key)
            if r is not None and not r.busy and r.id not in avoid:
                # In place if it may be; else the same slot, its state saved first and a stored one restored.
                return Lease(r, resident=self.usable(r, tokens))
            if r is not None and r.busy and not fork:
                return None  # wait for it rather than fork a second copy of the same name
        idle = [s for s in self._idle() if s.id not in avoid]
        if not idle:
            if any(not s.busy for s in self.slots):
                raise Unavailable(f"no slot free: saving the state in slot(s) {sorted(avoid)} failed (it is kept "
                                  "there and saved again later)")
            return None
        p = self.resident(parent)
        if p is not None and not p.busy and p.id not in avoid and self.usable(p, tokens):
            return Lease(p, parent_resident=True)
        # Only a slot holding content of the same namespace is reused in place: tenants never share KV cells
        # (nor learn, from cache_n, what another tenant's prompt began with).
        same_ns = [s for s in idle if s.owner == namespace]
        if tokens and self._shared_in_flight(tokens, namespace, same_ns, better_than):
            return None  # wait: a request under way is evaluating a longer prefix of this prompt
        if tokens and same_ns:
            best = max(same_ns, key=lambda s: (common_prefix(s.tokens, tokens), -s.last_used))
            lcp = common_prefix(best.tokens, tokens)
            if lcp > 0 and lcp >= better_than:
                # lcp: what llama-server keeps in place; nothing where the prompt leaves the slot's content early
                return Lease(best, lcp=lcp if self.usable(best, tokens) else 0)
        return Lease(self._lru([s for s in idle if not self._wanted(s, namespace)] or idle))  # type: ignore[arg-type]

    def _wanted(self, slot: Slot, namespace: str) -> bool:
        """Does a waiting request of `namespace` share a block or more with this slot's content, usable in place?
        (Two questions waiting on two articles as both slots free: the one whose article is in neither slot takes
        the other slot, not the one holding the other question's article.) Only the picker's own namespace
        counts: another tenant's waiting prompts never shape which slot it gets."""
        if slot.owner != namespace or not slot.tokens:
            return False
        return any(ns == namespace and common_prefix(slot.tokens, toks) >= self.min_shared and self.usable(slot, toks)
                   for ns, toks in self._waiting.values())

    def _shared_in_flight(self, tokens: Sequence[int], namespace: str, same_ns: list[Slot], better_than: int
                          ) -> bool:
        """Is a request of this namespace under way in a busy slot whose prompt shares with `tokens` at least
        `min_shared` tokens more than an idle slot's content or the store (`better_than`) offers? Then waiting for
        that slot costs this request some latency and spares evaluating the shared prefix twice at once (several
        questions about one article in flight, none of it stored yet): once it is done, its slot (similar content,
        in place) or its saved state serves this request. Requests with a state of their own to restore pass a
        `better_than` no prefix reaches, and never wait here; other namespaces' requests are never waited for
        (their prompts must not shape this one's timing). Where a fork inside a state cannot be served (recurrent,
        hybrid: `forks_served`), only a prompt that extends the whole request under way waits for it."""
        have = max([better_than] + [common_prefix(s.tokens, tokens) for s in same_ns])
        forks = self.forks_served()
        return any(s.busy and s.inflight_namespace == namespace and s.inflight and (forks or extends(s.inflight, tokens))
                   and common_prefix(s.inflight, tokens) >= have + self.min_shared for s in self.slots)

    def _wake(self) -> None:
        for f in self._waiters:
            if not f.done():
                f.set_result(None)

    def _release(self, slot: Slot) -> None:
        if slot.lock.locked():
            slot.lock.release()
        self._wake()

    @contextlib.asynccontextmanager
    async def acquire(self, *, key: Optional[Key] = None, parent: Optional[Key] = None,
                      tokens: Optional[Sequence[int]] = None, slot_id: Optional[int] = None,
                      better_than: int = 0, relabel: bool = True, namespace: str = "",
                      guard: Optional[Callable[[Slot], None]] = None, fork: bool = False
                      ) -> AsyncIterator[Lease]:
        """Hold a slot for a request.

        key: the request's name (None: unnamed). parent: a parent name to use in place if resident.
        tokens: the prompt's tokens, for in-place reuse of an idle slot's content (unnamed requests, and named
        ones whose name and parent are not available). slot_id: a specific slot (raw slot API, idle saves).
        better_than: the fewest shared tokens for in-place reuse (a stored prefix this long exists). namespace: the
        request's; in-place reuse only considers slots whose content is of the same namespace. relabel: displace the
        slot's state (save it first if dirty) and
        label the slot with `key`; False leaves the slot's label alone (raw save, idle save). guard(slot): called
        once the slot is held, before anything changes; raising refuses the lease (raw slot API on another
        namespace's slot). A relabelled slot holding another namespace's cells is erased first (after its dirty
        state is saved). fork: see `_pick`; two slots may then hold one name until one of them finishes.
        """
        if key is not None:
            namespace = key[0]
        avoid: set[int] = set()
        while True:
            lease = await self._wait_pick(key, parent, tokens, slot_id, better_than, namespace, frozenset(avoid), fork)
            slot = lease.slot
            lease.table = self
            # The lock is free (checked by _pick in this same step), so this does not suspend.
            await slot.lock.acquire()
            if relabel:  # from now on, also while a displaced state is saved first: waiters see what is coming
                slot.inflight, slot.inflight_namespace = list(tokens or ()), namespace
            try:
                if guard is not None:
                    guard(slot)
                if relabel and not lease.resident and slot.dirty:
                    # Saved first, also when it holds this very name but cannot be used in place (`usable`).
                    await self.evict(lease, strict=True, behind=True)
            except SaveFailed:
                # Never reuse a slot without its state: it keeps its label and stays dirty; try another one.
                slot.inflight, slot.inflight_namespace = [], None
                self._release(slot)
                if slot_id is not None:
                    raise Unavailable(f"slot {slot_id}: saving its state {slot.key} failed; try again") from None
                avoid.add(slot.id)
                continue
            except BaseException:
                self._finish(lease)
                raise
            break
        try:
            if relabel and not lease.resident:
                lease.before = (slot.namespace, slot.name, slot.parent, list(slot.tokens))
                lease.version = slot.version  # an erase below, a restore later: the content changed
                if slot.owner is not None and slot.owner != namespace:
                    # Tenants never share KV cells: llama-server would reuse a common prefix (cache_n: a side channel).
                    if self._erase is not None:
                        await lease.shielded(self._erase(slot))
                    slot.clear()
                slot.owner = namespace  # whatever this lease puts there is this namespace's
                slot.hold(key, parent=parent[1] if lease.parent_resident and parent else None)
                if lease.parent_resident and key is None:
                    slot.parent = None
                if key is None:  # unnamed content still belongs to the requester's namespace
                    slot.namespace = namespace
            yield lease
        finally:
            self._finish(lease)

    def _finish(self, lease: Lease) -> None:
        slot = lease.slot
        slot.inflight, slot.inflight_namespace = [], None
        pending = [t for t in lease._tasks if not t.done()]
        if pending:
            # A cancelled handler left a save/restore running: keep the slot locked until it ends.
            log.warning("slot %d: handler left with a save/restore running; releasing when it ends", slot.id)
            waiter = asyncio.ensure_future(asyncio.wait(pending))
            waiter.add_done_callback(lambda _f, s=slot: self._release(s))
        else:
            self._release(slot)

    async def _wait_pick(self, key, parent, tokens, slot_id, better_than, namespace, avoid, fork=False) -> Lease:
        while True:
            lease = self._pick(key, parent, tokens, slot_id, better_than, namespace, avoid, fork)
            if lease is not None:
                return lease
            if len(self._waiters) >= self.max_queue:
                raise QueueFull(f"all {len(self.slots)} slots busy and {len(self._waiters)} requests waiting")
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            if tokens:
                self._waiting[fut] = (namespace, tokens)
            try:
                await fut
            finally:
                self._waiters.remove(fut)
                self._waiting.pop(fut, None)

    async def evict(self, lease: Lease, *, strict: bool = False, behind: bool = False) -> None:
        """Save the slot's dirty state into the store (shielded). On failure the slot stays dirty and labelled (a
        later idle save, eviction or shutdown tries again); strict raises SaveFailed, else it is only logged.
        behind: the slot goes to another request, whose wait ends once llama-server has written the state's file
        (its ingest may then run behind; a failure there is logged and counted, and the name keeps its previous
        state)."""
        slot = lease.slot
        try:
            await lease.shielded((self._save_behind if behind else self._save)(slot))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the store keeps its previous state of that name; the slot keeps the new one
            log.error("slot %d: saving %r failed, kept in the slot to save again later: %s", slot.id, slot.key, e)
            if strict:
                raise SaveFailed(str(e)) from e
            return
        slot.dirty = False

    # ---- background ---------------------------------------------------------------------------------------------
    def idle_dirty(self, older_than: float) -> list[Slot]:
        now = self.clock()
        return [s for s in self.slots if s.dirty and not s.busy and now - s.last_used >= older_than]

    async def save_idle(self, older_than: float) -> int:
        """Save dirty slots idle for `older_than` seconds (they stay resident, now clean)."""
        return await self._save_dirty(self.idle_dirty(older_than), skip_busy=True)

    async def save_all(self) -> int:
        """Shutdown: wait for each slot in turn and save it if dirty."""
        return await self._save_dirty(self.slots, skip_busy=False)

    async def _save_dirty(self, slots: list[Slot], *, skip_busy: bool) -> int:
        n = 0
        for s in slots:
            if skip_busy and s.busy:
                continue
            async with self.acquire(slot_id=s.id, relabel=False) as lease:
                if lease.slot.dirty:
                    await self.evict(lease)
                    n += 1
        return n

    # ---- what the holder of a slot reports (the only writers of slot fields besides acquire/evict) ---------------
    def touch(self, slot: Slot) -> None:
        slot.last_used = self.clock()

    def evaluated(self, slot: Slot, tokens: Optional[Sequence[int]] = None) -> None:
        """llama-server evaluated a request in the slot: its content changed (dirty if named), now `tokens`."""
        slot.version += 1
        self.touch(slot)
        if tokens is not None:
            slot.tokens = list(tokens)
        if slot.name is not None:
            slot.dirty = True
            # Overlapping requests of one name (a fork): the one that finished last holds the name; an idle slot
            # still labelled with it holds an older state and lets it go (its content stays, unnamed).
            for other in self.slots:
                if other is not slot and other.key == slot.key and not other.busy:
                    other.hold(None)
                    other.namespace = slot.namespace

    def loaded(self, slot: Slot) -> None:
        """llama-server loaded a stored state into the slot (the caller labelled it and knows its tokens)."""
        slot.version += 1

    def unchanged(self, lease: Lease) -> None:
        """llama-server evaluated nothing for the lease's request: it answered with an error status (a field of the
        wrong type, a prompt over the context: a 400; messages its chat template cannot render: a 500), or the
        prompt was empty (a 200 with nothing evaluated, nothing generated). If nothing
        was loaded into the slot either, it still holds what it held before the lease: its label, parent and tokens
        come back, so that a bad request displaces no one (the state it displaced was saved, and stays usable in
        place). Not when that name was loaded into another slot since. (Were an error to come after llama-server
        had begun the prompt, the label would promise more than the slot holds: llama-server compares its tokens,
        so that costs an evaluation, never a wrong reply.)"""
        slot, before = lease.slot, lease.before
        if before is None or slot.version != lease.version:
            return
        namespace, name, parent, tokens = before
        if name is not None and any(s is not slot and s.key == (namespace, name) for s in self.slots):
            return
        slot.namespace, slot.name, slot.parent, slot.tokens = namespace, name, parent, tokens

    def restored(self, slot: Slot) -> None:
        """A raw restore loaded a stored state (`loaded` counted it): clean, tokens unknown."""
        slot.tokens = []
        slot.dirty = False
        self.touch(slot)

    def saved(self, slot: Slot, key: Optional[Key] = None) -> None:
        """The slot's content is in the store (under `key`, default its own name): clean if that is its label."""
        if key is None or slot.key == key:
            slot.dirty = False

    def set_parent(self, slot: Slot, parent: Optional[str]) -> None:
        """The state in the slot was built on `parent` (recorded as lineage at its next save)."""
        slot.parent = parent

    def forget(self, slot: Slot) -> None:
        """The slot's content is no longer saved under its name (the name was removed or moved): unlabel it."""
        slot.hold(None)

    def cleared(self, slot: Slot) -> None:
        """llama-server emptied the slot (failed restore): keep the label, forget the content."""
        slot.clear()

    def lost(self, slot: Slot) -> None:
        """llama-server failed while working on the slot (timeout, connection lost, restarted): its content is
        unknown. No label (it is never saved under a name), no tokens (never reused in place); the namespace and
        the owner stay: llama-server may still hold (or be writing) the owner's cells, so the slot stays hidden from
        other namespaces and is erased before another one uses it."""
        if slot.name is not None or slot.tokens:
            log.warning("slot %d: state unknown after an upstream failure; %r is no longer resident (unsaved "
                        "changes are lost)", slot.id, slot.key)
        owner = slot.owner
        slot.name, slot.parent = None, None
        slot.clear()
        slot.owner = owner

    def erased(self, slot: Slot) -> None:
        """The slot was erased: no label, no content."""
        slot.hold(None)
        slot.clear()
