"""Moving a state between a llama-server slot and the store, through the sync directory. No aiohttp.

Contract: `save(slot)`: llama-server writes the slot to a `.kv-*` file, the store ingests it (file removed), under the slot's
name or another. `restore(lease, ...)`: the store materializes a name or a manifest into a file re-emitted for the
server's slot count, llama-server loads it. Both run under the caller's slot lease. A restore raises `NotStored`
(nothing under that name) or `RestoreFailed` (materialize or llama-server refused: the slot is now empty);
`UpstreamError` (llama-server unreachable) propagates.

The server's cache layout (types, flash attention, rotation) is not in `/props`: it is learned from the first
non-empty save and from then on required of every state restored or ingested (`expect()`).

`prefetch(namespace, name, cut=None)` materializes a named state ahead (whole, or its first `cut` tokens as
`restore_cut` would), while its request waits for a slot: a `restore` or `restore_cut` of that name (and cut) given
that `Prefetch` loads its file instead of materializing, if it still holds the name's current manifest (a newer save
meanwhile: materialized again); `Prefetch.close()` removes an unused file once its materialize ends.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Optional

from kvstore import _core
from kvstore.errors import KvStoreError, NameNotFound

from .cost import CostModel
from .errors import NotStored, RestoreFailed, UpstreamError, UpstreamReply
from .metrics import Metrics
from .slot import Lease, Slot
from .store import AsyncStore
from .syncdir import SyncDir

log = logging.getLogger("kvstore.hooks")


def layout_is_empty(layout: str) -> bool:
    """Does this layout describe an empty slot (no KV layers), which says nothing about the server's layout?
    The rule is the core's (`_core.layout_is_empty`); this name keeps the hooks' callers and tests short."""
    return _core.layout_is_empty(layout)


class Prefetch:
    """A named state being materialized into a sync-dir file of its own ahead of its restore (`cut`: only its first
    `cut` tokens, with a checkpoint there, as `Transfer.restore_cut` materializes them)."""

    def __init__(self, transfer: "Transfer", namespace: str, name: str, cut: Optional[int] = None):
        self.namespace, self.name, self.cut = namespace, name, cut
        self.changes = transfer.store.changes(namespace, name)  # this process's mark of the name, at the read
        self._files = contextlib.ExitStack()
        self.filename, self.path = self._files.enter_context(transfer.sync.temp())
        self.task = asyncio.ensure_future(transfer.materialize(self.path, namespace, name, None, cut))

    async def report(self) -> Optional[dict]:
        """The materialize report once written; None if it failed or the cut could not be emitted (the restore then
        materializes itself)."""
        try:
            info = await asyncio.shield(self.task)
        except Exception as e:  # noqa: BLE001 - logged; the restore path reports its own failure
            log.info("prefetch of %s/%s failed: %s", self.namespace, self.name, e)
            return None
        return None if "missing" in info else info

    def close(self) -> None:
        """Remove the file, now or when the materialize still writing it ends (its thread cannot be stopped)."""
        if self.task.done():
            if not self.task.cancelled():
                self.task.exception()  # retrieved: a failed prefetch was only an optimisation
            self._files.close()
        else:
            self.task.add_done_callback(lambda t: (t.cancelled() or t.exception(), self._files.close()))


# How long `learn_layout` waits for each of llama-server's steps (milliseconds when it is well).
LEARN_TIMEOUT_S = 5.0


class Transfer:
    def __init__(self, up: Any, store: AsyncStore, sync: SyncDir, metrics: Metrics, *, n_slots: int,
                 fingerprint: dict[str, str], swa_cells: int = 0, cost: Optional[CostModel] = None):
        self.up, self.store, self.sync, self.metrics = up, store, sync, metrics
        self.n_slots = n_slots
        self.fingerprint = fingerprint
        self.swa_cells = swa_cells  # hooks/cut.py swa_cells: keep a fresh evaluation's cell layout in a cut
        # Restore or recompute (hooks/cost.py): every restore's time is one of its observations.
        self.cost = cost if cost is not None else CostModel()
        self.layout: Optional[str] = None
        # Saves made so far per namespace (counted once llama-server has written the file; its ingest may still be
        # running behind: `AsyncStore.settled_namespace`): a prefix looked up before a wait is looked up again if a
        # save of its namespace was made meanwhile (per namespace: another tenant's saves never add a lookup).
        self.saves: collections.Counter[str] = collections.Counter()
        # The store's bound (hooks/bound.py): `reserve(namespace, file_bytes)` around every ingest (it may evict
        # first, so the store stays within its cap), `saved(namespace, name, report)` after it.
        self.bound: Optional[Any] = None

    def expect(self) -> dict[str, str]:
        """What a state must match to go into this server: the fingerprint, plus the layout once it is known.
        (The core keeps `layout` out of the fingerprint id, so prefix lookups are unaffected.)"""
        return {**self.fingerprint, "layout": self.layout} if self.layout else self.fingerprint

    async def save(self, slot: Slot, name: Optional[str] = None, namespace: Optional[str] = None, *,
                   behind: bool = False) -> Optional[dict]:
        """Save a slot into the sync dir and ingest it (under its own name, or `name`). Caller holds the slot.
        Returns the ingest report plus `save` (llama-server's reply); None for an unnamed slot. `behind`: the
        ingest runs behind where the store allows (as `save_behind`'s)."""
        return await self._save(slot, name, namespace, behind=behind and self.store.behind is not None)

    async def save_behind(self, slot: Slot) -> Optional[dict]:
        """Save a slot being handed to another request: once llama-server has written the file the slot is free,
        and the ingest runs behind (hooks/behind.py; synchronously when `store.behind` is None). Returns
        llama-server's reply as `save` plus `behind: True`, or the ingest report as `save()` does."""
        return await self.save(slot, behind=True)

    async def _save(self, slot: Slot, name: Optional[str], namespace: Optional[str], *, behind: bool
                    ) -> Optional[dict]:
        name = name if name is not None else slot.name
        namespace = namespace if namespace is not None else slot.namespace
        if name is None:
            return None
        t0 = time.perf_counter()
        parent = slot.parent if slot.parent != name else None
        files = contextlib.ExitStack()  # the sync-dir file, removed once ingested (or on any failure)
        try:
            fn, path = files.enter_context(self.sync.temp())
            r = await self.up.slot_action(slot.id, "save", fn)
        except BaseException:
            files.close()
            self.metrics.inc("save_failures")
            raise
        if not r.get("n_saved"):
            files.close()
            log.warning("slot %d: nothing to save for %r (empty slot); store unchanged", slot.id, name)
            return {"n_saved": 0, "save": r}
        self.saves[namespace] += 1
        ingest = self._ingest(files, path, slot.id, namespace, name, parent, r, t0)
        if not behind:
            return await ingest
        assert self.store.behind is not None
        try:
            # A crash before the ingest commits leaves the file and this record for the next start-up to ingest
            # (`recover_pending`); removed with the file once ingested.
            files.callback(self.sync.keep_pending(fn, {"namespace": namespace, "name": name, "parent": parent,
                                                       "fingerprint": self.expect(), "saved_at": time.time()}))
            await self.store.behind.start((namespace, name), [(namespace, parent)] if parent else [], lambda: ingest)
        except BaseException:  # cancelled while waiting for room (or the record not written): not saved
            ingest.close()
            files.close()
            self.metrics.inc("save_failures")
            raise
        self.metrics.inc("saves_behind")
        return {"n_saved": r.get("n_saved"), "save": r, "behind": True}

    async def _ingest(self, files: contextlib.ExitStack, path: Path, slot_id: int, namespace: str, name: str,
                      parent: Optional[str], r: dict, t0: float) -> dict:
        """Ingest the file llama-server wrote, then remove it (`files`); counts, learns the layout, tells the bound."""
        with files:
            try:
                async with self._reserved(namespace, path.stat().st_size):
                    try:
                        info = await self.store.ingest(name, str(path), namespace=namespace,
                                                       fingerprint=self.expect(), parent=parent)
                    except NameNotFound:  # the parent is gone; keep the state anyway
                        info = await self.store.ingest(name, str(path), namespace=namespace,
                                                       fingerprint=self.expect())
                if self.layout is None:
                    self._learn_layout(info["layout"])
            except BaseException:
                self.metrics.inc("save_failures")
                raise
        self.metrics.timed("save", time.perf_counter() - t0)
        self.metrics.inc("bytes_ingested", int(info.get("new_stored_bytes") or 0))
        self.metrics.inc("bytes_saved", int(info.get("file_bytes") or 0))
        info["save"] = r
        log.info("slot %d: saved %s/%s: %s tokens, %s new bytes", slot_id, namespace, name, info.get("n_tokens"),
                 info.get("new_stored_bytes"))
        if self.bound is not None:
            await self.bound.saved(namespace, name, info)
        return info

    def _reserved(self, namespace: str, file_bytes: int) -> Any:
        return self.bound.reserve(namespace, file_bytes) if self.bound is not None else contextlib.nullcontext()

    def _learn_layout(self, layout: str) -> None:
        if not layout_is_empty(layout):
            self.layout = layout
            log.info("hooks: llama-server's cache layout is %s", self.layout)

    async def learn_layout(self, slot_id: int) -> None:
        """Learn llama-server's cache layout before the first request: one token evaluated into the slot, saved
        into the sync dir, read for its layout, then the file removed and the slot erased (nothing is stored).
        Whether the cache has a recurrent section decides how a prompt leaving a state is served
        (`cut.extension_only`, `fork.applies`), and a first conversation's next turns would otherwise be planned
        without it, until a save shows it. Any failure leaves that to the first save, as before."""
        try:
            await asyncio.wait_for(self.up.completion("a", n_predict=0, id_slot=slot_id, cache_prompt=False),
                                   LEARN_TIMEOUT_S)
            with self.sync.temp() as (fn, path):
                r = await asyncio.wait_for(self.up.slot_action(slot_id, "save", fn), LEARN_TIMEOUT_S)
                if r.get("n_saved"):
                    info = await asyncio.to_thread(_core.inspect_state, str(path))
                    self._learn_layout(info["layout"])
        except (UpstreamError, UpstreamReply, KvStoreError, OSError, asyncio.TimeoutError) as e:
            log.warning("hooks: llama-server's cache layout not learned at start (the first save will show it): %s",
                        e or "timed out")
        finally:
            with contextlib.suppress(UpstreamError, UpstreamReply, asyncio.TimeoutError):
                await asyncio.wait_for(self.up.slot_action(slot_id, "erase"), LEARN_TIMEOUT_S)

    def materialize(self, path: Path, namespace: str, name: Optional[str], manifest_id: Optional[str],
                    cut: Optional[int] = None) -> Awaitable[dict]:
        """Write a stored state (`name`, else `manifest_id`) for this server into `path`: whole, or its first `cut`
        tokens with a checkpoint there (a report with `missing` when that cut cannot be emitted, nothing written).
        The one place that says how a restore's file is made, for a restore and for a prefetch alike."""
        if cut is not None:
            return self.store.materialize_prefix(name, cut, str(path), namespace=namespace,
                                                 manifest_id=None if name else manifest_id, expect=self.expect(),
                                                 n_stream=self.n_slots, fill_masked=self.swa_cells)
        if name is not None:
            return self.store.materialize(name, str(path), namespace=namespace, expect=self.expect(),
                                          n_stream=self.n_slots)
        assert manifest_id is not None
        return self.store.materialize_manifest(manifest_id, str(path), expect=self.expect(), n_stream=self.n_slots)

    def prefetch(self, namespace: str, name: str, cut: Optional[int] = None) -> Prefetch:
        """Start materializing the named state (or its first `cut` tokens) now: its request is about to wait for a
        slot."""
        return Prefetch(self, namespace, name, cut)

    async def restore(self, lease: Lease, namespace: str, *, name: Optional[str] = None,
                      manifest_id: Optional[str] = None, prefetched: Optional[Prefetch] = None) -> dict:
        """Materialize a stored state and restore it into the leased slot (shielded from cancellation).
        Returns llama-server's reply plus `kvstore` (the materialize report). `prefetched`: the name's state
        materialized ahead (used if it is still the name's current state)."""
        r = await lease.shielded(self._restore(lease, namespace, name, manifest_id, prefetched=prefetched))
        assert r is not None  # only a cut can be unavailable
        return r

    async def restore_cut(self, lease: Lease, namespace: str, n_tokens: int, *, name: Optional[str] = None,
                          manifest_id: Optional[str] = None, prefetched: Optional[Prefetch] = None
                          ) -> Optional[dict]:
        """Restore the first `n_tokens` of a stored state (hooks/cut.py). None, with the slot untouched, when the
        cut cannot be emitted (counted as prefix_unavailable); else as `restore`."""
        return await lease.shielded(self._restore(lease, namespace, name, manifest_id, n_tokens, prefetched))

    async def _prefetched(self, namespace: str, name: Optional[str], prefetched: Optional[Prefetch],
                          cut: Optional[int] = None) -> Optional[tuple[str, dict]]:
        """(filename, report) of a prefetch of this very name (and cut) that holds its current manifest, else
        None."""
        if (prefetched is None or name is None
                or (prefetched.namespace, prefetched.name, prefetched.cut) != (namespace, name, cut)):
            return None
        info = await prefetched.report()
        if info is None:
            return None
        await self.store.settled(namespace, name)
        mark = self.store.changes(namespace, name)
        if self.store.remote and mark is not None and mark == prefetched.changes:
            # A bucket store: the prefetch read the name's record when the request arrived (one round trip),
            # and this process has not saved or removed the name since; another machine's save in the meantime
            # is concurrent with this request, which serves the state it found on arrival. Asking again would
            # cost a returning user one more round trip. (A local store asks: its read is an index lookup.)
            self.metrics.inc("restores_prefetched")
            return prefetched.filename, info
        try:
            now = await self.store.get(name, namespace=namespace)
        except (KvStoreError, OSError):
            return None
        if not now or now.get("manifest_id") != info.get("manifest_id"):
            log.info("prefetch of %s/%s is stale (saved again meanwhile): materializing again", namespace, name)
            return None
        self.metrics.inc("restores_prefetched")
        return prefetched.filename, info

    async def _restore(self, lease: Lease, namespace: str, name: Optional[str], manifest_id: Optional[str],
                       cut: Optional[int] = None, prefetched: Optional[Prefetch] = None) -> Optional[dict]:
        what = name or manifest_id
        # A save of the name still being ingested behind a request is waited for first: that wait is not the
        # restore's cost (what the cost model learns, below).
        await self.store.settled(namespace, name)
        t0 = time.perf_counter()
        with self.sync.temp() as (fn, path):
            ahead = await self._prefetched(namespace, name, prefetched, cut)
            try:
                if ahead is not None:
                    fn, info = ahead
                else:
                    info = await self.materialize(path, namespace, name, manifest_id, cut)
                    if "missing" in info:  # a cut that cannot be emitted: never handed to llama-server
                        log.info("slot %d: no cut of %s at %d: %s %s", lease.slot.id, what, cut, info.get("reason"),
                                 info.get("missing"))
                        self.metrics.inc("prefix_unavailable")
                        return None
            except NameNotFound:
                raise NotStored(name) from None
            except (KvStoreError, OSError) as e:
                self._failed(lease, f"materialize {what}: {e}")
                raise RestoreFailed(str(e)) from e
            self.metrics.inc("bytes_materialized", int(info.get("file_bytes") or 0))
            t_load = time.perf_counter()
            try:
                r = await self.up.slot_action(lease.slot.id, "restore", fn)
            except UpstreamReply as e:
                self._failed(lease, f"llama-server refused {what}: {e}")
                raise RestoreFailed(e.body.decode(errors="replace")) from e
            except UpstreamError:
                lease.table.cleared(lease.slot)
                raise
        lease.table.loaded(lease.slot)
        n = int(r.get("n_restored") or 0)
        now = time.perf_counter()
        self.metrics.timed("restore", now - t0)
        # What the restore cost, for the cost model: the materialize (also a prefetched one, which ran while the
        # request waited) plus llama-server's own load time. Not the time the load waited in llama-server's queue
        # for another slot's decode step (bench/slotwait.py: up to a whole prompt's evaluation): evaluating the
        # tokens instead would not be spared that wait, and the prefill side is measured without it too
        # (`timings.prompt_ms`). An older server without `timings.restore_ms`: the load's wall time.
        materialize_s = float(info.get("elapsed_s") or 0.0) if ahead is not None else t_load - t0
        load_ms = (r.get("timings") or {}).get("restore_ms") if isinstance(r.get("timings"), dict) else None
        load_s = float(load_ms) / 1000.0 if isinstance(load_ms, (int, float)) else now - t_load
        self.cost.restored(n, int(info.get("file_bytes") or 0), materialize_s + load_s)
        self.metrics.inc("tokens_restored", n)
        r["kvstore"] = info
        return r

    def _failed(self, lease: Lease, why: str) -> None:
        log.error("slot %d: restore failed, continuing with a full evaluation: %s", lease.slot.id, why)
        self.metrics.inc("restore_failures")
        lease.table.cleared(lease.slot)


async def recover_pending(sync: SyncDir, store: AsyncStore) -> int:
    """Start-up, before the sync dir is swept: ingest the states an earlier process saved behind a request and did
    not get to ingest (a crash), oldest first (a parent before its child), each name's newest only; returns how many
    were stored. One is skipped where the store already holds a state of that name made after it (its own ingest
    committed just before the crash); one that fails is logged and dropped, as a failed ingest behind a request
    is."""
    n = 0
    pending = sync.pending_saves()
    # Only a name's newest pending save counts: an older one would have been replaced by it.
    newest = {(rec["namespace"], rec["name"]): state for rec, state, _ in pending}
    for rec, state, side in pending:
        ns, name, parent = rec["namespace"], rec["name"], rec.get("parent")
        try:
            if newest[(ns, name)] != state:
                log.info("sync dir: %s/%s was saved again after %s; dropped", ns, name, state.name)
                continue
            now = await store.get(name, namespace=ns)
            if now is not None and float(now.get("created") or 0) >= float(rec["saved_at"]):
                log.info("sync dir: %s/%s already holds a state saved after %s; dropped", ns, name, state.name)
                continue
            try:
                await store.ingest(name, str(state), namespace=ns, fingerprint=rec["fingerprint"], parent=parent)
            except NameNotFound:  # the parent is gone; keep the state anyway
                await store.ingest(name, str(state), namespace=ns, fingerprint=rec["fingerprint"])
            n += 1
            log.warning("sync dir: stored %s/%s, saved by an earlier process that stopped before ingesting it",
                        ns, name)
        except Exception as e:  # noqa: BLE001 - the state is dropped, the name keeps what it had
            log.error("sync dir: could not store %s/%s left pending by an earlier process: %s", ns, name, e)
        finally:
            for p in (side, state):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    return n
