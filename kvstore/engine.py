"""An embedded llama.cpp server (the `xllamacpp` wheel: llama.cpp's own server code, in-process, real HTTP).

The hooks and the tests talk to it only over HTTP, exactly as to an external `llama-server`.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


def wait_healthy(url: str, timeout: float = 300.0, alive=None) -> None:
    """Poll llama-server's (or kvstore serve's) `GET /health` until it answers 200.

    alive: optional callable; when it returns False (the process exited) waiting stops at once.
    """
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        if alive is not None and not alive():
            raise RuntimeError(f"server for {url} exited before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server at {url} not ready after {timeout:.0f}s")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EngineConfig:
    """llama-server settings, named as llama-server names its flags."""

    model: str
    parallel: int = 2  # -np
    ctx_size: int = 8192  # -c (total; each slot gets ctx_size / parallel)
    slot_save_path: Optional[str] = None  # --slot-save-path (a directory)
    port: int = 0  # 0 = the OS picks a free one
    flash_attn: str = "auto"  # -fa on|off|auto
    cache_type_k: str = "f16"  # -ctk
    cache_type_v: str = "f16"  # -ctv
    cache_ram: int = 8192  # --cache-ram MiB (0 = off, like llama-server)
    swa_full: bool = False  # --swa-full
    kv_unified: bool = False  # --kv-unified
    batch_size: int = 2048  # -b
    ubatch_size: int = 512  # -ub
    threads: int = 0  # -t (0 = llama.cpp default)
    ctx_checkpoints: int = 32  # --ctx-checkpoints
    # --checkpoint-min-step: 0 = a checkpoint at every user message of a chat, so a cut at an earlier turn finds
    # its window rows (measured: docs/design.md "Checkpoints llama-server makes"); llama-server's default 8192
    checkpoint_min_step: int = 0
    api_key: Optional[str] = None  # --api-key: then only /health and /v1/models answer without it
    lora: tuple = ()  # --lora FNAME (repeatable): LoRA adapters applied at scale 1; part of the states' fingerprint
    extra: dict = field(default_factory=dict)  # other CommonParams attributes, set verbatim


_FA = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "on": "LLAMA_FLASH_ATTN_TYPE_ENABLED", "off": "LLAMA_FLASH_ATTN_TYPE_DISABLED"}
_TYPES = {"f16": "GGML_TYPE_F16", "bf16": "GGML_TYPE_BF16", "f32": "GGML_TYPE_F32", "q8_0": "GGML_TYPE_Q8_0",
          "q4_0": "GGML_TYPE_Q4_0", "q4_1": "GGML_TYPE_Q4_1", "q5_0": "GGML_TYPE_Q5_0", "q5_1": "GGML_TYPE_Q5_1"}


class EmbeddedServer:
    """Start with `EmbeddedServer(cfg)`; `.url`; `.close()` (also a context manager)."""

    def __init__(self, cfg: EngineConfig):
        import xllamacpp as x

        self.config = cfg
        p = x.CommonParams()
        p.model.path = str(cfg.model)
        p.n_parallel = cfg.parallel
        p.n_ctx = cfg.ctx_size
        p.n_batch = cfg.batch_size
        p.n_ubatch = cfg.ubatch_size
        p.endpoint_slots = True
        p.endpoint_props = True
        p.endpoint_metrics = True
        p.cache_ram_mib = cfg.cache_ram
        p.swa_full = cfg.swa_full
        p.kv_unified = cfg.kv_unified
        p.n_ctx_checkpoints = cfg.ctx_checkpoints
        p.checkpoint_min_step = cfg.checkpoint_min_step
        if cfg.api_key:
            p.api_keys = [cfg.api_key]
        if cfg.lora:
            adapters = []
            for path in cfg.lora:
                adapter = x.CommonAdapterLoraInfo()
                adapter.path, adapter.scale = str(path), 1.0
                adapters.append(adapter)
            p.lora_adapters = adapters
        p.flash_attn_type = getattr(x.llama_flash_attn_type, _FA[cfg.flash_attn])
        p.cache_type_k = getattr(x.ggml_type, _TYPES[cfg.cache_type_k])
        p.cache_type_v = getattr(x.ggml_type, _TYPES[cfg.cache_type_v])
        if cfg.threads:
            p.cpuparams.n_threads = cfg.threads
            p.cpuparams_batch.n_threads = cfg.threads
        if cfg.slot_save_path:
            Path(cfg.slot_save_path).mkdir(parents=True, exist_ok=True)
            # xllamacpp concatenates path + filename: the trailing separator is required.
            p.slot_save_path = os.path.join(os.path.abspath(cfg.slot_save_path), "")
        # Port 0: the OS picks one while llama-server binds it, so two servers started at once never race for
        # a port that was free when probed (the real address is read back below).
        p.port = cfg.port
        for k, v in cfg.extra.items():
            setattr(p, k, v)
        self._server = x.Server(p)
        self.url = str(self._server.listening_address).rstrip("/")
        self.port = int(self.url.rsplit(":", 1)[1])

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            del server  # ~Server stops the main loop and frees the model

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def add_engine_args(p) -> None:
    """llama-server's own flag names, so its users need not learn new ones."""
    p.add_argument("-m", "--model", default=None, help="GGUF path, or 'gemma3' / 'smollm2' (PyPI models)")
    p.add_argument("-np", "--parallel", type=int, default=2, help="slots (default 2)")
    p.add_argument("-c", "--ctx-size", type=int, default=8192, help="total context, split across slots")
    p.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto")
    p.add_argument("-ctk", "--cache-type-k", default="f16", choices=sorted(_TYPES))
    p.add_argument("-ctv", "--cache-type-v", default="f16", choices=sorted(_TYPES))
    p.add_argument("--cache-ram", type=int, default=8192, help="llama-server's host prompt cache in MiB (0 = off)")
    p.add_argument("--swa-full", action="store_true")
    p.add_argument("--kv-unified", action="store_true")
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("--lora", action="append", default=[], metavar="FNAME",
                   help="a LoRA adapter, applied at scale 1 (repeatable); states saved with it are bound to it")


def config_from_args(args, slot_save_path: Optional[str] = None, port: int = 0) -> EngineConfig:
    from kvstore.models import default_model, model_path

    model = model_path(args.model) if args.model else default_model()
    return EngineConfig(
        model=str(model), parallel=args.parallel, ctx_size=args.ctx_size, slot_save_path=slot_save_path,
        port=port, flash_attn=args.flash_attn, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
        cache_ram=args.cache_ram, swa_full=args.swa_full, kv_unified=args.kv_unified,
        batch_size=args.batch_size, ubatch_size=args.ubatch_size, threads=args.threads, lora=tuple(args.lora),
    )


def main(argv=None) -> int:
    """`python -m kvstore.engine`: a plain llama.cpp server (no kvstore), for benchmarks and by-hand use."""
    import argparse
    import signal
    import threading

    p = argparse.ArgumentParser(prog="python -m kvstore.engine", description=main.__doc__)
    add_engine_args(p)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--slot-save-path", default=None)
    args = p.parse_args(argv)
    server = EmbeddedServer(config_from_args(args, slot_save_path=args.slot_save_path, port=args.port))
    print(f"llama.cpp server listening on {server.url}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
