"""`kvstore serve`: the hooks in front of an external llama-server (--upstream) or an embedded one.

Contract: `run(args)` runs the server for arguments parsed by `kvstore.cli` (the one parser; `kvstore serve --help`) until
SIGTERM/SIGINT, then saves dirty slots; exit status 0, or 2 with one line on stderr. `Running` is the same server
on a background thread (tests, embedding). The CLI imports this module lazily; it never imports the CLI
(`python -m kvstore.cli serve ARGS` is `kvstore serve ARGS`).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import sys
import threading
from typing import Optional

from aiohttp import web

from kvstore.engine import EmbeddedServer  # xllamacpp itself is imported only when one is started

from .app import HOOKS, HooksConfig, build_app
from .cost import CostModel
from .cut import swa_cells

log = logging.getLogger("kvstore.hooks")


def engine_config(args, *, multi_tenant: bool):
    """The embedded llama-server's settings: writing into <store>/sync, with a random API key of its own (only the
    hooks can use its slots API), and without its host prompt cache when tenants exist (that cache is keyed by
    tokens: one tenant's cached prefix would be served to another who guesses it)."""
    from kvstore.engine import config_from_args

    if args.kv_unified:
        # One KV stream shared by all slots: restores would need states re-emitted for 1 stream, not n_slots.
        raise ValueError("--kv-unified is not supported by kvstore serve")
    loc = getattr(args, "location", None)  # set by run(); callers that build args themselves name only --store
    if loc is None:
        from kvstore.config import locate

        loc = locate(args.store, cache=getattr(args, "cache", None), cache_size=getattr(args, "cache_size", None))
    cfg = config_from_args(args, slot_save_path=str(loc.sync))
    cfg.api_key = secrets.token_urlsafe(32)
    if multi_tenant and cfg.cache_ram:
        log.warning("--cache-ram %d -> 0: llama-server's host prompt cache would cross namespaces", cfg.cache_ram)
        cfg.cache_ram = 0
    return cfg


def start_engine(args, *, multi_tenant: bool = False):
    """Start the embedded llama-server (`engine_config`). Returns the EmbeddedServer."""
    from kvstore.engine import EmbeddedServer

    return EmbeddedServer(engine_config(args, multi_tenant=multi_tenant))


def engine_swa_cells(engine: Optional[EmbeddedServer]) -> int:
    """`cut.swa_cells` of the embedded llama-server (None: an external one, 0: unknown)."""
    if engine is None:
        return 0
    from kvstore.gguf import sliding_window

    c = engine.config
    return swa_cells(sliding_window(c.model), c.ubatch_size, c.ctx_size // max(1, c.parallel), c.kv_unified,
                     c.swa_full, c.parallel)


def tenancy_of(args):
    from .auth import tenancy_from

    return tenancy_from(args.api_key or (), args.api_key_file or (), args.admin_api_key or (),
                        allow_namespace_header=args.allow_namespace_header)


class Running:
    """A hooks server on its own event loop in a background thread (tests, embedding in other programs)."""

    def __init__(self, cfg: HooksConfig, host: str = "127.0.0.1", port: int = 0, *, wait: float = 300.0):
        self.cfg, self.host, self.port = cfg, host, port
        self.loop = asyncio.new_event_loop()
        self.app = build_app(cfg)
        self.runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=30)
        self._thread = threading.Thread(target=self.loop.run_forever, name="kvstore-hooks", daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
            self.url = f"http://{self.host}:{self.port}"
            if wait:  # 0: return while it still waits for llama-server (answering 503)
                self._call(self.hooks.wait_ready(wait))
        except BaseException:
            with contextlib.suppress(Exception):
                self._call(self.runner.cleanup(), 60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise

    @property
    def hooks(self):
        return self.app[HOOKS]

    def _call(self, coro, timeout: Optional[float] = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def run(self, coro, timeout: Optional[float] = None):
        """Run a coroutine on the server's loop (e.g. to inspect the slot table)."""
        return self._call(coro, timeout)

    def close(self) -> None:
        """Stop accepting, wait for requests in flight, save dirty slots, stop the loop."""
        if self.loop.is_closed():
            return
        try:
            self._call(self.runner.cleanup())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


async def _serve(cfg: HooksConfig, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before anything can be waited for: SIGTERM always exits 0
        loop.add_signal_handler(sig, stop.set)
    app = build_app(cfg)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()  # opens the store; llama-server is awaited in the background (503 until then)
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port  # type: ignore[union-attr]
    print(f"kvstore serve: listening on http://{host}:{bound} (llama-server {cfg.upstream}, store {cfg.location}"
          + (f", cache {cfg.location.cache})" if cfg.location.remote else ")"),
          flush=True)
    await stop.wait()
    log.info("kvstore serve: stopping: no new connections, finishing requests, saving dirty slots")
    await runner.cleanup()


def bounds_of(args) -> dict:
    """--max-size, --low-water, --default-ttl, --evict-period as HooksConfig fields; raises ValueError for a bad
    one."""
    from kvstore.config import LocationError, parse_size

    try:
        max_size = parse_size(getattr(args, "max_size", None), "--max-size")
    except LocationError as e:
        raise ValueError(str(e)) from None
    low = getattr(args, "low_water", 0.9)
    if not 0 < low <= 1:
        raise ValueError(f"--low-water {low}: must be in (0, 1]")
    ttl = getattr(args, "default_ttl", None)
    if ttl is not None and not ttl > 0:
        raise ValueError(f"--default-ttl {ttl}: must be a positive number of seconds")
    period = getattr(args, "evict_period", 5.0)
    if not (0 < period <= 86400):
        raise ValueError(f"--evict-period {period}: must be seconds in (0, 86400]")
    return {"max_size": max_size, "low_water": low, "default_ttl": ttl, "evict_period": period}


def cost_of(args) -> dict:
    """--assume-prefill-tps, --restore-policy as HooksConfig fields; raises ValueError for a bad one (the cost
    model says why)."""
    tps, policy = getattr(args, "assume_prefill_tps", None), getattr(args, "restore_policy", "cost")
    CostModel(tps, policy)
    return {"assume_prefill_tps": tps, "restore_policy": policy}


def configure(args):
    """The hooks' settings for arguments `kvstore.cli` parsed, starting the embedded llama-server unless
    `--upstream` names one. Returns (HooksConfig, the EmbeddedServer or None); the caller closes the engine."""
    from kvstore.config import Location, locate

    loc = locate(args.store, cache=args.cache, cache_size=args.cache_size)
    if not loc.remote:
        loc = Location(path=loc.path.resolve())  # type: ignore[union-attr]
    args.location = loc
    loc.local_dir.mkdir(parents=True, exist_ok=True)
    tenancy = tenancy_of(args)
    bounds = bounds_of(args)
    upstream_key = args.upstream_api_key
    engine = None
    extra = {}
    if args.upstream:
        upstream = args.upstream
    else:
        if args.swa_full:
            log.warning("--swa-full: llama-server keeps no checkpoints and a rollback inside the window after a "
                        "restore gives silently wrong K/V (docs/hooks.md); states are fingerprinted apart")
        extra["swa_full"] = "on" if args.swa_full else "off"
        engine = start_engine(args, multi_tenant=tenancy.enabled)
        upstream, upstream_key = engine.url, engine.config.api_key
    try:
        cfg = HooksConfig(upstream=upstream, store=loc, name_from_user=args.name_from_user,
                          idle_save=args.idle_save, max_queue=args.max_queue, fingerprint_extra=extra,
                          save_behind={"on": True, "off": False}.get(args.save_behind),
                          upstream_timeout=args.upstream_timeout, upstream_idle_timeout=args.upstream_idle_timeout,
                          upstream_stall_timeout=args.upstream_stall_timeout,
                          tenancy=tenancy, upstream_api_key=upstream_key, embedded=engine is not None,
                          swa_cells=engine_swa_cells(engine), resume_at=getattr(args, "resume_at", "checkpoint"),
                          fork_states=getattr(args, "fork_states", "on") == "on",
                          **cost_of(args), **bounds)
    except BaseException:
        if engine is not None:
            engine.close()
        raise
    return cfg, engine


def run(args) -> int:
    """`kvstore serve` with the arguments `kvstore.cli` parsed."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = None
    try:
        cfg, engine = configure(args)
        asyncio.run(_serve(cfg, args.host, args.port))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - one line, exit 2
        print(f"kvstore serve: error: {e}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()
    return 0

