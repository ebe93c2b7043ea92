"""The named slot API and state lookups, without HTTP (no aiohttp.web): `/slots/{id}?action=save|restore|erase`
with a name, and `GET` / `DELETE /kvstore/states/{name}`.

Contract: each step returns a plain dict and raises `errors.NotFound`, `Forbidden` (a slot holding another
namespace's state: a tenant acts only on empty slots or its own), `BadRequest` (a restore that failed: the slot is
then empty) or `UpstreamError` / `QueueFull`, which the handlers and the error middleware turn into replies. Slot
fields are only written through `SlotTable`.
"""
from __future__ import annotations

import time
from typing import Callable

from .auth import Caller
from .errors import BadRequest, Forbidden, NotFound, NotStored, RestoreFailed, remote_unavailable
from .slot import Slot
from .slots import SlotTable
from .store import AsyncStore
from .transfer import Transfer
from .upstream import Upstream


def own_slots_only(caller: Caller) -> Callable[[Slot], None]:
    """The raw slot API's guard: a slot that is empty or holds the caller's namespace (any, for an admin)."""
    def check(slot: Slot) -> None:
        if not slot.visible_to(caller.viewer):
            raise Forbidden(f"slot {slot.id} holds another namespace's state")
    return check


class SlotApi:
    def __init__(self, up: Upstream, store: AsyncStore, transfer: Transfer, table: SlotTable):
        self.up, self.store, self.transfer, self.table = up, store, transfer, table

    async def save_raw(self, slot_id: int, caller: Caller, name: str) -> dict:
        """`/slots/{id}?action=save` with a name: the slot's content into the store, its label unchanged."""
        namespace = caller.namespace
        async with self.table.acquire(slot_id=slot_id, relabel=False, guard=own_slots_only(caller)) as lease:
            t0 = time.perf_counter()
            info = await lease.shielded(self.transfer.save(lease.slot, name=name, namespace=namespace))
            self.table.saved(lease.slot, (namespace, name))
        return {"info": info or {}, "seconds": time.perf_counter() - t0}

    async def restore_raw(self, slot_id: int, caller: Caller, name: str) -> dict:
        """`/slots/{id}?action=restore` with a name: the stored state into that slot, which then holds the name.
        Raises NotFound, Forbidden (the slot holds another namespace's state), or BadRequest when the restore
        failed (the slot is then empty)."""
        namespace = caller.namespace
        key = (namespace, name)
        if self.table.slots[slot_id].key != key:
            own_slots_only(caller)(self.table.slots[slot_id])  # before moving the name's label out of another slot
        other = self.table.resident(key)
        if other is not None and other.id != slot_id:
            # The name is resident elsewhere: save its newest content, then let only the target hold the label.
            async with self.table.acquire(slot_id=other.id, relabel=False) as lease:
                if other.key == key:
                    if other.dirty:
                        await self.table.evict(lease, strict=True)
                    self.table.forget(other)
        async with self.table.acquire(slot_id=slot_id, key=key, namespace=namespace,
                                      guard=own_slots_only(caller)) as lease:
            if lease.resident and lease.slot.dirty:
                await self.table.evict(lease, strict=True)
            t0 = time.perf_counter()
            try:
                r = await self.transfer.restore(lease, namespace, name=name)
            except NotStored:
                raise NotFound(namespace, name) from None
            except RestoreFailed as e:
                if remote_unavailable(e):  # the bucket, not the request: 503, try again later
                    raise e.__cause__ from None  # type: ignore[misc]
                raise BadRequest(f"restore of {name!r} failed: {e}") from e
            self.table.restored(lease.slot)
        return {"reply": r, "seconds": time.perf_counter() - t0}

    async def erase(self, slot_id: int, caller: Caller) -> dict:
        async with self.table.acquire(slot_id=slot_id, relabel=False, guard=own_slots_only(caller)) as lease:
            r = await self.up.slot_action(slot_id, "erase")
            self.table.erased(lease.slot)
        return r

    async def delete(self, namespace: str, name: str) -> None:
        """Remove a name from the store and from the slot holding it; NotFound if neither had it."""
        s = self.table.resident((namespace, name))
        if s is not None:  # forget the label: the slot's content is no longer saved under that name
            self.table.forget(s)
        if not await self.store.remove(name, namespace=namespace) and s is None:
            raise NotFound(namespace, name)

    async def info(self, namespace: str, name: str) -> dict:
        """The stored state plus where it is resident; NotFound if not stored."""
        info = await self.store.get(name, namespace=namespace)
        if info is None:
            raise NotFound(namespace, name)
        s = self.table.resident((namespace, name))
        return {**info, "resident_slot": s.id if s is not None else None, "dirty": bool(s is not None and s.dirty)}
