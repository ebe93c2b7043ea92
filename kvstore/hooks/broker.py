"""What to restore into a slot and what to save from it: the proxy's decisions, without HTTP (no aiohttp.web).

`hold(naming, tokens_fn)` leases a slot for a request and brings the best stored state into it, in the order of
docs/hooks.md ("What happens to a request"): the name resident, the parent resident, in-place reuse of an idle slot
sharing a longer prefix than the store has (only when the request has nothing of its own stored), else an idle
slot into which the name, the parent or the longest stored prefix is restored. It yields
(lease, X-KV-Cache kind, tokens restored). A failed restore is a miss, never an error.

Contract: `prime` (`POST /kvstore/states/{name}`) returns a plain dict and raises `BadRequest` / `UpstreamError` /
`QueueFull`, which the handlers and the error middleware turn into replies (the named slot API and the state
lookups are `slot_api.py`'s). Slot fields are only written through `SlotTable`.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Optional

from kvstore.errors import NameNotFound

from . import cut, fork
from .cost import Decision
from .errors import BadRequest, NotStored, RestoreFailed, UpstreamError, UpstreamReply, remote_unavailable
from .metrics import Metrics
from .naming import Naming
from .slot import Lease, Slot, common_prefix, extends
from .slots import SlotTable
from .store import AsyncStore
from .transfer import Prefetch, Transfer
from .upstream import Upstream

log = logging.getLogger("kvstore.hooks")

TokensFn = Callable[[], Awaitable[Optional[list[int]]]]


class Once:
    """An awaitable computed at most once, and only if asked for (the prompt's tokens); `.value` once it is."""

    def __init__(self, fn: TokensFn):
        self._fn = fn
        self._done = False
        self.value: Optional[list[int]] = None

    async def __call__(self) -> Optional[list[int]]:
        if not self._done:
            self.value = await self._fn()
            self._done = True
        return self.value


@dataclass
class Ask:
    """What `Broker.plan` asks the slot table for: the prompt's tokens (None: not tokenized), the stored-prefix
    hit, the fewest shared tokens for a similar slot in place, whether the store was looked up, and whether to
    take an idle slot when the name is busy in another; whether the name is stored (None: not looked at, since it
    was resident), read once here for `hold` as well."""

    tokens: Optional[list[int]] = None
    hint: Optional[dict] = None
    better_than: int = 0
    looked_up: bool = False
    fork: bool = False
    own_stored: Optional[bool] = None
    saves: int = 0  # `Transfer.saves` of the namespace when the prefix was looked up


@dataclass
class ForkPlan:
    """`Broker._fork_plan`'s answer for a recurrent model's named request (hooks/fork.py)."""

    hint: Optional[dict]  # the stored state to restore from when neither the name nor the parent is
    looked_up: bool
    at: Optional[int] = None  # where to store a state at the fork on the way
    only_whole: bool = False  # the hint (a state the prompt extends all of) serves more than the name or parent
    # `_parent_serves_better`'s answer, when the plan read both states (so `_bring` does not read them again)
    parent_better: Optional[bool] = None


class Broker:
    def __init__(self, up: Upstream, store: AsyncStore, transfer: Transfer, table: SlotTable, metrics: Metrics, *,
                 resume_at_end: bool = False, fork_states: bool = True):
        self.up, self.store, self.transfer, self.table, self.metrics = up, store, transfer, table, metrics
        self.block_size = store.block_size
        self.resume_at_end = resume_at_end  # `--resume-at end`: cut.plan's `at_end`
        self.fork_states = fork_states  # `--fork-states`: hooks/fork.py, on models with a recurrent section
        # States at a fork being evaluated and stored: (namespace, name) -> (its tokens, set once it is stored or
        # given up). A request leaving a prompt there waits for it rather than evaluate the same tokens beside it.
        self._forking: dict[tuple[str, str], tuple[list[int], asyncio.Event]] = {}

    # ---- facts -----------------------------------------------------------------------------------------------
    async def lookup(self, namespace: str, tokens: Optional[list[int]], *, whole: bool = False) -> Optional[dict]:
        """The longest stored prefix of `tokens`, if at least one block long (a failed lookup is a miss); `whole`:
        the longest stored state that `tokens` extends all of."""
        if not tokens or len(tokens) < self.block_size:
            return None
        try:
            hit = await self.store.lookup(tokens, namespace=namespace, fingerprint=self.transfer.fingerprint,
                                          whole=whole)
        except Exception as e:  # noqa: BLE001 - a failed lookup is a miss
            log.error("prefix lookup failed: %s", e)
            return None
        if hit and int(hit.get("n_common") or 0) >= self.block_size:
            return hit
        return None

    async def stored(self, namespace: str, name: str) -> bool:
        """Whether the name is stored, as the plan needs it. On a bucket store this machine's index answering
        yes is taken without a round trip: the restore that follows confirms against the name's record (and
        restores a newer state saved elsewhere, or finds the name removed: then NotStored, a full evaluation).
        A no is asked of the bucket: another server may have saved the name (a user moving between servers)."""
        try:
            if self.store.remote and await self.store.held(name, namespace=namespace):
                return True
            return await self.store.get(name, namespace=namespace) is not None
        except Exception as e:  # noqa: BLE001 - unknown: let the restore decide
            log.error("store lookup of %r failed: %s", name, e)
            return True

    async def prompt_tokens(self, body: Optional[dict], chat: bool) -> Optional[list[int]]:
        """The prompt's tokens as llama-server will see them (best effort; None if unknown, as for no body)."""
        if body is None:
            return None
        try:
            if chat:
                if not isinstance(body.get("messages"), list):
                    return None
                return await self.up.tokenize(await self.up.apply_template(body))
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return await self.up.tokenize(prompt)
            if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                return list(prompt)
        except UpstreamReply as e:
            log.warning("could not tokenize the prompt: %s", e)
        return None

    # ---- a request's slot ------------------------------------------------------------------------------------
    async def plan(self, naming: Naming, tokens_fn: TokensFn) -> "Ask":
        """What to ask the slot table for, before taking a slot.

        A request with nothing of its own to restore (unnamed without a parent; named, with its name neither
        resident nor stored and no parent resident or stored) may reuse an idle slot's content in place, as
        llama-server's slot similarity does: its prompt is tokenized and the longest stored prefix looked up, and
        a slot wins if it shares more than that (a named request: at least one store block too).
        Where llama-server cannot roll back inside a slot's content (`cut.extension_only`) the prompt of a named
        request is tokenized as well, so that the table can tell whether its name or parent resident in a slot
        may serve it in place (`SlotTable.usable`). A request whose name is busy in a slot takes an idle one
        (`fork`) when a stored state shares at least as much with its prompt as the busy slot does: waiting
        would save nothing.
        """
        ns = naming.namespace
        if naming.name is None:
            if naming.parent is not None:
                return Ask()
        else:
            resident = self.table.resident(naming.key)
            own_stored = None if resident is not None else await self.stored(ns, naming.name)
            if (resident is not None or own_stored
                    or (naming.parent is not None and (self.table.resident(naming.parent_key) is not None
                                                       or await self.stored(ns, naming.parent)))):
                ask = Ask(own_stored=own_stored)
                if resident is not None and resident.busy or cut.extension_only(self.transfer.fingerprint,
                                                                                 self.transfer.layout):
                    # tokens for `usable`; never a similar slot in place of its own state (better_than)
                    ask.tokens = await tokens_fn()
                    ask.better_than = 1 << 40
                if resident is not None and resident.busy and ask.tokens:
                    ask.saves = self.transfer.saves[ns]
                    ask.hint, ask.looked_up = await self.lookup(ns, ask.tokens), True
                    covered = int(ask.hint["n_common"]) if ask.hint else 0
                    # What waiting would give: the busy slot's content once its request is done, which extends
                    # that request's prompt (its tokens before it, after a restore, may be none at all). Waiting
                    # pays only for a block or more beyond the stored state (SlotTable's rule for prefixes under
                    # way): two questions share a few tokens ("Question:") past their article.
                    busy_has = common_prefix(resident.inflight or resident.tokens, ask.tokens)
                    ask.fork = covered > 0 and covered + self.block_size > busy_has
                return ask
        tokens = await tokens_fn()
        saves = self.transfer.saves[ns]
        hint = await self.lookup(ns, tokens)
        stored = int(hint["n_common"]) if hint else 0
        better = stored if naming.name is None else max(stored + 1, self.block_size)
        return Ask(tokens, hint, better, True, own_stored=False if naming.name is not None else None, saves=saves)

    async def prepare(self, lease: Lease, naming: Naming, tokens_fn: TokensFn, hint: Optional[dict],
                      looked_up: bool = False, prefetched: Optional[Prefetch] = None, *, guess: bool = True
                      ) -> tuple[str, int]:
        """Bring the best stored state into the leased slot. Returns (X-KV-Cache kind, tokens restored)."""
        if lease.resident:
            return "slot", 0
        if lease.parent_resident:
            return "parent", 0
        if prefetched is None:
            # The stored states this request may restore from or cut include the one this slot just held, whose
            # ingest may still run behind: look them up once it is in (as when the save came first). A returning
            # user's prefetched state needs no lookup and so does not wait.
            await self.store.settled_namespace(naming.namespace)
        plan, forking = ForkPlan(hint, looked_up), None
        if naming.name and self.fork_states and fork.applies(self.transfer.layout):
            plan, forking = await self._plan_fork(lease, naming, await tokens_fn() or [], hint, looked_up, guess)
        try:
            kind, n_restored = await self._bring(lease, naming, tokens_fn, plan, prefetched)
            if forking is not None:
                await self._store_fork(lease, *forking, self._forking[forking][0])
        finally:
            if forking is not None:
                self._forking.pop(forking)[1].set()
        return kind, n_restored

    async def _bring(self, lease: Lease, naming: Naming, tokens_fn: TokensFn, plan: ForkPlan,
                     prefetched: Optional[Prefetch]) -> tuple[str, int]:
        """`prepare`'s restore: a cut (SWA), the name, the parent, else the lookup's hit (`plan.hint`; on a
        recurrent model with `plan.only_whole`, a state the prompt extends all of, which serves more than the name
        or the parent could)."""
        ns, slot = naming.namespace, lease.slot
        hint, looked_up, only_whole = plan.hint, plan.looked_up, plan.only_whole
        try:
            if cut.applies(self.transfer.fingerprint, self.transfer.layout):  # SWA: cut at the common prefix
                with contextlib.suppress(NotStored):
                    done = await self._restore_cut(lease, naming, await tokens_fn(), hint, prefetched)
                    if done is not None:
                        return done
            parent_better = plan.parent_better
            if parent_better is None and naming.name and not only_whole:
                parent_better = await self._parent_serves_better(naming, tokens_fn)
            if naming.name and not only_whole and not parent_better:
                with contextlib.suppress(NotStored):
                    if not await self._worth_name(lease, ns, naming.name):
                        return self._recomputed(lease)
                    r = await self.transfer.restore(lease, ns, name=naming.name, prefetched=prefetched)
                    return "restored", int(r.get("n_restored") or 0)
            if naming.parent and not only_whole:
                with contextlib.suppress(NotStored):
                    if not await self._worth_name(lease, ns, naming.parent):
                        return self._recomputed(lease)
                    r = await self.transfer.restore(lease, ns, name=naming.parent)
                    self._built_on(slot, naming, "parent", naming.parent)
                    return "parent", int(r.get("n_restored") or 0)
            if not looked_up and naming.name:
                hint = await self.lookup(ns, await tokens_fn())
            if hint is not None and int(hint["n_common"]) > lease.lcp:
                n_common = int(hint["n_common"])
                if not self._worth(lease, int(hint.get("n_tokens") or n_common), n_common):
                    return self._recomputed(lease)
                with contextlib.suppress(NotStored):
                    r = await self.transfer.restore(lease, ns, manifest_id=hint["manifest_id"])
                    self._built_on(slot, naming, "prefix", hint.get("name"))
                    return "prefix", int(r.get("n_restored") or 0)
        except RestoreFailed:
            return "miss", 0
        return ("slot", 0) if lease.lcp > 0 else ("miss", 0)

    async def _plan_fork(self, lease: Lease, naming: Naming, tokens: list[int], hint: Optional[dict],
                         looked_up: bool, guess: bool) -> tuple[ForkPlan, Optional[tuple[str, str]]]:
        """`_fork_plan`, then the claim on the state at the fork, if one is to be stored (the caller stores it at
        `plan.at` and lets the claim go): (the plan, the claim's key). A state at the fork that another request is
        storing is waited for and restored instead; none is stored where the cost model would not restore it."""
        ns = naming.namespace
        plan = await self._fork_plan(lease, naming, tokens, hint, looked_up, guess)
        if plan.at is not None and await self._fork_under_way(ns, tokens, plan.at):
            plan = await self._fork_plan(lease, naming, tokens, hint, looked_up, guess)  # it is stored now
        forking = None
        if plan.at is not None and self.transfer.cost.decide(plan.at, plan.at).restore:
            forking = self._claim_fork(ns, tokens[:plan.at])
            if forking is not None and await self.stored(*forking):
                self._forking.pop(forking)[1].set()  # stored since this plan (or a user's name: kept)
                forking = None
            if forking is None:  # stored, or being stored by another request: restore it once it is
                await self._fork_under_way(ns, tokens, plan.at)
                plan = await self._fork_plan(lease, naming, tokens, hint, looked_up, guess)
        return plan, forking

    async def _fork_plan(self, lease: Lease, naming: Naming, tokens: Optional[list[int]], hint: Optional[dict],
                         looked_up: bool, guess: bool) -> ForkPlan:
        """A recurrent model's named request (hooks/fork.py). A prompt that extends its own stored state or its
        parent's goes on as before. Otherwise the prompt is served from the longest state it extends all of
        (`lookup(whole=True)`), not from the state it shares the most with, which llama-server could continue only
        from a checkpoint before the fork (and rarely has one there) — unless that one shares a block more: then it
        is restored as before, for such a checkpoint, and a state is stored at the fork."""
        if not tokens:
            return ForkPlan(hint, looked_up)
        ns = naming.namespace
        own = await self._held(ns, naming.name)
        if own is not None and extends(own, tokens):
            return ForkPlan(hint, looked_up, parent_better=False)
        parent = await self._held(ns, naming.parent) if naming.parent else None
        if parent is not None and extends(parent, tokens):
            return ForkPlan(hint, looked_up, parent_better=own is not None)  # as `_parent_serves_better` says
        shared = max([lease.lcp] + [common_prefix(held, tokens) for held in (own, parent) if held is not None])
        if not looked_up:
            hint, looked_up = await self.lookup(ns, tokens), True
        if hint is not None:
            shared = max(shared, int(hint["n_common"]))
        # So do a request of the namespace under way and a slot's unsaved content (questions on one article sent
        # together): stored at the fork by this one, it serves those that come after both (never another
        # namespace's: its prompts must not shape this one's).
        for s in self.table.slots:
            if s is lease.slot:
                continue
            if s.busy and s.inflight_namespace == ns:
                shared = max(shared, common_prefix(s.inflight, tokens))
            elif not s.busy and s.owner == ns:
                shared = max(shared, common_prefix(s.tokens, tokens))
        whole = await self.lookup(ns, tokens, whole=True)
        served = max(lease.lcp, int(whole["n_tokens"]) if whole else 0)
        at = fork.point(len(tokens), shared, served, self.block_size)
        if at is None and own is None and guess:  # a name's first prompt: a state a block before its end
            at = fork.guess(len(tokens), served, self.block_size)
        if whole is None:
            return ForkPlan(hint, looked_up, at, parent_better=False)
        return ForkPlan(whole, True, at, only_whole=at is None, parent_better=False)

    async def _held(self, namespace: str, name: Optional[str]) -> Optional[list[int]]:
        """The tokens of a stored state, None when the name is not stored (or not given)."""
        if not name:
            return None
        try:
            return await self.store.tokens(name, namespace=namespace)
        except NameNotFound:
            return None

    async def _fork_under_way(self, namespace: str, tokens: list[int], at: int) -> bool:
        """Wait for a state at a fork that another request is evaluating and storing, of which this prompt extends
        all and which serves more than a block of what this one would store at `at`. True if there was one (it
        is stored now, unless that request gave it up)."""
        under_way = [(prefix, done) for (ns, _), (prefix, done) in self._forking.items()
                     if ns == namespace and len(prefix) + self.block_size > at and extends(prefix, tokens)]
        if not under_way:
            return False
        for _, done in under_way:
            await done.wait()
        await self.store.settled_namespace(namespace)
        return True

    def _claim_fork(self, namespace: str, prefix: list[int]) -> Optional[tuple[str, str]]:
        """This request will store the state at the fork `prefix` (hooks/fork.py): the key it holds in `_forking`
        until then, so that others leaving there wait for it (`_fork_under_way`; no await between that check and
        this claim). None when another request is storing it."""
        key = (namespace, fork.name(prefix))
        if key in self._forking:
            return None
        self._forking[key] = (prefix, asyncio.Event())
        return key

    async def _store_fork(self, lease: Lease, ns: str, name: str, prefix: list[int]) -> None:
        """Evaluate `prefix` in the leased slot (n_predict 0), after whatever `_bring` restored there, and store it
        as the state at the fork. The request then evaluates the rest of its prompt. The tokens evaluated are the
        reply's `X-KV-Fork-Evaluated` and in `kvstore_prompt_tokens_evaluated_total`. A refusal or a failed save
        leaves only the request."""
        slot = lease.slot
        try:
            r = await self.up.completion(prefix, n_predict=0, id_slot=slot.id, cache_prompt=True, temperature=0)
        except UpstreamReply as e:
            log.warning("slot %d: state at the fork not evaluated: %s", slot.id, e)
            return
        except BaseException:
            self.table.evaluated(slot)  # cut off mid-evaluation: the slot holds a prefix of this prompt
            raise
        self.table.evaluated(slot, prefix)
        timings = r.get("timings") or {}
        lease.fork_evaluated = int(timings.get("prompt_n") or 0)
        self.metrics.inc("prompt_tokens_evaluated", lease.fork_evaluated)
        self.metrics.inc("fork_tokens_evaluated", lease.fork_evaluated)
        self.transfer.cost.prefilled(timings)
        try:
            await lease.shielded(self.transfer.save(slot, name=name, namespace=ns, behind=True))
        except Exception as e:  # noqa: BLE001 - counted by the save; the request goes on without it
            log.warning("slot %d: state at the fork not stored: %s", slot.id, e)
            return
        self.metrics.inc("fork_states")
        # Clean: the slot now holds this request's name, and a request refused from here on must not store the
        # prefix under it (the name's stored state stays what it was).
        self.table.saved(slot)

    def _worth(self, lease: Lease, restore_tokens: int, useful_tokens: int) -> bool:
        """Restore a state of `restore_tokens` tokens, of which `useful_tokens` serve the prompt (those the slot
        holds in place are spared either way)? hooks/cost.py decides; the lease keeps the decision (X-KV-Decision)."""
        d = self.transfer.cost.decide(restore_tokens, max(0, useful_tokens - lease.lcp))
        lease.decision = d
        self.metrics.inc(f"decisions_{d.word}")
        return d.restore

    async def _worth_name(self, lease: Lease, namespace: str, name: str) -> bool:
        """`_worth` for a stored name, all of whose tokens the prompt is taken to extend (a returning user; the
        prompt is not tokenized for it). Raises NotStored when the name is not stored. The name's size is read only
        when the model could refuse (on a bucket store a read may cost a round trip)."""
        if not self.transfer.cost.can_refuse:
            lease.decision = Decision(True, None, None)  # nothing weighed: the estimates are unknown or moot
            self.metrics.inc(f"decisions_{lease.decision.word}")
            return True
        try:
            info = await self.store.get(name, namespace=namespace)
        except Exception as e:  # noqa: BLE001 - unknown: let the restore decide (and fail as it does)
            log.error("store lookup of %r failed: %s", name, e)
            return True
        if info is None:
            raise NotStored(name)
        n = int(info.get("n_tokens") or 0)
        return self._worth(lease, n, n)

    def _recomputed(self, lease: Lease) -> tuple[str, int]:
        """The restore was predicted slower than evaluating: llama-server evaluates the prompt (past what the slot
        holds in place)."""
        return ("slot", 0) if lease.lcp > 0 else ("miss", 0)

    async def _parent_serves_better(self, naming: Naming, tokens_fn: TokensFn) -> bool:
        """A recurrent or hybrid state is never rolled back into (it cannot be cut): when the prompt leaves the
        name's stored state but extends its parent's (the next question on the same article), the parent is
        restored instead of the name."""
        if (not naming.parent or cut.applies(self.transfer.fingerprint, self.transfer.layout)
                or not cut.extension_only(self.transfer.fingerprint, self.transfer.layout)):
            return False
        tokens = await tokens_fn()
        if not tokens:
            return False
        own = await self._held(naming.namespace, naming.name)
        parent = await self._held(naming.namespace, naming.parent) if own is not None else None
        return own is not None and parent is not None and not extends(own, tokens) and extends(parent, tokens)

    async def _restore_cut(self, lease: Lease, naming: Naming, tokens: Optional[list[int]], hint: Optional[dict],
                           prefetched: Optional[Prefetch] = None) -> Optional[tuple[str, int]]:
        """SWA models: restore the stored state `cut.plan` chooses, cut at its common prefix P with the prompt.
        Returns (X-KV-Cache kind, P), or None (nothing worth cutting, or the cut cannot be emitted)."""
        if not tokens:
            return None
        if hint is None:
            hint = await self.lookup(naming.namespace, tokens)
        chosen = await cut.plan(self.store, lease, naming, tokens, hint, self.block_size,
                                at_end=self.resume_at_end)
        if chosen is None:
            return None
        if not self._worth(lease, chosen.at, chosen.at):
            return self._recomputed(lease)
        c = chosen.source
        r = await self.transfer.restore_cut(lease, naming.namespace, chosen.at,
                                            name=c.name if c.kind != "prefix" else None, manifest_id=c.manifest_id,
                                            prefetched=prefetched)
        if r is None:
            return None
        self._built_on(lease.slot, naming, c.kind, c.name)
        return c.kind, int(r.get("n_restored") or 0)

    def _built_on(self, slot: Slot, naming: Naming, kind: str, source: Optional[str]) -> None:
        """Record the lineage of a state restored from another (recorded at its next save): a parent, or (for a
        named request) the named stored state whose prefix it restored."""
        if kind == "parent":
            self.table.set_parent(slot, naming.parent if naming.name else None)
        elif kind == "prefix" and naming.name and source and source != naming.name:
            self.table.set_parent(slot, source)

    @contextlib.asynccontextmanager
    async def hold(self, naming: Naming, tokens_fn: TokensFn, *, plan: bool = True, guess: bool = True
                   ) -> AsyncIterator[tuple[Lease, str, int]]:
        """Hold a slot for a request and bring the best state into it: yields (lease, X-KV-Cache kind, restored).

        plan: consider in-place reuse of an idle slot's content (see plan()); False for never-named requests.
        guess: a recurrent model's first prompt of a name stores a state a block before its end (fork.guess); not
        for a prime, whose whole prompt is the state stored.
        """
        ask = await self.plan(naming, tokens_fn) if plan else Ask()
        # A stored state of the request's own name beats its parent resident in a slot: it holds more tokens.
        parent = naming.parent_key
        own_stored = ask.own_stored
        if own_stored is None and naming.name is not None and (parent is not None
                                                               or self.table.resident(naming.key) is None):
            own_stored = await self.stored(naming.namespace, naming.name)  # resident at the plan, or not planned
        if parent is not None and own_stored:
            parent = None
        prefetched = await self._prefetch(naming, ask.tokens) if own_stored else None
        try:
            async with self.table.acquire(key=naming.key, parent=parent, tokens=ask.tokens,
                                          namespace=naming.namespace, better_than=ask.better_than,
                                          fork=ask.fork) as lease:
                try:
                    if ask.looked_up and ask.tokens and not lease.resident and self.transfer.saves[naming.namespace] != ask.saves:
                        # A save was made while this request waited (the state of a request it waited behind, or the
                        # one its slot held): the longest stored prefix may be longer now, once it is ingested.
                        await self.store.settled_namespace(naming.namespace)
                        ask.hint = await self.lookup(naming.namespace, ask.tokens)
                    kind, n_restored = await self.prepare(lease, naming, tokens_fn, ask.hint, ask.looked_up,
                                                          prefetched, guess=guess)
                    self.metrics.kind(kind)
                    yield lease, kind, n_restored
                except UpstreamError:  # timed out or lost on the way: what the slot holds now is unknown
                    self.table.lost(lease.slot)
                    raise
        finally:
            if prefetched is not None:
                prefetched.close()

    async def _prefetch(self, naming: Naming, tokens: Optional[list[int]]) -> Optional[Prefetch]:
        """Overlap the wait: a request whose stored name (the caller checked) is not resident has its state
        materialized from now on, while it waits for a slot and while the slot's displaced state is saved, so that
        only llama-server's load is left once the slot is its. Where llama-server cannot roll back inside a state
        (SWA, recurrent: `cut.extension_only`) only when the prompt extends all of the stored state (a returning
        user), since otherwise the restore is cut at the fork or is the parent's; with `--resume-at end` that state
        is cut at its end on an SWA model (`cut.plan`), so the cut is what is materialized ahead."""
        if naming.name is None or self.table.resident(naming.key) is not None:
            return None
        at = None
        if cut.extension_only(self.transfer.fingerprint, self.transfer.layout):
            if not tokens:
                return None
            try:
                own = await self.store.tokens(naming.name, namespace=naming.namespace)
            except NameNotFound:
                return None
            if not extends(own, tokens):
                return None
            if self.resume_at_end and cut.applies(self.transfer.fingerprint, self.transfer.layout):
                at = cut.end_cut(len(own), len(tokens), self.block_size)
        return self.transfer.prefetch(naming.namespace, naming.name, cut=at)

    # ---- the state and slot API --------------------------------------------------------------------------------
    async def prime(self, naming: Naming, prompt: object) -> dict:
        """Evaluate `prompt` (n_predict 0) into a slot and store it under the name."""
        tokens_fn = Once(lambda: self.prompt_tokens({"prompt": prompt}, False))
        if await tokens_fn() == []:  # llama-server would evaluate nothing, and the slot's old content be stored
            raise BadRequest("nothing to store: the prompt has no tokens")
        async with self.hold(naming, tokens_fn, guess=False) as (lease, kind, n_restored):
            slot = lease.slot
            try:
                r = await self.up.completion(prompt, n_predict=0, id_slot=slot.id, cache_prompt=True, temperature=0)
            except UpstreamReply:
                self.table.unchanged(lease)  # refused (a prompt over the context): nothing evaluated
                raise
            except BaseException:
                self.table.evaluated(slot)  # cut off mid-evaluation: the slot holds a prefix of this prompt
                raise
            self.table.evaluated(slot, await tokens_fn() or [])
            timings = r.get("timings") or {}
            self.metrics.evaluated(kind, timings, n_restored)
            self.transfer.cost.prefilled(timings)
            info = await lease.shielded(self.transfer.save(slot))
            self.table.saved(slot)
        return {"id_slot": slot.id, "cache": kind, "n_restored": n_restored, "timings": timings, "stored": info,
                "fork_evaluated": lease.fork_evaluated,
                "decision": lease.decision.word if lease.decision else None,
                "n_tokens": int((info or {}).get("n_tokens") or r.get("tokens_cached") or 0)}
