"""The store kept within bounds while serving: `--max-size`, names' ttl and pins, tenants' quotas. No aiohttp.

Contract (docs/design.md "Bounded store"): every ingest of a save runs inside `reserve(namespace, file_bytes)`, which
evicts first when the store's size estimate plus the ingests under way would pass the cap or the namespace's quota
(evicting down to what leaves them room), so the store never passes its cap by whole states; `saved(namespace, name,
info)` then gives the name the retention its request asked for (`ask()`, kept until the name's next save) or the
default ttl, and adds the save's new bytes to the estimates (an estimate still over a bound evicts then). `run()`
also evicts expired names every `period` seconds once any ttl is in play. One eviction at a time, in a worker thread,
under the core's gc lock (saves wait for it); the names the slot table holds (resident, being restored or saved, and
their parents) and those of every request under way (`in_use`) are protected. A failed eviction or a refused pin at save time is logged and counted, never a failed
request: a name evicted is only a miss later.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Optional

from kvstore.errors import GcLocked, KvStoreError, StoreFull

from .errors import BadRequest
from .store import AsyncStore

log = logging.getLogger("kvstore.hooks")

TTL_FIELD = "cache_prompt_ttl"
PIN_FIELD = "cache_prompt_pin"
TTL_HEADER = "X-KV-TTL"
PIN_HEADER = "X-KV-Pin"
MAX_TTL = 10 * 365 * 86400.0  # seconds; a longer ttl is a pin
# Another machine's gc holds a bucket store's lock: an eviction that must make room for a save tries again after
# about this long (with jitter) until this many seconds have passed; a periodic one lets that gc do the work.
LOCKED_RETRY_S = 0.25
LOCKED_PATIENCE_S = 3.0
REASONS = ("ttl", "quota", "cap")

Key = tuple[str, str]


@dataclass(frozen=True)
class RetentionAsk:
    """What a request asked for its name: a ttl in seconds and/or a pin (None: unchanged)."""

    ttl: Optional[float] = None
    pin: Optional[bool] = None

    @property
    def empty(self) -> bool:
        return self.ttl is None and self.pin is None


def _ttl(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadRequest(f"{TTL_FIELD} must be a number of seconds, not {type(value).__name__}")
    try:
        t = float(value)
    except ValueError:
        raise BadRequest(f"{TTL_FIELD} / {TTL_HEADER}: {value!r} is not a number of seconds") from None
    if not (math.isfinite(t) and 0 < t <= MAX_TTL):
        raise BadRequest(f"{TTL_FIELD} / {TTL_HEADER}: {value!r}: want seconds in (0, {MAX_TTL:.0f}] "
                         f"(to keep a name forever, pin it: {PIN_FIELD}: true)")
    return t


def _pin(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no"):
        return False
    raise BadRequest(f"{PIN_FIELD} / {PIN_HEADER}: {value!r}: want true or false (header: 1 or 0)")


def ask_of(headers: Mapping[str, str], body: Optional[Mapping[str, Any]]) -> RetentionAsk:
    """The retention a request asks for (body field, else header); raises BadRequest for a bad value."""
    body = body or {}
    ttl = body.get(TTL_FIELD, headers.get(TTL_HEADER))
    pin = body.get(PIN_FIELD, headers.get(PIN_HEADER))
    return RetentionAsk(None if ttl is None else _ttl(ttl), None if pin is None else _pin(pin))


def strip_fields(body: dict) -> None:
    body.pop(TTL_FIELD, None)
    body.pop(PIN_FIELD, None)


class Bound:
    def __init__(self, store: AsyncStore, metrics: Any, *, max_bytes: Optional[int] = None, low_water: float = 0.9,
                 default_ttl: Optional[float] = None, quotas: Optional[Mapping[str, int]] = None,
                 protect: Callable[[], Iterable[Key]] = lambda: (), period: float = 5.0):
        self.store, self.metrics = store, metrics
        self.max_bytes, self.low_water, self.default_ttl = max_bytes, low_water, default_ttl
        self.quotas = dict(quotas or {})
        self.protect, self.period = protect, period
        self.pending: dict[Key, RetentionAsk] = {}
        self.in_use_keys: Counter = Counter()  # names (and parents) of requests under way: never evicted now
        self.reserved: dict[str, int] = {}  # namespace -> bytes of the ingests under way (reserve())
        self.refused: dict[Key, str] = {}  # pins refused at a save (the prime route answers them 507)
        self.used: Optional[int] = None  # estimate of the store's stored bytes (None: not counted yet)
        self.ns_used: dict[str, int] = {}
        self.evicted: Counter = Counter()
        self.evictions = 0
        self.last: Optional[dict] = None
        self.ttl_seen = default_ttl is not None
        self._lock = asyncio.Lock()
        # New bytes of saves seen while an eviction is in flight: its plan may not have counted them.
        self._during: Optional[dict[str, int]] = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes is not None or bool(self.quotas) or self.ttl_seen

    def describe(self) -> dict:
        return {"enabled": self.enabled, "max_bytes": self.max_bytes, "low_water": self.low_water,
                "default_ttl": self.default_ttl, "used_bytes": self.used,
                "evicted": {r: self.evicted.get(r, 0) for r in REASONS}, "evictions": self.evictions, "last": self.last}

    def quota_of(self, namespace: str) -> Optional[int]:
        return self.quotas.get(namespace)

    # ---- requests -----------------------------------------------------------------------------------------------
    async def ask(self, key: Optional[Key], asked: RetentionAsk) -> Optional[str]:
        """A request asks for a ttl or a pin of its name: applied now if the name is stored (a pin over the cap is
        StoreFull: 507, nothing changed), and again at the name's next save. Returns, for a pin asked, what the reply
        tells (`X-KV-Pin`): "1" (pinned now) or "pending" (a new name: pinned at its first save, where a pin over
        the cap is refused, logged and counted, and the name stays unpinned)."""
        if asked.empty:
            return None
        if key is None:
            raise BadRequest(f"{TTL_FIELD} / {PIN_FIELD} need a name ({'cache_prompt_name'} or X-KV-Name)")
        if asked.ttl is not None:
            self.ttl_seen = True
        info = await self.store.get(key[1], namespace=key[0])
        if info is not None:
            await self._apply(key, asked, info)
        self.pending[key] = asked
        if not asked.pin:
            return None
        return "1" if info is not None else "pending"

    async def _apply(self, key: Key, asked: RetentionAsk, info: Mapping[str, Any]) -> None:
        ttl = asked.ttl if asked.ttl is not None else info.get("ttl_s")
        pin = asked.pin if asked.pin is not None else bool(info.get("pinned"))
        if ttl == info.get("ttl_s") and pin == bool(info.get("pinned")):
            return
        await self.store.set_retention(key[1], namespace=key[0], ttl_seconds=ttl, pinned=pin,
                                       max_bytes=self.max_bytes)

    @contextlib.asynccontextmanager
    async def in_use(self, *keys: Optional[Key]) -> AsyncIterator[None]:
        """While a request is under way (waiting for a slot, restoring, evaluating, saving), its name and parent
        are protected from eviction."""
        held = [k for k in keys if k is not None]
        self.in_use_keys.update(held)
        try:
            yield
        finally:
            self.in_use_keys.subtract(held)
            for k in held:
                if self.in_use_keys[k] <= 0:
                    del self.in_use_keys[k]

    # ---- saves ----------------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def reserve(self, namespace: str, file_bytes: int) -> AsyncIterator[None]:
        """Around an ingest of a `file_bytes` slot file (at most what it adds): if the store with every ingest under
        way would pass the cap or the namespace's quota, evict first, down to what leaves room for them. So a
        store passes its cap only by what compression and dedup failed to save, never by whole states."""
        self.reserved[namespace] = self.reserved.get(namespace, 0) + file_bytes
        try:
            if self.enabled and self._would_pass(namespace):
                await self.evict_serialized(patient=True)
            yield
        finally:
            self.reserved[namespace] -= file_bytes

    def _would_pass(self, namespace: str) -> bool:
        if self.used is None:
            return True
        if self.max_bytes is not None and self.used + sum(self.reserved.values()) > self.max_bytes:
            return True
        quota = self.quotas.get(namespace)
        return quota is not None and self.ns_used.get(namespace, 0) + self.reserved.get(namespace, 0) > quota

    async def saved(self, namespace: str, name: str, info: Mapping[str, Any]) -> None:
        """After a save of (namespace, name) with its ingest report: retention, the size estimates, an eviction."""
        key = (namespace, name)
        asked = self.pending.pop(key, None)
        if asked is None and self.default_ttl is not None and info.get("ttl_s") is None and not info.get("pinned"):
            asked = RetentionAsk(ttl=self.default_ttl)
        if asked is not None:
            try:
                await self._apply(key, asked, info)
            except StoreFull as e:
                self.metrics.inc("pins_refused")
                self.refused[key] = str(e)
                if len(self.refused) > 1024:  # only the prime route reads them, right after its save
                    self.refused.pop(next(iter(self.refused)))
                log.warning("hooks: pin of %s/%s refused: %s", namespace, name, e)
            except KvStoreError as e:
                log.error("hooks: retention of %s/%s not set: %s", namespace, name, e)
        if not self.enabled:
            return
        new = int(info.get("new_stored_bytes") or 0)
        if self._during is not None:
            self._during[namespace] = self._during.get(namespace, 0) + new
        if self.used is not None:
            self.used += new
        self.ns_used[namespace] = self.ns_used.get(namespace, 0) + new
        if self._would_pass(namespace):
            # The estimate was off (another machine's saves, compression): correct it before the slot is reused.
            await self.evict_serialized(patient=True)

    async def evict_serialized(self, patient: bool = False) -> None:
        """An eviction now, after the one running (if any) has finished. `patient`: while another machine's gc
        holds a bucket store's lock, wait for it and evict then (a save waits for the room); else leave it to that
        gc, which keeps the bucket within the cap as that machine counts it."""
        async with self._lock:
            until = time.monotonic() + (LOCKED_PATIENCE_S if patient else 0.0)
            while True:
                try:
                    await self.evict_now()
                    return
                except GcLocked as e:
                    why = e
                if time.monotonic() >= until:
                    break
                await asyncio.sleep(LOCKED_RETRY_S * (0.5 + random.random()))
            self.metrics.inc("evictions_deferred")
            (log.warning if patient else log.info)("hooks: eviction put off: %s", why)

    async def evict_now(self) -> Optional[dict]:
        """One eviction; None when it failed (logged, counted). Raises GcLocked when another machine's gc (or
        saves in flight too long) held a bucket store's lock: nothing was done."""
        protect = sorted(set(self.protect()) | set(self.in_use_keys))
        # Room for the ingests under way: evict as if the cap and quotas were smaller by what they may add.
        room = sum(self.reserved.values())
        max_bytes = None if self.max_bytes is None else max(1, self.max_bytes - room)
        quotas = {ns: max(1, q - self.reserved.get(ns, 0)) for ns, q in self.quotas.items()}
        self._during = {}
        try:
            # The sweep may hold up to the cap itself meanwhile: the saves the room is for wait for it.
            r = await self.store.evict(max_bytes=max_bytes, low_water=self.low_water, quotas=quotas,
                                       protect=protect, ceiling_bytes=self.max_bytes)
        except GcLocked:
            self._during = None
            raise
        except KvStoreError as e:
            self._during = None
            self.metrics.inc("eviction_failures")
            log.error("hooks: eviction failed (the store may pass its cap until the next one): %s", e)
            return None
        plan = r["plan"]
        # What the store holds after the sweep (what it listed less what went: victims' objects that stayed, such as
        # a bucket's dead objects left in packs it could not rewrite below the cap, still count), plus what was
        # saved meanwhile (counted twice if the plan saw it: an estimate that errs high only makes the next save
        # look again).
        during, self._during = self._during or {}, None
        left = int(plan["used_bytes"]) - int(r.get("freed_bytes") or 0)
        self.used = max(int(plan["after_bytes"]), left) + sum(during.values())
        self.ns_used = {u["namespace"]: int(u["after_bytes"]) for u in plan["namespaces"]}
        for ns, n in during.items():
            self.ns_used[ns] = self.ns_used.get(ns, 0) + n
        self.evictions += 1
        by_reason = Counter(v["reason"] for v in plan["victims"])
        self.evicted.update(by_reason)
        for reason, n in by_reason.items():
            self.metrics.evicted(reason, n)
        self.last = {"victims": len(plan["victims"]), "freed_bytes": r.get("freed_bytes"),
                     "after_bytes": plan["after_bytes"], "kept_packed_bytes": r.get("kept_packed_bytes"),
                     "unmet": plan["unmet"]}
        if plan["victims"]:
            log.info("hooks: evicted %d name(s) (%s), freed %s bytes; stored %s of cap %s",
                     len(plan["victims"]), dict(by_reason),
                     r.get("freed_bytes"), plan["after_bytes"], self.max_bytes)
        if plan["unmet"]:
            log.warning("hooks: the cap or a quota cannot be met: what is left is pinned or in use")
        return r

    async def run(self) -> None:
        """The periodic pass: expired names go whether or not the store is full (and the estimate is refreshed)."""
        while True:
            if self.enabled and not self._lock.locked():
                await self.evict_serialized()
            await asyncio.sleep(self.period)
