"""kvstore's exceptions.

The store's exception classes are defined once, by the compiled core (`kvstore._core`, rust/src/py/errors.rs),
with their attributes (`name`, `namespace`, `key`, `stored`, `server`, `object_id`, `what`, `value`, `path`, `url`;
see `_core.pyi`), and re-exported here. `ServerError` is the Python side's own: llama-server (or `kvstore
serve`) could not be reached or refused a request.
"""
from __future__ import annotations

from typing import Optional

from kvstore._core import (
    CorruptObject,
    FingerprintMismatch,
    FormatError,
    InvalidName,
    KvStoreError,
    GcLocked,
    NameNotFound,
    RemoteUnavailable,
    StoreFull,
)



class ServerError(KvStoreError):
    """llama-server (or `kvstore serve`) was unreachable or refused a request.

    The message names the URL, the HTTP status (if any) and the server's own error text.
    """

    def __init__(self, message: str, *, url: str = "", status: Optional[int] = None, detail: str = ""):
        super().__init__(message)
        self.url = url
        self.status = status
        self.detail = detail


def error_message(exc: BaseException) -> str:
    """One line for the user: KeyError-derived exceptions otherwise print their message in quotes."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


__all__ = [
    "KvStoreError", "FormatError", "CorruptObject", "FingerprintMismatch", "NameNotFound", "InvalidName",
    "StoreFull", "RemoteUnavailable", "GcLocked", "ServerError", "error_message",
]
