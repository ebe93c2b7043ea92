"""`kvstore serve`: the hooks in front of an external llama-server (--upstream) or an embedded one.

`run(args)` runs the server for arguments parsed by `kvstore.cli` (the one parser; `kvstore serve --help`) until
SIGTERM/SIGINT, then saves dirty slots; exit status 0, or 2 with one line on stderr. `Running` is the same server
on a background thread (tests, embedding). `python -m kvstore.hooks.serve ARGS` is `kvstore serve ARGS`.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Optional

from aiohttp import web

from .app import HOOKS, HooksConfig, build_app

log = logging.getLogger("kvstore.hooks")


def start_engine(args):
    """Start the embedded llama-server writing into <store>/sync. Returns the EmbeddedServer."""
    from kvstore.config import sync_dir
    from kvstore.engine import EmbeddedServer, config_from_args

    if args.kv_unified:
        # One KV stream shared by all slots: restores would need states re-emitted for 1 stream, not n_slots.
        raise ValueError("--kv-unified is not supported by kvstore serve")
    return EmbeddedServer(config_from_args(args, slot_save_path=str(sync_dir(args.store))))


class Running:
    """A hooks server on its own event loop in a background thread (tests, embedding in other programs)."""

    def __init__(self, cfg: HooksConfig, host: str = "127.0.0.1", port: int = 0):
        self.cfg, self.host, self.port = cfg, host, port
        self.loop = asyncio.new_event_loop()
        self.app = build_app(cfg)
        self.runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=30)
        self._thread = threading.Thread(target=self.loop.run_forever, name="kvstore-hooks", daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            raise
        self.url = f"http://{self.host}:{self.port}"

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
    app = build_app(cfg)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()  # connects to llama-server, opens the store
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if port == 0 else port  # type: ignore[union-attr]
    print(f"kvstore serve: listening on http://{host}:{bound} (llama-server {cfg.upstream}, store {cfg.store})",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("kvstore serve: stopping: no new connections, finishing requests, saving dirty slots")
    await runner.cleanup()


def run(args) -> int:
    """`kvstore serve` with the arguments `kvstore.cli` parsed."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from kvstore.config import store_dir

    args.store = store_dir(args.store).resolve()
    Path(args.store).mkdir(parents=True, exist_ok=True)
    engine = None
    extra = {}
    try:
        if args.upstream:
            upstream = args.upstream
        else:
            if args.swa_full:
                log.warning("--swa-full: llama-server keeps no checkpoints and a rollback inside the window after a "
                            "restore gives silently wrong K/V (docs/hooks.md); states are fingerprinted apart")
            extra["swa_full"] = "on" if args.swa_full else "off"
            engine = start_engine(args)
            upstream = engine.url
        cells = 0
        if engine is not None:
            from kvstore.gguf import sliding_window

            from .prefix import swa_cells

            c = engine.config
            cells = swa_cells(sliding_window(c.model), c.ubatch_size, c.ctx_size // max(1, c.parallel), c.kv_unified,
                              c.swa_full, c.parallel)
        cfg = HooksConfig(upstream=upstream, store=Path(args.store), name_from_user=args.name_from_user,
                          idle_save=args.idle_save, max_queue=args.max_queue, fingerprint_extra=extra,
                          swa_cells=cells)
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


def main(argv: Optional[list[str]] = None) -> int:
    from kvstore.cli import main as cli_main

    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
