"""The hooks application: its lifecycle (configuration and parts: `wiring.py`; endpoints: `routes.ROUTES`).

Contract: `build_app(cfg)` returns an aiohttp application whose cleanup context (`Hooks.context`) opens one httpx client and
the store, clears the sync directory and returns at once: the server listens while `_connect` waits for
llama-server (until then every request is a 503 with Retry-After, and `/health` says why), then reads its
fingerprint and builds the slot table. Background: the idle saver; the upstream watch (a restarted llama-server
empties its slots: the table then forgets what it believed resident; the sync directory is swept of files that are
not ours); the liveness probe of llama-server's /health on a client of its own (`Upstream.watch_liveness`: a stalled
llama-server is a 504 for waiting requests, a 503 for new ones). On the way out every dirty slot is saved. Requests
go to `handlers.py`; errors become replies in `middleware.py`; what to restore or save is decided in `broker.py`.
Wire protocol: docs/hooks.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator, Optional

from aiohttp import web

from kvstore import llama
from kvstore.fingerprint import server_fingerprint

from . import cut
from .behind import WriteBehind
from .bound import Bound
from .cost import CostModel
from .broker import Broker
from .slot_api import SlotApi
from .errors import Unavailable, UpstreamError, UpstreamReply
from .handlers import Handlers
from .metrics import Metrics
from .middleware import error, error_middleware
from .routes import HEALTH_PATHS, add_routes, gate
from .slots import SlotTable
from .store import AsyncStore
from .syncdir import SyncDir
from .transfer import Transfer, recover_pending
from .upstream import KEEPALIVE, Upstream
from .upstream import client as upstream_client
from .wiring import HooksConfig, Wired

__all__ = ["HOOKS", "Hooks", "HooksConfig", "build_app"]

log = logging.getLogger("kvstore.hooks")


class Hooks:
    """Everything one running hooks server shares: `wired` once llama-server has answered (`Wired`)."""

    def __init__(self, cfg: HooksConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.location = cfg.location
        self.sync = SyncDir(self.location.sync)
        self._wired: Optional[Wired] = None
        self.ready = asyncio.Event()
        self.waiting_for = "starting"  # why requests are refused until `ready` (the /health reply)
        self._tasks: list[asyncio.Task] = []
        self._check = asyncio.Event()  # set after a connection error: check for a restarted llama-server now
        self._epoch: dict[int, int] = {}  # slot id -> the highest id_task seen (task ids only grow in one process)

    @property
    def wired(self) -> Wired:
        """The connected server's parts; Unavailable before llama-server has answered (`ready_middleware` keeps
        every handler from getting here that early)."""
        if self._wired is None:
            raise Unavailable(f"not ready: {self.waiting_for}")
        return self._wired

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup context: one httpx client and the store now, llama-server when it answers (in the
        background); save everything on the way out."""
        session = upstream_client(KEEPALIVE)
        probe = upstream_client(KEEPALIVE, connections=1)  # the side connection of the liveness probe
        try:
            up = Upstream(self.cfg.upstream, session, first_byte=self.cfg.upstream_timeout,
                          idle=self.cfg.upstream_idle_timeout, on_error=self._check.set,
                          api_key=self.cfg.upstream_api_key, strip_client_key=self.cfg.tenancy.enabled,
                          stall=self.cfg.upstream_stall_timeout,
                          on_stall=lambda: self.metrics.inc("upstream_stalls"))
            store = await AsyncStore.open(self.location)
            store.on_remote_failure = lambda: self.metrics.inc("remote_failures")
            # Nothing of ours is in use yet: everything there is left over. States an earlier process saved
            # behind a request and did not ingest (a crash) are stored first.
            await recover_pending(self.sync, store)
            self.sync.sweep()
            self._tasks.append(asyncio.create_task(self._connect(up, store, probe)))
            yield
        finally:
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            if self._wired is not None:
                try:
                    n = await self._wired.table.save_all()
                    log.info("hooks: saved %d dirty slot(s) on shutdown", n)
                except Exception as e:  # noqa: BLE001 - report, still close
                    log.error("hooks: saving slots on shutdown failed: %s", e)
                await self._wired.store.drained()  # the saves written behind, logged if they failed
            await session.aclose()
            await probe.aclose()

    async def wait_ready(self, timeout: float) -> None:
        """Until llama-server has answered and the slot table is built (tests, embedding); raises if connecting
        failed or took longer than `timeout`."""
        connect = self._tasks[0]
        ready = asyncio.ensure_future(self.ready.wait())
        try:
            await asyncio.wait([ready, connect], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self.ready.is_set():
            failed = connect.exception() if connect.done() else None
            if failed is not None:
                raise failed
            raise UpstreamError(f"not ready after {timeout:.0f} s: {self.waiting_for}")

    async def _connect(self, up: Upstream, store: AsyncStore, probe) -> None:
        try:
            await self._connect_once(up, store, probe)
        except Exception as e:  # noqa: BLE001 - reported by /health and the 503s, and logged
            self.waiting_for = f"start-up failed: {e}"
            log.error("hooks: %s", self.waiting_for)
            raise

    async def _connect_once(self, up: Upstream, store: AsyncStore, probe) -> None:
        """Wait for llama-server (as long as it takes; SIGTERM cancels), then build the slot table and go ready;
        `probe`: the liveness probe's own client."""
        first = True
        while True:
            try:
                props = await up.call("GET", llama.PROPS, timeout=10)
                break
            except (UpstreamError, UpstreamReply) as e:
                self.waiting_for = f"waiting for llama-server at {up.url}: {e}"
                if first:
                    log.warning("hooks: %s; answering 503 until it is ready", self.waiting_for)
                    first = False
                await asyncio.sleep(0.5)
        models = await up.models()
        adapters = await up.lora_adapters()
        n_slots = int(props.get("total_slots") or 1)
        fp = await asyncio.to_thread(server_fingerprint, props, models, adapters=adapters)
        fp.update({k: str(v) for k, v in self.cfg.fingerprint_extra.items()})
        transfer = Transfer(up, store, self.sync, self.metrics, n_slots=n_slots, fingerprint=fp,
                            swa_cells=self.cfg.swa_cells, cost=CostModel(self.cfg.assume_prefill_tps, self.cfg.restore_policy))
        if self.cfg.saves_behind:
            store.behind = WriteBehind(limit=n_slots)  # at most one file a slot waiting to be ingested
        table = SlotTable(n_slots, save=transfer.save, save_behind=transfer.save_behind, max_queue=self.cfg.max_queue,
                          erase=lambda s: up.slot_action(s.id, "erase"),
                          extension_only=lambda: cut.extension_only(transfer.fingerprint, transfer.layout),
                          forks_served=lambda: cut.forks_served(transfer.fingerprint, transfer.layout))
        broker = Broker(up, store, transfer, table, self.metrics, resume_at_end=self.cfg.resume_at == "end",
                        fork_states=self.cfg.fork_states)
        bound = Bound(store, self.metrics, max_bytes=self.cfg.max_size, low_water=self.cfg.low_water,
                      default_ttl=self.cfg.default_ttl, quotas=self.cfg.tenancy.quotas(),
                      protect=lambda: _held_names(table), period=self.cfg.evict_period)
        transfer.bound = bound
        await transfer.learn_layout(0)  # before the first request (and before the first look at the task ids)
        await self._restarted(up)  # the first look at the slots' task ids
        self._wired = wired = Wired(up=up, store=store, transfer=transfer, table=table, broker=broker,
                                    slot_api=SlotApi(up, store, transfer, table), n_slots=n_slots, bound=bound)
        self.metrics.cap_bytes = self.cfg.max_size
        self._tasks.append(asyncio.create_task(bound.run()))
        if self.cfg.idle_save > 0:
            self._tasks.append(asyncio.create_task(self._idle_loop(wired)))
        self._tasks.append(asyncio.create_task(self._watch_loop(wired)))
        if self.cfg.upstream_stall_timeout > 0:
            self._tasks.append(asyncio.create_task(up.watch_liveness(probe)))
        self.ready.set()
        log.info("hooks: upstream %s, %d slots, store %s, fingerprint %s", up.url, n_slots, self.cfg.store, fp)
        self._log_tenancy(props)

    def _log_tenancy(self, props: dict) -> None:
        t = self.cfg.tenancy
        if not t.enabled:
            log.warning("hooks: single-tenant: no API keys, every client is trusted and may use any namespace "
                        "(--api-key / --api-key-file for tenants)")
            return
        log.info("hooks: %d API key(s); namespace header %s", t.describe()["n_keys"], t.describe()["namespace_header"])
        # llama-server's host prompt cache is keyed by tokens, not tenants: a guessed prefix would be served warm.
        # Its /props does not say whether the cache is on, so an external server can only be warned about.
        cache = props.get("cache_ram_mib", props.get("cache_ram"))
        if not self.cfg.embedded and cache != 0:
            log.warning("hooks: llama-server's host prompt cache (cache_ram %s) would serve one tenant's cached "
                        "prefix to another: start the external llama-server with --cache-ram 0",
                        "unknown" if cache is None else cache)

    async def _idle_loop(self, wired: Wired) -> None:
        period = max(0.2, min(self.cfg.idle_save / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            try:
                await wired.table.save_idle(self.cfg.idle_save)
            except Exception as e:  # noqa: BLE001 - keep the loop alive
                log.error("hooks: idle save failed: %s", e)

    async def _watch_loop(self, wired: Wired) -> None:
        """Every `watch_period` s, and at once after a connection error: has llama-server restarted? Every
        `sync_sweep` s: remove foreign files from the sync dir."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self.cfg.sync_sweep
        while True:
            await asyncio.sleep(0.5)  # at most two checks a second, even while llama-server is down
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.cfg.watch_period - 0.5)):
                    await self._check.wait()
            self._check.clear()
            try:
                if await self._restarted(wired.up):
                    self.metrics.inc("upstream_restarts")
                    for slot in wired.table.slots:
                        wired.table.lost(slot)
                    log.warning("hooks: llama-server at %s restarted: its slots are empty; names are restored from "
                                "the store on their next request", wired.up.url)
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.cfg.sync_sweep
                    await asyncio.to_thread(self.sync.sweep, self.cfg.sync_sweep)
            except Exception as e:  # noqa: BLE001 - keep the loop alive
                log.error("hooks: upstream watch failed: %s", e)

    def check_upstream_soon(self) -> None:
        """Ask the watch loop for a restart check now (it runs at most twice a second)."""
        self._check.set()

    async def _restarted(self, up: Upstream) -> bool:
        """Compare the slots' task ids (`GET /slots`; kept across save, restore and erase) with those seen before: a
        task id never decreases within one llama-server process, so a lower one, or none where there was one, means a
        new process whose slots are empty. Unreachable: unknown (False), checked again."""
        try:
            slots = await up.call("GET", llama.SLOTS, timeout=10)
        except (UpstreamError, UpstreamReply, Unavailable) as e:  # Unavailable: stalled, checked once it answers
            log.debug("hooks: restart check: %s", e)
            return False
        restarted = False
        for s in slots if isinstance(slots, list) else []:
            if not isinstance(s, dict) or not isinstance(s.get("id"), int):
                continue
            sid, task = s["id"], s.get("id_task")
            task = task if isinstance(task, int) else -1  # a slot that never ran a task has no id_task
            if task < self._epoch.get(sid, -1):
                restarted = True
            self._epoch[sid] = task
        return restarted


HOOKS = web.AppKey("hooks", Hooks)


@web.middleware
async def ready_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Until llama-server has answered: 503 + Retry-After for everything, `/health` saying why."""
    hooks = request.app[HOOKS]
    if not hooks.ready.is_set():
        if request.path in HEALTH_PATHS:
            return error(503, hooks.waiting_for, "unavailable_error", headers={"Retry-After": "5"})
        raise Unavailable(f"not ready: {hooks.waiting_for}")
    return await handler(request)


def build_app(cfg: HooksConfig) -> web.Application:
    hooks = Hooks(cfg)
    h = Handlers(hooks)
    app = web.Application(client_max_size=64 * 1024 * 1024,
                          middlewares=[error_middleware, gate(cfg.tenancy), ready_middleware])
    app[HOOKS] = hooks
    app.cleanup_ctx.append(hooks.context)
    add_routes(app.router, h)
    return app


def _held_names(table: SlotTable) -> list[tuple[str, str]]:
    """What an eviction must not take now: every name a slot holds, and the parents their states were built on."""
    out = []
    for s in table.slots:
        if s.key is not None:
            out.append(s.key)
        if s.parent:
            out.append((s.namespace, s.parent))
    return out
