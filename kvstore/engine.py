"""An embedded llama.cpp server (the `xllamacpp` wheel: llama.cpp's own server code, in-process, real HTTP).

The hooks and the tests talk to it only over HTTP, exactly as to an external `llama-server`.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


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
    port: int = 0  # 0 = pick a free one
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
        self.port = cfg.port or free_port()
        p.port = self.port
        for k, v in cfg.extra.items():
            setattr(p, k, v)
        self._server = x.Server(p)
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            del server  # ~Server stops the main loop and frees the model

    def __enter__(self) -> "EmbeddedServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
