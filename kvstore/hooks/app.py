"""The hooks application: its configuration, its lifecycle, its route table.

`build_app(cfg)` returns an aiohttp application whose cleanup context (`Hooks.context`) opens one ClientSession,
waits for llama-server, reads its fingerprint, opens the store and the slot table, runs the idle saver, and on the
way out saves every dirty slot. Requests go to `handlers.py`; errors become replies in `middleware.py`; what to
restore or save is decided in `broker.py`. Wire protocol: docs/hooks.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import aiohttp
from aiohttp import web

from kvstore.config import sync_dir
from kvstore.fingerprint import server_fingerprint

from .broker import Broker
from .handlers import CHAT_PATHS, COMPLETION_PATHS, SLOT_ONLY_PATHS, Handlers
from .metrics import Metrics
from .middleware import error_middleware
from .slots import SlotTable
from .store import AsyncStore
from .syncdir import SyncDir
from .transfer import Transfer
from .upstream import Upstream

log = logging.getLogger("kvstore.hooks")


@dataclass
class HooksConfig:
    upstream: str  # llama-server URL
    store: Path  # store directory; llama-server's --slot-save-path must be <store>/sync
    name_from_user: bool = False
    idle_save: float = 30.0  # seconds; <= 0 disables
    max_queue: int = 64
    fingerprint_extra: dict = field(default_factory=dict)  # added to the server fingerprint (e.g. swa_full)
    # SWA models: the server's SWA cache cells per slot (hooks/prefix.py swa_cells), so a cut keeps a fresh
    # evaluation's cell layout; 0 when unknown (an external llama-server): the cut carries the window alone.
    swa_cells: int = 0
    ready_timeout: float = 300.0


class Hooks:
    """Everything one running hooks server shares; filled in by `context` before the first request."""

    def __init__(self, cfg: HooksConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.sync = SyncDir(sync_dir(cfg.store))
        self.session: Optional[aiohttp.ClientSession] = None
        self.up: Optional[Upstream] = None
        self.store: Optional[AsyncStore] = None
        self.table: Optional[SlotTable] = None
        self.transfer: Optional[Transfer] = None
        self.broker: Optional[Broker] = None
        self.n_slots = 0
        self._idle_task: Optional[asyncio.Task] = None

    @property
    def fingerprint(self) -> dict[str, str]:
        return self.transfer.fingerprint if self.transfer else {}

    @property
    def layout(self) -> Optional[str]:
        return self.transfer.layout if self.transfer else None

    async def context(self, app: web.Application):
        """aiohttp cleanup context: one ClientSession, the store, the slot table; save everything on the way out."""
        # llama-server (cpp-httplib) drops idle keep-alive connections after 5 s; keep ours for less, so a pooled
        # connection is rarely stale (Upstream also retries once when one is).
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                                             connector=aiohttp.TCPConnector(keepalive_timeout=2.0),
                                             auto_decompress=False)
        try:
            self.up = Upstream(self.cfg.upstream, self.session)
            props = await self.up.wait_ready(self.cfg.ready_timeout)
            models = await self.up.models()
            self.n_slots = int(props.get("total_slots") or 1)
            fp = await asyncio.to_thread(server_fingerprint, props, models)
            fp.update({k: str(v) for k, v in self.cfg.fingerprint_extra.items()})
            self.store = await AsyncStore.open(str(self.cfg.store))
            self.sync.clean_stale()
            self.transfer = Transfer(self.up, self.store, self.sync, self.metrics, n_slots=self.n_slots,
                                     fingerprint=fp, swa_cells=self.cfg.swa_cells)
            self.table = SlotTable(self.n_slots, save=self.transfer.save, max_queue=self.cfg.max_queue)
            self.broker = Broker(self.up, self.store, self.transfer, self.table, self.metrics)
            if self.cfg.idle_save > 0:
                self._idle_task = asyncio.create_task(self._idle_loop())
            log.info("hooks: upstream %s, %d slots, store %s, fingerprint %s", self.up.url, self.n_slots,
                     self.cfg.store, fp)
            yield
        finally:
            if self._idle_task is not None:
                self._idle_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._idle_task
            if self.table is not None:
                try:
                    n = await self.table.save_all()
                    log.info("hooks: saved %d dirty slot(s) on shutdown", n)
                except Exception as e:  # noqa: BLE001 - report, still close
                    log.error("hooks: saving slots on shutdown failed: %s", e)
            await self.session.close()
            self.store = None

    async def _idle_loop(self) -> None:
        period = max(0.2, min(self.cfg.idle_save / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            try:
                await self.table.save_idle(self.cfg.idle_save)
            except Exception as e:  # noqa: BLE001 - keep the loop alive
                log.error("hooks: idle save failed: %s", e)


HOOKS = web.AppKey("hooks", Hooks)


def build_app(cfg: HooksConfig) -> web.Application:
    hooks = Hooks(cfg)
    h = Handlers(hooks)
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[error_middleware])
    app[HOOKS] = hooks
    app.cleanup_ctx.append(hooks.context)
    r = app.router
    for p in COMPLETION_PATHS + CHAT_PATHS + SLOT_ONLY_PATHS:
        r.add_post(p, h.completion)
    r.add_post("/slots/{id}", h.slot_action)
    r.add_get("/kvstore/states", h.state_list)
    r.add_post("/kvstore/states/{name}", h.prime)
    r.add_get("/kvstore/states/{name}", h.state_info)
    r.add_delete("/kvstore/states/{name}", h.state_delete)
    r.add_get("/kvstore/stats", h.stats)
    r.add_get("/kvstore/", h.status_page)
    r.add_get("/metrics", h.prometheus)
    r.add_route("*", "/{tail:.*}", h.passthrough)
    return app
