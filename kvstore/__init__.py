"""kvstore: named, persistent, deduplicated KV-cache states for llama.cpp's llama-server.

    import kvstore
    store = kvstore.open_store()                 # $KVSTORE_DIR or ~/.local/share/kvstore
    kvstore.save("alice", slot=0)                # llama-server slot 0 -> the store
    kvstore.restore("alice", slot=1)             # the store -> slot 1

The store itself is the compiled `kvstore._core.Store` (see `_core.pyi`); this module only re-exports.
"""
from kvstore.api import Store, open_store, restore, save
from kvstore.errors import (
    CorruptObject,
    FingerprintMismatch,
    FormatError,
    InvalidName,
    KvStoreError,
    GcLocked,
    NameNotFound,
    RemoteUnavailable,
    ServerError,
    StoreFull,
)

try:
    from kvstore._core import __version__
except ImportError:  # core not built: the installed distribution's version
    try:
        from importlib.metadata import version as _version

        __version__ = _version("kvstore")
    except Exception:  # pragma: no cover - source tree without metadata
        __version__ = "0+unknown"

__all__ = [
    "Store", "open_store", "save", "restore", "__version__",
    "KvStoreError", "FormatError", "CorruptObject", "FingerprintMismatch", "NameNotFound", "InvalidName",
    "StoreFull", "ServerError", "RemoteUnavailable", "GcLocked",
]
