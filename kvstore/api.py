"""The Python face of the store: `open_store`, `save`, `restore`.

`save(name, slot)` moves the state of a llama-server slot into the store under a name; `restore(name, slot)`
moves it back into a slot (any slot, of any server with the same fingerprint). Two kinds of server:

* a `kvstore serve` proxy: the request is sent as llama-server's own `POST /slots/{slot}?action=save|restore`
  with `{"filename": name}`; the proxy intercepts it and uses its store (namespace in `X-KV-Namespace`);
* a plain llama-server whose `--slot-save-path` is the store's sync directory (`kvstore.config.sync_dir`):
  the server writes/reads a file with a generated name there (names are never used as file names), and the
  store ingests/materializes it. The file is always removed afterwards.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional, Union

from kvstore import config
from kvstore.config import temp_state_name
from kvstore.errors import ServerError
from kvstore.llama_client import LlamaServer

from kvstore._core import Store, hash_file, inspect_state, validate_name

StoreLike = Union["Store", str, os.PathLike, None]
ServerLike = Union[LlamaServer, str, None]


def open_store(path: Union[str, os.PathLike, None] = None, *, cache: Union[str, os.PathLike, None] = None,
               cache_size: Union[str, int, None] = None, **kw: Any) -> "Store":
    """Open (creating if needed) the store at `path`, else `$KVSTORE_DIR`, else `~/.local/share/kvstore`.

    `path` is a directory or `s3://BUCKET/PREFIX` (endpoint and credentials from the AWS environment variables);
    an S3 store keeps its index and the objects it has seen in `cache` (default `~/.cache/kvstore/<hash>`),
    bounded by `cache_size` (bytes, or a string such as "10G"). Also creates the sync directory (the
    `--slot-save-path` for llama-server: `kvstore.config.sync_dir_of(store)`). Other keyword arguments go to
    `Store` (`block_size`, `level`, `map_size_mib`). A malformed location raises `config.LocationError`
    (a ValueError) before anything is created."""
    return config.locate(path, cache=cache, cache_size=cache_size).open(**kw)


def _store(store: StoreLike) -> "Store":
    if store is None or isinstance(store, (str, os.PathLike)):
        return open_store(store)
    return store


def _server(server: ServerLike, api_key: Optional[str] = None) -> LlamaServer:
    if isinstance(server, LlamaServer):
        return server
    return LlamaServer(server, api_key=api_key)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _ms(reply: dict, key: str) -> Optional[float]:
    return (reply.get("timings") or {}).get(key)


def _sync_hint(srv: LlamaServer, sync: Path, exc: ServerError) -> ServerError:
    """Add what to do when the server cannot write/read our sync directory."""
    if exc.status in (500, 501):
        return ServerError(f"{exc}; start llama-server with --slot-save-path {sync}{os.sep} "
                           f"(the store's sync directory)", url=exc.url, status=exc.status, detail=exc.detail)
    return exc


def _via_proxy(srv: LlamaServer, action: str, name: str, slot: int, namespace: str) -> dict:
    slot = srv.check_slot(slot)
    headers = {"X-KV-Namespace": namespace} if namespace else None
    t0 = time.perf_counter()
    reply = srv.slot_action(slot, action, name, headers=headers)
    out = dict(reply)
    out.setdefault("name", name)
    # the proxy says where the state went: a tenant key picks the namespace, not the argument
    out.setdefault("namespace", (reply.get("kvstore") or {}).get("namespace", namespace))
    out.update(server=srv.url, slot=slot, via="kvstore-serve", total_s=time.perf_counter() - t0)
    return out


def _direct(srv, store: StoreLike, name: str, namespace: str, slot: int):
    """Checks and paths shared by save and restore against a plain llama-server: (slot, store, server
    fingerprint, sync dir, generated file name, its path). Names are validated and never become file names."""
    validate_name(name)
    if namespace:
        validate_name(namespace, "namespace")
    slot = srv.check_slot(slot)
    st = _store(store)
    fp = srv.fingerprint()
    sync = config.sync_dir_of(st)
    sync.mkdir(parents=True, exist_ok=True)
    fname = temp_state_name()
    return slot, st, fp, sync, fname, sync / fname


def save(name: str, slot: int, *, server: ServerLike = None, store: StoreLike = None, namespace: str = "",
         parent: Optional[str] = None, api_key: Optional[str] = None) -> dict:
    """Save llama-server slot `slot` into the store as (namespace, name).

    `parent`: the name this state was restored from and extends (recorded in the manifest; plain server only).
    `api_key`: sent as a Bearer token (a `kvstore serve` tenant key, or llama-server's own --api-key); default
    `$KVSTORE_API_KEY`.

    Returns the store's ingest report (`manifest_id`, `n_tokens`, `file_bytes`, `new_raw_bytes`, ...) plus
    `server`, `slot`, `n_saved`, `save_ms` (llama-server writing the file), `ingest_s` and `total_s`.
    Raises ServerError (server unreachable/refused), ValueError (no such slot), InvalidName, StoreFull."""
    srv = _server(server, api_key)
    if srv.is_kvstore():
        return _via_proxy(srv, "save", name, slot, namespace)
    slot, st, fp, sync, fname, path = _direct(srv, store, name, namespace, slot)
    t0 = time.perf_counter()
    try:
        try:
            reply = srv.save_slot(slot, fname)
        except ServerError as e:
            raise _sync_hint(srv, sync, e) from None
        if not path.is_file():
            raise ServerError(f"{srv.url} saved slot {slot} as {fname!r}, but {path} does not exist: start "
                              f"llama-server with --slot-save-path {sync}{os.sep} (the store's sync directory)",
                              url=srv.url)
        t1 = time.perf_counter()
        # The server's own save: a new cache configuration may change the layout (force skips only that check).
        report = st.ingest(name, str(path), namespace=namespace, fingerprint=fp, parent=parent,
                           remove_file=True, force=True)
        t2 = time.perf_counter()
    finally:
        _unlink(path)
    report = dict(report)
    report.update(server=srv.url, slot=slot, n_saved=reply.get("n_saved"), save_ms=_ms(reply, "save_ms"),
                  ingest_s=t2 - t1, total_s=t2 - t0)
    return report


def restore(name: str, slot: int, *, server: ServerLike = None, store: StoreLike = None,
            namespace: str = "", api_key: Optional[str] = None) -> dict:
    """Restore (namespace, name) from the store into llama-server slot `slot`.

    The state is checked against the server's fingerprint first (FingerprintMismatch, before the server is
    asked to do anything) and re-emitted for the server's slot count. Returns the store's materialize report
    plus `server`, `slot`, `n_restored`, `restore_ms`, `materialize_s`, `total_s`.
    If llama-server refuses the file it has already cleared the slot: ServerError says so."""
    srv = _server(server, api_key)
    if srv.is_kvstore():
        return _via_proxy(srv, "restore", name, slot, namespace)
    slot, st, fp, sync, fname, path = _direct(srv, store, name, namespace, slot)
    n_stream = srv.n_slots()
    t0 = time.perf_counter()
    try:
        report = st.materialize(name, str(path), namespace=namespace, expect=fp, n_stream=n_stream)
        t1 = time.perf_counter()
        try:
            reply = srv.restore_slot(slot, fname)
        except ServerError as first:
            reply = None
            if first.status == 400 and n_stream > 1:
                # /props does not say whether the server runs with --kv-unified (one stream for all slots):
                # the slot is already cleared by the failed restore, so try the single-stream layout once.
                _unlink(path)
                report = st.materialize(name, str(path), namespace=namespace, expect=fp, n_stream=1)
                try:
                    reply = srv.restore_slot(slot, fname)
                except ServerError:
                    reply = None
            if reply is None:
                if first.status is None:
                    raise
                raise ServerError(f"llama-server at {srv.url} refused to restore {name!r} into slot {slot} "
                                  f"(HTTP {first.status}: {first.detail}); llama-server has cleared slot {slot}",
                                  url=first.url, status=first.status, detail=first.detail) from None
        t2 = time.perf_counter()
    finally:
        _unlink(path)
    report = dict(report)
    report.update(server=srv.url, slot=slot, n_restored=reply.get("n_restored"),
                  restore_ms=_ms(reply, "restore_ms"), materialize_s=t1 - t0, total_s=t2 - t0)
    return report


__all__ = ["Store", "open_store", "save", "restore", "temp_state_name", "hash_file", "inspect_state",
           "validate_name"]
