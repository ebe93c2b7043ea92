"""What a server's states are bound to (docs/design.md, "Fingerprint").

The slot file carries no model identity and llama.cpp does not check one, so we derive it from the server:
the content hash of the GGUF when it is readable here, else the model metadata the server reports.
The cache layout (types, flash attention, rotation) is derived by the core from every saved file.
"""
from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, Mapping, Optional

_lock = threading.Lock()
_hash_cache: dict[tuple, str] = {}


def model_file_hash(path: str) -> str:
    """Content hash of a GGUF file, cached per (path, size, mtime) for this process."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _hash_cache:
            return _hash_cache[key]
    try:
        from kvstore._core import hash_file  # blake3, GIL released

        digest = "blake3:" + hash_file(path)
    except ImportError:  # pragma: no cover - the core is always built in practice
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        digest = "sha256:" + h.hexdigest()
    with _lock:
        _hash_cache[key] = digest
    return digest


def server_fingerprint(props: Mapping[str, Any], models: Optional[Mapping[str, Any]] = None,
                       n_ctx_slot: Optional[int] = None, adapters: Optional[list] = None) -> dict[str, str]:
    """Fingerprint of a llama-server from its `/props` (and optionally `/v1/models`, `/lora-adapters`) replies.

    Keys: `model` (identity), `n_ctx_slot` (a fit limit, not identity), and, when the GGUF is readable here,
    `n_swa` (the model's sliding window, only for SWA models: a prefix state of such a model is cut with it;
    without the key no prefix of an SWA state is cut) and `n_layer` (not identity: with it and `n_swa` the core
    refuses a slot file missing a section), and `lora` when LoRA adapters apply (`lora_fingerprint`: the KV of a
    prompt depends on them). `n_stream` is deliberately absent: states are re-emitted for the target server's slot
    count.
    """
    path = props.get("model_path") or ""
    fp: dict[str, str] = {}
    if path and os.path.isfile(path):
        fp = model_fingerprint(path)
    else:
        # External server on another machine: bind to what it says about the model.
        meta = {}
        if models:
            data = models.get("data") or []
            if data:
                meta = data[0].get("meta") or {}
        desc = repr((os.path.basename(path), props.get("model_ftype"), sorted(meta.items())))
        fp = {"model": "meta:" + hashlib.sha256(desc.encode()).hexdigest()}
    if n_ctx_slot is None:
        n_ctx_slot = (props.get("default_generation_settings") or {}).get("n_ctx")
    if n_ctx_slot:
        fp["n_ctx_slot"] = str(int(n_ctx_slot))
    lora = lora_fingerprint(adapters or [])
    if lora:
        fp["lora"] = lora
    return fp


def lora_fingerprint(adapters: list) -> Optional[str]:
    """The LoRA adapters a server applies (its `/lora-adapters` reply: path and scale each), as a fingerprint
    value: each adapter's content hash when its file is readable here (else its file name) with its scale;
    None when none applies (no adapter, or every scale 0), so a server without adapters keeps the plain model's
    fingerprint. A global scale changed later (`POST /lora-adapters` on llama-server itself) is not seen."""
    active = []
    for a in adapters:
        if not isinstance(a, dict) or not float(a.get("scale") or 0.0):
            continue
        path = str(a.get("path") or "")
        ident = model_file_hash(path) if path and os.path.isfile(path) else "name:" + os.path.basename(path)
        active.append(f"{ident}*{float(a['scale'])!r}")
    if not active:
        return None
    return "sha256:" + hashlib.sha256("\n".join(sorted(active)).encode()).hexdigest()


def model_fingerprint(path: str) -> dict[str, str]:
    """What a GGUF file binds states to: its content hash, and its window and layer count when the header is
    readable (`kvstore ingest --model` and the hooks' fingerprint both use it)."""
    from kvstore.gguf import shape

    fp = {"model": model_file_hash(path)}
    try:
        n_swa, n_layer = shape(path)
    except (OSError, ValueError):
        n_swa, n_layer = 0, 0
    if n_swa:
        fp["n_swa"] = str(n_swa)
    if n_layer:
        fp["n_layer"] = str(n_layer)
    return fp
